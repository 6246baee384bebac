// Request parsing/validation and response bodies of the OpenAI server, without
// a model or a socket (the metrics exposition: server_metrics_test.cc).
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/json_input.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server_tokenizer_fixture.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

class ServerOpenAiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = new std::shared_ptr<const Tokenizer>(test::make_server_test_tokenizer()); }
  static void TearDownTestSuite() { delete tokenizer_; }

  ParseContext context() const {
    ParseContext context;
    context.tokenizer = tokenizer_->get();
    context.base_model_names = {"tiny", "/models/tiny"};
    context.has_adapter = [](const std::string& name) { return name == "agent0"; };
    context.max_context_tokens = 256;
    return context;
  }
  ParsedRequest parse(Endpoint endpoint, const Json& body) const {
    return parse_openai_request(endpoint, body.dump(), context());
  }
  // The ApiError a body raises (status 0 if none). Any other exception fails
  // the test: the parser may throw ApiError only.
  ApiError error_of(Endpoint endpoint, const std::string& body, const RequestLimits* limits = nullptr) const {
    ParseContext parse_context = context();
    if (limits) parse_context.limits = *limits;
    try {
      parse_openai_request(endpoint, body, parse_context);
    } catch (const ApiError& error) {
      return error;
    } catch (const std::exception& error) {
      ADD_FAILURE() << "not an ApiError: " << error.what() << " for " << body;
      return ApiError(-1, "other exception");
    }
    return ApiError(0, "no error");
  }
  // Expects a 400 naming `param`, whose body serialises and whose message
  // holds printable ASCII only (no raw body bytes).
  void expect_bad_field(Endpoint endpoint, const std::string& body, const std::string& param,
                        const RequestLimits* limits = nullptr) const {
    const ApiError error = error_of(endpoint, body, limits);
    EXPECT_EQ(error.status(), 400) << body << ": " << error.message();
    EXPECT_EQ(error.param(), param) << body << ": " << error.message();
    for (const char c : error.message())
      EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "raw byte " << int(static_cast<unsigned char>(c)) << " in "
                                         << error.message();
    EXPECT_NO_THROW(Json::parse(error.body())) << body;
  }
  const Tokenizer& tokenizer() const { return **tokenizer_; }

  static std::shared_ptr<const Tokenizer>* tokenizer_;
};
std::shared_ptr<const Tokenizer>* ServerOpenAiTest::tokenizer_ = nullptr;

