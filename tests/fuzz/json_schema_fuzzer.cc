// libFuzzer target: a JSON schema (grammar/json_schema_compiler.h) compiled into a
// grammar, bound to a small vocabulary, and walked for a few tokens.
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/json_schema_compiler.h"
#include "grammar_fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  loom::fuzz::run_clean([&] {
    const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) return;
    // Odd sizes compile leniently (what no grammar enforces is skipped, not refused).
    const auto strictness = size % 2 ? loom::grammar::SchemaStrictness::kLenient : loom::grammar::SchemaStrictness::kStrict;
    loom::fuzz::exercise_grammar(
        loom::grammar::json_schema_grammar(schema, loom::fuzz::fuzz_grammar_limits(), strictness));
  });
  return 0;
}
