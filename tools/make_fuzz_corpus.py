#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) and
their libFuzzer dictionaries (tests/fuzz/<target>.dict).

Seeds are small valid inputs plus a few near-valid ones (one field wrong, a
lie in a header), so the fuzzers start from the interesting shapes. Run from
anywhere; deterministic; needs only the standard library:

    python3 tools/make_fuzz_corpus.py

Reproducers of fixed crashes live beside the seeds as crash-<what> files and
are kept (this script never deletes files it did not write).
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZ = os.path.join(ROOT, "tests", "fuzz")


def write(target, name, data):
    directory = os.path.join(FUZZ, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, (dict, list)):
        data = json.dumps(data, separators=(",", ":"))
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def write_dict(target, tokens):
    with open(os.path.join(FUZZ, target + ".dict"), "w") as f:
        f.write("# libFuzzer dictionary for %s_fuzzer (tools/make_fuzz_corpus.py)\n" % target)
        for token in tokens:
            f.write('"%s"\n' % "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "\\x%02X" % ord(c)
                                       for c in token))


JSON_TOKENS = ["{", "}", "[", "]", ":", ",", "null", "true", "false", "0", "-1", "1e999", "1.5", "\"\"",
               "\\u0000", "\\ud800", "2147483647", "-2147483648", "65536", "16777216", "4294967296",
               "9223372036854775807", "9223372036854775808", "-9223372036854775809", "1e38", "1e39"]

# --- the tiny base model the adapter targets use: hidden 8, 2 heads of 4, 1 kv head, mlp 16 ---
HIDDEN, Q_SIZE, KV_SIZE, INTERMEDIATE = 8, 8, 4, 16
PROJECTIONS = {"q_proj": ("self_attn", HIDDEN, Q_SIZE), "k_proj": ("self_attn", HIDDEN, KV_SIZE),
               "v_proj": ("self_attn", HIDDEN, KV_SIZE), "o_proj": ("self_attn", Q_SIZE, HIDDEN),
               "gate_proj": ("mlp", HIDDEN, INTERMEDIATE), "up_proj": ("mlp", HIDDEN, INTERMEDIATE),
               "down_proj": ("mlp", INTERMEDIATE, HIDDEN)}