TEST_F(ServerOpenAiTest, CompletionFieldsBecomeEngineRequest) {
  const ParsedRequest parsed = parse(Endpoint::kCompletions,
                                     {{"model", "agent0"}, {"prompt", "hello world"}, {"max_tokens", 7},
                                      {"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 5}, {"seed", 42},
                                      {"stop", "\n"}, {"logprobs", 3}, {"ignore_eos", true}, {"min_tokens", 2},
                                      {"priority", -1}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  EXPECT_EQ(parsed.adapter, "agent0");
  EXPECT_EQ(parsed.model, "agent0");
  ASSERT_EQ(parsed.prompts.size(), 1u);
  EXPECT_EQ(parsed.prompts[0], tokenizer().encode("hello world", true));
  EXPECT_TRUE(parsed.stream);
  EXPECT_TRUE(parsed.include_usage);
  EXPECT_TRUE(parsed.logprobs.enabled);
  EXPECT_EQ(parsed.logprobs.num_top, 3);
  const EngineRequest request = parsed.engine_request(0);
  EXPECT_EQ(request.prompt_tokens, parsed.prompts[0]);
  EXPECT_EQ(request.adapter, "agent0");
  EXPECT_EQ(request.max_new_tokens, 7);
  EXPECT_EQ(request.min_new_tokens, 2);
  EXPECT_FLOAT_EQ(request.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(request.sampling.top_p, 0.9f);
  EXPECT_EQ(request.sampling.top_k, 5);
  EXPECT_EQ(request.sampling.seed, 42u);
  EXPECT_EQ(request.sampling.num_top_logprobs, 3);
  EXPECT_EQ(request.stop_strings, std::vector<std::string>{"\n"});
  EXPECT_TRUE(request.ignore_eos);
  EXPECT_EQ(request.priority, -1);
}

TEST_F(ServerOpenAiTest, GenerationConfigDefaultsFillOnlyOmittedSamplingFields) {
  test::TempDir directory;
  std::ofstream(directory.path() / "generation_config.json")
      << R"({"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
            "do_sample": true, "eos_token_id": [1, 2]})";
  const SamplingDefaults defaults = read_generation_config(directory.str());
  EXPECT_EQ(defaults.source, (directory.path() / "generation_config.json").string());
  ParseContext with_defaults = context();
  with_defaults.sampling_defaults = defaults;
  const SamplingParams omitted =
      parse_openai_request(Endpoint::kCompletions, R"({"model": "tiny", "prompt": "hi"})", with_defaults)
          .engine_template.sampling;
  EXPECT_FLOAT_EQ(omitted.temperature, 0.6f);
  EXPECT_FLOAT_EQ(omitted.top_p, 0.9f);
  EXPECT_EQ(omitted.top_k, 20);
  EXPECT_FLOAT_EQ(omitted.min_p, 0.05f);
  EXPECT_FLOAT_EQ(omitted.repetition_penalty, 1.1f);
  const SamplingParams given = parse_openai_request(
      Endpoint::kCompletions, R"({"model": "tiny", "prompt": "hi", "temperature": 0, "top_k": -1})", with_defaults)
                                   .engine_template.sampling;
  EXPECT_EQ(given.temperature, 0.0f);  // the request's own values win
  EXPECT_EQ(given.top_k, 0);
  EXPECT_FLOAT_EQ(given.top_p, 0.9f);
  // No file: OpenAI's defaults. A bad value: an error naming the file and the key.
  test::TempDir empty;
  EXPECT_EQ(read_generation_config(empty.str()), SamplingDefaults{});
  std::ofstream(empty.path() / "generation_config.json") << R"({"temperature": 7})";
  test::expect_error([&] { read_generation_config(empty.str()); }, ErrorKind::kFormat,
                     {"generation_config.json", "temperature"});
}

TEST_F(ServerOpenAiTest, PromptShapesAndDefaults) {
  const auto strings = parse(Endpoint::kCompletions, {{"model", "tiny"}, {"prompt", {"a b", "c"}}, {"n", 2}});
  ASSERT_EQ(strings.prompts.size(), 2u);
  EXPECT_EQ(strings.num_choices(), 4);
  EXPECT_EQ(strings.adapter, "");
  EXPECT_EQ(strings.engine_request(3).prompt_tokens, tokenizer().encode("c", true));
  EXPECT_EQ(strings.engine_request(1).sampling.seed, strings.engine_request(0).sampling.seed + 1);
  EXPECT_EQ(strings.engine_template.max_new_tokens, 16);  // OpenAI's completions default
  EXPECT_FLOAT_EQ(strings.engine_template.sampling.temperature, 1.0f);

  const auto ids = parse(Endpoint::kCompletions, {{"model", "/models/tiny"}, {"prompt", {5, 6, 7}}});
  EXPECT_EQ(ids.prompts, (std::vector<std::vector<TokenId>>{{5, 6, 7}}));
  const auto id_lists = parse(Endpoint::kCompletions, {{"prompt", {{1, 2}, {3}}}});  // no model: the base
  EXPECT_EQ(id_lists.prompts, (std::vector<std::vector<TokenId>>{{1, 2}, {3}}));
  EXPECT_EQ(id_lists.model, "tiny");
  EXPECT_FALSE(id_lists.logprobs.enabled);
}

TEST_F(ServerOpenAiTest, ChatRendersTemplateAndUsesRemainingContext) {
  const Json messages = {{{"role", "system"}, {"content", "be brief"}},
                         {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi "}}, {{"type", "text"}, {"text", "there"}}}}}};
  const auto parsed = parse(Endpoint::kChatCompletions,
                            {{"model", "tiny"}, {"messages", messages}, {"logprobs", true}, {"top_logprobs", 2}});
  // Text parts are joined with "\n", as vLLM joins them for string-content templates.
  const std::string rendered =
      tokenizer().chat_template().render({{"system", "be brief"}, {"user", "hi \nthere"}}, true);
  ASSERT_EQ(parsed.prompts.size(), 1u);
  EXPECT_EQ(parsed.prompts[0], tokenizer().encode(rendered, false));
  EXPECT_EQ(parsed.engine_template.max_new_tokens, 256 - static_cast<int32_t>(parsed.prompts[0].size()));
  EXPECT_EQ(parsed.engine_template.sampling.num_top_logprobs, 2);

  const auto limited = parse(Endpoint::kChatCompletions,
                             {{"messages", messages}, {"max_tokens", 9}, {"max_completion_tokens", 3}});
  EXPECT_EQ(limited.engine_template.max_new_tokens, 3);  // max_completion_tokens wins
}

TEST_F(ServerOpenAiTest, BadInputsGetStatusAndParam) {
  struct Case {
    Endpoint endpoint;
    std::string body;
    int status;
    std::string param;
  };
  const Endpoint kC = Endpoint::kCompletions, kChat = Endpoint::kChatCompletions;
  const std::vector<Case> cases = {
      {kC, "{not json", 400, ""},
      {kC, "[1, 2]", 400, ""},
      {kC, R"({"model": "tiny"})", 400, "prompt"},
      {kC, R"({"prompt": 5})", 400, "prompt"},
      {kC, R"({"prompt": []})", 400, "prompt"},
      {kC, R"({"prompt": [1, 99999]})", 400, "prompt[1]"},
      {kC, R"({"prompt": "x", "max_tokens": "3"})", 400, "max_tokens"},
      {kC, R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {kC, R"({"prompt": "x", "temperature": -1})", 400, "temperature"},
      {kC, R"({"prompt": "x", "top_p": 0})", 400, "top_p"},
      {kC, R"({"prompt": "x", "stop": [1]})", 400, "stop[0]"},
      {kC, R"({"prompt": "x", "stream": "yes"})", 400, "stream"},
      {kC, R"({"prompt": "x", "stream_options": {"include_usage": true}})", 400, "stream_options"},
      {kC, R"({"prompt": "x", "n": 0})", 400, "n"},
      {kC, R"({"prompt": "x", "n": 17})", 400, "n"},
      {kC, R"({"prompt": "x", "logprobs": 21})", 400, "logprobs"},
      {kC, R"({"prompt": "x", "min_tokens": 20, "max_tokens": 4})", 400, "min_tokens"},
      {kC, R"({"prompt": "x", "presence_penalty": 2.5})", 400, "presence_penalty"},
      {kC, R"({"prompt": "x", "frequency_penalty": -3})", 400, "frequency_penalty"},
      {kC, R"({"prompt": "x", "repetition_penalty": 0})", 400, "repetition_penalty"},
      {kC, R"({"prompt": "x", "min_p": 1.5})", 400, "min_p"},
      {kC, R"({"prompt": "x", "logit_bias": {"1": 101}})", 400, "logit_bias.1"},
      {kC, R"({"prompt": "x", "logit_bias": {"one": 1}})", 400, "logit_bias.one"},
      {kC, R"({"prompt": "x", "logit_bias": {"99999": 1}})", 400, "logit_bias.99999"},
      {kC, R"({"prompt": "x", "echo": true, "logprobs": 1})", 400, "echo"},
      {kC, R"({"prompt": "x", "max_tokens": 256})", 400, "prompt"},  // context is 256
      {kC, R"({"model": "nope", "prompt": "x"})", 404, "model"},
      {kC, R"({"model": 3, "prompt": "x"})", 400, "model"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", 400, "echo"},
      {kChat, R"({"messages": []})", 400, "messages"},
      {kChat, R"({"messages": "hi"})", 400, "messages"},
      {kChat, R"({"prompt": "hi"})", 400, "messages"},
      {kChat, R"({"messages": [{"content": "hi"}]})", 400, "messages[0].role"},
      {kChat, R"({"messages": [{"role": "wizard", "content": "hi"}]})", 400, "messages[0].role"},
      {kChat, R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400, "top_logprobs"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})", 400, "logprobs"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400, "tools[0].function"},
  };
  for (const Case& item : cases) {
    const ApiError error = error_of(item.endpoint, item.body);
    EXPECT_EQ(error.status(), item.status) << item.body << ": " << error.message();
    EXPECT_EQ(error.param(), item.param) << item.body;
    const Json body = Json::parse(error.body());
    EXPECT_TRUE(body["error"]["message"].is_string());
    EXPECT_EQ(body["error"]["type"], item.status == 404 ? "invalid_request_error" : error.type());
  }
}

TEST_F(ServerOpenAiTest, ErrorBodyAndEngineErrorMapping) {
  const Json body = Json::parse(ApiError(400, "bad", "invalid_request_error", "prompt").body());
  EXPECT_EQ(body, Json::parse(R"({"error": {"message": "bad", "type": "invalid_request_error",
                                             "param": "prompt", "code": null}})"));
  EXPECT_EQ(api_error_from(Error(ErrorKind::kNotFound, "x")).status(), 404);
  const ApiError busy = api_error_from(Error(ErrorKind::kCapacity, "queue full"));
  EXPECT_EQ(busy.status(), 503);
  EXPECT_EQ(busy.retry_after_seconds(), 1);
  EXPECT_EQ(api_error_from(Error(ErrorKind::kInvalidArgument, "x")).status(), 400);
  EXPECT_EQ(api_error_from(Error(ErrorKind::kInternal, "x")).status(), 500);
  const ApiError shutting_down = api_error_from(Error(ErrorKind::kUnavailable, "the engine is shutting down"));
  EXPECT_EQ(shutting_down.status(), 503);
  EXPECT_EQ(shutting_down.code(), "server_shutting_down");
  EXPECT_EQ(api_error_from(Error(ErrorKind::kCancelled, "x")).status(), 400);
}

TEST_F(ServerOpenAiTest, CompletionBodyWithLogprobs) {
  const auto parsed = parse(Endpoint::kCompletions, {{"model", "tiny"}, {"prompt", "hi"}, {"logprobs", 1}});
  ResponseBuilder builder(parsed, tokenizer(), "cmpl-1", 1700000000);
  const TokenId a = tokenizer().encode("ab", false)[0];
  ChoiceResult choice;
  choice.text = tokenizer().decode({a, a});
  choice.tokens = {{a, -0.25f, {{a + 1, -0.1f}}}, {a, -0.5f, {{a, -0.5f}}}};
  choice.finished = true;
  choice.finish_reason = FinishReason::kStop;
  choice.num_output_tokens = 2;
  const Json body = Json::parse(builder.full_body({choice}, {3, 2, 2}));
  EXPECT_EQ(body["id"], "cmpl-1");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["usage"], Json::parse(R"({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                           "prompt_tokens_details": {"cached_tokens": 2}})"));
  EXPECT_FALSE(body.contains("system_fingerprint"));  // none given to the builder
  const Json& item = body["choices"][0];
  EXPECT_EQ(item["index"], 0);
  EXPECT_EQ(item["text"], choice.text);
  EXPECT_EQ(item["finish_reason"], "stop");
  const std::string token = tokenizer().decode({a});
  EXPECT_EQ(item["logprobs"]["tokens"], Json::array({token, token}));
  EXPECT_EQ(item["logprobs"]["token_logprobs"], Json::array({-0.25, -0.5}));
  EXPECT_EQ(item["logprobs"]["text_offset"], Json::array({0, token.size()}));
  // The best alternative plus the sampled token.
  EXPECT_EQ(item["logprobs"]["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(item["logprobs"]["top_logprobs"][1], Json({{token, -0.5}}));
}

TEST_F(ServerOpenAiTest, ChatBodyAndStreamChunks) {
  const Json messages = {{{"role", "user"}, {"content", "hi"}}};
  const auto parsed = parse(Endpoint::kChatCompletions,
                            {{"model", "agent0"}, {"messages", messages}, {"logprobs", true}, {"top_logprobs", 1},
                             {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ResponseBuilder builder(parsed, tokenizer(), "chatcmpl-1", 5);
  const TokenId a = tokenizer().encode("a", false)[0];

  ChoiceResult choice;
  choice.text = "a";
  choice.tokens = {{a, -0.75f, {{a, -0.75f}}}};
  const Json body = Json::parse(builder.full_body({choice}, {4, 1}));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"], Json::parse(R"({"role": "assistant", "content": "a"})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  const Json& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["token"], "a");
  EXPECT_EQ(content[0]["logprob"], -0.75);
  EXPECT_EQ(content[0]["bytes"], Json::array({'a'}));
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "a");

  auto data_of = [](const std::string& event) {
    EXPECT_EQ(event.rfind("data: ", 0), 0u);
    EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
    return Json::parse(event.substr(6));
  };
  const Json role = data_of(builder.role_event(0));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"], Json::parse(R"({"role": "assistant", "content": ""})"));

  RequestOutput output;
  output.new_tokens = {{a, -0.75f, {}}};
  output.text_delta = "a";
  const Json delta = data_of(builder.delta_event(0, output));
  EXPECT_EQ(delta["choices"][0]["delta"], Json::parse(R"({"content": "a"})"));
  EXPECT_TRUE(delta["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(delta["usage"].is_null());
  EXPECT_EQ(delta["choices"][0]["logprobs"]["content"][0]["token"], "a");

  RequestOutput last;
  last.finished = true;
  last.finish_reason = FinishReason::kStop;
  const Json final_chunk = data_of(builder.delta_event(0, last));
  EXPECT_EQ(final_chunk["choices"][0]["delta"], Json::object());
  EXPECT_EQ(final_chunk["choices"][0]["finish_reason"], "stop");

  const Json usage = data_of(builder.usage_event({4, 1}));
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
  EXPECT_EQ(ResponseBuilder::done_event(), "data: [DONE]\n\n");
}

// Numbers that nlohmann cannot hold (1e999 overflows a double and
// used to escape as a non-ApiError exception: a 500 with internal text) and
// integers beyond each field's range, every numeric field.
TEST_F(ServerOpenAiTest, NonFiniteAndHugeNumbersAreFieldErrors) {
  const Endpoint kC = Endpoint::kCompletions, kChat = Endpoint::kChatCompletions;
  const std::string chat_messages = R"("messages": [{"role": "user", "content": "x"}])";
  struct Field {
    Endpoint endpoint;
    std::string name;      // the key in the body
    std::string template_; // body with $ where the value goes
    std::string param;
  };
  const std::vector<Field> fields = {
      {kC, "temperature", R"({"prompt": "x", "temperature": $})", "temperature"},
      {kC, "top_p", R"({"prompt": "x", "top_p": $})", "top_p"},
      {kC, "top_k", R"({"prompt": "x", "top_k": $})", "top_k"},
      {kC, "max_tokens", R"({"prompt": "x", "max_tokens": $})", "max_tokens"},
      {kC, "min_tokens", R"({"prompt": "x", "min_tokens": $})", "min_tokens"},
      {kC, "n", R"({"prompt": "x", "n": $})", "n"},
      {kC, "seed", R"({"prompt": "x", "seed": $})", "seed"},
      {kC, "priority", R"({"prompt": "x", "priority": $})", "priority"},
      {kC, "logprobs", R"({"prompt": "x", "logprobs": $})", "logprobs"},
      {kC, "best_of", R"({"prompt": "x", "best_of": $})", "best_of"},
      {kC, "presence_penalty", R"({"prompt": "x", "presence_penalty": $})", "presence_penalty"},
      {kC, "frequency_penalty", R"({"prompt": "x", "frequency_penalty": $})", "frequency_penalty"},
      {kC, "repetition_penalty", R"({"prompt": "x", "repetition_penalty": $})", "repetition_penalty"},
      {kC, "prompt token", R"({"prompt": [1, $]})", "prompt[1]"},
      {kC, "prompt list token", R"({"prompt": [[1], [2, $]]})", "prompt[1][1]"},
      {kC, "stop_token_ids", R"({"prompt": "x", "stop_token_ids": [$]})", "stop_token_ids[0]"},
      {kC, "fixed_prefix_tokens", R"({"prompt": "x", "workflow": "w", "fixed_prefix_tokens": $})",
       "fixed_prefix_tokens"},
      {kChat, "top_logprobs", "{" + chat_messages + R"(, "logprobs": true, "top_logprobs": $})", "top_logprobs"},
      {kChat, "max_completion_tokens", "{" + chat_messages + R"(, "max_completion_tokens": $})",
       "max_completion_tokens"},
  };
  for (const Field& item : fields) {
    for (const std::string value : {"1e999", "-1e999", "1e30", "-1e30", "18446744073709551616",
                                    "123456789012345678901234567890"}) {
      std::string body = item.template_;
      body.replace(body.find('$'), 1, value);
      SCOPED_TRACE(item.name + " = " + value);
      expect_bad_field(item.endpoint, body, item.param);
    }
  }
  // Negative counts and ids.
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "x", "n": -1})", "n"},
           {R"({"prompt": "x", "max_tokens": -5})", "max_tokens"},
           {R"({"prompt": "x", "min_tokens": -1})", "min_tokens"},
           {R"({"prompt": "x", "logprobs": -1})", "logprobs"},
           {R"({"prompt": "x", "top_k": -2})", "top_k"},
           {R"({"prompt": [-1]})", "prompt[0]"},
           {R"({"prompt": "x", "stop_token_ids": [-3]})", "stop_token_ids[0]"},
           {R"({"prompt": "x", "workflow": "w", "fixed_prefix_tokens": -1})", "fixed_prefix_tokens"},
           {R"({"prompt": "x", "max_tokens": 2.5})", "max_tokens"},
           {R"({"prompt": "x", "n": 18446744073709551615})", "n"},
           {R"({"prompt": "x", "priority": 3000000000})", "priority"},
       })
    expect_bad_field(kC, body, param);

  // Whole floats and full 64-bit seeds still work.
  const auto parsed = parse(kC, Json::parse(R"({"prompt": "x", "max_tokens": 3.0, "seed": 18446744073709551615})"));
  EXPECT_EQ(parsed.engine_template.max_new_tokens, 3);
  EXPECT_EQ(parsed.engine_template.sampling.seed, UINT64_MAX);  // used to be clamped to INT64_MAX silently
  EXPECT_EQ(parse(kC, Json::parse(R"({"prompt": "x", "seed": -1})")).engine_template.sampling.seed, UINT64_MAX);
}

// A non-string "type" in a content part or in response_format used
// to throw nlohmann's type_error (a 500); every field's wrong types are 400s
// naming the field's path.
TEST_F(ServerOpenAiTest, WrongTypesNameTheFieldPath) {
  const Endpoint kC = Endpoint::kCompletions, kChat = Endpoint::kChatCompletions;
  auto chat = [](const std::string& message, const std::string& extra = "") {
    return R"({"messages": [{"role": "user", "content": "a"}, )" + message + "]" + extra + "}";
  };
  const std::string user = R"({"role": "user", "content": "x"})";
  const std::vector<std::pair<std::string, std::string>> chat_cases = {
      {chat(R"({"role": "user", "content": [{"type": 5, "text": "x"}]})"), "messages[1].content[0].type"},
      {chat(R"({"role": "user", "content": [{"type": "text", "text": "x"}, {"type": null}]})"),
       "messages[1].content[1].type"},
      {chat(R"({"role": "user", "content": [{"type": ["text"], "text": "x"}]})"), "messages[1].content[0].type"},
      {chat(R"({"role": "user", "content": [{"type": "image_url", "image_url": {}}]})"),
       "messages[1].content[0].type"},
      {chat(R"({"role": "user", "content": [{"type": "text", "text": 5}]})"), "messages[1].content[0].text"},
      {chat(R"({"role": "user", "content": [{"type": "text"}]})"), "messages[1].content[0].text"},
      {chat(R"({"role": "user", "content": ["x"]})"), "messages[1].content[0]"},
      {chat(R"({"role": "user", "content": {"text": "x"}})"), "messages[1].content"},
      {chat(R"({"role": 5, "content": "x"})"), "messages[1].role"},
      {chat(R"({"role": ["user"], "content": "x"})"), "messages[1].role"},
      {chat(R"("hi")"), "messages[1]"},
      {chat(user, R"(, "response_format": {"type": 5})"), "response_format.type"},
      {chat(user, R"(, "response_format": {"type": null})"), "response_format.type"},
      {chat(user, R"(, "response_format": {"type": "xml"})"), "response_format.type"},
      {chat(user, R"(, "response_format": "text")"), "response_format"},
      {chat(user, R"(, "response_format": ["text"])"), "response_format"},
      {chat(user, R"(, "tools": "x")"), "tools"},
      {chat(user, R"(, "logprobs": "yes")"), "logprobs"},
      {chat(user, R"(, "max_tokens": "3", "max_completion_tokens": 3)"), "max_tokens"},
      {chat(user, R"(, "stream": true, "stream_options": {"include_usage": "yes"})"), "stream_options.include_usage"},
      {chat(user, R"(, "stream": true, "stream_options": [true])"), "stream_options"},
  };
  for (const auto& [body, param] : chat_cases) expect_bad_field(kChat, body, param);

  const std::vector<std::pair<std::string, std::string>> completion_cases = {
      {R"({"prompt": true})", "prompt"},
      {R"({"prompt": [{"text": "x"}]})", "prompt[0]"},
      {R"({"prompt": ["x", 5]})", "prompt[1]"},
      {R"({"prompt": [[1, "a"]]})", "prompt[0][1]"},
      {R"({"prompt": [[1], [2.5]]})", "prompt[1][0]"},
      {R"({"prompt": [1, [2]]})", "prompt[1]"},
      {R"({"prompt": "x", "stop": {"a": 1}})", "stop"},
      {R"({"prompt": "x", "stop": ["a", 1]})", "stop[1]"},
      {R"({"prompt": "x", "stop_token_ids": "1"})", "stop_token_ids"},
      {R"({"prompt": "x", "stop_token_ids": ["a"]})", "stop_token_ids[0]"},
      {R"({"prompt": "x", "logit_bias": {"1": "5"}})", "logit_bias.1"},
      {R"({"prompt": "x", "logit_bias": [1]})", "logit_bias"},
      {R"({"prompt": "x", "echo": "yes"})", "echo"},
      {R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos"},
      {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "x", "temperature": true})", "temperature"},
      {R"({"prompt": "x", "seed": "1"})", "seed"},
      {R"({"prompt": "x", "presence_penalty": "0"})", "presence_penalty"},
      {R"({"prompt": "x", "best_of": 2})", "best_of"},
      {R"({"prompt": "x", "workflow": 5})", "workflow"},
      {R"({"prompt": "x", "workflow": "w", "agent": ["a"]})", "agent"},
      {R"({"prompt": "x", "workflow": "w", "fixed_prefix_tokens": "3"})", "fixed_prefix_tokens"},
      {R"({"prompt": "x", "model": ["tiny"]})", "model"},
  };
  for (const auto& [body, param] : completion_cases) expect_bad_field(kC, body, param);
}

// Invalid UTF-8 in any string (or key) is a 400 naming the field,
// and no raw byte reaches the message (it used to, and the strict writer then
// threw while building the error body).
TEST_F(ServerOpenAiTest, InvalidUtf8NamesTheField) {
  const Endpoint kC = Endpoint::kCompletions, kChat = Endpoint::kChatCompletions;
  for (const std::string& bad : {std::string("\xff"), std::string("\xc0\xaf"), std::string("\xed\xa0\x80"),
                                std::string("a\xe2\x82"), std::string("\\ud800"), std::string("\\udc00x")}) {
    SCOPED_TRACE(bad);
    const std::vector<std::pair<std::string, std::string>> completion_cases = {
        {R"({"model": ")" + bad + R"(", "prompt": "x"})", "model"},
        {R"({"prompt": ")" + bad + R"("})", "prompt"},
        {R"({"prompt": ["ok", ")" + bad + R"("]})", "prompt[1]"},
        {R"({"prompt": "x", "stop": ")" + bad + R"("})", "stop"},
        {R"({"prompt": "x", "stop": ["a", ")" + bad + R"("]})", "stop[1]"},
        {R"({"prompt": "x", "workflow": ")" + bad + R"("})", "workflow"},
        {R"({"prompt": "x", "workflow": "w", "agent": ")" + bad + R"("})", "agent"},
        {R"({"prompt": "x", "user": ")" + bad + R"("})", "user"},  // a field we ignore is checked too
        {R"({"prompt": "x", "extra": {"deep": [")" + bad + R"("]}})", "extra.deep[0]"},
        {R"({"prompt": "x", ")" + bad + R"(": 1})", ""},  // a key: the object it is in
    };
    for (const auto& [body, param] : completion_cases) expect_bad_field(kC, body, param);
    const std::vector<std::pair<std::string, std::string>> chat_cases = {
        {R"({"messages": [{"role": ")" + bad + R"(", "content": "x"}]})", "messages[0].role"},
        {R"({"messages": [{"role": "user", "content": ")" + bad + R"("}]})", "messages[0].content"},
        {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": ")" +
             bad + R"("}]}]})",
         "messages[0].content[1].text"},
        {R"({"messages": [{"role": "user", "content": [{"type": ")" + bad + R"(", "text": "x"}]}]})",
         "messages[0].content[0].type"},
        {R"({"messages": [{"role": "user", "name": ")" + bad + R"(", "content": "x"}]})", "messages[0].name"},
        {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": ")" + bad + R"("}})",
         "response_format.type"},
    };
    for (const auto& [body, param] : chat_cases) expect_bad_field(kChat, body, param);
  }
  // A long string with a bad byte at its end: the message stays short.
  const std::string long_body = R"({"prompt": ")" + std::string(1 << 20, 'a') + "\xff\"}";
  const ApiError error = error_of(kC, long_body);
  EXPECT_EQ(error.param(), "prompt");
  EXPECT_LT(error.message().size(), 400u);
}

