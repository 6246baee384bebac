#!/usr/bin/env python3
"""Writes an all-F32 copy of a GGUF file (every quantized or half tensor
dequantized, metadata copied, general.file_type set to ALL_F32).

Loom's CPU backend dequantizes GGUF weights to fp32 at load, so running llama.cpp
on this copy compares the two engines at the same weight precision, separating
engine speed from the bandwidth that Q4_1 weights save. Needs python3 with the
`gguf` and `numpy` packages.

    bench/make_f32_gguf.py IN.gguf OUT.gguf
"""
import argparse

import gguf
import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("output")
    args = parser.parse_args()

    reader = gguf.GGUFReader(args.input, "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(args.output, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.ALL_F32)
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, value_type, sub_type=sub_type)

    tensors = []
    for tensor in reader.tensors:
        # dequantize returns the logical shape in numpy order (last dim = ne[0]).
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        tensors.append((tensor.name, np.ascontiguousarray(values)))
        writer.add_tensor_info(tensor.name, values.shape, values.dtype, values.nbytes, gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, values in tensors:
        writer.write_tensor_data(values)
    writer.close()
    total = sum(values.nbytes for _, values in tensors)
    print(f"wrote {args.output}: {len(tensors)} tensors, {total / 2**20:.0f} MiB of F32 weights")


if __name__ == "__main__":
    main()
