// The HTTP layer end to end over a real socket, against a scripted engine:
// routes, auth, error statuses, SSE framing, runtime adapters, disconnects.
#include <gtest/gtest.h>

#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/http_server.h"
#include "server_fake_engine.h"
#include "server_tokenizer_fixture.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

class ServerHttpTest : public ::testing::Test {
 protected:
  void start(ServerConfig config = {}, int handler_threads = 8) {
    engine_ = std::make_unique<test::FakeEngine>(test::make_server_test_tokenizer(), 256);
    engine_->load_adapter("agent0", "/adapters/agent0");
    config.http.port = 0;
    config.served_model_names = {"tiny"};
    config.model_path = "/models/tiny";
    config.http.num_handler_threads = handler_threads;
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
  httplib::Result post(const std::string& path, const Json& body, const httplib::Headers& headers = {}) {
    return client_->Post(path.c_str(), headers, body.dump(), "application/json");
  }
  static Json error_of(const httplib::Result& result) { return Json::parse(result->body)["error"]; }

  // The JSON payloads of an SSE body, "[DONE]" kept as a string.
  static std::vector<Json> events(const std::string& body) {
    std::vector<Json> list;
    size_t position = 0;
    while ((position = body.find("data: ", position)) != std::string::npos) {
      const size_t end = body.find("\n\n", position);
      const std::string payload = body.substr(position + 6, end - position - 6);
      list.push_back(payload == "[DONE]" ? Json("[DONE]") : Json::parse(payload));
      position = end;
    }
    return list;
  }

  std::unique_ptr<test::FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ServerHttpTest, CompletionAndChat) {
  start();
  auto result = post("/v1/completions", {{"model", "agent0"}, {"prompt", {1, 2, 3}}, {"max_tokens", 3}});
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  Json body = Json::parse(result->body);
  const auto& tokenizer = *engine_->model().tokenizer;
  EXPECT_EQ(body["choices"][0]["text"], tokenizer.decode({4}) + tokenizer.decode({5}) + tokenizer.decode({6}));
  EXPECT_EQ(body["usage"], Json::parse(R"({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                                           "prompt_tokens_details": {"cached_tokens": 0}})"));
  EXPECT_EQ(engine_->last().adapter, "agent0");

  result = post("/v1/chat/completions", {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                         {"max_completion_tokens", 2}, {"n", 2}});
  ASSERT_EQ(result->status, 200) << result->body;
  body = Json::parse(result->body);
  EXPECT_EQ(body["object"], "chat.completion");
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["message"]["role"], "assistant");
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
  EXPECT_EQ(engine_->last().adapter, "");
}

