// Structured-output overhead: time per generated token to compute the allowed
// mask over a 128K-token vocabulary and advance the matcher, for typical
// schemas (Google Benchmark). The vocabulary is synthetic byte-level BPE-like:
// the 256 bytes plus 130,816 random pieces (words with and without a leading
// space, digits, JSON punctuation, quotes, multi-byte UTF-8 and split UTF-8
// characters). Each iteration is one decode step: fill the mask, draw a random
// allowed token (fixed seed), accept it; a completed output starts over.
// Reports the mean (Google Benchmark's time) and p99 (counter "p99_us") per step.
#include <algorithm>
#include <chrono>
#include <random>

#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/regex_compiler.h"

namespace loom::grammar {
namespace {

constexpr int32_t kVocabularySize = 131072;

std::shared_ptr<const TokenVocabulary> synthetic_vocabulary() {
  static const auto vocabulary = [] {
    std::mt19937 rng(1234);
    const std::string letters = "etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCM";
    const std::vector<std::string> punctuation = {"\"", ",", ":", "{", "}", "[", "]", "\":", "\",", "\"}", ".", "-",
                                                  "_", "(", ")", "\\", "\\n", " ", "\n", "  "};
    const std::vector<std::string> unicode = {"é", "ü", "€", "中", "文", "\xe2\x82", "\xac", "\xc3", "😀"};
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    while (static_cast<int32_t>(tokens.size()) < kVocabularySize - 1) {
      std::string token;
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 5) {  // a word piece
        if (rng() % 2) token += ' ';
        const int length = 2 + static_cast<int>(rng() % 8);
        for (int i = 0; i < length; ++i) token += letters[rng() % letters.size()];
      } else if (kind < 6) {  // digits
        const int length = 1 + static_cast<int>(rng() % 4);
        for (int i = 0; i < length; ++i) token += static_cast<char>('0' + rng() % 10);
      } else if (kind < 8) {  // punctuation mixed with a word
        token += punctuation[rng() % punctuation.size()];
        const int length = static_cast<int>(rng() % 5);
        for (int i = 0; i < length; ++i) token += letters[rng() % letters.size()];
        if (rng() % 2) token += punctuation[rng() % punctuation.size()];
      } else {  // unicode, possibly split
        const int length = 1 + static_cast<int>(rng() % 3);
        for (int i = 0; i < length; ++i) token += unicode[rng() % unicode.size()];
      }
      tokens.push_back(token);
    }
    tokens.push_back("");  // EOS
    std::vector<bool> excluded(tokens.size(), false);
    return std::make_shared<const TokenVocabulary>(std::move(tokens), excluded,
                                                   std::vector<int32_t>{kVocabularySize - 1});
  }();
  return vocabulary;
}

const char* const kSchemas[] = {
    // 0: a flat record
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string",
       "format":"email"},"active":{"type":"boolean"}},"required":["name","age","email","active"],"additionalProperties":false})",
    // 1: a tool call with nested arguments and an array
    R"({"type":"object","properties":{"name":{"enum":["get_weather","search","send_email"]},"arguments":{"type":"object",
       "properties":{"query":{"type":"string"},"limit":{"type":"integer"},"units":{"enum":["c","f"]},"tags":{"type":"array",
       "items":{"type":"string"}}},"required":["query"]}},"required":["name","arguments"]})",
    // 2: any JSON object
    nullptr,
};

void BM_MaskAndAdvance(benchmark::State& state) {
  const auto vocabulary = synthetic_vocabulary();
  const char* schema = kSchemas[state.range(0)];
  const auto start = std::chrono::steady_clock::now();
  const auto grammar = std::make_shared<const CompiledGrammar>(
      schema ? json_schema_grammar(nlohmann::json::parse(schema)) : json_object_grammar(), vocabulary);
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::mt19937 rng(7);
  auto matcher = std::make_unique<GrammarMatcher>(grammar);
  std::vector<uint64_t> mask;
  std::vector<int32_t> allowed;
  std::vector<double> step_us;
  int64_t num_allowed = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    matcher->fill_next_token_bitmask(mask);
    allowed.clear();
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint64_t bits = mask[w]; bits; bits &= bits - 1)
        allowed.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits))));
    num_allowed += static_cast<int64_t>(allowed.size());
    const int32_t token = allowed[rng() % allowed.size()];
    matcher->accept_token(token);
    step_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (matcher->is_completed() || step_us.size() % 200 == 0) {  // bound output length: restart
      state.PauseTiming();
      matcher = std::make_unique<GrammarMatcher>(grammar);
      state.ResumeTiming();
    }
  }
  std::sort(step_us.begin(), step_us.end());
  state.counters["p99_us"] = step_us.empty() ? 0 : step_us[step_us.size() * 99 / 100];
  state.counters["mean_us"] = step_us.empty() ? 0 : [&] { double s = 0; for (double v : step_us) s += v; return s / static_cast<double>(step_us.size()); }();
  state.counters["allowed_per_step"] = static_cast<double>(num_allowed) / static_cast<double>(std::max<size_t>(step_us.size(), 1));
  state.counters["compile_ms"] = compile_ms;
  state.counters["cached_pairs"] = grammar->num_cached_pairs();
}
BENCHMARK(BM_MaskAndAdvance)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond)->Iterations(2000);

}  // namespace
}  // namespace loom::grammar

BENCHMARK_MAIN();
