"""llama.cpp's GGUF layout of a Hugging Face Llama, shared by the scripts that write GGUF files for
side-by-side runs with llama.cpp (serve/hf_to_gguf.py: a whole model; quality/peft_to_gguf_lora.py: a
PEFT adapter): the projections' GGUF names, the q/k row order, and safetensors read with numpy."""
import json
import os
import struct

import numpy as np

# A decoder layer's HF module -> its GGUF tensor name (blk.N.<name>.weight).
LAYER_MODULES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def permute_rope_rows(w, heads):
    """llama.cpp's row order for llama q/k weights (and LoRA B of q/k): per head, the two rotary halves
    interleaved. HF row h*d + j*(d/2) + i -> GGUF row h*d + 2*i + j (i < d/2, j in {0, 1})."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def safetensors_index(paths):
    """name -> (file, dtype, shape, start, end) over safetensors files, read lazily by load_f32."""
    tensors = {}
    for path in paths:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            tensors[key] = (path, entry["dtype"], entry["shape"], 8 + header_len + start, 8 + header_len + end)
    return tensors


def model_safetensors(model_dir):
    """safetensors_index over model.safetensors or the shards its index names."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        names = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        names = ["model.safetensors"]
    return safetensors_index([os.path.join(model_dir, name) for name in names])


def load_f32(entry):
    """One tensor of safetensors_index as float32 (F32, F16 or BF16 on disk), memory-mapped."""
    path, dtype, shape, start, end = entry
    if dtype not in _DTYPES:
        raise SystemExit(f"{path}: dtype {dtype} not handled (F32, F16, BF16)")
    item = np.dtype(_DTYPES[dtype]).itemsize
    raw = np.memmap(path, dtype=_DTYPES[dtype], mode="r", offset=start, shape=((end - start) // item,))
    values = (raw.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else raw.astype(np.float32)
    return values.reshape(shape)
