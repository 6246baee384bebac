// The tool-call parsers (src/toolcall): each convention on whole outputs, and
// the streamed parse against the whole-text one for every way of cutting the
// text in two and byte by byte.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "toolcall/forced_call_reader.h"
#include "toolcall/forced_calls.h"
#include "toolcall/tool_call_parser.h"

namespace loom::toolcall {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kSeed = 7;

ParsedOutput parse(ParserKind kind, std::string_view text) { return parse_tool_calls(kind, text, kSeed); }

// Streams `pieces`, checking each delta's shape, and joins what came out.
ParsedOutput stream(ParserKind kind, const std::vector<std::string_view>& pieces) {
  ToolCallParser parser(kind, kSeed);
  ParsedOutput output;
  auto add = [&](StreamDelta delta) {
    output.content += delta.content;
    for (ToolCallDelta& piece : delta.tool_calls) {
      if (piece.is_first()) {
        EXPECT_EQ(piece.index, static_cast<int32_t>(output.tool_calls.size()));
        EXPECT_FALSE(piece.name.empty());
        EXPECT_TRUE(piece.arguments.empty());
        output.tool_calls.push_back({piece.id, piece.name, ""});
      } else {
        EXPECT_EQ(piece.index + 1, static_cast<int32_t>(output.tool_calls.size()));
        EXPECT_TRUE(piece.name.empty());
        output.tool_calls.back().arguments += piece.arguments;
      }
    }
  };
  for (std::string_view piece : pieces) add(parser.feed(piece));
  add(parser.finish());
  EXPECT_EQ(parser.has_tool_calls(), !output.tool_calls.empty());
  return output;
}

void expect_same(const ParsedOutput& streamed, const ParsedOutput& whole, const std::string& how) {
  EXPECT_EQ(streamed.content, whole.content) << how;
  EXPECT_EQ(streamed.tool_calls, whole.tool_calls) << how;
}

// Every cut into two pieces, and one byte at a time, give the whole-text result.
void expect_stream_agrees(ParserKind kind, std::string_view text) {
  const ParsedOutput whole = parse(kind, text);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    expect_same(stream(kind, {text.substr(0, cut), text.substr(cut)}), whole,
                "cut at " + std::to_string(cut) + " of: " + std::string(text));
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  expect_same(stream(kind, bytes), whole, "byte by byte: " + std::string(text));
}

// name + arguments of each call, ids left out.
std::vector<std::pair<std::string, Json>> calls_of(const ParsedOutput& output) {
  std::vector<std::pair<std::string, Json>> calls;
  for (const ToolCall& call : output.tool_calls) calls.emplace_back(call.name, Json::parse(call.arguments));
  return calls;
}
using Calls = std::vector<std::pair<std::string, Json>>;

TEST(ToolCallNames, ParsersByNameAndFromTemplates) {
  EXPECT_EQ(parser_from_name("hermes"), ParserKind::kHermes);
  EXPECT_EQ(parser_from_name("llama3_json"), ParserKind::kLlama3Json);
  EXPECT_EQ(parser_from_name("mistral"), ParserKind::kMistral);
  EXPECT_EQ(parser_from_name("none"), ParserKind::kNone);
  EXPECT_EQ(parser_from_name("auto"), std::nullopt);
  EXPECT_EQ(parser_from_name("Hermes"), std::nullopt);
  EXPECT_STREQ(parser_name(ParserKind::kLlama3Json), "llama3_json");

  EXPECT_EQ(detect_parser("{% for tool in tools %}<tool_call>{{ tool | tojson }}</tool_call>{% endfor %}"),
            ParserKind::kHermes);
  EXPECT_EQ(detect_parser("<|start_header_id|>system<|end_header_id|><tool_call>"), ParserKind::kHermes);
  EXPECT_EQ(detect_parser("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}"), ParserKind::kMistral);
  EXPECT_EQ(detect_parser("{{- '<|python_tag|>' + tool_call.name }}"), ParserKind::kLlama3Json);
  EXPECT_EQ(detect_parser("'<|start_header_id|>' + message['role']"), ParserKind::kLlama3Json);
  EXPECT_EQ(detect_parser("<|im_start|>{{ message.content }}<|im_end|>"), ParserKind::kNone);
  EXPECT_EQ(detect_parser(""), ParserKind::kNone);
}

TEST(ToolCallIds, OpenAiAndMistralShapes) {
  CallIdGenerator openai(ParserKind::kHermes, 1), again(ParserKind::kHermes, 1), mistral(ParserKind::kMistral, 1);
  const std::string id = openai.next();
  EXPECT_EQ(id.size(), 5u + 24u);
  EXPECT_EQ(id.substr(0, 5), "call_");
  for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
  EXPECT_EQ(again.next(), id);        // seeded: reproducible
  EXPECT_NE(openai.next(), id);       // and unique within an output
  const std::string short_id = mistral.next();
  EXPECT_EQ(short_id.size(), 9u);
  for (char c : short_id) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << short_id;
}

TEST(HermesParser, CallsAndContent) {
  const std::string text =
      "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const ParsedOutput output = parse(ParserKind::kHermes, text);
  EXPECT_EQ(output.content, "Let me check both.");
  EXPECT_EQ(calls_of(output), (Calls{{"get_weather", {{"city", "Paris"}, {"days", 2}}}, {"get_time", Json::object()}}));
  ASSERT_EQ(output.tool_calls.size(), 2u);
  EXPECT_NE(output.tool_calls[0].id, output.tool_calls[1].id);
  EXPECT_EQ(output.tool_calls[0].arguments, R"({"city":"Paris","days":2})");  // compact JSON text
  expect_stream_agrees(ParserKind::kHermes, text);
}

TEST(HermesParser, ContentAfterAndBetweenCallsAndStringArguments) {
  const std::string text =
      "A<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}</tool_call> then B "
      "<tool_call>{\"name\": \"g\"}</tool_call>  done.";
  const ParsedOutput output = parse(ParserKind::kHermes, text);
  EXPECT_EQ(output.content, "Athen Bdone.");  // the whitespace framing each call is dropped
  EXPECT_EQ(calls_of(output), (Calls{{"f", {{"x", {1, 2}}}}, {"g", Json::object()}}));
  expect_stream_agrees(ParserKind::kHermes, text);
}

TEST(HermesParser, NoCallsIsAllContent) {
  for (const std::string text : {"", "plain answer", "  spaced  \n", "a < b and <tool_ is not a tag <tool_call"}) {
    const ParsedOutput output = parse(ParserKind::kHermes, text);
    EXPECT_EQ(output.content, text);
    EXPECT_TRUE(output.tool_calls.empty());
    expect_stream_agrees(ParserKind::kHermes, text);
  }
}

TEST(HermesParser, MalformedCallsAreContent) {
  const std::vector<std::string> malformed = {
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }}</tool_call>",       // bad JSON
      "<tool_call>{\"arguments\": {}}</tool_call>",                               // no name
      "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",                  // name not a string
      "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",             // arguments not an object
      "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",    // string that is no object
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}",                   // unterminated JSON
      "<tool_call>{\"name\": \"f\"}] </tool_call>",                               // junk before the close
      "<tool_call>{\"name\": \"f\"}</tool_c",                                     // cut closing tag
      "<tool_call>name: f</tool_call>",                                           // not JSON at all
      "<tool_call>{\"name\": \"f\"]",                                             // mismatched bracket
      "<tool_call>",                                                              // marker only
  };
  for (const std::string& text : malformed) {
    const ParsedOutput output = parse(ParserKind::kHermes, text);
    EXPECT_EQ(output.content, text);
    EXPECT_TRUE(output.tool_calls.empty()) << text;
    expect_stream_agrees(ParserKind::kHermes, text);
  }
  // A malformed call does not hide a good one after it.
  const std::string text = "<tool_call>{oops}</tool_call> <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  const ParsedOutput output = parse(ParserKind::kHermes, text);
  EXPECT_EQ(output.content, "<tool_call>{oops}</tool_call>");
  EXPECT_EQ(calls_of(output), (Calls{{"f", Json::object()}}));
  expect_stream_agrees(ParserKind::kHermes, text);
}

