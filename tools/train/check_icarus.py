#!/usr/bin/env python3
"""CPU check of train.py's ICaRus training path (--kind icarus) on a tiny random Llama
(`loom make-model --preset tiny`, fp32), with torch + transformers + peft:

  1. a hand-written Llama forward equals transformers' base logits (the reference is sound);
  2. with a random (non-zero) adapter on q, o, gate, up, down, FrozenEncoderKV.forward equals the
     hand-written ICaRus forward (queries, o and MLP from the adapted weights; every layer's K/V
     from the base model's own hidden states), on a left-padded batch, and differs from the
     plain adapted forward;
  3. a zero-initialised adapter (PEFT's init) gives the base model's logits through the hook;
  4. the loss's gradients reach the LoRA weights (A and B, after one step) and no k/v weight;
  5. icarus_generate's greedy tokens equal a greedy loop over the hand-written ICaRus forward;
  6. with --loom: Loom serving the saved adapter in `base` mode (every K/V the base model's)
     generates icarus_generate's tokens, and in `isolated` mode PEFT's generate() tokens.

    python tools/train/check_icarus.py --loom build/loom                   # the tiny random Llama
    python tools/train/check_icarus.py --model SMOLLM2_HF_DIR --loom build/loom  # the real model (~40 s)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import ICARUS_MODULES, FrozenEncoderKV, icarus_generate  # noqa: E402


def layer_weights(peft_model, adapted):
    """Per layer: the projection matrices, the adapter's delta added where `adapted` and it has one."""
    layers = []
    for layer in peft_model.get_base_model().model.layers:
        weights = {}
        for part, module in [("q", layer.self_attn.q_proj), ("k", layer.self_attn.k_proj),
                             ("v", layer.self_attn.v_proj), ("o", layer.self_attn.o_proj),
                             ("gate", layer.mlp.gate_proj), ("up", layer.mlp.up_proj), ("down", layer.mlp.down_proj)]:
            if hasattr(module, "base_layer"):
                weight = module.base_layer.weight.detach().clone()
                if adapted:
                    weight += module.get_delta_weight("default").detach()
            else:
                weight = module.weight.detach().clone()
            weights[part] = weight
        weights["in_norm"] = layer.input_layernorm.weight.detach()
        weights["post_norm"] = layer.post_attention_layernorm.weight.detach()
        layers.append(weights)
    return layers