# --- safetensors ---------------------------------------------------------------
def safetensors(tensors, metadata=None, header_patch=None):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    if header_patch:
        header_patch(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def lora_tensors(layers, rank=2, dtype="F32"):
    tensors = []
    for layer in layers:
        for module, (block, fan_in, fan_out) in PROJECTIONS.items():
            for part, shape in (("A", [rank, fan_in]), ("B", [fan_out, rank])):
                count = shape[0] * shape[1]
                raw = f32([0.01 * (i % 7) for i in range(count)])
                if dtype == "F16":
                    raw = struct.pack("<%de" % count, *[0.01 * (i % 7) for i in range(count)])
                name = "base_model.model.model.layers.%d.%s.%s.lora_%s.weight" % (layer, block, module, part)
                tensors.append((name, dtype, shape, raw))
    return tensors


def safetensors_corpus():
    t = "safetensors"
    write(t, "f32_matrix", safetensors([("w", "F32", [2, 3], f32([1, 2, 3, 4, 5, 6]))], {"format": "pt"}))
    write(t, "f16_bf16", safetensors([("a", "F16", [4], struct.pack("<4e", 1, -2, 0.5, 65504)),
                                      ("b", "BF16", [2, 2], b"\x80\x3f\x00\x40\x00\xc0\x80\x7f")]))
    write(t, "empty_and_scalar", safetensors([("empty", "F32", [0, 4], b""), ("scalar", "F32", [], f32([7]))]))
    write(t, "i64_unsupported", safetensors([("ids", "I64", [2], struct.pack("<2q", 1, 2))]))
    write(t, "adapter_valid", safetensors(lora_tensors([0, 1]), {"format": "pt"}))
    write(t, "adapter_f16_layer0", safetensors(lora_tensors([0], dtype="F16")))
    write(t, "adapter_huge_layer", safetensors(
        [("base_model.model.model.layers.99999999999.self_attn.q_proj.lora_A.weight", "F32", [2, 8], f32([0] * 16))]))
    write(t, "adapter_bad_shape", safetensors(
        [("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "F32", [3, 8], f32([0] * 24))]))

    def lie_offsets(header):
        header["w"]["data_offsets"] = [0, 1 << 40]
    write(t, "lying_offsets", safetensors([("w", "F32", [2], f32([1, 2]))], header_patch=lie_offsets))

    def overlap(header):
        header["b"]["data_offsets"] = [4, 12]
    write(t, "overlapping", safetensors([("a", "F32", [2], f32([1, 2])), ("b", "F32", [2], f32([3, 4]))],
                                        header_patch=overlap))

    def huge_shape(header):
        header["w"]["shape"] = [0, 4611686018427387904, 4611686018427387904]
    write(t, "huge_empty_shape", safetensors([("w", "F32", [0], b"")], header_patch=huge_shape))
    write(t, "truncated_header", struct.pack("<Q", 64) + b'{"w":{"dtype":"F32"')
    # An FP8 linear as llm-compressor stores it: e4m3 rows (a NaN byte 0x7f among them), scales beside.
    write(t, "fp8_linear", safetensors([("l.weight", "F8_E4M3", [2, 4], bytes([0x38, 0xb8, 0x7e, 0x01, 0x00, 0x80, 0x7f, 0x40])),
                                        ("l.weight_scale", "F32", [2, 1], f32([0.5, 2.0])),
                                        ("l.input_scale", "F32", [], f32([0.25]))], {"format": "pt"}))
    write(t, "f8_e5m2_refused", safetensors([("w", "F8_E5M2", [2, 2], bytes([0x3c, 0xbc, 0x7c, 0x00]))]))
    write_dict(t, JSON_TOKENS + ["dtype", "shape", "data_offsets", "__metadata__", "F32", "F16", "BF16", "I64",
                                 "F8_E4M3", "F8_E5M2", "base_model.model.model.layers.", ".self_attn.", ".mlp.", "q_proj",
                                 "down_proj", ".lora_A.weight", ".lora_B.weight", "lora_magnitude_vector",
                                 "lora_embedding_A", ".bias"])


# --- GGUF ----------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32T, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)


def gguf_string(text):
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(kind, value):
    scalar = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32T: "<f", BOOL: "<?",
              U64: "<Q", I64: "<q", F64: "<d"}
    if kind in scalar:
        return struct.pack(scalar[kind], value)
    if kind == STRING:
        return gguf_string(value)
    element_kind, items = value
    out = struct.pack("<IQ", element_kind, len(items))
    for item in items:
        out += gguf_value(element_kind, item)
    return out


def gguf(metadata, tensors, version=3, alignment=32):
    """metadata: list of (key, kind, value); tensors: list of (name, dims, ggml type, raw bytes)."""
    out = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(metadata))
    for key, kind, value in metadata:
        out += gguf_string(key) + struct.pack("<I", kind) + gguf_value(kind, value)
    offset, data = 0, b""
    for name, dims, ggml_type, raw in tensors:
        out += gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims)
        out += struct.pack("<IQ", ggml_type, offset)
        padded = raw + b"\0" * (-len(raw) % alignment)
        data += padded
        offset += len(padded)
    out += b"\0" * (-len(out) % alignment)
    return out + data


GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30


def gguf_llama(arch="llama", extra_metadata=(), tensor_types=None):
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(ord("a"), ord("h"))] + \
        ["ab", "Ġ", "Ġa"]
    metadata = [
        ("general.architecture", STRING, arch),
        ("general.alignment", U32, 32),
        (arch + ".embedding_length", U32, HIDDEN),
        (arch + ".feed_forward_length", U32, 32),
        (arch + ".block_count", U32, 1),
        (arch + ".attention.head_count", U32, 2),
        (arch + ".attention.head_count_kv", U32, 1),
        (arch + ".context_length", U32, 64),
        (arch + ".attention.layer_norm_rms_epsilon", F32T, 1e-5),
        (arch + ".rope.freq_base", F32T, 10000.0),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, "smollm"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [3, 3, 3] + [1] * (len(tokens) - 3))),
        ("tokenizer.ggml.merges", ARRAY, (STRING, ["a b", "Ġ a"])),
        ("tokenizer.ggml.bos_token_id", U32, 0),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.chat_template", STRING, "{% for message in messages %}<|im_start|>{{ message['role'] }}"),
    ] + list(extra_metadata)
    vocab = len(tokens)
    q8 = struct.pack("<e", 0.5) + bytes(range(32))                          # one Q8_0 block: 32 values
    q4_0 = struct.pack("<e", 0.25) + bytes(range(16))                       # one Q4_0 block
    q4_1 = struct.pack("<ee", 0.25, -1.0) + bytes(range(16))                # one Q4_1 block
    tensors = [
        ("token_embd.weight", [HIDDEN, vocab], GGML_F32, f32([0.1 * (i % 5) for i in range(HIDDEN * vocab)])),
        ("blk.0.attn_q.weight", [HIDDEN, Q_SIZE], GGML_F16, struct.pack("<64e", *[0.01 * i for i in range(64)])),
        ("blk.0.attn_k.weight", [HIDDEN, KV_SIZE], GGML_F32, f32([0.02 * i for i in range(32)])),
        ("blk.0.ffn_gate.weight", [32, 1], GGML_Q8_0, q8),
        ("blk.0.ffn_up.weight", [32, 1], GGML_Q4_0, q4_0),
        ("blk.0.ffn_down.weight", [32, 1], GGML_Q4_1, q4_1),
        ("output_norm.weight", [HIDDEN], GGML_F32, f32([1.0] * HIDDEN)),
    ]
    return gguf(metadata, tensors)


