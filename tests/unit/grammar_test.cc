// The grammar module: compilers (accept / reject strings), the matcher's masks
// against a brute-force check of every token, byte-level tokens split inside
// UTF-8 characters, recursion, the end of the grammar, and the limits.
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/constraint_compiler.h"
#include "grammar/gbnf_compiler.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/regex_compiler.h"
#include "util/error.h"

namespace loom::grammar {
namespace {

using Json = nlohmann::json;

// Every single byte, plus multi-byte tokens typical of JSON and of byte-level
// BPE (including halves of UTF-8 characters); the last id is the end token.
std::shared_ptr<const TokenVocabulary> small_vocabulary() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "\"}", "\"]", "},", "}]", "[\"", "true", "false", "null", "ab", "abc", "12",
                        "0.", "-1", "e+", "\\n", "\\u00", "name", "\"name\":", "age", "\xc3", "\xc3\xa9", "\xa9\"",
                        "\xe2\x82", "\xe2\x82\xac", "\xac\"}", "\"\"", "{}", "[]", "a\"", "yes", "no", "maybe", " ",
                        "  ", "\n"})
    tokens.push_back(t);
  tokens.push_back("");  // the end token (its bytes are never used)
  std::vector<bool> excluded(tokens.size(), false);
  return std::make_shared<const TokenVocabulary>(tokens, excluded, std::vector<int32_t>{static_cast<int32_t>(tokens.size() - 1)});
}

std::shared_ptr<const CompiledGrammar> compile(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary = small_vocabulary()) {
  return std::make_shared<const CompiledGrammar>(std::move(grammar), std::move(vocabulary));
}

bool matches(const std::shared_ptr<const CompiledGrammar>& grammar, const std::string& text) {
  GrammarMatcher matcher(grammar);
  return matcher.accept_bytes(text) && matcher.can_end();
}

bool schema_matches(const Json& schema, const std::string& text) { return matches(compile(json_schema_grammar(schema)), text); }

TEST(GrammarRegex, AcceptsAndRejects) {
  const auto g = compile(regex_grammar(R"(^[a-c]+\d{2,3}(x|yz)?$)"));
  EXPECT_TRUE(matches(g, "ab12"));
  EXPECT_TRUE(matches(g, "c123yz"));
  EXPECT_FALSE(matches(g, "ab1"));
  EXPECT_FALSE(matches(g, "ab1234"));
  EXPECT_FALSE(matches(g, "d12"));
  EXPECT_FALSE(matches(g, "ab12y"));
  const auto unicode = compile(regex_grammar("[α-ω]+€?"));
  EXPECT_TRUE(matches(unicode, "αβω€"));
  EXPECT_FALSE(matches(unicode, "αa"));
  const auto dot = compile(regex_grammar(".{2}"));
  EXPECT_TRUE(matches(dot, "é€"));
  EXPECT_FALSE(matches(dot, "\xc3"));
  EXPECT_FALSE(matches(dot, "a\n"));
}

TEST(GrammarRegex, UnsupportedConstructsAreNamed) {
  for (const auto& [pattern, name] : std::vector<std::pair<std::string, std::string>>{
           {"(?=a)b", "lookahead"}, {"(a)\\1", "backreference"}, {"\\bword", "word boundary"}, {"a^b", "'^'"},
           {"(a", "unclosed"}, {"*a", "quantifier"}}) {
    try {
      regex_grammar(pattern);
      ADD_FAILURE() << pattern << " compiled";
    } catch (const Error& error) {
      EXPECT_NE(error.message().find(name), std::string::npos) << pattern << ": " << error.message();
    }
  }
  EXPECT_THROW(regex_grammar("(a*)*"), Error);  // a loop over something empty
  EXPECT_THROW(regex_grammar("a{100001}"), Error);
}

