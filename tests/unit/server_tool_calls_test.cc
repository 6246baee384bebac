// Tool calling on /v1/chat/completions: tool_choice parsing and validation,
// tool_calls in whole bodies and SSE streams (a scripted engine writes the
// model's text), and the parser choice of --tool-call-parser.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "grammar/grammar_matcher.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/openai_request.h"
#include "server/tool_choice.h"
#include "server_fake_engine.h"
#include "server_tokenizer_fixture.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;
using toolcall::ParserKind;

const Json kUser = {{{"role", "user"}, {"content", "weather in Paris?"}}};

Json weather_tool() {
  return Json::parse(R"({"type": "function", "function": {"name": "get_weather", "description": "Current weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");
}
Json time_tool() { return {{"type", "function"}, {"function", {{"name", "get_time"}}}}; }
Json tools() { return Json::array({weather_tool(), time_tool()}); }

class ToolChoiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = new std::shared_ptr<const Tokenizer>(test::make_server_test_tokenizer()); }
  static void TearDownTestSuite() { delete tokenizer_; }

  ParsedRequest parse(Json body, ParserKind parser = ParserKind::kHermes) const {
    ParseContext context;
    context.tokenizer = tokenizer_->get();
    context.base_model_names = {"tiny"};
    context.max_context_tokens = 256;
    context.tool_call_parser = parser;
    if (!body.contains("messages")) body["messages"] = kUser;
    return parse_openai_request(Endpoint::kChatCompletions, body.dump(), context);
  }
  // A body sent as text (nlohmann::json would sort its keys).
  ParsedRequest parse_text(const std::string& body) const {
    ParseContext context;
    context.tokenizer = tokenizer_->get();
    context.base_model_names = {"tiny"};
    context.max_context_tokens = 256;
    context.tool_call_parser = ParserKind::kHermes;
    return parse_openai_request(Endpoint::kChatCompletions, body, context);
  }
  // The 400 a body raises: its param (fails the test if it parses).
  std::string bad_param(const Json& body) const {
    try {
      parse(body);
    } catch (const ApiError& error) {
      EXPECT_EQ(error.status(), 400) << error.message();
      EXPECT_FALSE(error.message().empty());
      return error.param();
    }
    ADD_FAILURE() << "no error for " << body.dump();
    return {};
  }

  static std::shared_ptr<const Tokenizer>* tokenizer_;
};
std::shared_ptr<const Tokenizer>* ToolChoiceTest::tokenizer_ = nullptr;

TEST_F(ToolChoiceTest, DefaultsFollowTools) {
  const ParsedRequest plain = parse(Json::object());
  EXPECT_EQ(plain.tool_choice.mode, ToolChoiceMode::kNone);
  EXPECT_FALSE(plain.tool_choice.parses_output());
  EXPECT_TRUE(plain.engine_template.skip_special_tokens);

  const ParsedRequest with_tools = parse({{"tools", tools()}});
  EXPECT_EQ(with_tools.tool_choice.mode, ToolChoiceMode::kAuto);
  EXPECT_EQ(with_tools.tool_choice.parser, ParserKind::kHermes);
  EXPECT_EQ(with_tools.tool_choice.tool_names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_TRUE(with_tools.tool_choice.parallel_tool_calls);
  EXPECT_FALSE(with_tools.tool_choice.output_schema.has_value());
  // Call markers are often special tokens: their text is kept unless the client says otherwise.
  EXPECT_FALSE(with_tools.engine_template.skip_special_tokens);
  EXPECT_TRUE(parse({{"tools", tools()}, {"skip_special_tokens", true}}).engine_template.skip_special_tokens);

  // A server without a parser: tool_choice auto is a 400 naming the flag; forced and none still work.
  try {
    parse({{"tools", tools()}}, ParserKind::kNone);
    ADD_FAILURE() << "tools under auto without a parser were accepted";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status(), 400);
    EXPECT_NE(error.body().find("--tool-call-parser"), std::string::npos) << error.body();
  }
  EXPECT_EQ(parse({{"tools", tools()}, {"tool_choice", "required"}}, ParserKind::kNone).tool_choice.mode,
            ToolChoiceMode::kRequired);
  EXPECT_EQ(parse({{"tools", tools()}, {"tool_choice", "none"}}, ParserKind::kNone).tool_choice.mode,
            ToolChoiceMode::kNone);

  EXPECT_EQ(parse({{"tools", tools()}, {"tool_choice", "none"}}).tool_choice.mode, ToolChoiceMode::kNone);
  EXPECT_EQ(parse({{"tool_choice", "none"}}).tool_choice.mode, ToolChoiceMode::kNone);  // allowed without tools
  EXPECT_EQ(parse({{"tools", Json::array()}}).tool_choice.mode, ToolChoiceMode::kNone);
  EXPECT_FALSE(parse({{"tools", tools()}, {"parallel_tool_calls", false}}).tool_choice.parallel_tool_calls);
}