def gguf_corpus():
    t = "gguf"
    write(t, "llama_small", gguf_llama())
    write(t, "qwen2_small", gguf_llama("qwen2"))
    write(t, "nested_arrays", gguf([("general.architecture", STRING, "llama"),
                                    ("x.nested", ARRAY, (ARRAY, [(U8, [1, 2]), (U8, [])]))], []))
    write(t, "huge_head_count", gguf_llama(extra_metadata=[("llama.attention.head_count", U64, 1 << 62)]))
    write(t, "huge_counts", struct.pack("<IIQQ", 0x46554747, 3, 1 << 60, 1 << 60))
    write(t, "huge_string", struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + struct.pack("<Q", 1 << 62) + b"abc")
    write(t, "bad_alignment", gguf_llama(extra_metadata=[("general.alignment", U32, 24)]))
    write(t, "zero_dim_tensor", gguf([("general.architecture", STRING, "qwen3")],
                                     [("blk.0.attn_q.weight", [0, 1 << 40], GGML_F32, b"")]))
    write(t, "rope_freqs", gguf_llama(extra_metadata=[("llama.rope.dimension_count", U32, 4)]) )
    write(t, "version1", struct.pack("<IIQQ", 0x46554747, 1, 0, 0))
    write_dict(t, ["GGUF", "general.architecture", "general.alignment", "llama", "qwen2", "qwen3",
                   ".embedding_length", ".feed_forward_length", ".block_count", ".attention.head_count",
                   ".attention.head_count_kv", ".attention.key_length", ".rope.dimension_count",
                   ".attention.layer_norm_rms_epsilon", ".rope.freq_base", ".rope.scaling.type", ".context_length",
                   "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                   "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
                   "gpt2", "llama-bpe", "rope_freqs.weight", "token_embd.weight", "output.weight",
                   "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_q.bias",
                   "\xff\xff\xff\xff\xff\xff\xff\x7f", "\x00\x00\x00\x00\x00\x00\x00\x40"])


# --- tokenizer.json --------------------------------------------------------------
def shrink_tokenizer(path, keep_below=128, num_merges=12):
    with open(path, encoding="utf-8") as f:
        tokenizer = json.load(f)
    model = tokenizer["model"]
    by_id = {i: token for token, i in model["vocab"].items()}
    keep = {i for i in by_id if i < keep_below}
    merges = []
    for merge in model.get("merges", []):
        if len(merges) == num_merges:
            break
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        merged = left + right
        if left in model["vocab"] and right in model["vocab"] and merged in model["vocab"]:
            keep |= {model["vocab"][left], model["vocab"][right], model["vocab"][merged]}
            merges.append(merge)
    for option in ("unk_token",):
        if isinstance(model.get(option), str) and model[option] in model["vocab"]:
            keep.add(model["vocab"][model[option]])
    model["vocab"] = {by_id[i]: i for i in sorted(keep)}
    model["merges"] = merges
    return tokenizer


