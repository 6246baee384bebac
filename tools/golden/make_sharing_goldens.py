#!/usr/bin/env python3
"""Golden outputs for Loom's KV sharing modes `activated` (aLoRA) and `base` (ICaRus).

Reads model directories written by `loom make-model` (as make_goldens.py does)
and computes, in fp32 on the CPU with torch's own kernels (one thread):

activated (--activated DIR; every adapter of DIR must be an aLoRA adapter with
the same invocation sequence): PEFT 0.21's aLoRA itself. For each prompt the
invocation start is the first token of the LAST occurrence of
alora_invocation_tokens in the prompt (peft calculate_alora_offsets); the
PeftModel runs with alora_offsets = [len(ids) - start] (None when the prompt has
no occurrence: the base model answers), so the adapter applies from the start
on, to every generated token too. Prompts are P_A = 6 sequences of T_A = 40
token ids with the invocation placed at 16 and 32 (block-aligned for block
sizes 16 and 4), 21 (inside a block; the prompt also holds an earlier
occurrence at 6, which must lose to the last one), 38 (inside a block, the
invocation as the prompt's last two tokens), 0, and nowhere.

base (--base DIR): the ICaRus logical encoder / decoder (arXiv:2603.13281 §3.2-3.3,
appendix B; docs/design.md §1 `base`), built on the HF modules of one PeftModel:

  * Logical encoder = the base model (PeftModel.disable_adapter()). One
    forward over the whole sequence s[0..n) records, at every layer l, the
    outputs of self_attn.k_proj and self_attn.v_proj (pre-RoPE; with bias for
    qwen2): K_l[0..n), V_l[0..n) of the base model at every position.
  * Logical decoder = the adapted model (LoRA on q, o, gate, up, down as the
    adapter targets them) whose k_proj / v_proj are replaced, through forward
    hooks, by the encoder's recorded outputs: the adapter's LoRA on k and v is
    ignored, and the K/V that position p attends to, its own included, are the
    base model's, computed from the BASE residual stream (not from the
    decoder's). HF's own code then applies RoPE and causal eager attention, so
    the decoder row at position p attends with its own query to the base K/V
    of positions 0..p. Decoder rows write nothing and read nothing from each
    other, so one parallel pass over s[0..n) gives every position's decoder
    logits; the script checks this against step-by-step decoding (a
    DynamicCache of the base K/V cropped to p, the decoder fed token p alone,
    its own K/V hooked to the base one, asserting that the K/V entry it wrote
    equals the encoder's bit for bit) and stops if they differ by > 1e-4.
  * Logits at position p are the decoder's; greedy decoding appends the argmax
    of the decoder at the last position, and every generated token's K/V again
    comes from the encoder (full recomputation of both passes per step, no
    cache). The first generated token is therefore the decoder's prediction at
    the last prompt position.
  Prompts are P_B = 2 sequences of T_B = 20 pseudo-random ids. For information
  the metadata also records, per adapter, max |golden - isolated PEFT logits|
  and max |golden - the same construction with the adapter's k/v LoRA applied
  to the encoder's inputs| (both must be far above the test tolerance, or the
  goldens could not tell the modes apart).

Writes OUT/activated_<dir name>.safetensors and OUT/base_<dir name>.safetensors,
every tensor F32 (token ids are exact):

  prompts                  [P, T]     token ids
  alora_starts             [P]        activated only: invocation start, -1 = none
  <adapter>.logits         [P, T, V]  logits at every prompt position
  <adapter>.greedy         [P, G]     G = 16 greedy tokens continuing each prompt
  <adapter>.greedy_margin  [P, G]     top1 - top2 logit at each greedy step

__metadata__ (all strings): format "loom-sharing-golden-1", mode
("activated" | "base"), arch, adapters (comma list), num_greedy, alora.<adapter>
(activated: JSON invocation tokens), alora_starts (activated: JSON list),
peft_modules, sha256.<file> / fnv1a64.<file> of every model file, versions, and
for base: reference_checks (JSON {adapter: {"isolated": d, "kv_lora": d,
"stepwise": d}}, the max |diff| figures above).

Needs torch, transformers >= 5, peft >= 0.21, safetensors; nothing from Loom.
Usage: make_sharing_goldens.py --out OUT [--activated DIR ...] [--base DIR ...]
"""
import argparse
import copy
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import alora_start, fnv1a64_of, load_base, peft_module_table, sha256_of  # noqa: E402

