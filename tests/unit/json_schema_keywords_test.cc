// The JSON-schema keywords beyond types and shapes: numeric bounds (exact for
// integers, sound for numbers), string formats, uniqueItems, member counts,
// patternProperties, propertyNames, member order, and the strict / lenient
// split for what no grammar enforces (grammar/json_schema_compiler.h).
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/regex_compiler.h"
#include "util/error.h"

namespace loom::grammar {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const TokenVocabulary> byte_vocabulary() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  tokens.push_back("");  // the end token
  return std::make_shared<const TokenVocabulary>(tokens, std::vector<bool>(tokens.size(), false),
                                                 std::vector<int32_t>{static_cast<int32_t>(tokens.size() - 1)});
}

class Schema {
 public:
  explicit Schema(const std::string& text, SchemaStrictness strictness = SchemaStrictness::kStrict)
      : grammar_(std::make_shared<const CompiledGrammar>(json_schema_grammar(Json::parse(text), {}, strictness),
                                                         vocabulary())) {}
  bool accepts(const std::string& text) const {
    GrammarMatcher matcher(grammar_);
    return matcher.accept_bytes(text) && matcher.can_end();
  }
  const std::vector<UnenforcedKeyword>& unenforced() const { return grammar_->grammar().unenforced; }
  // An output of a walk choosing uniformly among the allowed bytes (the end, when allowed, with
  // probability `end_chance`), as a sampler under the grammar's masks would.
  std::string random_output(std::mt19937& random, double end_chance = 0.2) const {
    GrammarMatcher matcher(grammar_);
    std::string text;
    std::vector<uint64_t> mask;
    while (!matcher.is_completed()) {
      if (matcher.can_end() && std::bernoulli_distribution(end_chance)(random)) break;
      matcher.fill_next_token_bitmask(mask);
      std::vector<int32_t> bytes;
      for (int32_t b = 0; b < 256; ++b)
        if ((mask[static_cast<size_t>(b) >> 6] >> (b & 63)) & 1) bytes.push_back(b);
      if (bytes.empty()) break;
      const int32_t b = bytes[std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(random)];
      EXPECT_TRUE(matcher.accept_bytes(std::string(1, static_cast<char>(b))));
      text.push_back(static_cast<char>(b));
    }
    EXPECT_TRUE(matcher.can_end() || matcher.is_completed()) << text;
    return text;
  }

 private:
  static std::shared_ptr<const TokenVocabulary> vocabulary() {
    static const auto shared = byte_vocabulary();
    return shared;
  }
  std::shared_ptr<const CompiledGrammar> grammar_;
};

// The error a strict compile of `text` throws ("" when none).
std::string strict_error(const std::string& text) {
  try {
    json_schema_grammar(Json::parse(text));
  } catch (const Error& error) {
    return error.message();
  }
  return "";
}

TEST(SchemaIntegerBounds, ExactAtTheEdges) {
  const Schema percent(R"({"type":"integer","minimum":0,"maximum":100})");
  for (const char* ok : {"0", "1", "9", "10", "42", "99", "100"}) EXPECT_TRUE(percent.accepts(ok)) << ok;
  for (const char* bad : {"-1", "101", "110", "1000", "00", "007", "-0", "1.0", "1e2", ""})
    EXPECT_FALSE(percent.accepts(bad)) << bad;

  const Schema open(R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})");
  EXPECT_FALSE(open.accepts("0"));
  EXPECT_TRUE(open.accepts("1"));
  EXPECT_TRUE(open.accepts("9"));
  EXPECT_FALSE(open.accepts("10"));

  const Schema draft4(R"({"type":"integer","minimum":5,"exclusiveMinimum":true})");  // draft 4's boolean form
  EXPECT_FALSE(draft4.accepts("5"));
  EXPECT_TRUE(draft4.accepts("6"));
  EXPECT_TRUE(draft4.accepts("123456789012"));

  const Schema fractional(R"({"type":"integer","minimum":-2.5,"maximum":3.5})");
  EXPECT_TRUE(fractional.accepts("-2"));
  EXPECT_FALSE(fractional.accepts("-3"));
  EXPECT_TRUE(fractional.accepts("3"));
  EXPECT_FALSE(fractional.accepts("4"));
}

