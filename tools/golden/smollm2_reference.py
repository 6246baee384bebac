#!/usr/bin/env python3
"""Reference outputs of transformers for SmolLM2-135M-Instruct, converted by `loom convert`.

For three fixed prompts: the prompt ids (HF tokenizer), the fp32 logits at the last prompt position,
and 32 greedy tokens (no early stop at EOS). Written as one safetensors file that
tests/unit/smollm2_test.cc reads.

    build/loom convert ~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-hf
    python3 tools/golden/smollm2_reference.py /tmp/smollm2-hf tests/fixtures/golden/smollm2.safetensors

Needs torch, transformers (5.x) and safetensors; runs on the CPU in fp32. With a third argument, the
model is read by transformers' own GGUF loader instead (MODEL_DIR holds the file; needs `gguf`):

    python3 tools/golden/smollm2_reference.py DIR OUT.safetensors SmolLM2-135M-Instruct.Q4_1.gguf
"""
import json
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

NUM_GREEDY = 32
PROMPTS = [
    {"chat": [{"role": "user", "content": "What is the capital of France?"}]},
    {"text": "def fibonacci(n):\n    "},
    {"text": "The quick brown fox jumps over the lazy dog. In 2024, the"},
]


def main(model_dir: str, out_path: str, gguf_file: str = None) -> None:
    torch.manual_seed(0)
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(model_dir, **extra)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **extra)
    model.eval()
    tensors = {}
    for index, prompt in enumerate(PROMPTS):
        if "chat" in prompt:
            ids = tokenizer.apply_chat_template(prompt["chat"], add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(prompt["text"])["input_ids"]
        ids = list(ids)
        with torch.no_grad():
            sequence = torch.tensor([ids])
            last_logits = model(sequence).logits[0, -1].float()
            greedy = []
            for _ in range(NUM_GREEDY):
                logits = model(sequence).logits[0, -1]
                token = int(torch.argmax(logits))
                greedy.append(token)
                sequence = torch.cat([sequence, torch.tensor([[token]])], dim=1)
        tensors[f"prompt{index}.ids"] = torch.tensor(ids, dtype=torch.float32)
        tensors[f"prompt{index}.last_logits"] = last_logits.contiguous()
        tensors[f"prompt{index}.greedy"] = torch.tensor(greedy, dtype=torch.float32)
        print(f"prompt {index}: {len(ids)} tokens -> {tokenizer.decode(greedy)!r}")
    metadata = {"prompts": json.dumps(PROMPTS), "transformers": __import__("transformers").__version__,
                "torch": torch.__version__}
    save_file(tensors, out_path, metadata=metadata)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