def tokenizer_corpus():
    t = "tokenizer_json"
    fixtures = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
    for name in sorted(os.listdir(fixtures)):
        path = os.path.join(fixtures, name, "tokenizer.json")
        if not os.path.isfile(path):
            continue
        data = json.dumps(shrink_tokenizer(path), separators=(",", ":")).encode()
        config_path = os.path.join(fixtures, name, "tokenizer_config.json")
        if os.path.isfile(config_path):  # tokenizer.json NUL tokenizer_config.json
            with open(config_path, "rb") as f:
                data += b"\0" + f.read()
        write(t, name, data)
    minimal = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3}, "merges": ["a b"],
                         "unk_token": "<unk>"},
               "added_tokens": [{"id": 4, "content": "<s>", "special": True, "lstrip": True, "rstrip": True,
                                 "single_word": True, "normalized": False}],
               "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"},
                                                                   {"type": "Replace", "pattern": {"Regex": "x+"},
                                                                    "content": "y"}]},
               "post_processor": {"type": "BertProcessing", "cls": ["<s>", 4], "sep": ["<s>", 4]}}
    write(t, "minimal_unk", minimal)
    write(t, "wrong_types", {"model": {"vocab": {"a": "zero"}, "merges": [1, 2]}, "added_tokens": {"id": 1}})
    write(t, "huge_ids", {"model": {"vocab": {"a": 16777216, "b": -1}}, "added_tokens": [
        {"id": 2147483647, "content": "<big>"}]})
    write_dict(t, JSON_TOKENS + ["model", "vocab", "merges", "type", "BPE", "unk_token", "byte_fallback",
                                 "fuse_unk", "continuing_subword_prefix", "end_of_word_suffix", "ignore_merges",
                                 "dropout", "added_tokens", "id", "content", "special", "lstrip", "rstrip",
                                 "single_word", "normalized", "normalizer", "normalizers", "pre_tokenizer",
                                 "pretokenizers", "post_processor", "processors", "decoder", "decoders",
                                 "Sequence", "NFC", "NFKC", "Lowercase", "Prepend", "prepend", "Replace",
                                 "pattern", "Regex", "String", "ByteLevel", "Split", "behavior", "Isolated",
                                 "MergedWithPrevious", "MergedWithNext", "Removed", "Contiguous", "invert",
                                 "Metaspace", "replacement", "prepend_scheme", "first", "always", "never",
                                 "Digits", "individual_digits", "add_prefix_space", "trim_offsets", "use_regex",
                                 "TemplateProcessing", "single", "pair", "SpecialToken", "special_tokens", "ids",
                                 "tokens", "BertProcessing", "cls", "sep", "ByteFallback", "Fuse", "Strip",
                                 "start", "stop", "bos_token", "eos_token", "add_bos_token", "chat_template",
                                 "<|im_start|>", "<|eot_id|>", "<0xFF>", "\x00"])


# --- adapter_config.json -----------------------------------------------------------
def adapter_config_corpus():
    t = "adapter_config"
    base = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 4, "bias": "none",
            "target_modules": ["q_proj", "v_proj"], "use_rslora": False, "use_dora": False,
            "modules_to_save": None, "base_model_name_or_path": "tiny"}
    write(t, "peft_basic", base)
    write(t, "all_linear_rslora", dict(base, target_modules="all-linear", use_rslora=True, lora_alpha=2.5))
    write(t, "patterns", dict(base, target_modules=["q_proj", "k_proj", "down_proj"],
                              rank_pattern={"k_proj": 4, "layers.1.self_attn.q_proj": 1},
                              alpha_pattern={"down_proj": 8.0}))
    write(t, "regex_targets", dict(base, target_modules=r".*\.(q|v)_proj$", exclude_modules=r".*layers\.0\..*"))
    write(t, "layers_to_transform", dict(base, layers_to_transform=[0, 2], layers_pattern="layers"))
    write(t, "alora", dict(base, alora_invocation_tokens=[5, 6], loom_kv_sharing="activated"))
    write(t, "dora_unsupported", dict(base, use_dora=True))
    write(t, "embed_target", dict(base, target_modules=["embed_tokens"]))
    write(t, "huge_numbers", '{"r": 1e300, "lora_alpha": 1e999, "layers_to_transform": [4294967296], '
                             '"rank_pattern": {"q_proj": -9223372036854775809}}')
    write(t, "bad_regex", dict(base, target_modules="(unclosed[", rank_pattern={"(": 2}))
    write_dict(t, JSON_TOKENS + ["peft_type", "LORA", "task_type", "r", "lora_alpha", "use_rslora", "use_dora",
                                 "bias", "none", "lora_bias", "target_modules", "exclude_modules", "all-linear",
                                 "layers_to_transform", "layers_pattern", "rank_pattern", "alpha_pattern",
                                 "alora_invocation_tokens", "base_model_name_or_path", "loom_kv_sharing",
                                 "isolated", "activated", "base", "forked", "modules_to_save",
                                 "target_parameters", "trainable_token_indices", "layer_replication",
                                 "use_qalora", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                 "down_proj", "lm_head", "embed_tokens", "model.layers.", "self_attn", "mlp",
                                 ".*", "(?P<x>", "\\d+", "|"])