NUM_GREEDY = 16
ACTIVATED_PROMPT_LENGTH = 40
# (start of the last occurrence, earlier decoy occurrences); None = no occurrence.
ACTIVATED_PLACEMENTS = [(16, []), (21, [6]), (32, []), (38, []), (0, []), (None, [])]
BASE_NUM_PROMPTS = 2
BASE_PROMPT_LENGTH = 20
STEPWISE_TOLERANCE = 1e-4


def random_ids(state, count, vocab_size, avoid):
    """`count` ids in [4, vocab - 4) from a 64-bit LCG (no library randomness), skipping `avoid`."""
    ids = []
    while len(ids) < count:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        token = 4 + (state >> 33) % (vocab_size - 8)
        if token not in avoid:
            ids.append(int(token))
    return state, ids


def model_metadata(model_dir, adapter_names, mode):
    import peft
    import transformers

    with open(os.path.join(model_dir, "config.json")) as stream:
        config = json.load(stream)
    metadata = {
        "format": "loom-sharing-golden-1",
        "mode": mode,
        "arch": str(config.get("model_type")),
        "adapters": ",".join(adapter_names),
        "num_greedy": str(NUM_GREEDY),
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}",
    }
    for relative in ["config.json", "model.safetensors"] + [
        os.path.join("adapters", name, file) for name in adapter_names
        for file in ("adapter_config.json", "adapter_model.safetensors")
    ]:
        key = relative.replace(os.sep, "/")
        metadata["sha256." + key] = sha256_of(os.path.join(model_dir, relative))
        metadata["fnv1a64." + key] = fnv1a64_of(os.path.join(model_dir, relative))
    return config, metadata


def adapter_names_of(model_dir):
    root = os.path.join(model_dir, "adapters")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def load_adapter(model_dir, name):
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_base(model_dir), os.path.join(model_dir, "adapters", name), adapter_name=name)
    model.eval()
    return model


def greedy_loop(next_logits, prompt):
    """NUM_GREEDY greedy steps; next_logits(ids) gives the last position's logits."""
    sequence = list(prompt)
    tokens, gaps = [], []
    for _ in range(NUM_GREEDY):
        last = next_logits(sequence)
        top = torch.topk(last, 2)
        token = int(torch.argmax(last))
        tokens.append(token)
        gaps.append(float(top.values[0] - top.values[1]))
        sequence.append(token)
    return tokens, gaps


def stack_results(logits, greedy, margins):
    return (torch.stack(logits).contiguous(), torch.tensor(greedy, dtype=torch.float32),
            torch.tensor(margins, dtype=torch.float32))


# ---------------------------------------------------------------- activated

def activated_prompts(vocab_size, invocation):
    state = 0x9E3779B97F4A7C15
    prompts, starts = [], []
    for start, decoys in ACTIVATED_PLACEMENTS:
        state, row = random_ids(state, ACTIVATED_PROMPT_LENGTH, vocab_size, set(invocation[:1]))
        for position in decoys + ([] if start is None else [start]):
            row[position : position + len(invocation)] = invocation
        found = alora_start(row, invocation)
        assert found == start, (found, start)
        prompts.append(row)
        starts.append(-1 if start is None else start)
    return prompts, starts


def alora_logits(model, ids, start):
    offsets = [None if start < 0 else len(ids) - start]
    with torch.no_grad():
        output = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False, alora_offsets=offsets)
    return output.logits[0].float()