TEST(GrammarRegex, InvalidUtf8IsAnErrorNotAnotherCharacter) {
  // fuzz_regex's crash: 0xCE took the '{' after it as its continuation byte, so the class held U+03BB.
  const std::string crash("[\xce{2\x1e\0\0\0\0]+?{0,9}", 17);
  for (const std::string& pattern : {crash, std::string("[\xce{]"), std::string("a\xce"), std::string("\x80"),
                                     std::string("\xc0\x80"), std::string("\xed\xa0\x80"),
                                     std::string("\xf4\x90\x80\x80"), std::string("\\uD800"),
                                     std::string("[\\uDC00]")}) {
    try {
      regex_grammar(pattern);
      ADD_FAILURE() << pattern << " compiled";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUnsupported) << error.message();
      EXPECT_TRUE(error.message().find("UTF-8") != std::string::npos ||
                  error.message().find("surrogate") != std::string::npos)
          << error.message();
    }
  }
  const auto pair = compile(regex_grammar("\\uD83D\\uDE00|[\\u00e9]"));  // a surrogate pair is one code point
  EXPECT_TRUE(matches(pair, "\xf0\x9f\x98\x80"));
  EXPECT_TRUE(matches(pair, "é"));
  EXPECT_THROW(gbnf_grammar("root ::= \"\xce{\""), Error);
  EXPECT_THROW(gbnf_grammar("root ::= [\xe2\x82]"), Error);
  EXPECT_THROW(gbnf_grammar("root ::= \"\\uD800\""), Error);
}

TEST(GrammarJsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const Json schema = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
      "c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(schema_matches(schema, R"({"b":"x"})"));
  EXPECT_TRUE(schema_matches(schema, R"({"a":-12,"b":"\u00e9\n","c":true})"));
  EXPECT_TRUE(schema_matches(schema, R"({"b":"","c":false})"));
  EXPECT_FALSE(schema_matches(schema, R"({"a":1})"));
  EXPECT_FALSE(schema_matches(schema, R"({"b":"x","d":1})"));
  EXPECT_FALSE(schema_matches(schema, R"({"a":01,"b":"x"})"));
  EXPECT_FALSE(schema_matches(schema, R"({,"b":"x"})"));
  EXPECT_FALSE(schema_matches(schema, R"({"b":"x",})"));
}

TEST(GrammarJsonSchema, ArraysEnumsConstAnyOfAndLengths) {
  EXPECT_TRUE(schema_matches(Json::parse(R"({"type":"array","items":{"enum":["x",1,null]},"minItems":1,"maxItems":2})"), R"(["x",null])"));
  EXPECT_FALSE(schema_matches(Json::parse(R"({"type":"array","items":{"enum":["x",1,null]},"minItems":1,"maxItems":2})"), "[]"));
  EXPECT_FALSE(schema_matches(Json::parse(R"({"type":"array","items":{"enum":["x",1,null]},"minItems":1,"maxItems":2})"), "[1,1,1]"));
  EXPECT_TRUE(schema_matches(Json::parse(R"({"type":"array","prefixItems":[{"type":"number"},{"const":"k"}],"items":false})"), R"([1.5e+3,"k"])"));
  EXPECT_TRUE(schema_matches(Json::parse(R"({"anyOf":[{"type":"null"},{"type":"string","maxLength":2}]})"), R"("ab")"));
  EXPECT_FALSE(schema_matches(Json::parse(R"({"anyOf":[{"type":"null"},{"type":"string","maxLength":2}]})"), R"("abc")"));
  EXPECT_TRUE(schema_matches(Json::parse(R"({"type":"string","minLength":2})"), R"("é€")"));
  EXPECT_FALSE(schema_matches(Json::parse(R"({"type":"string","minLength":2})"), R"("é")"));
  EXPECT_TRUE(schema_matches(Json::parse(R"({"type":"string","pattern":"^[0-9]{3}-\\d$"})"), R"("123-4")"));
  EXPECT_FALSE(schema_matches(Json::parse(R"({"type":"string","pattern":"^[0-9]{3}-\\d$"})"), R"("12-4")"));
  EXPECT_TRUE(schema_matches(Json::parse(R"({"type":"string","format":"date"})"), R"("2024-02-29")"));
  EXPECT_TRUE(schema_matches(Json::parse(R"({"type":["integer","null"]})"), "null"));
}

TEST(GrammarJsonSchema, RecursiveReferences) {
  const Json schema = Json::parse(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{
      "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"]}}})");
  // nlohmann::json sorts keys: converted to the compiler's ordered_json, "kids" comes first.
  EXPECT_TRUE(schema_matches(schema, R"({"kids":[{"kids":[],"v":2},{"kids":[{"kids":[],"v":4}],"v":3}],"v":1})"));
  EXPECT_FALSE(schema_matches(schema, R"({"kids":[{"v":2}],"v":1})"));
}