// The nesting guard runs before the parser on every body.
TEST_F(ServerOpenAiTest, DeepNestingIsRejectedBeforeParsing) {
  auto nested = [](int depth) {  // the body object is level 1
    return R"({"prompt": )" + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
  };
  for (int depth : {65, 1000, 100000}) {
    const ApiError error = error_of(Endpoint::kCompletions, nested(depth));
    EXPECT_EQ(error.status(), 400);
    EXPECT_NE(error.message().find("deeper than 64"), std::string::npos) << error.message();
  }
  const ApiError shallow = error_of(Endpoint::kCompletions, nested(64));  // allowed depth, wrong shape
  EXPECT_EQ(shallow.status(), 400);
  EXPECT_EQ(shallow.message().find("deeper"), std::string::npos) << shallow.message();
  // Brackets inside strings do not count.
  EXPECT_EQ(parse(Endpoint::kCompletions, {{"prompt", std::string(100, '[')}}).prompts.size(), 1u);
}

// --max-n, --max-stop-strings, --max-stop-string-bytes
// and --max-request-output-tokens (prompts x n x max_tokens; chat's default
// max_tokens is the rest of the context).
TEST_F(ServerOpenAiTest, RequestLimitsAreEnforced) {
  const Endpoint kC = Endpoint::kCompletions, kChat = Endpoint::kChatCompletions;
  RequestLimits limits;
  limits.max_n = 4;
  limits.max_stop_strings = 2;
  limits.max_stop_string_bytes = 8;
  limits.max_request_output_tokens = 100;
  expect_bad_field(kC, R"({"prompt": "x", "n": 5})", "n", &limits);
  expect_bad_field(kC, R"({"prompt": "x", "stop": ["a", "b", "c"]})", "stop", &limits);
  expect_bad_field(kC, R"({"prompt": "x", "stop": "123456789"})", "stop", &limits);
  expect_bad_field(kC, R"({"prompt": "x", "stop": ["ok", "123456789"]})", "stop[1]", &limits);
  expect_bad_field(kC, R"({"prompt": ["a", "b"], "n": 2, "max_tokens": 26})", "max_tokens", &limits);
  expect_bad_field(kC, R"({"prompt": ["a", "b", "c", "d", "e", "f", "g"]})", "max_tokens", &limits);  // 7 x 16
  expect_bad_field(kChat, R"({"messages": [{"role": "user", "content": "x"}]})", "max_tokens", &limits);
  expect_bad_field(kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 3, "max_completion_tokens": 34})",
                   "max_completion_tokens", &limits);
  // At the limits: accepted.
  ParseContext limited = context();
  limited.limits = limits;
  auto accepts = [&](Endpoint endpoint, const std::string& body) {
    EXPECT_NO_THROW(parse_openai_request(endpoint, body, limited)) << body;
  };
  accepts(kC, R"({"prompt": ["a", "b"], "n": 2, "max_tokens": 25})");
  accepts(kC, R"({"prompt": "x", "n": 4, "stop": ["12345678", "b"]})");
  accepts(kC, R"({"prompt": ["a", "b", "c", "d", "e", "f"]})");  // 6 x 16 = 96
  accepts(kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "max_tokens": 50})");
  // The defaults allow a normal request.
  EXPECT_EQ(parse(kC, {{"prompt", "x"}, {"n", 16}, {"stop", Json::array({"a", "b"})}}).n, 16);
}