// Every integer in [-1100, 1100] against a set of ranges: accepted exactly when inside.
TEST(SchemaIntegerBounds, EveryValueAgainstManyRanges) {
  struct Range {
    std::optional<int64_t> lo, hi;
  };
  const Range ranges[] = {{0, 100},   {-25, -3},   {-999, 999}, {7, 7},         {-1, 0},  {13, 1000},
                          {-1000, -999}, {5, std::nullopt}, {std::nullopt, -5}, {std::nullopt, 250},
                          {-250, std::nullopt}, {99, 101}, {-101, 1009}};
  for (const Range& range : ranges) {
    Json schema = {{"type", "integer"}};
    if (range.lo) schema["minimum"] = *range.lo;
    if (range.hi) schema["maximum"] = *range.hi;
    const Schema compiled(schema.dump());
    for (int64_t v = -1100; v <= 1100; ++v) {
      const bool inside = (!range.lo || v >= *range.lo) && (!range.hi || v <= *range.hi);
      ASSERT_EQ(compiled.accepts(std::to_string(v)), inside) << schema.dump() << " " << v;
    }
    EXPECT_FALSE(compiled.accepts("-0"));
    EXPECT_EQ(compiled.accepts("123456789"), !range.hi) << schema.dump();
  }
  EXPECT_NE(strict_error(R"({"type":"integer","minimum":5,"maximum":4})"), "");  // nothing in range
}

// Numbers: whatever is accepted is in range; integers in range and decimals inside whole units are accepted.
TEST(SchemaNumberBounds, SoundAndCoveringTheCommonCases) {
  const Schema unit(R"({"type":"number","minimum":0,"maximum":1})");
  for (const char* ok : {"0", "1", "0.5", "0.999", "0.0"}) EXPECT_TRUE(unit.accepts(ok)) << ok;
  for (const char* bad : {"-0.1", "1.5", "2", "1e0", "-1", ".5", "01"}) EXPECT_FALSE(unit.accepts(bad)) << bad;

  const Schema positive(R"({"type":"number","exclusiveMinimum":0})");
  for (const char* ok : {"1", "0.001", "3.25", "1000000.5"}) EXPECT_TRUE(positive.accepts(ok)) << ok;
  for (const char* bad : {"0", "0.0", "0.000", "-0.5", "-3"}) EXPECT_FALSE(positive.accepts(bad)) << bad;

  const Schema negative(R"({"type":"number","exclusiveMaximum":0,"minimum":-10})");
  for (const char* ok : {"-0.5", "-10", "-9.99", "-1"}) EXPECT_TRUE(negative.accepts(ok)) << ok;
  for (const char* bad : {"0", "-0.0", "0.5", "-10.5", "-11"}) EXPECT_FALSE(negative.accepts(bad)) << bad;

  // A range without an integer or a whole unit: named under strict, listed otherwise; an empty one is an error.
  EXPECT_NE(strict_error(R"({"type":"number","minimum":0.25,"maximum":0.75})").find("'minimum'"), std::string::npos);
  const Schema narrow(R"({"type":"number","minimum":0.25,"maximum":0.75})", SchemaStrictness::kLenient);
  EXPECT_EQ(narrow.unenforced().size(), 2u);
  EXPECT_NE(strict_error(R"({"type":"number","minimum":2,"exclusiveMaximum":2})").find("no value"), std::string::npos);

  // Soundness over many candidates and ranges, fractional bounds included.
  const std::pair<double, double> ranges[] = {{-1.5, 2.5}, {0, 10}, {-7, -2}, {0.25, 3}, {-100, 100}};
  for (const auto& [lo, hi] : ranges) {
    for (const bool exclusive : {false, true}) {
      Json schema = {{"type", "number"}};
      schema[exclusive ? "exclusiveMinimum" : "minimum"] = lo;
      schema[exclusive ? "exclusiveMaximum" : "maximum"] = hi;
      const Schema compiled(schema.dump());
      for (int whole = -120; whole <= 120; ++whole) {
        for (const char* fraction : {"", ".0", ".25", ".5", ".75", ".999"}) {
          for (const bool minus : {false, true}) {
            if (minus && whole != 0) continue;
            const std::string text = (minus ? "-" : "") + std::to_string(whole) + fraction;
            const double value = std::stod(text);
            const bool inside = (exclusive ? value > lo : value >= lo) && (exclusive ? value < hi : value <= hi);
            if (compiled.accepts(text)) {
              ASSERT_TRUE(inside) << schema.dump() << " accepted " << text;
            }
            if (inside && *fraction == '\0' && !minus) {
              ASSERT_TRUE(compiled.accepts(text)) << schema.dump() << " " << text;
            }
          }
        }
      }
    }
  }
}