def make_activated(model_dir, out_dir):
    names = adapter_names_of(model_dir)
    invocations = {}
    for name in names:
        with open(os.path.join(model_dir, "adapters", name, "adapter_config.json")) as stream:
            invocations[name] = [int(t) for t in (json.load(stream).get("alora_invocation_tokens") or [])]
    invocation = invocations[names[0]] if names else []
    if not invocation or any(tokens != invocation for tokens in invocations.values()):
        sys.exit(f"{model_dir}: needs aLoRA adapters that share one invocation sequence")
    config, metadata = model_metadata(model_dir, names, "activated")
    prompts, starts = activated_prompts(int(config["vocab_size"]), invocation)
    metadata["alora_starts"] = json.dumps(starts)
    tensors = {"prompts": torch.tensor(prompts, dtype=torch.float32),
               "alora_starts": torch.tensor(starts, dtype=torch.float32)}
    modules = {}
    for name in names:
        model = load_adapter(model_dir, name)
        modules[name] = peft_module_table(model, name)
        metadata[f"alora.{name}"] = json.dumps(invocation)
        logits, greedy, margins = [], [], []
        for prompt, start in zip(prompts, starts):
            logits.append(alora_logits(model, prompt, start))
            tokens, gaps = greedy_loop(lambda ids: alora_logits(model, ids, start)[-1], prompt)
            greedy.append(tokens)
            margins.append(gaps)
        logits, greedy, margins = stack_results(logits, greedy, margins)
        tensors.update({f"{name}.logits": logits, f"{name}.greedy": greedy, f"{name}.greedy_margin": margins})
        del model
    metadata["peft_modules"] = json.dumps(modules, sort_keys=True)
    return write(out_dir, "activated", model_dir, tensors, metadata)


# --------------------------------------------------------------------- base

class KvHooks:
    """Forward hooks on every self_attn.k_proj / v_proj of a PeftModel.

    record(): keeps each module's input and output (the encoder pass).
    replay(): returns the recorded output instead of the module's own, sliced
    to the positions of the current call (the decoder pass).
    apply_lora(): returns the module (adapter enabled) applied to the recorded
    INPUT, i.e. the base residual stream with the adapter's k/v LoRA on top."""

    def __init__(self, model):
        self.modules = [(path, module) for path, module in model.base_model.model.named_modules()
                        if path.endswith("self_attn.k_proj") or path.endswith("self_attn.v_proj")]
        self.inputs, self.outputs = {}, {}
        self.mode = None
        self.positions = None  # slice of the recorded sequence the current call covers
        self.handles = [module.register_forward_hook(self._hook(path)) for path, module in self.modules]
        self.module_of = dict(self.modules)

    def _hook(self, path):
        def hook(module, args, output):
            if self.mode == "record":
                self.inputs[path], self.outputs[path] = args[0].detach().clone(), output.detach().clone()
                return None
            if self.mode == "replay":
                replacement = self.outputs[path][:, self.positions]
            elif self.mode == "apply_lora":
                self.mode = None  # calling the module again must not recurse into this branch
                replacement = module(self.inputs[path][:, self.positions])
                self.mode = "apply_lora"
            else:
                return None
            assert replacement.shape == output.shape, (path, replacement.shape, output.shape)
            return replacement
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()


def encode(model, hooks, ids):
    """Encoder pass: records base k_proj / v_proj outputs; returns the base model's KV cache."""
    hooks.mode = "record"
    with torch.no_grad(), model.disable_adapter():
        output = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=True)
    hooks.mode = None
    return output.past_key_values


def decode_all(model, hooks, ids, mode="replay"):
    """Decoder pass over every position at once, K/V from the encoder: logits [len(ids), V]."""
    hooks.mode, hooks.positions = mode, slice(0, len(ids))
    with torch.no_grad():
        output = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    hooks.mode = None
    return output.logits[0].float()


def decode_stepwise(model, hooks, ids, cache):
    """The decoder fed one token at a time over the base cache cropped to p: logits [len(ids), V]."""
    rows = []
    for p in range(len(ids)):
        past = None  # crop() cannot empty a cache
        if p > 0:
            past = copy.deepcopy(cache)
            past.crop(p - len(ids))  # drops the last len(ids) - p entries
        hooks.mode, hooks.positions = "replay", slice(p, p + 1)
        with torch.no_grad():
            output = model(input_ids=torch.tensor([ids[p : p + 1]], dtype=torch.long), past_key_values=past,
                           use_cache=True)
        hooks.mode = None
        for written, base in zip(output.past_key_values.layers, cache.layers):
            # the entry the decoder's own position attended to is the encoder's, bit for bit
            assert torch.equal(written.keys[..., p, :], base.keys[..., p, :])
            assert torch.equal(written.values[..., p, :], base.values[..., p, :])
        rows.append(output.logits[0, -1].float())
    return torch.stack(rows)


