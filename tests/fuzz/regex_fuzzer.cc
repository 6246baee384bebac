// libFuzzer target: a regex (grammar/regex_compiler.h) compiled into a
// grammar, bound to a small vocabulary, and walked for a few tokens.
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/regex_compiler.h"
#include "grammar_fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  loom::fuzz::run_clean([&] {
    loom::fuzz::exercise_grammar(loom::grammar::regex_grammar(text, loom::fuzz::fuzz_grammar_limits()));
  });
  return 0;
}