// Error bodies never throw, whatever bytes they carry, and a 500
// never shows internal text.
TEST_F(ServerOpenAiTest, ErrorBodiesAreSafe) {
  const ApiError invalid_utf8(400, "unknown thing 'a\xff\xfe'", "invalid_request_error", "field\xc3");
  std::string body;
  ASSERT_NO_THROW(body = invalid_utf8.body());  // nlohmann's strict dump threw type_error 316 here
  const Json parsed = Json::parse(body);
  EXPECT_EQ(parsed["error"]["message"], "unknown thing 'a\xEF\xBF\xBD\xEF\xBF\xBD'");
  EXPECT_EQ(parsed["error"]["param"], "field\xEF\xBF\xBD");

  const ApiError internal = api_error_from(Error(ErrorKind::kInternal, "invariant failed: x < y at kv.cc:12"));
  EXPECT_EQ(internal.status(), 500);
  EXPECT_EQ(internal.message(), "internal error");
  EXPECT_EQ(internal.body().find("kv.cc"), std::string::npos);

  // Response bodies and stream events with invalid UTF-8 in generated text.
  const auto request = parse(Endpoint::kChatCompletions, {{"messages", {{{"role", "user"}, {"content", "x"}}}}});
  ResponseBuilder builder(request, tokenizer(), "chatcmpl-1", 5);
  ChoiceResult choice;
  choice.text = "half a character: \xe2\x82";
  EXPECT_NO_THROW(Json::parse(builder.full_body({choice}, {1, 1})));
  RequestOutput output;
  output.text_delta = "\xff";
  const std::string event = builder.delta_event(0, output);
  EXPECT_NO_THROW(Json::parse(event.substr(6)));
}