TEST(HermesParser, MissingCloseTagForgivenAtTheEnd) {
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"}{\"}}\n";
  const ParsedOutput output = parse(ParserKind::kHermes, text);
  EXPECT_EQ(output.content, "");
  EXPECT_EQ(calls_of(output), (Calls{{"f", {{"q", "}{"}}}}));
  expect_stream_agrees(ParserKind::kHermes, text);
}

TEST(HermesParser, UnicodeArguments) {
  const std::string text =
      "Voilà: <tool_call>{\"name\": \"translate\", \"arguments\": {\"text\": \"日本語 😀 \\u00e9\", \"to\": \"ελ\"}}"
      "</tool_call>";
  const ParsedOutput output = parse(ParserKind::kHermes, text);
  EXPECT_EQ(output.content, "Voilà:");
  ASSERT_EQ(output.tool_calls.size(), 1u);
  EXPECT_EQ(output.tool_calls[0].arguments, "{\"text\":\"日本語 😀 é\",\"to\":\"ελ\"}");
  expect_stream_agrees(ParserKind::kHermes, text);
}

TEST(HermesParser, StreamReleasesContentEarlyAndHoldsMarkers) {
  ToolCallParser parser(ParserKind::kHermes, kSeed);
  EXPECT_EQ(parser.feed("Hello").content, "Hello");
  EXPECT_EQ(parser.feed(" wor").content, " wor");
  EXPECT_EQ(parser.feed("ld\n<tool").content, "ld");  // "\n<tool" may be a call's frame
  StreamDelta delta = parser.feed("_call>{\"name\": \"f\", ");
  EXPECT_TRUE(delta.empty());
  delta = parser.feed("\"arguments\": {\"a\": 1}}</tool_call>");
  EXPECT_EQ(delta.content, "");
  ASSERT_EQ(delta.tool_calls.size(), 2u);
  EXPECT_EQ(delta.tool_calls[0].name, "f");
  EXPECT_EQ(delta.tool_calls[0].index, 0);
  EXPECT_EQ(delta.tool_calls[0].id.substr(0, 5), "call_");
  EXPECT_EQ(delta.tool_calls[1].arguments, R"({"a":1})");
  EXPECT_TRUE(parser.has_tool_calls());
  EXPECT_TRUE(parser.finish().empty());
}