TEST(GrammarJsonSchema, UnsupportedKeywordsAreNamed) {
  for (const char* keyword : {"multipleOf", "not", "if", "contains"}) {
    Json schema = Json::parse(R"({"type":"object","properties":{"x":{"type":"integer"}}})");
    schema["properties"]["x"][keyword] = 1;
    try {
      json_schema_grammar(schema);
      ADD_FAILURE() << keyword;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUnsupported);
      EXPECT_NE(error.message().find(std::string("'") + keyword + "'"), std::string::npos) << error.message();
      EXPECT_NE(error.message().find("/properties/x"), std::string::npos) << error.message();
    }
  }
  EXPECT_THROW(json_schema_grammar(Json::parse(R"({"$ref":"http://example.com/s"})")), Error);
  EXPECT_THROW(json_schema_grammar(Json::parse(R"({"type":"string","maxLength":100000000})")), Error);
}

TEST(GrammarJsonObject, AnyObject) {
  const auto g = compile(json_object_grammar());
  EXPECT_TRUE(matches(g, R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_FALSE(matches(g, R"({"a":})"));
}

TEST(GrammarGbnf, ParsesLlamaCppStyle) {
  const auto g = compile(gbnf_grammar(R"(
    # a list of words
    root ::= "[" ws item ("," ws item)* "]"
    item ::= [a-z]+ | "\"" [^"\\]* "\""
    ws   ::= [ \t\n]?
  )"));
  EXPECT_TRUE(matches(g, "[ abc, \"é x\",\nz]"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, "[ab,]"));
  EXPECT_THROW(gbnf_grammar("root ::= x"), Error);             // undefined rule
  EXPECT_THROW(gbnf_grammar("root ::= root \"a\" | \"b\""), Error);  // left recursion
  EXPECT_THROW(gbnf_grammar("item ::= \"a\""), Error);         // no root
  try {
    gbnf_grammar("root ::= \"a\"\nx ::= [b");
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("line 2"), std::string::npos) << error.message();
  }
}

// The masks equal a brute-force check of every token, along random walks.
void check_masks_against_brute_force(const std::shared_ptr<const CompiledGrammar>& grammar, uint32_t seed, int max_steps) {
  const TokenVocabulary& vocabulary = grammar->vocabulary();
  const int32_t end_id = vocabulary.end_ids()[0];
  GrammarMatcher matcher(grammar);
  std::mt19937 rng(seed);
  std::vector<uint64_t> mask;
  std::string text;
  for (int step = 0; step < max_steps; ++step) {
    matcher.fill_next_token_bitmask(mask);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < vocabulary.size(); ++id) {
      GrammarMatcher copy = matcher;
      const bool expected = copy.accept_token(id);
      const bool got = (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
      ASSERT_EQ(got, expected) << "token " << id << " '" << vocabulary.bytes(id) << "' after '" << text << "'";
      if (got) allowed.push_back(id);
    }
    ASSERT_FALSE(allowed.empty()) << "dead end after '" << text << "'";
    // Prefer continuing, so that walks go deep.
    int32_t token = allowed[rng() % allowed.size()];
    if (token == end_id && allowed.size() > 1 && step < max_steps / 2) token = allowed[rng() % (allowed.size() - 1)];
    if (token == end_id) token = allowed[rng() % allowed.size()];
    ASSERT_TRUE(matcher.accept_token(token));
    if (token == end_id) {
      EXPECT_TRUE(matcher.is_completed());
      return;
    }
    text += vocabulary.bytes(token);
    if (matcher.is_completed()) return;
  }
}

TEST(GrammarMatcher, MasksEqualBruteForce) {
  const Json schema = Json::parse(R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},
      "age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["yes","no"]}},"x":{"anyOf":[{"type":"null"},
      {"type":"number"}]}},"required":["name"]})");
  const std::vector<std::shared_ptr<const CompiledGrammar>> grammars = {
      compile(json_schema_grammar(schema)), compile(json_object_grammar()), compile(regex_grammar("(ab|é€)+[0-9]?")),
      compile(choice_grammar({"yes", "no", "maybe", "n"})),
      compile(gbnf_grammar("root ::= \"[\" (v (\",\" v)*)? \"]\"\nv ::= root | [a-c]+ | \"\\\"\" [^\"]* \"\\\"\""))};
  for (size_t g = 0; g < grammars.size(); ++g)
    for (uint32_t seed = 0; seed < 6; ++seed) {
      SCOPED_TRACE("grammar " + std::to_string(g) + " seed " + std::to_string(seed));
      check_masks_against_brute_force(grammars[g], seed, 40);
    }
}

