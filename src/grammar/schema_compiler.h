// The JSON-schema compiler's internals (json_schema_compiler.h is the
// interface): one SchemaCompiler per compilation, writing rules into a
// GrammarBuilder. Split over schema_compiler.cc (dispatch, scalars) and
// schema_containers.cc (objects and arrays).
//
// Keywords no grammar here can enforce go through unenforceable(): strict,
// it throws Error(kUnsupported) naming the keyword and its path; lenient, it
// records them and the caller compiles the schema as if they were absent.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/number_grammar.h"
#include "grammar/regex_compiler.h"

namespace loom::grammar {

class SchemaCompiler {
 public:
  using Json = nlohmann::ordered_json;

  SchemaCompiler(GrammarBuilder& builder, const Json& root, bool strict)
      : builder_(builder), root_(root), strict_(strict) {}

  // The rule for `schema` (at JSON pointer `path`).
  Symbol compile(const Json& schema, const std::string& path, int32_t depth);
  Symbol any_value();
  Symbol any_object();
  std::vector<UnenforcedKeyword> take_unenforced() { return std::move(unenforced_); }

 private:
  void unenforceable(const char* keyword, const std::string& path);
  void check_unenforceable_keywords(const Json& schema, const std::string& path);
  std::vector<std::string> types_of(const Json& schema, const std::string& path);
  Symbol typed(const Json& schema, const std::string& type, const std::string& path, int32_t depth);
  Symbol reference(const Json& ref, const std::string& path, int32_t depth);
  const Json* resolve(const std::string& target) const;
  Symbol enumeration(const Json& values, const std::string& path);
  Symbol any_of(const Json& schemas, const std::string& path, int32_t depth);

  // Scalars (schema_compiler.cc).
  Symbol string_character();
  Symbol string(const Json& schema, const std::string& path);
  Symbol plain_string();
  int64_t checked_regex_max_length(const std::string& pattern, const RegexOptions& options, const std::string& path);
  std::optional<int64_t> open_repeat_cap(const std::string& pattern, RegexOptions options, int64_t max_length,
                                         const std::string& path);
  NumberBounds number_bounds(const Json& schema, const std::string& path);
  Symbol integer(const Json& schema, const std::string& path);
  Symbol number(const Json& schema, const std::string& path);
  Sequence integer_part();

  // Containers (schema_containers.cc).
  Symbol object(const Json& schema, const std::string& path, int32_t depth);
  std::optional<Symbol> property_key(const Json& schema, const std::string& path);
  Symbol array(const Json& schema, const std::string& path, int32_t depth);
  std::optional<std::vector<std::string>> finite_values(const Json& schema, int32_t depth);
  Symbol unique_array(const std::vector<std::string>& values, int64_t min_items, int64_t max_items, const std::string& path);
  std::optional<Symbol> ordered_unique_array(const std::vector<std::string>& values, int64_t min_items,
                                             int64_t max_items, const std::string& path);

  GrammarBuilder& builder_;
  const Json& root_;
  const bool strict_;
  std::vector<UnenforcedKeyword> unenforced_;
  std::map<std::string, int32_t> refs_;
  std::optional<Symbol> string_char_, plain_string_, integer_, number_, any_value_, any_object_;
};

// A non-negative integer keyword (minLength, maxItems...): `fallback` when absent.
int64_t read_count(const nlohmann::ordered_json& schema, const char* key, int64_t fallback, const std::string& path);

}  // namespace loom::grammar
