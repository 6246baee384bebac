// --reasoning-parser over a real socket, the scripted engine writing a
// reasoning model's text: reasoning_content / reasoning on chat messages and
// stream deltas, tool calls read from the answer only, enable_thinking, the
// constraint's start after </think>, and reasoning items on /v1/responses.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/http_server.h"
#include "server_fake_engine.h"
#include "server_tokenizer_fixture.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

// ChatML that renders tools and, with enable_thinking false, closes an empty think block (as Qwen3's does).
constexpr const char* kThinkTemplate =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if tools %}{% for t in tools %}{{ t.function.name }}\n{% endfor %}{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}";

const Json kUser = {{{"role", "user"}, {"content", "weather in Paris?"}}};
const std::vector<std::string> kThinkScript = {"<thi", "nk>\nplan: look it", " up\n</th", "ink>\n\nIt is", " sunny."};

Json tools() {
  return Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "get_time"}}])");
}

class ReasoningServerTest : public ::testing::Test {
 protected:
  // think_tokens: the vocabulary has <think> and </think> (what --reasoning-parser auto looks for).
  void start(const std::string& reasoning_parser, bool think_tokens = false) {
    engine_ = std::make_unique<test::FakeEngine>(test::make_server_test_tokenizer(think_tokens), 256);
    ServerConfig config;
    config.chat_template = kThinkTemplate;
    config.http.port = 0;
    config.served_model_names = {"tiny"};
    config.http.num_handler_threads = 4;
    config.tool_call_parser = "hermes";
    config.reasoning_parser = reasoning_parser;
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
  // The body, or a stream's JSON payloads ("[DONE]" left out).
  Json post(const std::string& path, Json body) {
    auto result = client_->Post(path, body.dump(), "application/json");
    EXPECT_TRUE(result);
    if (!result) return {};
    EXPECT_EQ(result->status, 200) << result->body;
    if (!body.value("stream", false)) return Json::parse(result->body);
    Json list = Json::array();
    size_t position = 0;
    while ((position = result->body.find("data: ", position)) != std::string::npos) {
      const size_t end = result->body.find("\n\n", position);
      const std::string payload = result->body.substr(position + 6, end - position - 6);
      if (payload != "[DONE]") list.push_back(Json::parse(payload));
      position = end;
    }
    return list;
  }
  Json chat(Json body) {
    body["messages"] = kUser;
    return post("/v1/chat/completions", std::move(body));
  }
  // A chat stream's choice 0 joined: {reasoning, content, tool call names, finish_reason}; checks that the
  // two names of the thinking agree and that no chunk mixes thinking with the answer.
  static Json join(const Json& chunks) {
    std::string reasoning, content, finish;
    Json names = Json::array();
    for (const Json& chunk : chunks) {
      const Json& choice = chunk["choices"][0];
      const Json& delta = choice["delta"];
      if (delta.contains("reasoning_content")) {
        EXPECT_EQ(delta["reasoning_content"], delta["reasoning"]);
        EXPECT_FALSE(delta.contains("content") || delta.contains("tool_calls")) << chunk.dump();
        reasoning += delta["reasoning_content"].get<std::string>();
      }
      if (delta.contains("content") && delta["content"].is_string()) content += delta["content"].get<std::string>();
      for (const Json& call : delta.value("tool_calls", Json::array()))
        if (call.contains("id")) names.push_back(call["function"]["name"]);
      if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    }
    return {{"reasoning", reasoning}, {"content", content}, {"names", names}, {"finish_reason", finish}};
  }

  std::unique_ptr<test::FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ReasoningServerTest, ThinkingGoesToReasoningContent) {
  start("qwen3");
  engine_->set_script(kThinkScript);
  const Json message = chat(Json::object())["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "\nplan: look it up\n");
  EXPECT_EQ(message["reasoning"], message["reasoning_content"]);
  EXPECT_EQ(message["content"], "\n\nIt is sunny.");

  const Json streamed = join(chat({{"stream", true}}));
  EXPECT_EQ(streamed["reasoning"], "\nplan: look it up\n");
  EXPECT_EQ(streamed["content"], "\n\nIt is sunny.");
  EXPECT_EQ(streamed["finish_reason"], "stop");

  // Cut while thinking: all reasoning, content null.
  engine_->set_script({"<think>still", " going"}, FinishReason::kLength);
  const Json cut = chat(Json::object())["choices"][0];
  EXPECT_EQ(cut["message"]["reasoning_content"], "still going");
  EXPECT_TRUE(cut["message"]["content"].is_null());
  EXPECT_EQ(cut["finish_reason"], "length");
}

TEST_F(ReasoningServerTest, EnableThinkingFalseAndNoParserLeaveItAllContent) {
  start("qwen3");
  engine_->set_script({"It is ", "sunny."});
  const Json off = chat({{"chat_template_kwargs", {{"enable_thinking", false}}}})["choices"][0]["message"];
  EXPECT_EQ(off["content"], "It is sunny.");
  EXPECT_TRUE(off["reasoning_content"].is_null());
  const Json streamed = join(chat({{"chat_template_kwargs", {{"enable_thinking", false}}}, {"stream", true}}));
  EXPECT_EQ(streamed["reasoning"], "");
  EXPECT_EQ(streamed["content"], "It is sunny.");

  TearDown();
  start("none");
  engine_->set_script(kThinkScript);
  const Json plain = chat(Json::object())["choices"][0]["message"];
  EXPECT_EQ(plain, Json({{"role", "assistant"}, {"content", "<think>\nplan: look it up\n</think>\n\nIt is sunny."}}));
}

TEST_F(ReasoningServerTest, ToolCallsAreReadAfterTheThinkingOnly) {
  start("deepseek_r1");
  // DeepSeek-R1's template opened the think block: the output starts in it.
  engine_->set_script({"maybe <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>", "</think>",
                       "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>"});
  const Json choice = chat({{"tools", tools()}})["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["reasoning_content"],
            "maybe <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");

  const Json streamed = join(chat({{"tools", tools()}, {"stream", true}}));
  EXPECT_EQ(streamed["names"], Json::array({"get_weather"}));
  EXPECT_EQ(streamed["reasoning"], choice["message"]["reasoning_content"]);
  EXPECT_EQ(streamed["finish_reason"], "tool_calls");
}

TEST_F(ReasoningServerTest, ConstraintsStartAfterTheThinking) {
  start("qwen3");
  const Json format = {{"type", "json_schema"},
                       {"json_schema", {{"name", "a"}, {"schema", {{"type", "object"}}}}}};
  chat({{"response_format", format}});
  EXPECT_TRUE(engine_->last().constraint);
  EXPECT_EQ(engine_->last().constraint_after, "</think>");
  chat({{"response_format", format}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
  EXPECT_TRUE(engine_->last().constraint);
  EXPECT_EQ(engine_->last().constraint_after, "");  // the prompt closed the thinking
  chat({{"tools", tools()}, {"tool_choice", "required"}});
  EXPECT_EQ(engine_->last().constraint_after, "</think>");

  TearDown();
  start("none");
  chat({{"response_format", format}});
  EXPECT_EQ(engine_->last().constraint_after, "");
}

TEST_F(ReasoningServerTest, ResponsesApiHasAReasoningItem) {
  start("qwen3");
  engine_->set_script(kThinkScript);
  const Json response = post("/v1/responses", {{"model", "tiny"}, {"input", "weather in Paris?"}});
  ASSERT_EQ(response["output"].size(), 2u) << response.dump();
  const Json& thinking = response["output"][0];
  EXPECT_EQ(thinking["type"], "reasoning");
  EXPECT_EQ(thinking["id"].get<std::string>().substr(0, 3), "rs_");
  EXPECT_EQ(thinking["summary"], Json::array());
  EXPECT_EQ(thinking["content"], Json::parse(R"([{"type": "reasoning_text", "text": "\nplan: look it up\n"}])"));
  EXPECT_EQ(response["output"][1]["content"][0]["text"], "\n\nIt is sunny.");

  const Json events = post("/v1/responses", {{"model", "tiny"}, {"input", "weather?"}, {"stream", true}});
  std::vector<std::string> types;
  std::string reasoning;
  for (const Json& event : events) {
    types.push_back(event["type"]);
    if (event["type"] == "response.reasoning_text.delta") reasoning += event["delta"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "\nplan: look it up\n");
  const auto at = [&](const std::string& type) { return std::find(types.begin(), types.end(), type) - types.begin(); };
  EXPECT_LT(at("response.reasoning_text.delta"), at("response.reasoning_text.done"));
  EXPECT_LT(at("response.reasoning_text.done"), at("response.output_text.delta"));
  EXPECT_EQ(events.back()["type"], "response.completed");
  const Json& streamed = events.back()["response"]["output"];
  ASSERT_EQ(streamed.size(), 2u);
  EXPECT_EQ(streamed[0]["content"], thinking["content"]);
  EXPECT_EQ(streamed[1]["content"][0]["text"], "\n\nIt is sunny.");

  // Cut while thinking: the reasoning item alone, incomplete.
  engine_->set_script({"<think>still"}, FinishReason::kLength);
  const Json cut = post("/v1/responses", {{"model", "tiny"}, {"input", "x"}});
  ASSERT_EQ(cut["output"].size(), 1u);
  EXPECT_EQ(cut["output"][0]["type"], "reasoning");
  EXPECT_EQ(cut["output"][0]["status"], "incomplete");
  EXPECT_EQ(cut["status"], "incomplete");
}

TEST_F(ReasoningServerTest, ReasoningTokensCountInUsage) {
  start("qwen3");
  // One token per piece: the four up to the one closing </think> are the thinking's.
  engine_->set_script(kThinkScript);
  const Json usage = chat(Json::object())["usage"];
  EXPECT_EQ(usage["completion_tokens"], 5);
  EXPECT_EQ(usage["completion_tokens_details"]["reasoning_tokens"], 4);
  const Json chunks = chat({{"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens_details"]["reasoning_tokens"], 4);
  const Json both = chat({{"n", 2}})["usage"];
  EXPECT_EQ(both["completion_tokens"], 10);
  EXPECT_EQ(both["completion_tokens_details"]["reasoning_tokens"], 8);
  // Thinking turned off: none.
  const Json off = chat({{"chat_template_kwargs", {{"enable_thinking", false}}}})["usage"];
  EXPECT_EQ(off["completion_tokens_details"]["reasoning_tokens"], 0);
  // Cut while thinking: every token.
  engine_->set_script({"<think>still", " going"}, FinishReason::kLength);
  EXPECT_EQ(chat(Json::object())["usage"]["completion_tokens_details"]["reasoning_tokens"], 2);

  // The Responses API, whole and streamed.
  engine_->set_script(kThinkScript);
  const Json response = post("/v1/responses", {{"model", "tiny"}, {"input", "x"}});
  EXPECT_EQ(response["usage"]["output_tokens"], 5);
  EXPECT_EQ(response["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
  const Json events = post("/v1/responses", {{"model", "tiny"}, {"input", "x"}, {"stream", true}});
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["type"], "response.completed");
  EXPECT_EQ(events.back()["response"]["usage"]["output_tokens_details"]["reasoning_tokens"], 4);
}

TEST_F(ReasoningServerTest, NoParserCountsNoReasoningTokens) {
  start("none");
  engine_->set_script(kThinkScript);
  const Json usage = chat(Json::object())["usage"];
  EXPECT_EQ(usage["completion_tokens_details"]["reasoning_tokens"], 0);
  // /v1/completions carries no completion_tokens_details (OpenAI's shape).
  const Json completion = post("/v1/completions", {{"model", "tiny"}, {"prompt", "x"}});
  EXPECT_FALSE(completion["usage"].contains("completion_tokens_details")) << completion.dump();
}

TEST_F(ReasoningServerTest, AutoPicksQwen3FromTheTemplateAndThinkTokens) {
  start("auto", true);  // kThinkTemplate: enable_thinking and a think block
  engine_->set_script(kThinkScript);
  const Json message = chat(Json::object())["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "\nplan: look it up\n");
  EXPECT_EQ(message["content"], "\n\nIt is sunny.");
}

TEST_F(ReasoningServerTest, AutoWithoutThinkTokensLeavesItAllContent) {
  start("auto");
  engine_->set_script(kThinkScript);
  const Json message = chat(Json::object())["choices"][0]["message"];
  EXPECT_EQ(message["content"], "<think>\nplan: look it up\n</think>\n\nIt is sunny.");
  EXPECT_TRUE(message.value("reasoning_content", Json()).is_null());
  EXPECT_EQ(chat(Json::object())["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
}

TEST(ReasoningParserFlag, UnknownNameIsRefused) {
  test::FakeEngine engine(test::make_server_test_tokenizer(), 256);
  ServerConfig config;
  config.http.port = 0;
  config.served_model_names = {"tiny"};
  config.reasoning_parser = "granite";
  EXPECT_THROW(HttpServer(engine, config), Error);
}

}  // namespace
}  // namespace loom::server