TEST(Llama3JsonParser, PlainAndPythonTagCalls) {
  const std::string plain = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
  EXPECT_EQ(calls_of(parse(ParserKind::kLlama3Json, plain)), (Calls{{"get_weather", {{"city", "Oslo"}}}}));
  EXPECT_EQ(parse(ParserKind::kLlama3Json, plain).content, "");
  expect_stream_agrees(ParserKind::kLlama3Json, plain);

  const std::string tagged =
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"arguments\": {\"y\": \"é\"}}"
      "<|eom_id|>";
  const ParsedOutput output = parse(ParserKind::kLlama3Json, tagged);
  EXPECT_EQ(output.content, "");
  EXPECT_EQ(calls_of(output), (Calls{{"a", {{"x", 1}}}, {"b", {{"y", "é"}}}}));
  expect_stream_agrees(ParserKind::kLlama3Json, tagged);
}

TEST(Llama3JsonParser, ContentWhenNotCalls) {
  for (const std::string text : {"The weather is fine.", "  {\"answer\": 42}", "Here: {\"name\": \"f\", \"parameters\": {}}",
                                 "{\"name\": \"f\", \"parameters\": {", "<|python_tag|>brave_search.call(query=\"x\")",
                                 " ", ""}) {
    const ParsedOutput output = parse(ParserKind::kLlama3Json, text);
    EXPECT_EQ(output.content, text);
    EXPECT_TRUE(output.tool_calls.empty()) << text;
    expect_stream_agrees(ParserKind::kLlama3Json, text);
  }
}

TEST(Llama3JsonParser, TextAfterCallsIsContent) {
  const std::string text = "{\"name\": \"f\", \"parameters\": {}} and then some words";
  const ParsedOutput output = parse(ParserKind::kLlama3Json, text);
  EXPECT_EQ(output.content, "and then some words");
  EXPECT_EQ(calls_of(output), (Calls{{"f", Json::object()}}));
  expect_stream_agrees(ParserKind::kLlama3Json, text);
}

TEST(MistralParser, ListForm) {
  const std::string text =
      "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"neg\", \"arguments\": "
      "{\"a\": -1.5}}]";
  const ParsedOutput output = parse(ParserKind::kMistral, text);
  EXPECT_EQ(output.content, "");
  EXPECT_EQ(calls_of(output), (Calls{{"add", {{"a", 1}, {"b", 2}}}, {"neg", {{"a", -1.5}}}}));
  for (const ToolCall& call : output.tool_calls) EXPECT_EQ(call.id.size(), 9u);
  expect_stream_agrees(ParserKind::kMistral, text);
}

