#!/usr/bin/env python3
"""Golden outputs from Hugging Face transformers + PEFT for Loom's numerics tests.

Reads model directories written by `loom make-model` (config.json,
model.safetensors, adapters/NAME/) and, in fp32 on the CPU, computes for a
fixed set of token-id prompts:

  * the logits at every prompt position, for the base model and each adapter;
  * 32 greedy tokens (full recomputation each step, no KV cache) and the gap
    between the best and second-best logit at each step (a test should only
    insist on a greedy token whose gap exceeds its numerical tolerance).

Writes OUT/<dir name>.safetensors, every tensor F32 (token ids are exact):

  prompts                    [P, T]     token ids
  base.logits                [P, T, V]
  base.greedy                [P, G]     token ids, continuing each prompt
  base.greedy_margin         [P, G]     top1 - top2 logit at each step
  <adapter>.logits / .greedy / .greedy_margin   the same, per adapter

and __metadata__ (all strings):

  format            "loom-golden-1"
  arch              config.json "model_type"
  adapters          comma-separated adapter names (directory names)
  num_greedy        G
  alora_prompt      index of the prompt containing the aLoRA invocation, or "-1"
  peft_modules      JSON {adapter: {module path: [rank, scaling]}}, as PEFT resolved them
  alora.<adapter>   JSON invocation tokens, for aLoRA adapters
  sha256.<file>     of config.json, model.safetensors, adapters/*/adapter_*: the
  fnv1a64.<file>    exact model the goldens belong to (regenerate them if
                    `loom make-model` output changes); fnv1a64 is 16 hex digits,
                    cheap to check from C++
  versions          torch / transformers / peft versions

aLoRA adapters follow PEFT (and Loom's `activated` mode): the adapter applies
from the last occurrence of the invocation sequence in the *prompt* onwards,
including every generated token; without an occurrence the base model answers.

Needs torch, transformers >= 5, peft >= 0.21, safetensors; nothing from Loom.
Usage: make_goldens.py --out OUT DIR [DIR ...]
"""
import argparse
import hashlib
import json
import os
import sys

import torch
from safetensors.torch import save_file

NUM_PROMPTS = 2
PROMPT_LENGTH = 12
NUM_GREEDY = 32
ALORA_INVOCATION_POSITION = 5  # where prompt 1 carries the invocation sequence


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fnv1a64_of(path):
    value = 0xCBF29CE484222325
    with open(path, "rb") as stream:
        data = stream.read()
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def make_prompts(vocab_size, invocation):
    """Fixed pseudo-random ids (a 64-bit LCG, no library randomness) in [4, vocab - 4).

    Prompt 0 never contains the invocation's first token; prompt 1 carries the
    invocation sequence at ALORA_INVOCATION_POSITION when there is one."""
    state = 0x2545F4914F6CDD1D
    prompts = []
    avoid = set(invocation[:1])
    for _ in range(NUM_PROMPTS):
        row = []
        while len(row) < PROMPT_LENGTH:
            state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            token = 4 + (state >> 33) % (vocab_size - 8)
            if token not in avoid:
                row.append(int(token))
        prompts.append(row)
    alora_prompt = -1
    if invocation:
        alora_prompt = 1
        start = ALORA_INVOCATION_POSITION
        prompts[1][start : start + len(invocation)] = invocation
    return prompts, alora_prompt


def alora_start(prompt, invocation):
    """PEFT's calculate_alora_offsets: the start of the last occurrence, or None."""
    best = None
    for start in range(len(prompt) - len(invocation) + 1):
        if prompt[start : start + len(invocation)] == invocation:
            best = start
    return best


def forward_logits(model, ids, invocation):
    """Logits [len(ids), V] of one sequence; for aLoRA, offsets from the prompt's invocation."""
    kwargs = {}
    if invocation is not None:
        start = invocation["start"]
        kwargs["alora_offsets"] = [None if start is None else len(ids) - start]
    with torch.no_grad():
        output = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False, **kwargs)
    return output.logits[0].float()


def run_model(model, prompts, invocation_tokens):
    logits, greedy, margins = [], [], []
    for prompt in prompts:
        invocation = None
        if invocation_tokens:
            invocation = {"start": alora_start(prompt, invocation_tokens)}
        logits.append(forward_logits(model, prompt, invocation))
        sequence = list(prompt)
        tokens, gaps = [], []
        for _ in range(NUM_GREEDY):
            last = forward_logits(model, sequence, invocation)[-1]
            top = torch.topk(last, 2)
            token = int(torch.argmax(last))
            tokens.append(token)
            gaps.append(float(top.values[0] - top.values[1]))
            sequence.append(token)
        greedy.append(tokens)
        margins.append(gaps)
    return (torch.stack(logits).contiguous(), torch.tensor(greedy, dtype=torch.float32),
            torch.tensor(margins, dtype=torch.float32))