TEST(SchemaFormats, ValidSamplesAcceptedInvalidRefused) {
  struct Case {
    const char* format;
    std::vector<const char*> valid, invalid;
  };
  const Case cases[] = {
      {"uri",
       {"https://example.com/a/b?x=1&y=2#top", "http://user:pw@[2001:db8::1]:8080/p", "urn:isbn:0451450523",
        "mailto:a@b.c", "file:///etc/hosts", "a:"},
       {"example.com", "http://exa mple.com", "1http://x", "://x", "http://x/%zz", ""}},
      {"uri-reference", {"/a/b", "../x?y#z", "https://x.org", "", "#frag", "a/b:c"}, {"a b", "x:y z", "%g0"}},
      {"hostname", {"example.com", "a-b.c", "localhost", "x1.y2.z3"}, {"-a.com", "a-.com", "a..b", "a_b", ".a", "a."}},
      {"ipv6",
       {"::1", "::", "2001:db8::8a2e:370:7334", "fe80:0:0:0:0:0:0:1", "1::", "1:2:3:4:5:6:7::"},
       {"2001:::1", "12345::", "1:2:3:4:5:6:7:8:9", "1:2", "::g", "1::2::3"}},
      {"date-time",
       {"2024-02-29T12:30:00Z", "2024-02-29T12:30:00.5+01:00", "1999-12-31t23:59:60-08:00"},
       {"2024-13-01T00:00:00Z", "2024-01-01T25:00:00Z", "2024-01-01T00:00:00", "2024-01-01"}},
      {"date", {"2024-02-29", "0001-01-01"}, {"2024-00-10", "2024-1-1", "2024-01-32"}},
      {"time", {"23:59:60Z", "00:00:00.123+05:30"}, {"24:00:00Z", "12:00:00", "12:60:00Z"}},
      {"duration",
       {"P1D", "PT1H30M", "P1Y2M3DT4H5M6.5S", "P2W", "PT0S", "P1M"},
       {"P", "PT", "P1H", "1D", "P1DT", "P1W2D"}},
  };
  for (const Case& c : cases) {
    const Schema schema(Json({{"type", "string"}, {"format", c.format}}).dump());
    for (const char* text : c.valid) EXPECT_TRUE(schema.accepts(Json(text).dump())) << c.format << ": " << text;
    for (const char* text : c.invalid) EXPECT_FALSE(schema.accepts(Json(text).dump())) << c.format << ": " << text;
  }
}

TEST(SchemaUniqueItems, EnforcedOverFewValues) {
  const Schema letters(R"({"type":"array","items":{"enum":["a","b","c"]},"uniqueItems":true})");
  for (const char* ok : {R"([])", R"(["a"])", R"(["a","c"])", R"(["c","a","b"])"}) EXPECT_TRUE(letters.accepts(ok)) << ok;
  for (const char* bad : {R"(["a","a"])", R"(["a","b","a"])", R"(["d"])"}) EXPECT_FALSE(letters.accepts(bad)) << bad;
  EXPECT_TRUE(letters.unenforced().empty());

  const Schema bounded(R"({"type":"array","items":{"$ref":"#/$defs/c"},"uniqueItems":true,"minItems":2,"maxItems":2,
                           "$defs":{"c":{"type":"boolean"}}})");
  EXPECT_TRUE(bounded.accepts("[true,false]"));
  EXPECT_TRUE(bounded.accepts("[false,true]"));
  EXPECT_FALSE(bounded.accepts("[true,true]"));
  EXPECT_FALSE(bounded.accepts("[true]"));

  // Strings: no grammar here enforces it. Strict: named; lenient: listed, the rest still enforced.
  const std::string strings = R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"},
                                  "uniqueItems":true,"maxItems":2}},"required":["tags"]})";
  const std::string error = strict_error(strings);
  EXPECT_NE(error.find("'uniqueItems'"), std::string::npos) << error;
  EXPECT_NE(error.find("/properties/tags"), std::string::npos) << error;
  const Schema lenient(strings, SchemaStrictness::kLenient);
  ASSERT_EQ(lenient.unenforced().size(), 1u);
  EXPECT_EQ(lenient.unenforced()[0].keyword, "uniqueItems");
  EXPECT_EQ(lenient.unenforced()[0].path, "/properties/tags");
  EXPECT_TRUE(lenient.accepts(R"({"tags":["x","y"]})"));
  EXPECT_FALSE(lenient.accepts(R"({"tags":["x","y","z"]})"));
}