TEST(MistralParser, NamedArgsFormAndContentBefore) {
  const std::string text = "Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Zürich\"}[TOOL_CALLS]get_time[ARGS]{}";
  const ParsedOutput output = parse(ParserKind::kMistral, text);
  EXPECT_EQ(output.content, "Sure.");
  EXPECT_EQ(calls_of(output), (Calls{{"get_weather", {{"city", "Zürich"}}}, {"get_time", Json::object()}}));
  expect_stream_agrees(ParserKind::kMistral, text);
}

TEST(MistralParser, MalformedIsContent) {
  for (const std::string text : {"[TOOL_CALLS][]", "[TOOL_CALLS][{\"arguments\": {}}]", "[TOOL_CALLS]f[ARG]{}",
                                 "[TOOL_CALLS]f[ARGS]{\"a\": 1", "[TOOL_CALLS][{\"name\": \"f\"}, 3]",
                                 "[TOOL_CALLS] hello", "[TOOL_CALLS]f[ARGS][1]"}) {
    const ParsedOutput output = parse(ParserKind::kMistral, text);
    EXPECT_EQ(output.content, text);
    EXPECT_TRUE(output.tool_calls.empty()) << text;
    expect_stream_agrees(ParserKind::kMistral, text);
  }
}

TEST(NoneParser, EverythingIsContent) {
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  const ParsedOutput output = parse(ParserKind::kNone, text);
  EXPECT_EQ(output.content, text);
  EXPECT_TRUE(output.tool_calls.empty());
  expect_stream_agrees(ParserKind::kNone, text);
}

TEST(ToolCallParsers, DeepNestingIsContentNotACrash) {
  const std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(5000, '[') +
                           std::string(5000, ']') + "}}</tool_call>";
  const ParsedOutput output = parse(ParserKind::kHermes, deep);
  EXPECT_EQ(output.content, deep);
  EXPECT_TRUE(output.tool_calls.empty());
  const std::string nested_string = "<tool_call>{\"name\": \"f\", \"arguments\": \"" + std::string(5000, '[') +
                                    "\"}</tool_call>";
  EXPECT_TRUE(parse(ParserKind::kHermes, nested_string).tool_calls.empty());
}

TEST(ForcedCalls, RequiredOutput) {
  CallIdGenerator ids(ParserKind::kNone, kSeed);
  const std::vector<std::string> tools = {"f", "g"};
  const auto calls = parse_required_output(
      " [{\"name\": \"f\", \"parameters\": {\"a\": 1}}, {\"name\": \"g\", \"parameters\": {}}] ", tools, ids);
  ASSERT_TRUE(calls.has_value());
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].name, "f");
  EXPECT_EQ((*calls)[0].arguments, R"({"a":1})");
  EXPECT_EQ((*calls)[1].name, "g");
  EXPECT_EQ((*calls)[1].id.substr(0, 5), "call_");
  EXPECT_FALSE(parse_required_output("[]", tools, ids));
  EXPECT_FALSE(parse_required_output("[{\"name\": \"h\", \"parameters\": {}}]", tools, ids));  // not a tool
  EXPECT_FALSE(parse_required_output("[{\"name\": \"f\"}]", tools, ids));                      // no parameters
  EXPECT_FALSE(parse_required_output("{\"name\": \"f\", \"parameters\": {}}", tools, ids));    // not a list
  EXPECT_FALSE(parse_required_output("I will call f", tools, ids));
}

TEST(ForcedCalls, NamedOutput) {
  CallIdGenerator ids(ParserKind::kNone, kSeed);
  const auto call = parse_named_output("get_weather", "{\"city\": \"Lima\"}\n", ids);
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->name, "get_weather");
  EXPECT_EQ(call->arguments, R"({"city":"Lima"})");
  EXPECT_FALSE(parse_named_output("get_weather", "[1]", ids));
  EXPECT_FALSE(parse_named_output("get_weather", "{\"city\": ", ids));
  EXPECT_FALSE(parse_named_output("get_weather", "Lima", ids));
}