# --- config.json ---------------------------------------------------------------------
def model_config_corpus():
    t = "model_config"
    formats = os.path.join(ROOT, "tests", "fixtures", "formats")
    for name in sorted(os.listdir(formats)):
        if name.endswith("_config_saved_by_transformers5.json"):
            with open(os.path.join(formats, name), "rb") as f:
                write(t, name[:-len(".json")], f.read())
    llama = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 8, "intermediate_size": 16,
             "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
             "max_position_embeddings": 64, "rope_theta": 10000.0, "bos_token_id": 0, "eos_token_id": [1, 2],
             "tie_word_embeddings": True}
    write(t, "llama_tiny", llama)
    write(t, "llama3_rope", dict(llama, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 8192}))
    write(t, "qwen2", dict(llama, architectures=["Qwen2ForCausalLM"], use_sliding_window=True, sliding_window=32))
    write(t, "mistral_model_type", {k: v for k, v in dict(llama, model_type="mistral").items()
                                    if k != "architectures"})
    write(t, "huge_heads", dict(llama, num_attention_heads=65536, num_key_value_heads=65536, head_dim=65536))
    write(t, "wrong_types", dict(llama, hidden_size="8", eos_token_id={"a": 1}, rope_scaling=[1]))
    float8 = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "block_structure": None}
    write(t, "compressed_tensors_fp8", dict(llama, quantization_config={
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head", "re:.*down_proj"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": dict(float8, strategy="channel", dynamic=False),
                                      "input_activations": dict(float8, strategy="token", dynamic=True)}}}))
    write(t, "fbgemm_fp8", dict(llama, quantization_config={
        "quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}))
    write_dict(t, JSON_TOKENS + ["architectures", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                 "MistralForCausalLM", "model_type", "vocab_size", "hidden_size",
                                 "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
                                 "rope_parameters", "rope_type", "llama3", "factor", "low_freq_factor",
                                 "high_freq_factor", "original_max_position_embeddings", "max_position_embeddings",
                                 "sliding_window", "use_sliding_window", "attention_bias", "mlp_bias",
                                 "hidden_act", "silu", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                                 "torch_dtype", "dtype", "quantization_config", "quant_method", "compressed-tensors",
                                 "fbgemm_fp8", "format", "float-quantized", "config_groups", "targets", "Linear",
                                 "weights", "input_activations", "num_bits", "type", "float", "strategy", "tensor",
                                 "channel", "token", "dynamic", "symmetric", "ignore", "re:", "activation_scale_ub",
                                 "modules_to_not_convert", "kv_cache_scheme"])


# --- request bodies ----------------------------------------------------------------------
def openai_request_corpus():
    t = "openai_request"
    write(t, "completion_basic", {"model": "tiny", "prompt": "hello world", "max_tokens": 4})
    write(t, "completion_all_fields", {
        "model": "agent0", "prompt": ["a b", "c"], "n": 2, "max_tokens": 3, "temperature": 0.5, "top_p": 0.9,
        "top_k": 5, "seed": 42, "stop": ["\n", "END"], "logprobs": 2, "echo": False, "ignore_eos": True,
        "min_tokens": 1, "priority": -1, "presence_penalty": 0.5, "frequency_penalty": 0.1,
        "repetition_penalty": 1.1, "logit_bias": {"5": -100}, "stop_token_ids": [2], "stream": True,
        "stream_options": {"include_usage": True}, "best_of": 2, "suffix": None, "user": "u"})
    write(t, "completion_token_ids", {"model": "/models/tiny", "prompt": [[1, 2, 3], [4]], "max_tokens": 1})
    write(t, "chat_basic", {"model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                                          {"role": "user", "content": "hi"}],
                            "max_completion_tokens": 3, "logprobs": True, "top_logprobs": 2})
    write(t, "chat_parts", {"model": "agent1", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "text", "text": "r"}]},
        {"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"}],
        "response_format": {"type": "text"}, "tools": []})
    write(t, "chat_tools", {"model": "tiny", "tools": [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "messages": [{"role": "user", "content": "Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21"}]})
    write(t, "chat_template", {"model": "tiny", "messages": [{"role": "user", "content": "hi"},
                                                             {"role": "assistant", "content": "Hel"}],
                               "chat_template": "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}"
                                                "[INST] {{ m.content | trim }}[/INST]{% elif loop.last %}{{ m.content }}"
                                                "{% else %}{{ raise_exception('bad role') }}{% endif %}{% endfor %}"
                                                "{{ tools | tojson if tools }}{{ enable_thinking }}",
                               "chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": False,
                               "continue_final_message": True, "documents": [{"title": "t", "text": "d"}]})
    write(t, "workflow_hints", {"model": "tiny", "prompt": "x", "workflow": "w1", "agent": "planner",
                                "fixed_prefix_tokens": 1})
    write(t, "out_of_range", '{"model": "tiny", "prompt": "x", "max_tokens": 1e999, "n": 4294967296, '
                             '"temperature": -1, "top_k": "5", "seed": -1}')
    write(t, "bad_utf8", b'{"model":"tiny","prompt":"\xff\xfe","stop":["\xc3"]}')
    write(t, "unknown_model", {"model": "nope", "messages": []})
    write_dict(t, JSON_TOKENS + ["model", "tiny", "agent0", "prompt", "messages", "role", "content", "type",
                                 "text", "system", "user", "assistant", "developer", "tool", "max_tokens",
                                 "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                                 "stop_token_ids", "n", "best_of", "logprobs", "top_logprobs", "echo", "suffix",
                                 "stream", "stream_options", "include_usage", "ignore_eos", "min_tokens",
                                 "priority", "presence_penalty", "frequency_penalty", "repetition_penalty",
                                 "logit_bias", "response_format", "tools", "workflow", "agent",
                                 "fixed_prefix_tokens", "<|im_start|>", "<|im_end|>", "tool_calls", "tool_call_id",
                                 "function", "arguments", "name", "description", "parameters", "documents",
                                 "chat_template", "chat_template_kwargs", "add_generation_prompt",
                                 "continue_final_message", "enable_thinking", "{{", "}}", "{%", "%}", "{%-", "-%}",
                                 "endfor", "endif", "raise_exception", "tojson", "loop.last"])


def grammar_corpora():
    for name, pattern in [("digits", r"^\d{3}-[a-z]+$"), ("alternation", "(yes|no|maybe)( [0-9]{1,3})?"),
                          ("classes", r"[^\s\"]+@[\w.-]+\.(com|org)"), ("unicode", "[α-ω€]+.?"),
                          ("lookahead", "(?=a)b"), ("nested", "((a|b)*c){2,4}")]:
        write("regex", name, pattern)
    write_dict("regex", ["(", ")", "(?:", "(?=", "[", "]", "[^", "\\d", "\\w", "\\s", "\\b", "\\1", "{2,5}", "*", "+",
                         "?", "|", ".", "^", "$", "\\u00e9"])
    write("gbnf", "json_like", 'root ::= "{" ws (pair ("," ws pair)*)? "}"\npair ::= str ":" ws val\n'
                               'val ::= str | [0-9]+ | root\nstr ::= "\\"" [^"\\\\]* "\\""\nws ::= [ \\t\\n]*')
    write("gbnf", "repeat", "root ::= (\"ab\" | [x-z]){2,5} rest?\nrest ::= . | \"\\u00e9\"")
    write("gbnf", "left_recursive", 'root ::= root "a" | "b"')
    write_dict("gbnf", ["::=", "root", "|", "(", ")", "[", "]", "[^", "\"", "*", "+", "?", "{1,3}", "#", "\\n", "."])
    schemas = {
        "object": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "integer"},
                                                    "c": {"enum": ["x", 1, None]}}, "required": ["a"],
                   "additionalProperties": False},
        "recursive": {"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {
            "k": {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2}}}}},
        "mixed": {"anyOf": [{"type": "null"}, {"type": "array", "prefixItems": [{"type": "number"}],
                                                "items": {"type": "string", "pattern": "^[a-c]+$"}}]},
        "unsupported": {"type": "integer", "minimum": 3},
    }
    for name, schema in schemas.items():
        write("json_schema", name, schema)
    write_dict("json_schema", JSON_TOKENS + ["type", "object", "array", "string", "integer", "number", "boolean", "null",
                                             "properties", "required", "additionalProperties", "items", "prefixItems",
                                             "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "#/$defs/",
                                             "minItems", "maxItems", "minLength", "maxLength", "pattern", "format"])


