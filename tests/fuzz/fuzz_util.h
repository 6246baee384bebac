// Shared pieces of the libFuzzer targets (tests/fuzz/*_fuzzer.cc).
//
// Contract of every target: any input may be rejected, but only with a
// loom::Error of a user-facing kind (or, for request parsers, an ApiError
// below 500). Anything else is a finding and must crash the run so libFuzzer
// keeps the input: another exception type escapes (libFuzzer reports the
// uncaught exception), and Error(kInternal) or a 5xx ApiError aborts here.
// ASan/UBSan report memory errors and undefined behaviour on their own.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "util/error.h"

namespace loom::fuzz {

// One private directory per fuzzing process, removed at exit. Readers that take
// a path get the input written to a file there (rewritten for every input).
class ScratchDir {
 public:
  static const std::filesystem::path& path() {
    static ScratchDir instance;
    return instance.path_;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

 private:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "loom_fuzz_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    path_ = pattern;
  }
  std::filesystem::path path_;
};

// Writes `bytes` to <scratch>/<name> and returns the path.
inline std::string write_scratch_file(const std::string& name, std::string_view bytes) {
  const std::filesystem::path path = ScratchDir::path() / name;
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  stream.close();
  if (!stream) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
  return path.string();
}

// Keeps a value (and the reads that made it) from being optimised away.
inline void keep(float value) {
  static volatile float sink;
  sink = value;
  (void)sink;
}

// The readers log warnings for odd but accepted input; at libFuzzer's rates that is noise.
inline void quiet_logs() { spdlog::set_level(spdlog::level::off); }

// A loom::Error is a clean rejection unless it says an invariant broke.
inline void check_clean(const Error& error) {
  if (error.kind() == ErrorKind::kInternal) {
    std::fprintf(stderr, "internal error from hostile input: %s\n", error.what());
    std::abort();
  }
}

// Runs `body`; a loom::Error other than kInternal is a clean rejection.
template <typename Body>
void run_clean(Body&& body) {
  try {
    body();
  } catch (const Error& error) {
    check_clean(error);
  }
}

}  // namespace loom::fuzz
