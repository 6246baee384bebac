// Writes the weights Loom reads from a GGUF file (dequantized, renamed to HF
// names, Q/K un-permuted) to a safetensors file, so that
// check_gguf_against_transformers.py can compare them with transformers' own
// GGUF loader. Not part of the build; compile by hand, e.g.
//   g++ -std=c++20 -O2 -fopenmp -Isrc tools/formats/gguf_weights_to_safetensors.cc \
//       build/libloom_formats.a build/libloom_util.a -lfmt -o /tmp/gguf_weights_to_safetensors
#include <cstdio>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "util/error.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf OUT.safetensors\n", argv[0]);
    return 2;
  }
  try {
    loom::GgufFile gguf = loom::read_gguf(argv[1]);
    loom::write_safetensors(argv[2], gguf.tensors);
    std::printf("%zu tensors\n", gguf.tensors.size());
  } catch (const loom::Error& error) {
    std::fprintf(stderr, "error (%s): %s\n", loom::error_kind_name(error.kind()), error.what());
    return 1;
  }
  return 0;
}
