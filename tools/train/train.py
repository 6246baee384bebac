#!/usr/bin/env python3
"""Trains one LoRA adapter on one task of tasks.py with PyTorch + transformers +
peft (on a GPU machine), saves it as PEFT writes it, and scores it and the base
model on the task's held-out split with transformers + PEFT (greedy): the
reference row of the quality table (issue 39).

    tools/train/train.py --model HF_DIR --task arithmetic --kind lora --out DIR

--kind lora:   q, k, v, o, gate, up, down (isolated, forked, or base-mode serving)
--kind alora:  the same modules as an activated LoRA (PEFT's alora_invocation_tokens =
               tasks.INVOCATION's tokens): the base model's K/V up to the invocation
Not yet: ICaRus-style training (every K/V from the frozen base model).

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
def score(model, tokenizer, items, max_new_tokens, batch_size=100):
    """Held-out accuracy, greedy, prompts left-padded in batches."""
    model.eval()
    correct = 0.0
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        prompts = [encode(tokenizer, item)[0] for item in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(chunk), width), tokenizer.eos_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.eos_token_id)
        for row, item in enumerate(chunk):
            text = tokenizer.decode(out[row, width:], skip_special_tokens=True)
            correct += TASKS[item["task"]].score(text, item["answer"])
    return correct / len(items)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--kind", default="lora", choices=["lora", "alora"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--train-items", type=int, default=4000)
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda()
    heldout = make_split(args.task, "heldout", args.heldout)
    base_accuracy = score(model, tokenizer, heldout, args.max_new_tokens)

    config = dict(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=MODULES, task_type="CAUSAL_LM")
    if args.kind == "alora":
        config["alora_invocation_tokens"] = tokenizer.encode(INVOCATION, add_special_tokens=False)
    model = get_peft_model(model, LoraConfig(**config))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    items = make_split(args.task, "train", args.train_items)
    stream = batches(tokenizer, items, args.batch, random.Random(args.seed))
    losses, start = [], time.time()
    model.train()
    for step in range(args.steps):
        ids, labels, mask = (tensor.cuda() for tensor in next(stream))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step % 20 == 0 or step == args.steps - 1:
            losses.append([step, round(loss.item(), 4)])
    train_seconds = time.time() - start
    accuracy = score(model, tokenizer, heldout, args.max_new_tokens)
    model.to(torch.bfloat16).save_pretrained(args.out)  # in the model's dtype, as PEFT saves a bf16 model's
    report = {"task": args.task, "kind": args.kind, "rank": args.rank, "alpha": 2 * args.rank, "steps": args.steps,
              "batch": args.batch, "lr": args.lr, "train_items": args.train_items, "seed": args.seed,
              "train_seconds": round(train_seconds, 1), "losses": losses, "heldout": len(heldout),
              "peft_accuracy": accuracy, "base_accuracy": base_accuracy,
              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    with open(os.path.join(args.out, "train.json"), "w") as out:
        json.dump(report, out, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "losses"}))


if __name__ == "__main__":
    main()