TEST_F(ToolChoiceTest, RequiredBuildsTheCallListSchema) {
  const ParsedRequest parsed = parse({{"tools", tools()}, {"tool_choice", "required"}});
  EXPECT_EQ(parsed.tool_choice.mode, ToolChoiceMode::kRequired);
  ASSERT_TRUE(parsed.tool_choice.output_schema.has_value());
  const Json schema = *parsed.tool_choice.output_schema;
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["minItems"], 1);
  EXPECT_FALSE(schema.contains("maxItems"));
  const Json& branches = schema["items"]["anyOf"];
  ASSERT_EQ(branches.size(), 2u);
  EXPECT_EQ(branches[0]["properties"]["name"], Json::parse(R"({"type": "string", "enum": ["get_weather"]})"));
  EXPECT_EQ(branches[0]["properties"]["parameters"], weather_tool()["function"]["parameters"]);
  EXPECT_EQ(branches[0]["required"], Json::parse(R"(["name", "parameters"])"));
  // A function without parameters takes an empty object.
  EXPECT_EQ(branches[1]["properties"]["parameters"], Json::parse(R"({"type": "object", "properties": {}})"));

  const ParsedRequest single = parse({{"tools", tools()}, {"tool_choice", "required"}, {"parallel_tool_calls", false}});
  EXPECT_EQ(Json(*single.tool_choice.output_schema)["maxItems"], 1);
}

TEST_F(ToolChoiceTest, RequiredLiftsDefsToTheRoot) {
  Json with_defs = weather_tool();
  with_defs["function"]["parameters"]["$defs"] = {{"unit", {{"enum", {"C", "F"}}}}};
  with_defs["function"]["parameters"]["properties"]["unit"] = {{"$ref", "#/$defs/unit"}};
  const ParsedRequest parsed = parse({{"tools", {with_defs, time_tool()}}, {"tool_choice", "required"}});
  const Json schema = *parsed.tool_choice.output_schema;
  EXPECT_EQ(schema["$defs"]["unit"], Json::parse(R"({"enum": ["C", "F"]})"));
  EXPECT_FALSE(schema["items"]["anyOf"][0]["properties"]["parameters"].contains("$defs"));

  Json clash = time_tool();
  clash["function"]["parameters"] = {{"type", "object"}, {"$defs", {{"unit", {{"type", "string"}}}}}};
  EXPECT_EQ(bad_param({{"tools", {with_defs, clash}}, {"tool_choice", "required"}}),
            "tools[1].function.parameters.$defs.unit");
}