def icarus_logits(model, hooks, ids, mode="replay"):
    encode(model, hooks, ids)
    return decode_all(model, hooks, ids, mode)


def make_base(model_dir, out_dir):
    names = adapter_names_of(model_dir)
    config, metadata = model_metadata(model_dir, names, "base")
    state, prompts = 0xD1B54A32D192ED03, []
    for _ in range(BASE_NUM_PROMPTS):
        state, row = random_ids(state, BASE_PROMPT_LENGTH, int(config["vocab_size"]), set())
        prompts.append(row)
    tensors = {"prompts": torch.tensor(prompts, dtype=torch.float32)}
    modules, checks = {}, {}
    for name in names:
        model = load_adapter(model_dir, name)
        modules[name] = peft_module_table(model, name)
        hooks = KvHooks(model)
        logits, greedy, margins = [], [], []
        check = {"isolated": 0.0, "kv_lora": 0.0, "stepwise": 0.0}
        for prompt in prompts:
            cache = encode(model, hooks, prompt)
            golden = decode_all(model, hooks, prompt)
            stepwise = decode_stepwise(model, hooks, prompt, cache)
            with torch.no_grad():
                isolated = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=False).logits[0]
            kv_lora = decode_all(model, hooks, prompt, mode="apply_lora")
            for key, other in (("isolated", isolated), ("kv_lora", kv_lora), ("stepwise", stepwise)):
                check[key] = max(check[key], float((golden - other).abs().max()))
            logits.append(golden)
            tokens, gaps = greedy_loop(lambda ids: icarus_logits(model, hooks, ids)[-1], prompt)
            greedy.append(tokens)
            margins.append(gaps)
        if check["stepwise"] > STEPWISE_TOLERANCE:
            sys.exit(f"{model_dir} {name}: parallel and step-by-step decoder differ by {check['stepwise']}")
        checks[name] = check
        logits, greedy, margins = stack_results(logits, greedy, margins)
        tensors.update({f"{name}.logits": logits, f"{name}.greedy": greedy, f"{name}.greedy_margin": margins})
        hooks.remove()
        del model
    metadata["peft_modules"] = json.dumps(modules, sort_keys=True)
    metadata["reference_checks"] = json.dumps(checks, sort_keys=True)
    return write(out_dir, "base", model_dir, tensors, metadata)


# -------------------------------------------------------------------- output

def write(out_dir, mode, model_dir, tensors, metadata):
    out_path = os.path.join(out_dir, f"{mode}_{os.path.basename(os.path.normpath(model_dir))}.safetensors")
    save_file({key: value.contiguous() for key, value in tensors.items()}, out_path, metadata=metadata)
    lines = [f"{out_path}: {os.path.getsize(out_path)} bytes"]
    for key in sorted(k for k in tensors if k.endswith(".logits")):
        name = key[: -len(".logits")]
        lines.append(f"  {name}: logit std {tensors[key].std():.3f}, "
                     f"min greedy margin {tensors[f'{name}.greedy_margin'].min():.4f}")
    if "reference_checks" in metadata:
        lines.append(f"  max |diff| vs isolated / k,v LoRA applied / step-by-step: {metadata['reference_checks']}")
    print("\n".join(lines))
    return out_path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--activated", action="append", default=[], help="model dir with aLoRA adapters")
    parser.add_argument("--base", action="append", default=[], help="model dir for base (ICaRus) sharing")
    args = parser.parse_args()
    torch.manual_seed(0)  # nothing should be random; this guards against LoRA init noise
    torch.set_num_threads(1)  # one summation order, whatever machine runs this
    os.makedirs(args.out, exist_ok=True)
    for model_dir in args.activated:
        make_activated(model_dir, args.out)
    for model_dir in args.base:
        make_base(model_dir, args.out)


if __name__ == "__main__":
    main()
