// The grammar IR every structured-output constraint compiles into: a
// context-free grammar over BYTES (not characters: UTF-8 is spelled out as byte
// sequences, so byte-level BPE tokens that split a character are handled by
// the same machinery as any other token).
//
//   rule      := alternative ( "|" alternative )*
//   alternative := element* END
//   element   := byte class (a set of bytes, matches one byte) | reference to a rule
//
// Repetition, optionals and literals are lowered by GrammarBuilder into helper
// rules (x* is R ::= x R | "" — right recursion, which the matcher runs as a
// tail call in constant stack). Alternatives of all rules live in one flat
// array, `elements`: a position (index into it) is what the matcher's stacks hold.
//
// Invariants of a built Grammar (GrammarBuilder::build checks them): every rule
// has at least one alternative; no rule reaches itself without consuming a
// byte (left recursion, or a loop over something that can be empty), so the
// matcher's expansion always terminates; sizes are under GrammarLimits.
// A Grammar is immutable once built and shared read-only across threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::grammar {

// 256 bits: which bytes a class element matches.
struct ByteClass {
  std::array<uint64_t, 4> bits{};

  bool has(uint8_t byte) const { return (bits[byte >> 6] >> (byte & 63)) & 1; }
  void add(uint8_t byte) { bits[byte >> 6] |= uint64_t{1} << (byte & 63); }
  void add_range(uint8_t first, uint8_t last) {
    for (int b = first; b <= last; ++b) add(static_cast<uint8_t>(b));
  }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  ByteClass complement() const { return {{~bits[0], ~bits[1], ~bits[2], ~bits[3]}}; }
  bool operator==(const ByteClass&) const = default;
  static ByteClass of(uint8_t byte) {
    ByteClass c;
    c.add(byte);
    return c;
  }
  static ByteClass range(uint8_t first, uint8_t last) {
    ByteClass c;
    c.add_range(first, last);
    return c;
  }
};

struct Element {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  int32_t value = 0;  // kBytes: index into Grammar::classes; kRule: rule id
};

// A keyword of a grammar's source that the grammar does not enforce (a JSON
// schema compiled leniently: what no grammar here can express).
struct UnenforcedKeyword {
  std::string keyword;  // "uniqueItems"
  std::string path;     // where, as a JSON pointer into the schema ("" = the root)
};

struct Grammar {
  std::vector<ByteClass> classes;
  std::vector<Element> elements;  // every alternative, each ending with a kEnd element
  std::vector<std::vector<int32_t>> rule_alternatives;  // per rule: the positions its alternatives start at
  std::vector<std::string> rule_names;                  // for error messages
  int32_t root_rule = 0;
  std::vector<UnenforcedKeyword> unenforced;  // empty unless the compiler was lenient

  const ByteClass& byte_class_at(int32_t position) const { return classes[static_cast<size_t>(elements[static_cast<size_t>(position)].value)]; }
  int32_t num_rules() const { return static_cast<int32_t>(rule_alternatives.size()); }
};

// What one compiled grammar may cost (a hostile schema or pattern must fail
// with an Error, not exhaust memory). Exceeding one throws Error(kCapacity).
struct GrammarLimits {
  int32_t max_elements = 500000;
  int32_t max_rules = 100000;
  int32_t max_repetition = 10000;  // largest finite bound of {m,n}, maxLength, maxItems...
};

// A symbol of a sequence under construction: a byte class or a rule.
struct Symbol {
  bool is_rule = false;
  int32_t id = 0;  // class id or rule id
};
using Sequence = std::vector<Symbol>;

// Builds a Grammar. Compilers (JSON schema, regex, GBNF, choice) call it; one
// builder per compilation, not thread-safe.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(GrammarLimits limits = {});

  // A new rule with no alternatives yet (define it later with add_alternative:
  // this is how recursive rules are made).
  int32_t declare_rule(std::string name);
  void add_alternative(int32_t rule, const Sequence& sequence);
  int32_t num_alternatives(int32_t rule) const;
  const std::string& rule_name(int32_t rule) const { return rule_names_[static_cast<size_t>(rule)]; }

  Symbol byte_class(const ByteClass& byte_class);  // deduplicated
  Symbol byte(uint8_t value) { return byte_class(ByteClass::of(value)); }
  Sequence literal(std::string_view bytes);
  static Symbol rule(int32_t id) { return {true, id}; }

  // Combinators; each returns a symbol for a new helper rule named after `name`.
  Symbol alternatives(const std::vector<Sequence>& options, const std::string& name);
  Symbol optional(const Sequence& sequence, const std::string& name);
  Symbol star(const Sequence& sequence, const std::string& name);  // zero or more
  // min..max repetitions (max < 0: unbounded). Error(kCapacity) past limits.max_repetition.
  Sequence repeat(const Sequence& sequence, int64_t min, int64_t max, const std::string& name);

  // Validates (every rule defined; no left recursion or empty loops, Error(kInvalidArgument)
  // naming the rule) and returns the grammar. The builder is spent afterwards.
  Grammar build(int32_t root_rule);

  const GrammarLimits& limits() const { return limits_; }

 private:
  void count_elements(size_t added);

  GrammarLimits limits_;
  std::vector<ByteClass> classes_;
  std::vector<std::vector<Sequence>> rules_;
  std::vector<std::string> rule_names_;
  int64_t num_elements_ = 0;
};

}  // namespace loom::grammar