// The forced reader streamed byte by byte and cut in two anywhere: the deltas
// have OpenAI's shape and add up to the whole-text result.
void expect_forced_stream_matches(const std::string& named, const std::string& text) {
  const ParsedOutput whole = read_forced_output(named, text, kSeed);
  auto check = [&](const std::vector<std::string_view>& pieces) {
    ForcedCallReader reader(named, kSeed);
    ParsedOutput output;
    for (size_t i = 0; i < pieces.size(); ++i) {
      StreamDelta delta = i + 1 < pieces.size() ? reader.feed(pieces[i]) : reader.finish(pieces[i]);
      output.content += delta.content;
      for (ToolCallDelta& piece : delta.tool_calls) {
        if (piece.is_first()) {
          EXPECT_EQ(piece.index, static_cast<int32_t>(output.tool_calls.size()));
          EXPECT_TRUE(piece.arguments.empty());
          output.tool_calls.push_back({piece.id, piece.name, ""});
        } else {
          ASSERT_EQ(piece.index + 1, static_cast<int32_t>(output.tool_calls.size()));
          output.tool_calls.back().arguments += piece.arguments;
        }
      }
    }
    EXPECT_EQ(output.content, whole.content) << text;
    EXPECT_EQ(output.tool_calls, whole.tool_calls) << text;
  };
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  bytes.push_back({});
  check(bytes);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    check({std::string_view(text).substr(0, cut), std::string_view(text).substr(cut)});
}

TEST(ForcedCallReader, RequiredCallsAsWritten) {
  const std::string text =
      R"([{"name":"f","parameters":{"a":"}],\"","b":[1,{"c":2}]}},{"name":"g","parameters":{}}])";
  const ParsedOutput whole = read_forced_output("", text, kSeed);
  EXPECT_TRUE(whole.content.empty());
  ASSERT_EQ(whole.tool_calls.size(), 2u);
  EXPECT_EQ(whole.tool_calls[0].name, "f");
  EXPECT_EQ(whole.tool_calls[0].arguments, R"({"a":"}],\"","b":[1,{"c":2}]})");
  EXPECT_EQ(whole.tool_calls[1].name, "g");
  EXPECT_EQ(whole.tool_calls[1].arguments, "{}");
  EXPECT_EQ(whole.tool_calls[0].id.substr(0, 5), "call_");
  expect_forced_stream_matches("", text);
  expect_forced_stream_matches("", " [{\"name\": \"f\", \"parameters\": {\"x\": 1}}] ");
}

TEST(ForcedCallReader, NamedArgumentsAsWritten) {
  const ParsedOutput whole = read_forced_output("get_weather", " {\"city\": \"Lima\"}", kSeed);
  ASSERT_EQ(whole.tool_calls.size(), 1u);
  EXPECT_EQ(whole.tool_calls[0].name, "get_weather");
  EXPECT_EQ(whole.tool_calls[0].arguments, "{\"city\": \"Lima\"}");
  expect_forced_stream_matches("get_weather", "{\"city\": {\"name\": \"L}ima\"}, \"n\": [1, 2]}");
}

TEST(ForcedCallReader, CutShortIsAPartialCallNeverContent) {
  const ParsedOutput required = read_forced_output("", R"([{"name":"f","parameters":{"a":"xy)", kSeed);
  EXPECT_TRUE(required.content.empty());
  ASSERT_EQ(required.tool_calls.size(), 1u);
  EXPECT_EQ(required.tool_calls[0].arguments, R"({"a":"xy)");
  EXPECT_TRUE(read_forced_output("", R"([{"name":"f)", kSeed).tool_calls.empty());  // no name yet: nothing
  EXPECT_TRUE(read_forced_output("", R"([{"name":"f)", kSeed).content.empty());
  const ParsedOutput named = read_forced_output("f", R"({"a":)", kSeed);
  ASSERT_EQ(named.tool_calls.size(), 1u);
  EXPECT_EQ(named.tool_calls[0].arguments, R"({"a":)");
  expect_forced_stream_matches("", R"([{"name":"f","parameters":{"a":"xy)");
}

TEST(ForcedCallReader, UnforcedTextIsContent) {
  EXPECT_EQ(read_forced_output("f", "  no JSON", kSeed).content, "  no JSON");
  EXPECT_TRUE(read_forced_output("f", "  no JSON", kSeed).tool_calls.empty());
  EXPECT_EQ(read_forced_output("", "{\"a\": 1}", kSeed).content, "{\"a\": 1}");  // not a list
  expect_forced_stream_matches("f", "  no JSON");
}

}  // namespace
}  // namespace loom::toolcall
