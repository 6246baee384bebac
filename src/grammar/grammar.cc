#include "grammar/grammar.h"

#include <algorithm>

#include "util/error.h"

namespace loom::grammar {

GrammarBuilder::GrammarBuilder(GrammarLimits limits) : limits_(limits) {}

void GrammarBuilder::count_elements(size_t added) {
  num_elements_ += static_cast<int64_t>(added);
  if (num_elements_ > limits_.max_elements)
    fail(ErrorKind::kCapacity, "the grammar is too large (over {} elements); simplify the schema, pattern or grammar",
         limits_.max_elements);
}

int32_t GrammarBuilder::declare_rule(std::string name) {
  if (static_cast<int64_t>(rules_.size()) >= limits_.max_rules)
    fail(ErrorKind::kCapacity, "the grammar is too large (over {} rules)", limits_.max_rules);
  rules_.emplace_back();
  rule_names_.push_back(std::move(name));
  return static_cast<int32_t>(rules_.size() - 1);
}

void GrammarBuilder::add_alternative(int32_t rule, const Sequence& sequence) {
  count_elements(sequence.size() + 1);
  rules_.at(static_cast<size_t>(rule)).push_back(sequence);
}

int32_t GrammarBuilder::num_alternatives(int32_t rule) const {
  return static_cast<int32_t>(rules_.at(static_cast<size_t>(rule)).size());
}

Symbol GrammarBuilder::byte_class(const ByteClass& byte_class) {
  const auto it = std::find(classes_.begin(), classes_.end(), byte_class);
  if (it != classes_.end()) return {false, static_cast<int32_t>(it - classes_.begin())};
  classes_.push_back(byte_class);
  return {false, static_cast<int32_t>(classes_.size() - 1)};
}

Sequence GrammarBuilder::literal(std::string_view bytes) {
  Sequence sequence;
  sequence.reserve(bytes.size());
  for (char c : bytes) sequence.push_back(byte(static_cast<uint8_t>(c)));
  return sequence;
}

Symbol GrammarBuilder::alternatives(const std::vector<Sequence>& options, const std::string& name) {
  const int32_t id = declare_rule(name);
  for (const Sequence& option : options) add_alternative(id, option);
  return rule(id);
}

Symbol GrammarBuilder::optional(const Sequence& sequence, const std::string& name) {
  return alternatives({sequence, {}}, name);
}

Symbol GrammarBuilder::star(const Sequence& sequence, const std::string& name) {
  const int32_t id = declare_rule(name);
  Sequence loop = sequence;
  loop.push_back(rule(id));
  add_alternative(id, loop);
  add_alternative(id, {});
  return rule(id);
}

Sequence GrammarBuilder::repeat(const Sequence& sequence, int64_t min, int64_t max, const std::string& name) {
  if (min < 0 || (max >= 0 && max < min))
    fail(ErrorKind::kInvalidArgument, "bad repetition bounds {{{},{}}} in {}", min, max, name);
  if (min > limits_.max_repetition || max > limits_.max_repetition)
    fail(ErrorKind::kCapacity, "repetition bound {} in {} is over the limit {}", std::max(min, max), name,
         limits_.max_repetition);
  Sequence result;
  count_elements(sequence.size() * static_cast<size_t>(min));
  for (int64_t i = 0; i < min; ++i) result.insert(result.end(), sequence.begin(), sequence.end());
  if (max < 0) {
    result.push_back(star(sequence, name + "*"));
  } else if (max > min) {
    // (x (x (x)?)?)? built inside out: one rule per optional level.
    Sequence tail;
    for (int64_t i = min; i < max; ++i) {
      Sequence level = sequence;
      level.insert(level.end(), tail.begin(), tail.end());
      tail = {optional(level, name + "?")};
    }
    result.insert(result.end(), tail.begin(), tail.end());
  }
  return result;
}

Grammar GrammarBuilder::build(int32_t root_rule) {
  const size_t num_rules = rules_.size();
  LOOM_CHECK(root_rule >= 0 && static_cast<size_t>(root_rule) < num_rules);
  for (size_t r = 0; r < num_rules; ++r)
    if (rules_[r].empty())
      fail(ErrorKind::kInvalidArgument, "grammar rule '{}' matches nothing (it has no alternatives)", rule_names_[r]);

  // Nullable rules (fixpoint), then the "first symbol" graph: r -> s when s can
  // be reached in r without consuming a byte. A cycle there would make the
  // matcher expand forever.
  std::vector<char> nullable(num_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < num_rules; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alt : rules_[r]) {
        const bool all = std::all_of(alt.begin(), alt.end(), [&](const Symbol& s) { return s.is_rule && nullable[static_cast<size_t>(s.id)]; });
        if (all) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int32_t>> first_edges(num_rules);
  for (size_t r = 0; r < num_rules; ++r)
    for (const Sequence& alt : rules_[r])
      for (const Symbol& s : alt) {
        if (!s.is_rule) break;
        first_edges[r].push_back(s.id);
        if (!nullable[static_cast<size_t>(s.id)]) break;
      }
  // Iterative DFS (0 = new, 1 = on the path, 2 = done).
  std::vector<char> mark(num_rules, 0);
  for (size_t start = 0; start < num_rules; ++start) {
    if (mark[start]) continue;
    std::vector<std::pair<int32_t, size_t>> path{{static_cast<int32_t>(start), 0}};
    mark[start] = 1;
    while (!path.empty()) {
      auto& [rule, next] = path.back();
      const auto& edges = first_edges[static_cast<size_t>(rule)];
      if (next == edges.size()) {
        mark[static_cast<size_t>(rule)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t target = edges[next++];
      if (mark[static_cast<size_t>(target)] == 1)
        fail(ErrorKind::kInvalidArgument,
             "grammar rule '{}' is left-recursive (it reaches itself without consuming input; a repetition of "
             "something that can be empty does too)",
             rule_names_[static_cast<size_t>(target)]);
      if (mark[static_cast<size_t>(target)] == 0) {
        mark[static_cast<size_t>(target)] = 1;
        path.emplace_back(target, 0);
      }
    }
  }

  Grammar grammar;
  grammar.classes = std::move(classes_);
  grammar.rule_names = std::move(rule_names_);
  grammar.root_rule = root_rule;
  grammar.rule_alternatives.resize(num_rules);
  grammar.elements.reserve(static_cast<size_t>(num_elements_));
  for (size_t r = 0; r < num_rules; ++r) {
    for (const Sequence& alt : rules_[r]) {
      grammar.rule_alternatives[r].push_back(static_cast<int32_t>(grammar.elements.size()));
      for (const Symbol& s : alt)
        grammar.elements.push_back({s.is_rule ? Element::Kind::kRule : Element::Kind::kBytes, s.id});
      grammar.elements.push_back({Element::Kind::kEnd, 0});
    }
  }
  rules_.clear();
  return grammar;
}

}  // namespace loom::grammar