TEST_F(ToolChoiceTest, NamedFunctionGetsItsParameters) {
  const ParsedRequest parsed =
      parse({{"tools", tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  EXPECT_EQ(parsed.tool_choice.mode, ToolChoiceMode::kNamed);
  EXPECT_EQ(parsed.tool_choice.function_name, "get_weather");
  EXPECT_EQ(Json(*parsed.tool_choice.output_schema), weather_tool()["function"]["parameters"]);
  EXPECT_TRUE(parsed.engine_template.skip_special_tokens);  // forced JSON: no markers to keep
}

// Whether the request's compiled constraint accepts `text` whole.
bool constraint_accepts(const ParsedRequest& parsed, const std::string& text) {
  if (!parsed.engine_template.constraint) return false;
  grammar::GrammarMatcher matcher(parsed.engine_template.constraint);
  return matcher.accept_bytes(text) && matcher.can_end();
}

const std::string kOrderedTool = R"({"type": "function", "function": {"name": "plan", "parameters": {"type": "object",
    "properties": {"zeta": {"type": "integer", "minimum": 0, "maximum": 9}, "alpha": {"type": "string", "maxLength": 3}},
    "required": ["zeta", "alpha"]}}})";

TEST_F(ToolChoiceTest, ForcedCallsKeepThePropertiesOrder) {
  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  const ParsedRequest named = parse_text("{" + messages + R"(, "tools": [)" + kOrderedTool +
                                         R"(], "tool_choice": {"type": "function", "function": {"name": "plan"}}})");
  EXPECT_TRUE(constraint_accepts(named, R"({"zeta":3,"alpha":"ab"})"));
  EXPECT_FALSE(constraint_accepts(named, R"({"alpha":"ab","zeta":3})"));  // sorted keys: refused
  EXPECT_FALSE(constraint_accepts(named, R"({"zeta":10,"alpha":"ab"})"));  // maximum 9 enforced
  EXPECT_TRUE(named.unenforced_schema_keywords.empty());

  const ParsedRequest required = parse_text("{" + messages + R"(, "tools": [)" + kOrderedTool +
                                            R"(], "tool_choice": "required"})");
  EXPECT_TRUE(constraint_accepts(required, R"([{"name":"plan","parameters":{"zeta":0,"alpha":""}}])"));
  EXPECT_FALSE(constraint_accepts(required, R"([{"name":"plan","parameters":{"alpha":"","zeta":0}}])"));
}

// vLLM's behaviour: with a forced call, the tool's schema is the constraint; response_format is not read.
TEST_F(ToolChoiceTest, ForcedCallGovernsOverResponseFormat) {
  const Json format = Json::parse(R"({"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object",
      "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}})");
  const ParsedRequest parsed = parse({{"tools", tools()}, {"tool_choice", "required"}, {"response_format", format}});
  EXPECT_TRUE(constraint_accepts(parsed, R"([{"name":"get_weather","parameters":{"city":"Paris"}}])"));
  EXPECT_FALSE(constraint_accepts(parsed, R"({"answer":"x"})"));
  const ParsedRequest named = parse({{"tools", tools()},
                                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                                     {"guided_regex", "[0-9]+"}});
  EXPECT_TRUE(constraint_accepts(named, R"({"city":"Paris"})"));
}

// What no grammar enforces: 400 naming the tool under "strict": true, else served and listed.
TEST_F(ToolChoiceTest, StrictToolsRefuseWhatNoGrammarEnforces) {
  Json tool = weather_tool();
  tool["function"]["parameters"]["properties"]["tags"] = {{"type", "array"}, {"items", {{"type", "string"}}}, {"uniqueItems", true}};
  const Json named_choice = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const ParsedRequest lenient = parse({{"tools", {time_tool(), tool}}, {"tool_choice", named_choice}});
  EXPECT_EQ(lenient.unenforced_schema_keywords, std::vector<std::string>{"uniqueItems"});
  const ParsedRequest lenient_list = parse({{"tools", {time_tool(), tool}}, {"tool_choice", "required"}});
  EXPECT_EQ(lenient_list.unenforced_schema_keywords, std::vector<std::string>{"uniqueItems"});
  tool["function"]["strict"] = true;
  EXPECT_EQ(bad_param({{"tools", {time_tool(), tool}}, {"tool_choice", named_choice}}), "tools[1].function.parameters");
  EXPECT_EQ(bad_param({{"tools", {time_tool(), tool}}, {"tool_choice", "required"}}), "tools[1].function.parameters");
  EXPECT_EQ(parse({{"tools", {time_tool(), tool}}}).tool_choice.mode, ToolChoiceMode::kAuto);  // not forced: not compiled
  tool["function"]["strict"] = "yes";
  EXPECT_EQ(bad_param({{"tools", {tool}}}), "tools[0].function.strict");
}