TEST_F(ServerHttpTest, StreamingChatFraming) {
  start();
  auto result = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                              {"max_tokens", 3}, {"stream", true},
                                              {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "text/event-stream");
  const auto list = events(result->body);
  ASSERT_EQ(list.size(), 1u + 3u + 1u + 1u);  // role, 3 deltas, usage, [DONE]
  EXPECT_EQ(list[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(list[1]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(list[3]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(list[4]["choices"], Json::array());
  EXPECT_EQ(list[4]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(list[5], "[DONE]");
}

TEST_F(ServerHttpTest, ErrorStatusesAndServerKeepsServing) {
  ServerConfig config;
  config.http.max_request_bytes = 4096;
  start(config);
  auto result = client_->Post("/v1/completions", "{oops", "application/json");
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(error_of(result)["type"], "invalid_request_error");
  result = post("/v1/completions", {{"model", "ghost"}, {"prompt", "x"}});
  EXPECT_EQ(result->status, 404);
  EXPECT_EQ(error_of(result)["param"], "model");
  result = post("/v1/completions", {{"prompt", std::string(5000, 'x')}});
  EXPECT_EQ(result->status, 413);
  EXPECT_EQ(error_of(result)["code"], "request_too_large");
  result = post("/v1/completions", {{"prompt", {1, 2}}, {"max_tokens", 255}});
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(error_of(result)["code"], "context_length_exceeded");
  engine_->queue_full = true;
  result = post("/v1/completions", {{"prompt", "x"}, {"stream", true}});
  EXPECT_EQ(result->status, 503);
  EXPECT_EQ(result->get_header_value("Retry-After"), "1");
  engine_->queue_full = false;
  result = client_->Get("/v1/nothing");
  EXPECT_EQ(result->status, 404);
  EXPECT_TRUE(error_of(result)["message"].is_string());
  result = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}});
  EXPECT_EQ(result->status, 200) << result->body;
}

TEST_F(ServerHttpTest, ApiKeyGuardsV1Only) {
  ServerConfig config;
  config.api_key = "sekrit";
  start(config);
  auto result = client_->Get("/v1/models");
  EXPECT_EQ(result->status, 401);
  EXPECT_EQ(error_of(result)["type"], "authentication_error");
  result = client_->Get("/v1/models", {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(result->status, 401);
  result = client_->Get("/v1/models", {{"Authorization", "Bearer sekrit"}});
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(client_->Get("/health")->status, 200);
  EXPECT_EQ(client_->Get("/metrics")->status, 200);
}

TEST_F(ServerHttpTest, ModelsHealthMetrics) {
  start();
  const Json models = Json::parse(client_->Get("/v1/models")->body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_TRUE(models["data"][0]["parent"].is_null());
  EXPECT_EQ(models["data"][1]["id"], "agent0");
  EXPECT_EQ(models["data"][1]["parent"], "tiny");
  EXPECT_EQ(models["data"][1]["root"], "/adapters/agent0");
  EXPECT_EQ(models["data"][1]["kv_sharing"], "isolated");
  EXPECT_FALSE(models["data"][0].contains("kv_sharing"));
  const auto metrics = client_->Get("/metrics");
  EXPECT_NE(metrics->body.find("loom_time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.005\"} 1"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("loom_num_requests_running{model_name=\"tiny\"} 0"), std::string::npos);
}

TEST_F(ServerHttpTest, RuntimeAdaptersOnlyWhenAllowed) {
  start();
  EXPECT_EQ(post("/v1/load_lora_adapter", {{"lora_name", "b"}, {"lora_path", "/x"}})->status, 404);
  TearDown();

  test::TempDir lora_dir;
  ServerConfig config;
  config.allow_runtime_lora = true;
  config.lora_dir = lora_dir.str();
  start(config);
  auto result = post("/v1/load_lora_adapter", {{"lora_name", "b"}, {"lora_path", "b"}});
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(post("/v1/completions", {{"model", "b"}, {"prompt", "x"}, {"max_tokens", 1}})->status, 200);
  result = post("/v1/load_lora_adapter", {{"lora_name", "b"}, {"lora_path", "b"}});
  EXPECT_EQ(result->status, 400);  // already loaded
  result = post("/v1/load_lora_adapter", {{"lora_name", "c"}, {"lora_path", "../../etc"}});
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(error_of(result)["param"], "lora_path");
  result = post("/v1/load_lora_adapter", {{"lora_name", "c"}, {"lora_path", "missing"}});
  EXPECT_EQ(result->status, 400);
  EXPECT_EQ(post("/v1/load_lora_adapter", {{"lora_name", 3}})->status, 400);
  EXPECT_EQ(post("/v1/unload_lora_adapter", {{"lora_name", "b"}})->status, 200);
  EXPECT_EQ(post("/v1/unload_lora_adapter", {{"lora_name", "b"}})->status, 404);
  EXPECT_EQ(post("/v1/completions", {{"model", "b"}, {"prompt", "x"}})->status, 404);
}

TEST_F(ServerHttpTest, LoadBodyChoosesTheKvSharingMode) {
  ServerConfig config;
  config.allow_runtime_lora = true;
  start(config);
  auto result = post("/v1/load_lora_adapter", {{"lora_name", "f"}, {"lora_path", "/a/f"}, {"kv_sharing", "forked"}});
  ASSERT_EQ(result->status, 200) << result->body;
  result = post("/v1/load_lora_adapter", {{"lora_name", "n"}, {"lora_path", "/a/n"}, {"kv_sharing", nullptr}});
  ASSERT_EQ(result->status, 200) << result->body;
  for (const Json& bad : {Json("shared"), Json("Forked"), Json(3), Json::array()}) {
    result = post("/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", "/a/x"}, {"kv_sharing", bad}});
    EXPECT_EQ(result->status, 400) << bad;
    EXPECT_EQ(error_of(result)["param"], "kv_sharing");
    const std::string message = error_of(result)["message"];
    for (const char* mode : {"isolated", "activated", "base", "forked"})
      EXPECT_NE(message.find(mode), std::string::npos) << message;
  }
  // The engine refusing a mode (activated without invocation tokens) is a 400 too.
  result = post("/v1/load_lora_adapter", {{"lora_name", "a"}, {"lora_path", "/a/a"}, {"kv_sharing", "activated"}});
  EXPECT_EQ(result->status, 400);
  const Json models = Json::parse(client_->Get("/v1/models")->body);
  std::map<std::string, std::string> modes;
  for (const Json& model : models["data"])
    if (model.contains("kv_sharing")) modes[model["id"]] = model["kv_sharing"];
  EXPECT_EQ(modes, (std::map<std::string, std::string>{{"agent0", "isolated"}, {"f", "forked"}, {"n", "isolated"}}));
}

TEST_F(ServerHttpTest, DisconnectMidStreamCancels) {
  start();
  engine_->token_delay_ms = 20;
  int num_chunks = 0;
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = Json{{"prompt", "x"}, {"max_tokens", 60}, {"stream", true}}.dump();
  request.set_header("Content-Type", "application/json");
  request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++num_chunks < 2; };
  client_->send(request);
  EXPECT_GE(num_chunks, 2);
  for (int i = 0; i < 200 && engine_->num_live > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->num_live, 0);
  EXPECT_EQ(engine_->num_cancelled, 1);
}

}  // namespace
}  // namespace loom::server

namespace loom::server {
namespace {

// A whole-body (non-streaming) request whose client leaves is cancelled too.
TEST_F(ServerHttpTest, DisconnectWaitingForAWholeBodyCancels) {
  start();
  engine_->token_delay_ms = 20;
  client_->set_read_timeout(0, 200 * 1000);  // give up after 200 ms: the client closes its socket
  auto result = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 200}});
  EXPECT_FALSE(result);
  client_->stop();
  for (int i = 0; i < 200 && engine_->num_live > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->num_live, 0);
  EXPECT_EQ(engine_->num_cancelled, 1);
}

