// The CUDA benchmarks' main(): runs the benchmark, and on an exception prints
// its message after the program's name and exits with status 1.
#pragma once

#include <cstdio>
#include <exception>

namespace loom::cuda::bench {

template <typename Run>
int bench_main(const char* name, Run run, int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", name, error.what());
    return 1;
  }
}

}  // namespace loom::cuda::bench