def load_base(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def peft_module_table(peft_model, adapter_name):
    from peft.tuners.lora import LoraLayer

    table = {}
    for path, module in peft_model.base_model.model.named_modules():
        if isinstance(module, LoraLayer) and adapter_name in module.r:
            table[path] = [int(module.r[adapter_name]), float(module.scaling[adapter_name])]
    return table


def make_golden(model_dir, out_dir):
    from peft import PeftModel

    with open(os.path.join(model_dir, "config.json")) as stream:
        config = json.load(stream)
    vocab_size = int(config["vocab_size"])
    adapters_root = os.path.join(model_dir, "adapters")
    adapter_names = sorted(os.listdir(adapters_root)) if os.path.isdir(adapters_root) else []
    adapter_invocations = {}
    for name in adapter_names:
        with open(os.path.join(adapters_root, name, "adapter_config.json")) as stream:
            tokens = json.load(stream).get("alora_invocation_tokens")
        adapter_invocations[name] = [int(t) for t in tokens] if tokens else None
    invocation = next((t for t in adapter_invocations.values() if t), [])
    if any(t and t != invocation for t in adapter_invocations.values()):
        sys.exit(f"{model_dir}: aLoRA adapters with different invocation sequences are not supported here")
    prompts, alora_prompt = make_prompts(vocab_size, invocation)

    tensors = {"prompts": torch.tensor(prompts, dtype=torch.float32)}
    metadata = {
        "format": "loom-golden-1",
        "arch": str(config.get("model_type")),
        "adapters": ",".join(adapter_names),
        "num_greedy": str(NUM_GREEDY),
        "alora_prompt": str(alora_prompt),
    }
    import peft
    import transformers

    metadata["versions"] = f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}"
    for relative in ["config.json", "model.safetensors"] + [
        os.path.join("adapters", name, file) for name in adapter_names
        for file in ("adapter_config.json", "adapter_model.safetensors")
    ]:
        key = relative.replace(os.sep, "/")
        metadata["sha256." + key] = sha256_of(os.path.join(model_dir, relative))
        metadata["fnv1a64." + key] = fnv1a64_of(os.path.join(model_dir, relative))

    base = load_base(model_dir)
    logits, greedy, margins = run_model(base, prompts, None)
    tensors.update({"base.logits": logits, "base.greedy": greedy, "base.greedy_margin": margins})
    del base

    modules = {}
    for name in adapter_names:
        model = PeftModel.from_pretrained(load_base(model_dir), os.path.join(adapters_root, name), adapter_name=name)
        model.eval()
        modules[name] = peft_module_table(model, name)
        logits, greedy, margins = run_model(model, prompts, adapter_invocations[name])
        tensors.update({f"{name}.logits": logits, f"{name}.greedy": greedy, f"{name}.greedy_margin": margins})
        if adapter_invocations[name]:
            metadata[f"alora.{name}"] = json.dumps(adapter_invocations[name])
        del model
    metadata["peft_modules"] = json.dumps(modules, sort_keys=True)

    out_path = os.path.join(out_dir, os.path.basename(os.path.normpath(model_dir)) + ".safetensors")
    save_file({key: value.contiguous() for key, value in tensors.items()}, out_path, metadata=metadata)
    return out_path, tensors


def summarize(path, tensors):
    base = tensors["base.logits"]
    lines = [f"{path}: vocab {base.shape[-1]}, base logit std {base.std():.3f}, "
             f"min greedy margin {tensors['base.greedy_margin'].min():.4f}"]
    for key in sorted(k for k in tensors if k.endswith(".logits") and k != "base.logits"):
        name = key[: -len(".logits")]
        diff = (tensors[key] - base).abs()
        same = (tensors[f"{name}.greedy"] == tensors["base.greedy"]).float().mean()
        lines.append(f"  {name}: max |logit - base| {diff.max():.3f}, mean {diff.mean():.3f}, "
                     f"greedy same as base {same:.2f}, min margin {tensors[f'{name}.greedy_margin'].min():.4f}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("model_dirs", nargs="+", help="directories written by `loom make-model`")
    args = parser.parse_args()
    torch.manual_seed(0)  # nothing should be random; this guards against LoRA init noise
    os.makedirs(args.out, exist_ok=True)
    for model_dir in args.model_dirs:
        path, tensors = make_golden(model_dir, args.out)
        print(summarize(path, tensors))


if __name__ == "__main__":
    main()