TEST_F(ToolChoiceTest, ResponseFormatStrictOrListed) {
  const Json schema = {{"type", "object"},
                       {"properties", {{"n", {{"type", "integer"}, {"multipleOf", 3}}}}},
                       {"required", {"n"}}};
  const Json lenient = {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", schema}}}};
  EXPECT_EQ(parse({{"response_format", lenient}}).unenforced_schema_keywords, std::vector<std::string>{"multipleOf"});
  Json strict = lenient;
  strict["json_schema"]["strict"] = true;
  EXPECT_EQ(bad_param({{"response_format", strict}}), "response_format.json_schema.schema");
  EXPECT_EQ(parse({{"guided_json", schema}}).unenforced_schema_keywords, std::vector<std::string>{"multipleOf"});
}

TEST_F(ToolChoiceTest, BadToolChoicesNameTheField) {
  const Json named_ghost = {{"type", "function"}, {"function", {{"name", "ghost"}}}};
  EXPECT_EQ(bad_param({{"tools", tools()}, {"tool_choice", named_ghost}}), "tool_choice.function.name");
  EXPECT_EQ(bad_param({{"tool_choice", "auto"}}), "tool_choice");  // no tools
  EXPECT_EQ(bad_param({{"tool_choice", "required"}}), "tool_choice");
  EXPECT_EQ(bad_param({{"tool_choice", named_ghost}}), "tool_choice");
  EXPECT_EQ(bad_param({{"tools", Json::array()}, {"tool_choice", "auto"}}), "tool_choice");
  EXPECT_EQ(bad_param({{"tools", tools()}, {"tool_choice", "sometimes"}}), "tool_choice");
  EXPECT_EQ(bad_param({{"tools", tools()}, {"tool_choice", 1}}), "tool_choice");
  EXPECT_EQ(bad_param({{"tools", tools()}, {"tool_choice", {{"type", "retrieval"}}}}), "tool_choice.type");
  EXPECT_EQ(bad_param({{"tools", tools()}, {"tool_choice", {{"type", "function"}}}}), "tool_choice.function.name");
  EXPECT_EQ(bad_param({{"tools", tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", 3}}}}}}),
            "tool_choice.function.name");
  EXPECT_EQ(bad_param({{"tools", tools()}, {"parallel_tool_calls", "yes"}}), "parallel_tool_calls");
  EXPECT_EQ(bad_param({{"tools", {{{"type", "code_interpreter"}}}}}), "tools[0].type");
  EXPECT_EQ(bad_param({{"tools", {{{"type", "function"}, {"function", {{"name", ""}}}}}}}), "tools[0].function.name");
  Json bad_parameters = weather_tool();
  bad_parameters["function"]["parameters"] = "city";
  EXPECT_EQ(bad_param({{"tools", {time_tool(), bad_parameters}}}), "tools[1].function.parameters");
}

TEST(ToolCallParserFlag, ResolvesNamesAndAuto) {
  EXPECT_EQ(resolve_tool_call_parser("auto", "{{ '<tool_call>' }}"), ParserKind::kHermes);
  EXPECT_EQ(resolve_tool_call_parser("auto", "[TOOL_CALLS]"), ParserKind::kMistral);
  EXPECT_EQ(resolve_tool_call_parser("auto", "<|im_start|>"), ParserKind::kNone);
  EXPECT_EQ(resolve_tool_call_parser("mistral", "<tool_call>"), ParserKind::kMistral);
  EXPECT_EQ(resolve_tool_call_parser("none", "<tool_call>"), ParserKind::kNone);
  EXPECT_THROW(resolve_tool_call_parser("qwen", ""), Error);
}

// Over a real socket, the scripted engine writing the model's text.
class ToolCallServerTest : public ::testing::Test {
 protected:
  // A ChatML template that renders tools (the test tokenizer's own never reads them).
  static constexpr const char* kToolsTemplate =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if tools %}{% for t in tools %}{{ t.function.name }}\n{% endfor %}{% endif %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

  void start(const std::string& tool_call_parser, const std::string& chat_template = kToolsTemplate) {
    engine_ = std::make_unique<test::FakeEngine>(test::make_server_test_tokenizer(), 256);
    ServerConfig config;
    config.chat_template = chat_template;
    config.http.port = 0;
    config.served_model_names = {"tiny"};
    config.http.num_handler_threads = 4;
    config.tool_call_parser = tool_call_parser;
    server_ = std::make_unique<HttpServer>(*engine_, config);
    server_->bind();
    thread_ = std::thread([this] { server_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->bound_port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  Json chat(Json body, int expected_status = 200) {
    body["messages"] = kUser;
    auto result = client_->Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(result);
    if (!result) return {};
    EXPECT_EQ(result->status, expected_status) << result->body;
    if (body.value("stream", false) && result->status == 200) return events(result->body);
    return Json::parse(result->body);
  }
  // The JSON payloads of an SSE body ("[DONE]" left out).
  static Json events(const std::string& body) {
    Json list = Json::array();
    size_t position = 0;
    while ((position = body.find("data: ", position)) != std::string::npos) {
      const size_t end = body.find("\n\n", position);
      const std::string payload = body.substr(position + 6, end - position - 6);
      if (payload != "[DONE]") list.push_back(Json::parse(payload));
      position = end;
    }
    return list;
  }
  // A stream's choice 0 put back together as a whole message, checking the delta shapes.
  static Json reassemble(const Json& chunks, std::string& finish_reason) {
    std::string content;
    Json calls = Json::array();
    for (const Json& chunk : chunks) {
      if (chunk["choices"].empty()) continue;
      const Json& choice = chunk["choices"][0];
      const Json& delta = choice["delta"];
      if (delta.contains("content") && delta["content"].is_string()) content += delta["content"].get<std::string>();
      for (const Json& call : delta.value("tool_calls", Json::array())) {
        const size_t index = call["index"].get<size_t>();
        if (call.contains("id")) {  // the first delta of a call
          EXPECT_EQ(index, calls.size());
          EXPECT_EQ(call["type"], "function");
          calls.push_back({{"id", call["id"]},
                           {"type", "function"},
                           {"function", {{"name", call["function"]["name"]}, {"arguments", ""}}}});
        } else {
          EXPECT_FALSE(call["function"].contains("name"));
        }
        EXPECT_LT(index, calls.size());
        calls[index]["function"]["arguments"] =
            calls[index]["function"]["arguments"].get<std::string>() + call["function"]["arguments"].get<std::string>();
      }
      if (!choice["finish_reason"].is_null()) finish_reason = choice["finish_reason"];
    }
    Json message = {{"role", "assistant"}, {"content", content.empty() ? Json(nullptr) : Json(content)}};
    if (!calls.empty()) message["tool_calls"] = calls;
    return message;
  }
  // OpenAI's chunk sequence for tool calls: one call item per chunk; a call's
  // first item has id, type, name and "" arguments, then >= 1 argument item;
  // finish_reason comes alone (empty delta) in the last chunk.
  static void expect_openai_call_chunks(const Json& chunks) {
    std::map<size_t, int> argument_deltas;
    size_t finish_chunks = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Json& choice = chunks[i]["choices"][0];
      const Json& delta = choice["delta"];
      if (!choice["finish_reason"].is_null()) {
        ++finish_chunks;
        EXPECT_EQ(delta, Json::object()) << chunks[i].dump();
        EXPECT_EQ(i + 1, chunks.size()) << "the finish is the last chunk";
      }
      if (!delta.contains("tool_calls")) continue;
      ASSERT_EQ(delta["tool_calls"].size(), 1u) << chunks[i].dump();
      const Json& call = delta["tool_calls"][0];
      if (call.contains("id")) {
        EXPECT_EQ(call["type"], "function");
        EXPECT_TRUE(call["function"]["name"].is_string());
        EXPECT_EQ(call["function"]["arguments"], "") << chunks[i].dump();
        argument_deltas[call["index"].get<size_t>()] += 0;
      } else {
        EXPECT_FALSE(call["function"]["arguments"].get<std::string>().empty());
        ++argument_deltas[call["index"].get<size_t>()];
      }
    }
    EXPECT_EQ(finish_chunks, 1u);
    for (const auto& [index, count] : argument_deltas) EXPECT_GE(count, 1) << "call " << index;
  }
  // Names and arguments (as JSON) of a message's calls: ids differ between requests.
  static Json calls_without_ids(const Json& message) {
    Json list = Json::array();
    for (const Json& call : message.value("tool_calls", Json::array()))
      list.push_back({call["function"]["name"], Json::parse(call["function"]["arguments"].get<std::string>())});
    return list;
  }

  std::unique_ptr<test::FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

const std::vector<std::string> kHermesScript = {
    "I'll look", " that up.", "\n<tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\": ",
    "\"Par", "is\"}}\n</tool_call>", "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"};

TEST_F(ToolCallServerTest, WholeBodyHasToolCalls) {
  start("hermes");
  engine_->set_script(kHermesScript);
  const Json body = chat({{"tools", tools()}});
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  const Json& message = choice["message"];
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["content"], "I'll look that up.");
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  const Json& first = message["tool_calls"][0];
  EXPECT_EQ(first["type"], "function");
  EXPECT_EQ(first["id"].get<std::string>().substr(0, 5), "call_");
  EXPECT_NE(first["id"], message["tool_calls"][1]["id"]);
  EXPECT_EQ(first["function"]["name"], "get_weather");
  EXPECT_EQ(first["function"]["arguments"], R"({"city":"Paris"})");  // a JSON string, as OpenAI
  EXPECT_EQ(calls_without_ids(message), Json::parse(R"([["get_weather", {"city": "Paris"}], ["get_time", {}]])"));
  EXPECT_FALSE(engine_->last().skip_special_tokens);

  // Only calls: content is null. parallel_tool_calls false: the first call only.
  engine_->set_script({"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
                       "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"});
  const Json single = chat({{"tools", tools()}, {"parallel_tool_calls", false}});
  EXPECT_TRUE(single["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(single["choices"][0]["message"]["tool_calls"].size(), 1u);
}

TEST_F(ToolCallServerTest, NoCallsNoneAndMalformedStayContent) {
  start("hermes");
  engine_->set_script(kHermesScript);
  const std::string text = [] {
    std::string joined;
    for (const auto& piece : kHermesScript) joined += piece;
    return joined;
  }();
  for (const Json& body : {Json{{"tools", tools()}, {"tool_choice", "none"}}, Json::object()}) {
    const Json none = chat(body);
    EXPECT_EQ(none["choices"][0]["message"], Json({{"role", "assistant"}, {"content", text}})) << body.dump();
    EXPECT_EQ(none["choices"][0]["finish_reason"], "stop");
    EXPECT_TRUE(engine_->last().skip_special_tokens);
  }
  engine_->set_script({"Sure: ", "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }</tool_call>"});
  const Json malformed = chat({{"tools", tools()}});
  EXPECT_EQ(malformed["choices"][0]["message"]["content"],
            "Sure: <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }</tool_call>");
  EXPECT_FALSE(malformed["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(malformed["choices"][0]["finish_reason"], "stop");
}

TEST_F(ToolCallServerTest, StreamedDeltasReassembleToTheWholeBody) {
  start("hermes");
  engine_->set_script(kHermesScript);
  const Json whole = chat({{"tools", tools()}, {"n", 2}});
  const Json chunks = chat({{"tools", tools()}, {"stream", true}});
  std::string finish_reason;
  const Json message = reassemble(chunks, finish_reason);
  EXPECT_EQ(finish_reason, "tool_calls");
  EXPECT_EQ(message["content"], whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(calls_without_ids(message), calls_without_ids(whole["choices"][0]["message"]));
  for (const Json& call : message["tool_calls"]) EXPECT_EQ(call["id"].get<std::string>().size(), 29u);
  expect_openai_call_chunks(chunks);

  // No content chunk ever carries a marker, and the call arrives once complete.
  for (const Json& chunk : chunks) {
    const Json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      EXPECT_EQ(delta["content"].get<std::string>().find('<'), std::string::npos) << chunk.dump();
    }
  }
}

// Tools the model would never see, or whose calls nothing would read, are a
// 400 naming the fix (they used to be dropped silently).
TEST_F(ToolCallServerTest, UnservableToolsUnderAutoAre400) {
  start("auto");  // kToolsTemplate names no tool-call convention: no parser
  engine_->set_script({"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"});
  const Json no_parser = chat({{"tools", tools()}}, 400)["error"];
  EXPECT_EQ(no_parser["param"], "tool_choice");
  EXPECT_NE(no_parser["message"].get<std::string>().find("--tool-call-parser"), std::string::npos) << no_parser;
  EXPECT_EQ(chat({{"tools", tools()}, {"tool_choice", "none"}})["choices"][0]["finish_reason"], "stop");
}

TEST_F(ToolCallServerTest, TemplateThatCannotRenderToolsIs400) {
  start("hermes", "");  // the test tokenizer's ChatML template never reads tools
  const Json served = chat({{"tools", tools()}}, 400)["error"];
  EXPECT_EQ(served["param"], "tool_choice");
  EXPECT_NE(served["message"].get<std::string>().find("--chat-template"), std::string::npos) << served;
  // A request's own template is judged by itself.
  chat({{"tools", tools()}, {"chat_template", "{{ messages[0].content }}"}}, 400);
  engine_->set_script({"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"});
  const Json own = chat({{"tools", tools()}, {"chat_template", kToolsTemplate}});
  EXPECT_EQ(own["choices"][0]["finish_reason"], "tool_calls");
  // A forced call needs no template rendering: its constraint writes it.
  engine_->set_script({"{}"});
  chat({{"tools", tools()}, {"tool_choice", "required"}});
}

TEST_F(ToolCallServerTest, ToolChoiceErrorsAre400AndTheServerKeepsServing) {
  start("hermes");
  const Json error = chat({{"tool_choice", "auto"}}, 400)["error"];
  EXPECT_EQ(error["param"], "tool_choice");
  EXPECT_EQ(error["type"], "invalid_request_error");
  EXPECT_EQ(chat({{"tools", tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}, 400)
                ["error"]["param"],
            "tool_choice.function.name");
  engine_->set_script({"fine"});
  EXPECT_EQ(chat({{"tools", tools()}})["choices"][0]["message"]["content"], "fine");
}

// Forced outputs (the constraint writes the JSON; the scripted engine plays
// it) are calls; arguments stream as they are generated.
TEST_F(ToolCallServerTest, RequiredAndNamedOutputsAreRead) {
  start("hermes");
  const std::vector<std::string> required_script = {"[{\"name\": \"get_", "weather\", ", "\"parameters\": {\"ci",
                                                    "ty\": \"Os", "lo\"}}]"};
  engine_->set_script(required_script);
  const Json required = chat({{"tools", tools()}, {"tool_choice", "required"}});
  EXPECT_EQ(required["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(required["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(calls_without_ids(required["choices"][0]["message"]), Json::parse(R"([["get_weather", {"city": "Oslo"}]])"));
  std::string finish_reason;
  const Json chunks = chat({{"tools", tools()}, {"tool_choice", "required"}, {"stream", true}});
  expect_openai_call_chunks(chunks);
  const Json streamed = reassemble(chunks, finish_reason);
  EXPECT_EQ(finish_reason, "tool_calls");
  // The same arguments text, byte for byte, streamed in pieces as written.
  EXPECT_EQ(streamed["tool_calls"][0]["function"]["arguments"],
            required["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]);
  std::vector<std::string> argument_pieces;
  for (const Json& chunk : chunks)
    for (const Json& call : chunk["choices"][0]["delta"].value("tool_calls", Json::array()))
      if (!call.contains("id")) argument_pieces.push_back(call["function"]["arguments"]);
  EXPECT_EQ(argument_pieces, (std::vector<std::string>{"{\"ci", "ty\": \"Os", "lo\"}"}));

  const Json named_choice = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  engine_->set_script({"{\"city\": ", "\"Rome\"}"});
  const Json named = chat({{"tools", tools()}, {"tool_choice", named_choice}});
  EXPECT_EQ(named["choices"][0]["finish_reason"], "stop");  // as OpenAI for a named function
  EXPECT_EQ(calls_without_ids(named["choices"][0]["message"]), Json::parse(R"([["get_weather", {"city": "Rome"}]])"));
  const Json named_chunks = chat({{"tools", tools()}, {"tool_choice", named_choice}, {"stream", true}});
  expect_openai_call_chunks(named_chunks);
  EXPECT_EQ(calls_without_ids(reassemble(named_chunks, finish_reason)),
            calls_without_ids(named["choices"][0]["message"]));
  EXPECT_EQ(finish_reason, "stop");

  engine_->set_script({"no JSON here"});
  const Json unforced = chat({{"tools", tools()}, {"tool_choice", named_choice}});
  EXPECT_EQ(unforced["choices"][0]["message"]["content"], "no JSON here");
  EXPECT_FALSE(unforced["choices"][0]["message"].contains("tool_calls"));
}

// A forced call cut by max_tokens: the partial call where OpenAI puts it, never content.
TEST_F(ToolCallServerTest, ForcedCallCutByLengthIsAPartialCall) {
  start("hermes");
  const Json named_choice = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  for (const Json& tool_choice : {Json("required"), named_choice}) {
    engine_->set_script(tool_choice.is_string()
                            ? std::vector<std::string>{"[{\"name\": \"get_weather\", \"parameters\": ", "{\"city\": \"Ly"}
                            : std::vector<std::string>{"{\"city\": \"Ly"},
                        FinishReason::kLength);
    const Json whole = chat({{"tools", tools()}, {"tool_choice", tool_choice}});
    const Json& choice = whole["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "length") << tool_choice;
    EXPECT_TRUE(choice["message"]["content"].is_null()) << whole;
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << whole;
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Ly");

    const Json chunks = chat({{"tools", tools()}, {"tool_choice", tool_choice}, {"stream", true}});
    expect_openai_call_chunks(chunks);
    std::string finish_reason;
    const Json streamed = reassemble(chunks, finish_reason);
    EXPECT_EQ(finish_reason, "length");
    EXPECT_TRUE(streamed["content"].is_null());
    EXPECT_EQ(streamed["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Ly");
  }
}

}  // namespace
}  // namespace loom::server