TEST(SchemaUniqueItems, ManyValuesInTheirOrder) {
  // 12 values: more than the 2^n states take; the items come in the enum's order (sound, not complete).
  Json values = Json::array();
  for (int i = 0; i < 12; ++i) values.push_back("v" + std::to_string(i));
  const Json many = {{"type", "array"}, {"items", {{"enum", values}}}, {"uniqueItems", true}};
  EXPECT_EQ(strict_error(many.dump()), "");
  const Schema ordered(many.dump());
  for (const char* ok : {R"([])", R"(["v0"])", R"(["v0","v3","v11"])", R"(["v10","v11"])"})
    EXPECT_TRUE(ordered.accepts(ok)) << ok;
  for (const char* bad : {R"(["v1","v1"])", R"(["v3","v0"])", R"(["v12"])"}) EXPECT_FALSE(ordered.accepts(bad)) << bad;

  // With item counts: every walk is a distinct, counted list.
  Json counted = many;
  counted["minItems"] = 2;
  counted["maxItems"] = 4;
  const Schema bounded(counted.dump());
  std::mt19937 random(7);
  for (int walk = 0; walk < 200; ++walk) {
    const std::string text = bounded.random_output(random);
    const Json items = Json::parse(text);
    const std::set<std::string> distinct(items.begin(), items.end());
    EXPECT_EQ(distinct.size(), items.size()) << text;
    EXPECT_GE(items.size(), 2u) << text;
    EXPECT_LE(items.size(), 4u) << text;
  }
  // minItems past what distinct values allow: refused.
  counted["minItems"] = 13;
  counted.erase("maxItems");
  EXPECT_NE(strict_error(counted.dump()).find("minItems"), std::string::npos);
}

TEST(SchemaUniqueItems, IntegerRanges) {
  // set[Annotated[int, Field(ge=0, le=5)]]: six values, any order.
  const Schema small(R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":5},"uniqueItems":true})");
  EXPECT_TRUE(small.unenforced().empty());
  EXPECT_TRUE(small.accepts("[5,0,3]"));
  EXPECT_FALSE(small.accepts("[1,1]"));
  EXPECT_FALSE(small.accepts("[6]"));
  // 30 values (exclusive bounds): ascending; an open range stays unenforced.
  const Schema range(R"({"type":"array","items":{"type":"integer","exclusiveMinimum":-1,"exclusiveMaximum":30},
                         "uniqueItems":true})");
  EXPECT_TRUE(range.accepts("[0,7,29]"));
  EXPECT_FALSE(range.accepts("[7,7]"));
  EXPECT_FALSE(range.accepts("[30]"));
  EXPECT_NE(strict_error(R"({"type":"array","items":{"type":"integer","minimum":0},"uniqueItems":true})").find("'uniqueItems'"),
            std::string::npos);
}