// A stream still waiting for its first token (queued, prefilling) is cancelled
// soon after its client leaves: before a keep-alive write (2 s) or the token (10 s) could fail.
TEST_F(ServerHttpTest, DisconnectBeforeTheFirstTokenCancels) {
  start();
  engine_->token_delay_ms = 10000;
  client_->set_read_timeout(0, 200 * 1000);  // headers come at once; the body does not: the client leaves
  auto result = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 5}, {"stream", true}});
  client_->stop();
  const auto closed = std::chrono::steady_clock::now();
  while (engine_->num_cancelled == 0 && std::chrono::steady_clock::now() - closed < std::chrono::milliseconds(1500))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->num_cancelled, 1);
  EXPECT_EQ(engine_->num_submitted, 1);
}

// A request whose client left while it waited for a handler thread is never
// submitted (it would cost a whole prefill before its first write failed); the
// request that held the thread, and later ones, are served.
TEST_F(ServerHttpTest, RequestAbandonedBeforeItIsHandledIsNotSubmitted) {
  start({}, 1);
  engine_->token_delay_ms = 20;
  std::string first_body;
  std::thread holder([&] {  // holds the only handler thread for ~0.6 s
    httplib::Client client("127.0.0.1", server_->bound_port());
    client.set_read_timeout(10, 0);
    auto result = client.Post("/v1/completions", Json{{"prompt", "x"}, {"max_tokens", 30}, {"stream", true}}.dump(),
                              "application/json");
    if (result) first_body = result->body;
  });
  while (engine_->num_submitted == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(server_->bound_port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    const std::string body = Json{{"prompt", "y"}, {"max_tokens", 30}, {"stream", true}}.dump();
    const std::string message = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, message.data(), message.size(), 0), static_cast<ssize_t>(message.size()));
    ::close(fd);  // gone before the handler is free
  }
  holder.join();
  EXPECT_EQ(events(first_body).back(), Json("[DONE]"));
  engine_->token_delay_ms = 0;
  auto result = post("/v1/completions", {{"prompt", "z"}, {"max_tokens", 2}});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(engine_->num_submitted, 2);  // the holder and the last request, not the abandoned one
  EXPECT_EQ(engine_->num_cancelled, 0);
}

// Graceful shutdown ends what outlives the timeout with explicit errors.
TEST_F(ServerHttpTest, ShutdownEndsRequestsThatOutliveTheTimeout) {
  start();
  engine_->token_delay_ms = 20;
  std::string stream_body;
  std::thread streaming([&] {
    httplib::Client client("127.0.0.1", server_->bound_port());
    client.set_read_timeout(10, 0);
    auto result = client.Post("/v1/completions", Json{{"prompt", "x"}, {"max_tokens", 200}, {"stream", true}}.dump(),
                              "application/json");
    if (result) stream_body = result->body;
  });
  int whole_status = 0;
  Json whole_error;
  std::thread waiting([&] {
    auto result = post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 200}});
    if (!result) return;
    whole_status = result->status;
    whole_error = error_of(result);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(server_->shutdown(std::chrono::milliseconds(200)));
  streaming.join();
  waiting.join();
  thread_.join();  // run() returned
  EXPECT_EQ(whole_status, 503);
  EXPECT_EQ(whole_error["code"], "server_shutting_down");
  const auto list = events(stream_body);
  ASSERT_GE(list.size(), 2u) << stream_body;
  EXPECT_EQ(list.back(), "[DONE]");
  EXPECT_EQ(list[list.size() - 2]["error"]["code"], "server_shutting_down");
  EXPECT_EQ(engine_->num_live, 0);
}

}  // namespace
}  // namespace loom::server
