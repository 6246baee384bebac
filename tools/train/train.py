#!/usr/bin/env python3
"""Trains one LoRA adapter on one task of tasks.py with PyTorch + transformers +
peft (on a GPU machine), saves it as PEFT writes it, and scores it and the base
model on the task's held-out split with transformers + PEFT (greedy): the
reference row of the quality table (issue 39).

    tools/train/train.py --model HF_DIR --task arithmetic --kind lora --out DIR

--kind lora:   q, k, v, o, gate, up, down (isolated, forked, or base-mode serving)
--kind alora:  the same modules as an activated LoRA (PEFT's alora_invocation_tokens =
               tasks.INVOCATION's tokens): the base model's K/V up to the invocation
--kind icarus: ICaRus ("ICaRus: Identical Cache Reuse for Efficient Multi Model Inference", arXiv:2603.13281,
               §3.2, Appendix B): LoRA on q, o, gate, up, down only, trained with
               the logical encoder frozen: every layer's K and V come from the base model's own
               forward (adapter off, no grad) and the adapted forward's attention uses them instead
               of its own, so Loom's `base` sharing mode (every K/V the base model's) is exact for it.
               Its held-out reference score is computed the same way (the adapter's queries over the
               base model's K/V, the base model's K/V extended by each generated token), as `base`
               mode serves it; the plain (isolated) PEFT score is reported beside it. The saved
               adapter is an ordinary PEFT LoRA (target modules q, o, gate, up, down).

The question and INVOCATION are tokenized apart and joined, so the invocation's
tokens appear exactly (a serving test sends the same ids). Writes DIR/adapter_*
and DIR/train.json (settings, loss curve, time, held-out accuracy of the adapter
and of the base model).
"""
import argparse
import json
import os
import random
import sys
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tasks import INVOCATION, TASKS, make_split  # noqa: E402

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ICARUS_MODULES = ["q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # no k/v: the encoder is frozen


class FrozenEncoderKV:
    """ICaRus's frozen logical encoder on a PEFT model: forward hooks on every attention's k_proj and v_proj.

    forward() runs the base model first (adapter disabled, no grad) with the hooks capturing each layer's
    k_proj and v_proj outputs, then the adapted model with the hooks returning the captured tensors in place
    of its own projections. Everything the attention does after the projections (the view into heads, RoPE
    on K, a k-norm where a model has one, GQA) is a function of those outputs and of the position embeddings,
    which both passes share (same ids, mask and positions), so the adapted attention consumes exactly the base
    model's K/V, as Loom's `base` mode serves them. The captured tensors are detached: K/V are constants of the
    adapter's parameters (the encoder never sees the adapter), so no gradient flows through them.
    """

    def __init__(self, model):
        self.mode, self.store, self.handles = None, {}, []
        for name, module in model.named_modules():
            if name.endswith(("self_attn.k_proj", "self_attn.v_proj")):
                if not isinstance(module, torch.nn.Linear) or hasattr(module, "lora_A"):
                    raise SystemExit(f"icarus: {name} must be the base model's plain projection (no LoRA on k/v)")
                self.handles.append(module.register_forward_hook(self._hook(name)))
        if not self.handles:
            raise SystemExit("icarus: no self_attn.k_proj / v_proj modules found")

    def _hook(self, name):
        def hook(module, inputs, output):
            if self.mode == "capture":
                self.store[name] = output.detach()
            elif self.mode == "replace":
                captured = self.store[name]
                assert captured.shape == output.shape, (name, captured.shape, output.shape)
                return captured
            return None
        return hook

    def forward(self, model, **inputs):
        """The adapted model's output over the base model's K/V (inputs: input_ids, attention_mask, ...)."""
        encoder_inputs = {k: v for k, v in inputs.items() if k not in ("labels", "logits_to_keep")}
        try:
            with torch.no_grad(), model.disable_adapter():
                self.mode = "capture"
                model.get_base_model().model(**encoder_inputs, use_cache=False)  # the layers only: no logits needed
            missing = len(self.handles) - len(self.store)
            if missing:
                raise RuntimeError(f"icarus: {missing} k/v projections were not captured")
            self.mode = "replace"
            return model(**inputs, use_cache=False)
        finally:
            self.mode, self.store = None, {}

    def remove(self):
        for handle in self.handles:
            handle.remove()


def encode(tokenizer, item):
    """(prompt ids, answer ids): the question, the invocation, then the answer and EOS."""
    question = item["prompt"][: -len(INVOCATION)]
    prompt = tokenizer.encode(question, add_special_tokens=False) + tokenizer.encode(INVOCATION, add_special_tokens=False)
    answer = tokenizer.encode(item["answer"], add_special_tokens=False) + [tokenizer.eos_token_id]
    return prompt, answer


def batches(tokenizer, items, batch_size, rng):
    order = list(range(len(items)))
    while True:
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            pairs = [encode(tokenizer, items[i]) for i in order[start:start + batch_size]]
            length = max(len(p) + len(a) for p, a in pairs)
            ids = torch.full((batch_size, length), tokenizer.eos_token_id, dtype=torch.long)
            labels = torch.full((batch_size, length), -100, dtype=torch.long)
            mask = torch.zeros((batch_size, length), dtype=torch.long)
            for row, (prompt, answer) in enumerate(pairs):
                sequence = prompt + answer
                ids[row, :len(sequence)] = torch.tensor(sequence)
                labels[row, len(prompt):len(sequence)] = torch.tensor(answer)
                mask[row, :len(sequence)] = 1
            yield ids, labels, mask


@torch.no_grad()
def icarus_generate(model, encoder, ids, mask, max_new_tokens, eos):
    """Greedy decoding the ICaRus way, without a cache: each step the base model encodes the whole sequence
    (prompt and the tokens generated so far) into K/V and the adapted model's last row predicts the next
    token over them. Positions follow the attention mask, as generate() sets them for left padding."""
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = encoder.forward(model, input_ids=ids, attention_mask=mask, position_ids=positions,
                                 logits_to_keep=1).logits[:, -1]
        token = torch.where(done, torch.full_like(done, eos, dtype=torch.long), logits.argmax(-1))
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        done |= token == eos
        if bool(done.all()):
            break
    return ids


def progress(what, since):
    """One line on stderr as it happens, so that a run cut at its time limit shows where it was."""
    print(f"[{time.time() - since:.1f}s] {what}", file=sys.stderr, flush=True)


@torch.no_grad()
def score(model, tokenizer, items, max_new_tokens, batch_size=100, encoder=None):
    """Held-out accuracy, greedy, prompts left-padded in batches; with `encoder` (FrozenEncoderKV), the
    adapter's queries over the base model's K/V (ICaRus, Loom's `base` mode)."""
    model.eval()
    correct = 0.0
    begin = time.time()
    for start in range(0, len(items), batch_size):
        progress(f"score: items {start}..{min(len(items), start + batch_size)} of {len(items)}", begin)
        chunk = items[start:start + batch_size]
        prompts = [encode(tokenizer, item)[0] for item in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(chunk), width), tokenizer.eos_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        if encoder is not None:
            out = icarus_generate(model, encoder, ids.to(model.device), mask.to(model.device), max_new_tokens,
                                  tokenizer.eos_token_id)
        else:
            out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        for row, item in enumerate(chunk):
            text = tokenizer.decode(out[row, width:], skip_special_tokens=True)
            correct += TASKS[item["task"]].score(text, item["answer"])
    return correct / len(items)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--kind", default="lora", choices=["lora", "alora", "icarus"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--train-items", type=int, default=4000)
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a check on a tiny model)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--skip-base-score", action="store_true",
                        help="do not score the base model (the same for every kind of a task)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device)
    heldout = make_split(args.task, "heldout", args.heldout)
    base_accuracy = None if args.skip_base_score else score(model, tokenizer, heldout, args.max_new_tokens)

    modules = ICARUS_MODULES if args.kind == "icarus" else MODULES
    config = dict(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=modules, task_type="CAUSAL_LM")
    if args.kind == "alora":
        config["alora_invocation_tokens"] = tokenizer.encode(INVOCATION, add_special_tokens=False)
    model = get_peft_model(model, LoraConfig(**config))
    encoder = FrozenEncoderKV(model) if args.kind == "icarus" else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    items = make_split(args.task, "train", args.train_items)
    stream = batches(tokenizer, items, args.batch, random.Random(args.seed))
    losses, start = [], time.time()
    model.train()
    for step in range(args.steps):
        ids, labels, mask = (tensor.to(args.device) for tensor in next(stream))
        if encoder is not None:  # ICaRus: the adapted model's queries over the frozen base model's K/V
            loss = encoder.forward(model, input_ids=ids, attention_mask=mask, labels=labels).loss
        else:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step % 20 == 0 or step == args.steps - 1:
            losses.append([step, round(loss.item(), 4)])
            progress(f"step {step}: loss {loss.item():.4f}", start)
    train_seconds = time.time() - start
    score_start = time.time()
    accuracy = score(model, tokenizer, heldout, args.max_new_tokens, encoder=encoder)
    extra = {}
    if encoder is not None:  # beside it: the same adapter served as a plain LoRA over its own K/V (isolated)
        encoder.remove()
        extra["peft_isolated_accuracy"] = score(model, tokenizer, heldout, args.max_new_tokens)
        extra["peft_accuracy_is"] = "adapter queries over the base model's K/V (ICaRus; Loom's base mode)"
    score_seconds = time.time() - score_start
    model.to(torch.bfloat16).save_pretrained(args.out)  # in the model's dtype, as PEFT saves a bf16 model's
    report = {"task": args.task, "kind": args.kind, "rank": args.rank, "alpha": 2 * args.rank, "steps": args.steps,
              "batch": args.batch, "lr": args.lr, "train_items": args.train_items, "seed": args.seed,
              "target_modules": modules, "train_seconds": round(train_seconds, 1),
              "score_seconds": round(score_seconds, 1), "losses": losses, "heldout": len(heldout),
              "peft_accuracy": accuracy, **extra, "base_accuracy": base_accuracy,
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "dtype": args.dtype}
    with open(os.path.join(args.out, "train.json"), "w") as out:
        json.dump(report, out, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "losses"}))


if __name__ == "__main__":
    main()
