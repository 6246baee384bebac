#include "grammar/constraint_compiler.h"

#include <nlohmann/json.hpp>

#include "grammar/gbnf_compiler.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/regex_compiler.h"

namespace loom::grammar {

ConstraintCompiler::ConstraintCompiler(std::shared_ptr<const TokenVocabulary> vocabulary, size_t cache_entries,
                                       GrammarLimits limits, CompileBudget budget)
    : vocabulary_(std::move(vocabulary)), cache_entries_(cache_entries), limits_(limits), budget_(budget) {}

std::shared_ptr<const CompiledGrammar> ConstraintCompiler::compile(Grammar grammar) const {
  return std::make_shared<const CompiledGrammar>(std::move(grammar), vocabulary_, budget_);
}

template <typename Build>
std::shared_ptr<const CompiledGrammar> ConstraintCompiler::cached(const std::string& key, Build&& build) {
  {
    std::lock_guard lock(mutex_);
    if (const auto it = by_key_.find(key); it != by_key_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: two threads may compile the same key once each.
  auto compiled = compile(build());
  std::lock_guard lock(mutex_);
  if (by_key_.contains(key) || cache_entries_ == 0) return compiled;
  recent_.emplace_front(key, compiled);
  by_key_[key] = recent_.begin();
  bytes_ += static_cast<int64_t>(key.size()) + compiled->mask_bytes();
  if (recent_.size() > cache_entries_) {
    const auto& [oldest_key, oldest] = recent_.back();
    bytes_ -= static_cast<int64_t>(oldest_key.size()) + oldest->mask_bytes();
    by_key_.erase(oldest_key);
    recent_.pop_back();
    ++evictions_;
  }
  return compiled;
}

CacheGauge ConstraintCompiler::cache_gauge() {
  std::lock_guard lock(mutex_);
  return {"grammars", static_cast<int64_t>(recent_.size()), static_cast<int64_t>(cache_entries_), bytes_, evictions_};
}

std::shared_ptr<const CompiledGrammar> ConstraintCompiler::json_schema(const nlohmann::ordered_json& schema,
                                                                    SchemaStrictness strictness) {
  const char* mode = strictness == SchemaStrictness::kStrict ? "json_schema strict\n" : "json_schema lenient\n";
  return cached(mode + schema.dump(), [&] { return json_schema_grammar(schema, limits_, strictness); });
}

std::shared_ptr<const CompiledGrammar> ConstraintCompiler::json_object() {
  return cached("json_object", [&] { return json_object_grammar(limits_); });
}

std::shared_ptr<const CompiledGrammar> ConstraintCompiler::regex(std::string_view pattern) {
  return cached("regex\n" + std::string(pattern), [&] { return regex_grammar(pattern, limits_); });
}

std::shared_ptr<const CompiledGrammar> ConstraintCompiler::choice(const std::vector<std::string>& choices) {
  return cached("choice\n" + nlohmann::json(choices).dump(), [&] { return choice_grammar(choices, limits_); });
}

std::shared_ptr<const CompiledGrammar> ConstraintCompiler::gbnf(std::string_view grammar_text) {
  return cached("gbnf\n" + std::string(grammar_text), [&] { return gbnf_grammar(grammar_text, limits_); });
}

}  // namespace loom::grammar