def manual_forward(peft_model, layers, ids, mask, positions, base_kv=None):
    """Llama by hand (fp32): logits and each layer's (K, V) after RoPE. With base_kv, the attention uses
    those K/V instead of its own (ICaRus's logical decoder over the frozen encoder's cache)."""
    model = peft_model.get_base_model()
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    eps = config.rms_norm_eps
    inv_freq = model.model.rotary_emb.inv_freq.float()
    scaling = getattr(model.model.rotary_emb, "attention_scaling", 1.0)
    freqs = positions[:, :, None].float() * inv_freq[None, None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = (emb.cos() * scaling)[:, None], (emb.sin() * scaling)[:, None]

    def rope(x):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    batch, length = ids.shape
    allowed = torch.tril(torch.ones(length, length, dtype=torch.bool))[None] & mask.bool()[:, None, :]
    hidden = model.model.embed_tokens.weight.detach()[ids]
    kv = []
    for index, w in enumerate(layers):
        x = rms(hidden, w["in_norm"])
        q = (x @ w["q"].T).view(batch, length, heads, head_dim).transpose(1, 2)
        k = (x @ w["k"].T).view(batch, length, kv_heads, head_dim).transpose(1, 2)
        v = (x @ w["v"].T).view(batch, length, kv_heads, head_dim).transpose(1, 2)
        q, k = rope(q), rope(k)
        kv.append((k, v))
        if base_kv is not None:
            k, v = base_kv[index]
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        scores = (q @ k.transpose(-1, -2)) / head_dim ** 0.5
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        attention = torch.nan_to_num(torch.softmax(scores, dim=-1)) @ v
        hidden = hidden + attention.transpose(1, 2).reshape(batch, length, -1) @ w["o"].T
        x = rms(hidden, w["post_norm"])
        hidden = hidden + (torch.nn.functional.silu(x @ w["gate"].T) * (x @ w["up"].T)) @ w["down"].T
    hidden = rms(hidden, model.model.norm.weight.detach())
    return hidden @ model.lm_head.weight.detach().T, kv


def manual_icarus(peft_model, ids, mask, positions):
    base_layers, adapted_layers = layer_weights(peft_model, False), layer_weights(peft_model, True)
    base_logits, base_kv = manual_forward(peft_model, base_layers, ids, mask, positions)
    logits, _ = manual_forward(peft_model, adapted_layers, ids, mask, positions, base_kv=base_kv)
    return logits, base_logits


def close(a, b, valid, tolerance=2e-4):
    difference = (a - b).abs()[valid.bool()].max().item()
    scale = b.abs()[valid.bool()].max().item()
    return difference <= tolerance * max(1.0, scale), difference


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        check.failed = True


check.failed = False


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loom", help="a loom binary: also check Loom's base and isolated modes on the adapter")
    parser.add_argument("--model", help="an HF Llama directory (default: loom make-model --preset tiny)")
    args = parser.parse_args()
    torch.manual_seed(0)
    scratch = tempfile.mkdtemp(prefix="icarus_check_")
    model_dir = args.model
    if not model_dir:
        if not args.loom:
            raise SystemExit("give --model HF_DIR or --loom (to make the tiny model)")
        model_dir = os.path.join(scratch, "tiny")
        subprocess.run([args.loom, "make-model", "--arch", "llama", "--preset", "tiny", "--out", model_dir], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = base.config.vocab_size
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=ICARUS_MODULES,
                                            task_type="CAUSAL_LM"))
    model.eval()
    encoder = FrozenEncoderKV(model)

    # A left-padded batch, positions as generate() sets them.
    lengths = [9, 5, 7]
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(1, vocab, (length,))
        mask[row, width - length:] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions)

    with torch.no_grad():
        # 3 first: PEFT initialises B to zero, so the adapter is the identity.
        with model.disable_adapter():
            hf_base = model(**inputs).logits
        zero = encoder.forward(model, **inputs).logits
        ok, diff = close(zero, hf_base, mask)
        check("zero-initialised adapter through the hook == base logits", ok, f"(max |diff| {diff:.2e})")

        for name, parameter in model.named_parameters():  # a random adapter from here on
            if "lora_B" in name:
                parameter.normal_(0, 0.3)
        manual, manual_base = manual_icarus(model, ids, mask, positions)
        ok, diff = close(manual_base, hf_base, mask)
        check("hand-written base forward == transformers' base logits", ok, f"(max |diff| {diff:.2e})")
        hooked = encoder.forward(model, **inputs).logits
        ok, diff = close(hooked, manual, mask)
        check("FrozenEncoderKV.forward == hand-written ICaRus forward (adapted q/o/MLP over base K/V)", ok,
              f"(max |diff| {diff:.2e})")
        plain = model(**inputs).logits
        _, apart = close(plain, hooked, mask)
        check("the hook changes the adapted forward (adapter K/V != base K/V)", apart > 1e-3, f"(max |diff| {apart:.2e})")
        _, apart = close(hooked, hf_base, mask)
        check("the random adapter changes the logits", apart > 1e-3, f"(max |diff| {apart:.2e})")

    # 4: gradients reach every LoRA weight through the hooked forward.
    model.train()
    labels = ids.masked_fill(mask == 0, -100)
    loss = encoder.forward(model, **inputs, labels=labels).loss
    loss.backward()
    grads = {name: parameter.grad for name, parameter in model.named_parameters() if parameter.requires_grad}
    check("only LoRA weights train, none on k/v", all("lora_" in n for n in grads) and
          not any(("k_proj" in n or "v_proj" in n) for n in grads), f"({len(grads)} tensors)")
    check("every LoRA weight gets a gradient", all(g is not None and g.abs().sum() > 0 for g in grads.values()))
    model.zero_grad()
    model.eval()

    # 5: greedy decoding the ICaRus way == a greedy loop over the hand-written forward.
    steps = 6
    with torch.no_grad():
        generated = icarus_generate(model, encoder, ids, mask, steps, eos=-1)
        manual_ids, manual_mask = ids.clone(), mask.clone()
        for _ in range(steps):
            manual_positions = (manual_mask.cumsum(-1) - 1).clamp(min=0)
            logits, _ = manual_icarus(model, manual_ids, manual_mask, manual_positions)
            token = logits[:, -1].argmax(-1)
            manual_ids = torch.cat([manual_ids, token[:, None]], dim=1)
            manual_mask = torch.cat([manual_mask, torch.ones_like(manual_mask[:, :1])], dim=1)
    check("icarus_generate == greedy over the hand-written ICaRus forward", torch.equal(generated, manual_ids),
          f"({generated[:, width:].tolist()} vs {manual_ids[:, width:].tolist()})")

    if args.loom:
        loom_check(args.loom, model, encoder, model_dir, scratch)
    print("FAILED" if check.failed else "ALL PASSED")
    sys.exit(1 if check.failed else 0)


def loom_check(loom, model, encoder, model_dir, scratch):
    """6: the saved adapter served by Loom in base and isolated modes (generate, fp32, greedy)."""
    adapter_dir = os.path.join(scratch, "icarus_adapter")
    encoder.remove()
    model.save_pretrained(adapter_dir)
    encoder.__init__(model)
    with open(os.path.join(adapter_dir, "adapter_config.json")) as config_file:
        modules = sorted(json.load(config_file)["target_modules"])
    check("saved adapter targets q, o, gate, up, down", modules == sorted(ICARUS_MODULES), str(modules))
    prompts = ["Compute 12 + 34.", "Sort ascending: 5, 3, 9, 1.", "Label the ticket: my parcel is late"]
    steps = 8
    for mode in ["base", "isolated"]:
        result = subprocess.run([loom, "generate", "--model", model_dir, "--lora", f"a={adapter_dir}:{mode}", "--raw",
                                 *sum((["--prompt", p] for p in prompts), []), "--max-tokens", str(steps),
                                 "--ignore-eos", "--json", "--cpu-precision", "fp32", "--threads", "1"],
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            check(f"loom generate ({mode})", False, result.stderr[-2000:])
            continue
        outputs = json.loads(result.stdout)
        outputs = outputs if isinstance(outputs, list) else outputs.get("results", [outputs])
        for prompt, output in zip(prompts, outputs):
            prompt_ids = torch.tensor([output["prompt_tokens"]])
            prompt_mask = torch.ones_like(prompt_ids)
            with torch.no_grad():
                if mode == "base":
                    expected = icarus_generate(model, encoder, prompt_ids, prompt_mask, steps, eos=-1)
                else:
                    encoder.remove()
                    expected = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=steps,
                                              min_new_tokens=steps, do_sample=False)
                    encoder.__init__(model)
            expected = expected[0, prompt_ids.shape[1]:].tolist()
            check(f"loom {mode} mode == {'ICaRus forward' if mode == 'base' else 'PEFT generate'} ({prompt!r})",
                  expected == output["tokens"], f"(loom {output['tokens']} vs {expected})")


if __name__ == "__main__":
    main()