TEST(ServerJsonInputTest, FieldPathsOfParseErrors) {
  JsonSyntaxError error;
  EXPECT_FALSE(parse_json_text("{\"a\": [1, {\"b\": \"\xff\"}]}", error));
  EXPECT_EQ(error.field, "a[1].b");
  EXPECT_TRUE(error.message.starts_with("invalid JSON: ")) << error.message;
  EXPECT_FALSE(parse_json_text(R"([1, 2, tru])", error));
  EXPECT_EQ(error.field, "[2]");
  EXPECT_FALSE(parse_json_text(R"({"a": 1,, "b": 2})", error));
  EXPECT_EQ(error.field, "");
  EXPECT_FALSE(parse_json_text(R"({"a": {"b": 1e400}})", error));
  EXPECT_EQ(error.field, "a.b");
  EXPECT_EQ(error.message, "invalid JSON: a number is out of range (numbers must be finite)");
  EXPECT_FALSE(parse_json_text("", error));
  EXPECT_EQ(error.field, "");
  // What parses is what nlohmann's own parser gives (repeated keys: the last wins).
  const std::string text = R"({"a": [1, -2, 3.5, "x", null, true, {"b": [], "c": {}}], "a2": 18446744073709551615,
                               "k": 1, "k": 2})";
  const std::optional<Json> value = parse_json_text(text, error);
  ASSERT_TRUE(value);
  EXPECT_EQ(*value, Json::parse(text));
  EXPECT_EQ((*value)["k"], 2);
  EXPECT_EQ(field_path("", "a"), "a");
  EXPECT_EQ(field_path("a", 3), "a[3]");
  EXPECT_EQ(field_path("a[3]", "b"), "a[3].b");
}

}  // namespace
}  // namespace loom::server
