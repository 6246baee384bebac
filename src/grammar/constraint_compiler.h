// The one entry point for structured-output constraints: compiles a JSON
// schema, "any JSON object", a regex, a list of choices or a GBNF grammar into
// a CompiledGrammar bound to the server's vocabulary.
//
// Threads: thread-safe; call it on HTTP handler threads (compiling walks the
// vocabulary: milliseconds to ~a second for big schemas on a 128K vocabulary),
// never on the engine thread. Results are cached (most recently used, by kind
// and text), so a schema sent with every request compiles once.
// Errors: Error(kUnsupported) naming the unsupported feature,
// Error(kInvalidArgument) for malformed input, Error(kCapacity) past the limits.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/token_vocabulary.h"
#include "util/cache_gauge.h"

namespace loom::grammar {

class ConstraintCompiler {
 public:
  explicit ConstraintCompiler(std::shared_ptr<const TokenVocabulary> vocabulary, size_t cache_entries = 64,
                              GrammarLimits limits = {}, CompileBudget budget = {});

  // Members in the order of `schema`'s properties. Lenient: what the grammar
  // cannot enforce is in the result's grammar().unenforced instead of an Error.
  std::shared_ptr<const CompiledGrammar> json_schema(const nlohmann::ordered_json& schema,
                                                     SchemaStrictness strictness = SchemaStrictness::kStrict);
  std::shared_ptr<const CompiledGrammar> json_object();
  std::shared_ptr<const CompiledGrammar> regex(std::string_view pattern);
  std::shared_ptr<const CompiledGrammar> choice(const std::vector<std::string>& choices);
  std::shared_ptr<const CompiledGrammar> gbnf(std::string_view grammar_text);
  // Any Grammar (not cached).
  std::shared_ptr<const CompiledGrammar> compile(Grammar grammar) const;

  const std::shared_ptr<const TokenVocabulary>& vocabulary() const { return vocabulary_; }
  // The cache of compiled constraints ("grammars"): at most cache_entries, least recently used evicted.
  CacheGauge cache_gauge();

 private:
  template <typename Build>
  std::shared_ptr<const CompiledGrammar> cached(const std::string& key, Build&& build);

  std::shared_ptr<const TokenVocabulary> vocabulary_;
  size_t cache_entries_;
  GrammarLimits limits_;
  CompileBudget budget_;
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> recent_;  // most recent first
  std::unordered_map<std::string, decltype(recent_)::iterator> by_key_;
  int64_t evictions_ = 0;
  int64_t bytes_ = 0;  // keys plus mask_bytes() of what recent_ holds
};

}  // namespace loom::grammar
