// Request parsing/validation, response bodies and the metrics exposition of
// the OpenAI server, without a model or a socket.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/metrics_exporter.h"
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
  // The ApiError a body raises (status 0 if none).
  ApiError error_of(Endpoint endpoint, const std::string& body) const {
    try {
      parse_openai_request(endpoint, body, context());
    } catch (const ApiError& error) {
      return error;
    }
    return ApiError(0, "no error");
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
  const std::string rendered =
      tokenizer().chat_template().render({{"system", "be brief"}, {"user", "hi there"}}, true);
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
      {kC, R"({"prompt": [1, 99999]})", 400, "prompt"},
      {kC, R"({"prompt": "x", "max_tokens": "3"})", 400, "max_tokens"},
      {kC, R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {kC, R"({"prompt": "x", "temperature": -1})", 400, "temperature"},
      {kC, R"({"prompt": "x", "top_p": 0})", 400, "top_p"},
      {kC, R"({"prompt": "x", "stop": [1]})", 400, "stop"},
      {kC, R"({"prompt": "x", "stream": "yes"})", 400, "stream"},
      {kC, R"({"prompt": "x", "stream_options": {"include_usage": true}})", 400, "stream_options"},
      {kC, R"({"prompt": "x", "n": 0})", 400, "n"},
      {kC, R"({"prompt": "x", "n": 17})", 400, "n"},
      {kC, R"({"prompt": "x", "logprobs": 21})", 400, "logprobs"},
      {kC, R"({"prompt": "x", "min_tokens": 20, "max_tokens": 4})", 400, "min_tokens"},
      {kC, R"({"prompt": "x", "presence_penalty": 0.5})", 400, "presence_penalty"},
      {kC, R"({"prompt": "x", "echo": true})", 400, "echo"},
      {kC, R"({"prompt": "x", "max_tokens": 256})", 400, "prompt"},  // context is 256
      {kC, R"({"model": "nope", "prompt": "x"})", 404, "model"},
      {kC, R"({"model": 3, "prompt": "x"})", 400, "model"},
      {kChat, R"({"messages": []})", 400, "messages"},
      {kChat, R"({"messages": "hi"})", 400, "messages"},
      {kChat, R"({"prompt": "hi"})", 400, "messages"},
      {kChat, R"({"messages": [{"content": "hi"}]})", 400, "messages[0].role"},
      {kChat, R"({"messages": [{"role": "wizard", "content": "hi"}]})", 400, "messages[0].role"},
      {kChat, R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400, "top_logprobs"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})", 400, "logprobs"},
      {kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400, "tools"},
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
  const Json body = Json::parse(builder.full_body({choice}, {3, 2}));
  EXPECT_EQ(body["id"], "cmpl-1");
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["usage"], Json::parse(R"({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})"));
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

TEST(ServerMetricsTest, HistogramsAccumulateAndGaugesReplace) {
  MetricsExporter exporter;
  EngineMetrics first;
  first.num_running = 3;
  first.kv_bytes_in_use_or_cached = 4096;
  first.prefix_queried_tokens = 100;
  first.prefix_hit_tokens = 40;
  first.time_to_first_token = {0.003, 0.2};
  exporter.absorb(first);
  EngineMetrics second;
  second.num_running = 1;
  second.num_waiting = 2;
  second.kv_bytes_in_use_or_cached = 4096 + 512;
  second.kv_bytes_base = 4096;
  second.kv_bytes_residual = 512;
  second.kv_bytes_by_adapter = {{"a\"1", 300}, {"b", 0}};
  second.prefix_queried_tokens = 150;
  second.prefix_hit_tokens = 60;
  second.prefix_queried_tokens_by_mode = {{"none", 50}, {"forked", 100}};
  second.prefix_hit_tokens_by_mode = {{"none", 10}, {"forked", 50}};
  second.time_to_first_token = {50.0};
  exporter.absorb(second);
  const std::string text = exporter.render();
  auto has_line = [&](const std::string& line) { return text.find("\n" + line + "\n") != std::string::npos; };
  EXPECT_TRUE(has_line("loom_num_requests_running 1")) << text;
  EXPECT_TRUE(has_line("loom_num_requests_waiting 2"));
  EXPECT_TRUE(has_line("loom_prefix_cache_queried_tokens_total 150"));
  EXPECT_TRUE(has_line("loom_prefix_cache_hit_tokens_total 60"));
  EXPECT_TRUE(has_line("loom_kv_cache_bytes{tier=\"device\",kind=\"base\"} 4096"));
  EXPECT_TRUE(has_line("loom_kv_cache_bytes{tier=\"host\",kind=\"residual\"} 0"));
  EXPECT_TRUE(has_line("loom_kv_cache_bytes{tier=\"device\",kind=\"residual\"} 512"));
  EXPECT_TRUE(has_line("loom_prefix_cache_queried_tokens_total{mode=\"forked\"} 100"));
  EXPECT_TRUE(has_line("loom_prefix_cache_queried_tokens_total{mode=\"isolated\"} 0"));
  EXPECT_TRUE(has_line("loom_prefix_cache_hit_tokens_total{mode=\"none\"} 10"));
  EXPECT_TRUE(has_line("loom_prefix_cache_hit_tokens_total{mode=\"forked\"} 50"));
  EXPECT_TRUE(has_line("loom_kv_cache_adapter_bytes{adapter=\"a\\\"1\"} 300")) << text;
  EXPECT_TRUE(has_line("loom_kv_cache_adapter_bytes{adapter=\"b\"} 0"));
  EXPECT_TRUE(has_line("# TYPE loom_time_to_first_token_seconds histogram"));
  EXPECT_TRUE(has_line("loom_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
  EXPECT_TRUE(has_line("loom_time_to_first_token_seconds_bucket{le=\"0.25\"} 2"));
  EXPECT_TRUE(has_line("loom_time_to_first_token_seconds_bucket{le=\"40\"} 2"));
  EXPECT_TRUE(has_line("loom_time_to_first_token_seconds_bucket{le=\"80\"} 3"));
  EXPECT_TRUE(has_line("loom_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3"));
  EXPECT_TRUE(has_line("loom_time_to_first_token_seconds_count 3"));
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace loom::server