def workflow_request_corpus():
    t = "workflow_request"
    write(t, "spec_chain", {"agents": [{"name": "planner"}, {"name": "executor", "after": ["planner"]},
                                       {"name": "reviewer", "after": ["executor"]}]})
    write(t, "spec_joins", {"agents": [{"name": "a"}, {"name": "b", "after": ["a"]}, {"name": "c", "after": ["a"]},
                                       {"name": "d", "after": ["b", "c"], "join": "all"},
                                       {"name": "e", "after": ["b", "c"], "join": "any"}]})
    write(t, "spec_cycle", {"agents": [{"name": "x", "after": ["y"]}, {"name": "y", "after": ["x"]}]})
    write(t, "progress", {"running": ["executor"], "steps_to_execution": {"reviewer": 2, "planner": 0}})
    write(t, "hints", {"model": "tiny", "workflow": "w1", "agent": "planner", "fixed_prefix_tokens": 12})
    write(t, "bad_fields", '{"agents": [{"name": "", "aftr": ["a"], "join": 3}], "running": "x", '
                           '"steps_to_execution": {"a": 1e999}}')
    write_dict(t, JSON_TOKENS + ["agents", "name", "after", "join", "all", "any", "running", "steps_to_execution",
                                 "workflow", "agent", "fixed_prefix_tokens", "1000000", "1000001"])