TEST(SchemaStringLength, MaxLengthBesideAFormatBoundsItsRepetitions) {
  // Pydantic's HttpUrl.
  const std::string http_url = R"({"type":"string","format":"uri","minLength":1,"maxLength":2083})";
  EXPECT_EQ(strict_error(http_url), "");
  const Schema url(http_url);
  for (const char* ok : {"https://example.com/a/b?x=1&y=2#top", "https://docs.python.org/3/library/urllib.parse.html",
                         "http://user:pw@[2001:db8::1]:8080/p", "urn:isbn:0451450523"})
    EXPECT_TRUE(url.accepts(Json(ok).dump())) << ok;
  EXPECT_FALSE(url.accepts(Json("https://example.com/" + std::string(3000, 'a')).dump()));
  EXPECT_FALSE(url.accepts(R"("not a uri")"));
  // The cap: 23 repetitions past the minimum (a host of 23 characters, not 24).
  EXPECT_TRUE(url.accepts(Json("https://" + std::string(23, 'h') + "/p").dump()));
  EXPECT_FALSE(url.accepts(Json("https://" + std::string(24, 'h') + "/p").dump()));

  // A smaller bound (a cap of 8): every walk is a URI the unbounded format accepts, no longer than the bound.
  const Schema short_url(R"({"type":"string","format":"uri","maxLength":400})");
  const Schema any_url(R"({"type":"string","format":"uri"})");
  EXPECT_TRUE(short_url.unenforced().empty());
  std::mt19937 random(3);
  size_t longest = 0;
  for (int walk = 0; walk < 300; ++walk) {
    const std::string text = short_url.random_output(random, 0.01);
    const size_t length = Json::parse(text).get<std::string>().size();
    longest = std::max(longest, length);
    EXPECT_LE(length, 400u) << text;
    EXPECT_TRUE(any_url.accepts(text)) << text;
  }
  EXPECT_GT(longest, 40u);  // past what a 48-character bound would allow
  // Too small for a cap of 8 (a bracketed IPv6 host alone is 41 characters): left unenforced.
  EXPECT_NE(strict_error(R"({"type":"string","format":"uri","maxLength":48})").find("'maxLength'"), std::string::npos);
  const Schema cramped(R"({"type":"string","format":"uri","maxLength":48})", SchemaStrictness::kLenient);
  ASSERT_EQ(cramped.unenforced().size(), 1u);
  EXPECT_EQ(cramped.unenforced()[0].keyword, "maxLength");

  // A pattern: its open repetitions bounded likewise; one that implies the bound is enforced as it is.
  const Schema slug(R"({"type":"string","pattern":"^[a-z]+(-[a-z]+)*$","maxLength":200})");
  EXPECT_TRUE(slug.accepts(R"("abc-def-gh")"));
  EXPECT_FALSE(slug.accepts(Json(std::string(201, 'a')).dump()));
  for (int walk = 0; walk < 200; ++walk) {
    const std::string text = slug.random_output(random, 0.01);
    EXPECT_LE(Json::parse(text).get<std::string>().size(), 200u) << text;
  }
  const Schema implied(R"({"type":"string","pattern":"^[a-z]{2,5}$","maxLength":5})");
  EXPECT_TRUE(implied.accepts(R"("abcde")"));
  EXPECT_FALSE(implied.accepts(R"("abcdef")"));
  // The pattern's own bounded repetition is too long, or the bound leaves too little room: unenforced.
  EXPECT_NE(strict_error(R"({"type":"string","pattern":"^[a-z]+(-[a-z]+)*$","maxLength":12})").find("'maxLength'"),
            std::string::npos);
  EXPECT_NE(strict_error(R"({"type":"string","pattern":"^[a-z]{20}$","maxLength":10})").find("'maxLength'"),
            std::string::npos);
}

TEST(RegexMaxLength, CountsCharactersAndHonoursTheCap) {
  EXPECT_EQ(regex_max_length("a(bc)*"), -1);
  RegexOptions capped;
  capped.open_repeat_cap = 2;
  EXPECT_EQ(regex_max_length("a(bc)*", capped), 5);
  EXPECT_EQ(regex_max_length("a(bc)+", capped), 7);  // the minimum, then up to two more
  EXPECT_EQ(regex_max_length("x{3,}", capped), 5);
  EXPECT_EQ(regex_max_length(R"(\d{3}-\d{4})"), 8);
  EXPECT_EQ(regex_max_length("(ab|cde)?x"), 4);
  EXPECT_EQ(regex_max_length("[é-ü]{2}"), 2);  // characters, not bytes
  RegexOptions json;
  json.json_string = true;
  EXPECT_EQ(regex_max_length(R"(\"{2})", json), 2);  // an escaped quote is one character of the string
  EXPECT_THROW(regex_max_length("(a"), Error);
}