TEST(GrammarMatcher, MasksWithoutPrecomputationEqualBruteForce) {
  CompileBudget none;
  none.max_cached_pairs = 0;  // every step walks the whole trie
  const auto grammar = std::make_shared<const CompiledGrammar>(json_object_grammar(), small_vocabulary(), none);
  EXPECT_EQ(grammar->num_cached_pairs(), 0);
  for (uint32_t seed = 0; seed < 4; ++seed) check_masks_against_brute_force(grammar, seed, 40);
}

// Walks `steps` tokens as fuzz_regex does (the lowest allowed token each time); every one must be accepted.
void walk_lowest_allowed(const std::shared_ptr<const CompiledGrammar>& grammar, int steps) {
  GrammarMatcher matcher(grammar);
  std::vector<uint64_t> mask;
  std::string text;
  for (int step = 0; step < steps && !matcher.is_completed(); ++step) {
    matcher.fill_next_token_bitmask(mask);
    int32_t token = -1;
    for (int32_t id = 0; id < grammar->vocabulary().size() && token < 0; ++id)
      if ((mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1) token = id;
    ASSERT_GE(token, 0) << "dead end after '" << text << "'";
    ASSERT_TRUE(matcher.accept_token(token)) << "the mask offered token " << token << " after '" << text << "'";
    text += grammar->vocabulary().bytes(token);
  }
}

TEST(GrammarMatcher, AmbiguousRepetitionsStayWithinTheLimits) {
  // Every parse of an ambiguous repetition pushes its own (equal) return nodes: counted apart, the stacks
  // doubled with each byte until the state overflowed on a token the mask had offered (fuzz_regex's crash).
  for (const char* pattern : {"[\\x00\\x1e2λ]+?{0,9}", "(a|aa)*", "(a|b|ab)+{0,9}c?", "(\\w+\\s?)*",
                              "[\\x01\\x00λ*\\w\\x1e]?{5,99}99}"}) {
    SCOPED_TRACE(pattern);
    const auto grammar = compile(regex_grammar(pattern));
    walk_lowest_allowed(grammar, 200);
    for (uint32_t seed = 0; seed < 2; ++seed) check_masks_against_brute_force(grammar, seed, 40);
  }
  // Paths that meet again share their expansion: a byte of a?{5,99} costs a few expansions per level
  // (~700), not one expansion of every level below each of the ~99 stacks (~25000).
  CompileBudget budget;
  budget.pushdown.max_expansion_work = 1000;
  walk_lowest_allowed(std::make_shared<const CompiledGrammar>(regex_grammar("a?{5,99}"), small_vocabulary(), budget), 99);
}

TEST(GrammarMatcher, ByteLevelTokensSplitInsideUtf8) {
  const auto vocabulary = small_vocabulary();
  const auto grammar = compile(json_schema_grammar(Json::parse(R"({"type":"string"})")), vocabulary);
  GrammarMatcher matcher(grammar);
  auto id_of = [&](const std::string& bytes) {
    for (int32_t id = 0; id < vocabulary->size(); ++id)
      if (vocabulary->bytes(id) == bytes) return id;
    return -1;
  };
  ASSERT_TRUE(matcher.accept_token(id_of("\"")));
  ASSERT_TRUE(matcher.accept_token(id_of("\xe2\x82")));  // two bytes of €
  std::vector<uint64_t> mask;
  matcher.fill_next_token_bitmask(mask);
  auto allowed = [&](const std::string& bytes) { const int32_t id = id_of(bytes); return ((mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1) != 0; };
  EXPECT_TRUE(allowed("\xac\"}") == false);  // completes € then closes the string, but '}' cannot follow
  EXPECT_TRUE(allowed("\xac"));
  EXPECT_FALSE(allowed("\""));  // the character is unfinished
  EXPECT_FALSE(allowed("a"));
  ASSERT_TRUE(matcher.accept_token(id_of("\xac")));
  EXPECT_FALSE(matcher.can_end());
  ASSERT_TRUE(matcher.accept_token(id_of("\"")));
  EXPECT_TRUE(matcher.is_completed());  // nothing but the end is possible
}

TEST(GrammarMatcher, EndTokenOnlyWhereTheGrammarCanEnd) {
  const auto vocabulary = small_vocabulary();
  const int32_t end_id = vocabulary->end_ids()[0];
  const auto grammar = compile(regex_grammar("[0-9]+"), vocabulary);
  GrammarMatcher matcher(grammar);
  std::vector<uint64_t> mask;
  matcher.fill_next_token_bitmask(mask);
  EXPECT_FALSE((mask[static_cast<size_t>(end_id) >> 6] >> (end_id & 63)) & 1);
  EXPECT_FALSE(matcher.accept_token(end_id));
  ASSERT_TRUE(matcher.accept_bytes("12"));
  EXPECT_TRUE(matcher.can_end());
  EXPECT_FALSE(matcher.is_completed());  // more digits may follow
  matcher.fill_next_token_bitmask(mask);
  EXPECT_TRUE((mask[static_cast<size_t>(end_id) >> 6] >> (end_id & 63)) & 1);
  EXPECT_TRUE(matcher.accept_token(end_id));
  EXPECT_TRUE(matcher.is_terminated());
  EXPECT_FALSE(matcher.accept_bytes("1"));
}

TEST(GrammarLimits, OverTheLimitsIsACapacityErrorNotARefusal) {
  // Deep recursion at run time is capped. The masks offer "(" at every depth (the grammar allows it):
  // past the depth limit, accepting it is Error(kCapacity), never a refusal of an offered token.
  const auto grammar = compile(gbnf_grammar("root ::= \"(\" root \")\" | \"x\""));
  GrammarMatcher matcher(grammar);
  const int32_t open = '(';
  std::vector<uint64_t> mask;
  try {
    for (int i = 0; i < 5000; ++i) {
      matcher.fill_next_token_bitmask(mask);
      ASSERT_TRUE((mask[static_cast<size_t>(open) >> 6] >> (open & 63)) & 1) << "depth " << i;
      ASSERT_TRUE(matcher.accept_token(open)) << "the mask offered '(' at depth " << i;
    }
    ADD_FAILURE() << "5000 levels of nesting were followed";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kCapacity) << error.message();
  }
  EXPECT_TRUE(matcher.accept_bytes("x)"));  // the state is unchanged by the failed token
}

TEST(GrammarLimits, HostileInputsFailFast) {
  GrammarLimits small;
  small.max_elements = 1000;
  EXPECT_THROW(regex_grammar("(abcdefghij){1,200}", small), Error);
  std::string deep(500, '(');
  EXPECT_THROW(regex_grammar(deep + "a" + std::string(500, ')')), Error);
  Json nested = Json::parse(R"({"type":"string"})");
  for (int i = 0; i < 100; ++i) nested = Json{{"type", "array"}, {"items", nested}};
  EXPECT_THROW(json_schema_grammar(nested), Error);
}

TEST(ConstraintCompiler, CachesBySchema) {
  ConstraintCompiler compiler(small_vocabulary());
  const auto a = compiler.json_schema(Json::parse(R"({"type":"integer"})"));
  const auto b = compiler.json_schema(Json::parse(R"({"type":"integer"})"));
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), compiler.json_schema(Json::parse(R"({"type":"number"})")).get());
}

TEST(ConstraintCompiler, CacheStaysWithinItsLimitUnderAFloodOfDistinctSchemas) {
  ConstraintCompiler compiler(small_vocabulary(), /*cache_entries=*/16);
  const auto first = compiler.regex("a{1}");
  int64_t bytes_at_limit = 0;
  for (int i = 1; i < 200; ++i) {
    compiler.regex("q" + std::to_string(1000 + i) + "[a-c]{2}");  // distinct, of one size
    const CacheGauge gauge = compiler.cache_gauge();
    EXPECT_EQ(gauge.name, "grammars");
    EXPECT_EQ(gauge.capacity, 16);
    EXPECT_LE(gauge.entries, 16);
    EXPECT_GT(gauge.bytes, 0);
    if (i == 16) bytes_at_limit = gauge.bytes;
  }
  const CacheGauge gauge = compiler.cache_gauge();
  EXPECT_EQ(gauge.entries, 16);
  EXPECT_EQ(gauge.evictions, 200 - 16);
  EXPECT_LT(gauge.bytes, 2 * bytes_at_limit);  // bytes follow the entries held, not all ever compiled
  EXPECT_NE(compiler.regex("a{1}").get(), first.get());  // the oldest went
}

}  // namespace
}  // namespace loom::grammar