def tool_call_corpus():
    # Byte 0: the convention (0 hermes, 1 llama3_json, 2 mistral, 3 none); byte 1: how the rest is cut.
    t = "tool_call"
    hermes = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\u00eds \u65e5"}}\n'
              '</tool_call>\n<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>')
    write(t, "hermes", b"\x00\x05" + hermes.encode())
    write(t, "hermes_malformed", b"\x00\x09" + b'a <tool_call>{"name": "f", "arguments": {"x": ]}</tool_call> '
                                               b'<tool_call>{"name": "g"}')
    write(t, "llama3", b"\x01\x03" + b'<|python_tag|>{"name": "a", "parameters": {"x": [1, {"y": null}]}}; '
                                     b'{"name": "b", "parameters": {}}<|eom_id|>')
    write(t, "llama3_content", b"\x01\x07" + b'{"answer": 42} is the JSON')
    write(t, "mistral_list", b"\x02\x02" + b'[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2.5}}, '
                                           b'{"name": "neg", "arguments": {"a": -1}}]')
    write(t, "mistral_args", b"\x02\x0b" + b'Sure [TOOL_CALLS]get_weather[ARGS]{"city": "Z\xc3\xbcrich"}'
                                           b'[TOOL_CALLS]get_time[ARGS]{}')
    write(t, "required", b"\x03\x01" + b'[{"name": "f", "parameters": {"q": "x"}}]')
    write_dict(t, JSON_TOKENS + ["<tool_call>", "</tool_call>", "<|python_tag|>", "<|eom_id|>", "<|eot_id|>",
                                 "[TOOL_CALLS]", "[ARGS]", "\"name\"", "\"arguments\"", "\"parameters\"", ";",
                                 "\\\"", " ", "\n"])


if __name__ == "__main__":
    safetensors_corpus()
    gguf_corpus()
    tokenizer_corpus()
    adapter_config_corpus()
    model_config_corpus()
    openai_request_corpus()
    workflow_request_corpus()
    grammar_corpora()
    tool_call_corpus()
    for target in sorted(os.listdir(os.path.join(FUZZ, "corpus"))):
        directory = os.path.join(FUZZ, "corpus", target)
        sizes = [os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)]
        print("%-18s %2d seeds, %6d bytes (largest %d)" % (target, len(sizes), sum(sizes), max(sizes)))