TEST(SchemaObjects, MembersInPropertiesOrder) {
  const Schema schema(R"({"type":"object","properties":{"reasoning":{"type":"string"},"answer":{"type":"integer"},
                          "confidence":{"type":"number"}},"required":["reasoning","answer"]})");
  EXPECT_TRUE(schema.accepts(R"({"reasoning":"r","answer":1,"confidence":0.5})"));
  EXPECT_TRUE(schema.accepts(R"({"reasoning":"r","answer":1})"));
  EXPECT_FALSE(schema.accepts(R"({"answer":1,"confidence":0.5,"reasoning":"r"})"));  // sorted
  EXPECT_FALSE(schema.accepts(R"({"answer":1,"reasoning":"r"})"));
}

TEST(SchemaObjects, MemberCountsPatternsAndNames) {
  const Schema counted(R"({"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":2})");
  EXPECT_FALSE(counted.accepts("{}"));
  EXPECT_TRUE(counted.accepts(R"({"a":1})"));
  EXPECT_TRUE(counted.accepts(R"({"a":1,"b":2})"));
  EXPECT_FALSE(counted.accepts(R"({"a":1,"b":2,"c":3})"));

  const Schema declared(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
                            "c":{"type":"integer"}},"required":["a"],"maxProperties":2,"minProperties":2})");
  EXPECT_FALSE(declared.accepts(R"({"a":1})"));
  EXPECT_TRUE(declared.accepts(R"({"a":1,"c":3})"));
  EXPECT_FALSE(declared.accepts(R"({"a":1,"b":2,"c":3})"));

  const Schema patterned(R"({"type":"object","patternProperties":{"^x_[a-z]+$":{"type":"integer"}}})");
  EXPECT_TRUE(patterned.accepts(R"({"x_ab":1,"x_c":2})"));
  EXPECT_TRUE(patterned.accepts("{}"));
  EXPECT_FALSE(patterned.accepts(R"({"y":1})"));
  EXPECT_FALSE(patterned.accepts(R"({"x_ab":"s"})"));

  const Schema named(R"({"type":"object","propertyNames":{"enum":["a","b"]},"additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(named.accepts(R"({"a":1,"b":2})"));
  EXPECT_FALSE(named.accepts(R"({"c":1})"));
  const Schema named_pattern(R"({"type":"object","propertyNames":{"pattern":"^[a-z]{2}$"}})");
  EXPECT_TRUE(named_pattern.accepts(R"({"ab":[1]})"));
  EXPECT_FALSE(named_pattern.accepts(R"({"abc":1})"));
}

TEST(SchemaStrictness, WhatNoGrammarEnforcesIsNamedOrListed) {
  // Pydantic's HttpUrl (format uri, maxLength 2083: enforced) beside what no grammar enforces.
  const std::string url = R"({"type":"object","properties":{"site":{"type":"string","format":"uri","minLength":1,
                              "maxLength":2083},"n":{"type":"integer","multipleOf":3,"not":{"const":0}}},"required":["site","n"]})";
  const std::string error = strict_error(url);
  EXPECT_NE(error.find("'multipleOf'"), std::string::npos) << error;
  const Schema lenient(url, SchemaStrictness::kLenient);
  std::vector<std::string> keywords;
  for (const UnenforcedKeyword& k : lenient.unenforced()) keywords.push_back(k.keyword + " at " + k.path);
  EXPECT_EQ(keywords, (std::vector<std::string>{"multipleOf at /properties/n", "not at /properties/n"}));
  EXPECT_TRUE(lenient.accepts(R"({"site":"https://a.b/c","n":4})"));
  EXPECT_FALSE(lenient.accepts(R"({"site":"not a uri","n":4})"));

  // A length bound the format implies is enforced; an unknown format is named (strict) or listed.
  EXPECT_EQ(strict_error(R"({"type":"string","format":"date","maxLength":10,"minLength":10})"), "");
  EXPECT_NE(strict_error(R"({"type":"string","format":"ipv8"})").find("ipv8"), std::string::npos);
  const Schema unknown(R"({"type":"string","format":"ipv8","maxLength":3})", SchemaStrictness::kLenient);
  ASSERT_EQ(unknown.unenforced().size(), 1u);
  EXPECT_EQ(unknown.unenforced()[0].keyword, "format");
  EXPECT_TRUE(unknown.accepts(R"("abc")"));
  EXPECT_FALSE(unknown.accepts(R"("abcd")"));
}

}  // namespace
}  // namespace loom::grammar
