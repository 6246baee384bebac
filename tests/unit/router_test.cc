// `loom router`: the DualPath scheduler's choices (pure), and the whole flow
// against fake engines (cpp-httplib servers speaking the engines' KV contract
// and recording every call, in one global order) behind a real RouterServer.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "router/dual_path_scheduler.h"
#include "router/router_server.h"
#include "server/kv_auth.h"

namespace loom::router {
namespace {

using Json = nlohmann::json;

// ---- the scheduler ----

EngineLoad load_of(int64_t tokens, int64_t requests = 0, int64_t queued = 0, double bandwidth = 0.0) {
  EngineLoad load;
  load.num_tokens = tokens;
  load.num_requests = requests;
  load.queued_read_bytes = queued;
  load.read_bandwidth = bandwidth;
  return load;
}

TEST(DualPathScheduler, PrefillPrefersShortReadQueuesThenFewestTokens) {
  SchedulerConfig config;
  config.short_read_queue_bytes = 100;
  config.max_engine_tokens = 1000;
  // 0: long queue, least tokens; 1: short queue, more tokens; 2: short queue, fewest tokens of the short ones.
  std::vector<EngineLoad> engines = {load_of(10, 0, 500), load_of(300, 0, 50), load_of(200, 0, 100)};
  EXPECT_EQ(choose_prefill_engine(engines, config), 2u);
  engines[2].num_tokens = 1001;  // overloaded: never, whatever its queue
  EXPECT_EQ(choose_prefill_engine(engines, config), 1u);
  engines[1].available = false;  // failed recently
  EXPECT_EQ(choose_prefill_engine(engines, config), 0u);  // only the long-queue category is left
  engines[0].num_tokens = 5000;
  EXPECT_EQ(choose_prefill_engine(engines, config), std::nullopt);
  // Ties by tokens go to fewer requests.
  std::vector<EngineLoad> tied = {load_of(50, 3), load_of(50, 1)};
  EXPECT_EQ(choose_prefill_engine(tied, config), 1u);
}

TEST(DualPathScheduler, DecodeTakesFewestTokensThenFewestRequests) {
  std::vector<EngineLoad> engines = {load_of(100, 1), load_of(40, 5), load_of(40, 2)};
  EXPECT_EQ(choose_decode_engine(engines), 2u);
  engines[2].available = false;
  EXPECT_EQ(choose_decode_engine(engines), 1u);
  engines[0].available = engines[1].available = false;
  EXPECT_EQ(choose_decode_engine(engines), std::nullopt);
}

TEST(DualPathScheduler, ReadPathFollowsQueuesAndBandwidths) {
  const int64_t r = 1000;
  // Nothing in storage: no read at all, whatever the policy.
  EXPECT_EQ(choose_read_path(0, load_of(0), load_of(0), 0, PathPolicy::kDecode), ReadPath::kNone);
  // Equal sides and an unknown (fast) link: t_de = t_pe + r/1e12 > t_pe: the PE reads.
  EXPECT_EQ(choose_read_path(r, load_of(0, 0, 0, 100), load_of(0, 0, 0, 100), 0, PathPolicy::kDual),
            ReadPath::kPrefill);
  // The PE's queue is long: (9000+1000)/100 = 100 s vs (0+1000)/100 + 1000/1e6 = 10 s: the DE reads.
  EXPECT_EQ(choose_read_path(r, load_of(0, 0, 9000, 100), load_of(0, 0, 0, 100), 1e6, PathPolicy::kDual),
            ReadPath::kDecode);
  // ... unless the link is so slow that the detour costs more: 1000/10 = 100 s on the link.
  EXPECT_EQ(choose_read_path(r, load_of(0, 0, 9000, 100), load_of(0, 0, 0, 100), 10, PathPolicy::kDual),
            ReadPath::kPrefill);
  // Bandwidths: a slow PE disk (10 B/s) against an unknown (1e12) DE disk.
  EXPECT_EQ(choose_read_path(r, load_of(0, 0, 0, 10), load_of(0, 0, 0, 0), 1e9, PathPolicy::kDual),
            ReadPath::kDecode);
  // Forced policies.
  EXPECT_EQ(choose_read_path(r, load_of(0, 0, 9000, 100), load_of(0), 0, PathPolicy::kPrefill), ReadPath::kPrefill);
  EXPECT_EQ(choose_read_path(r, load_of(0), load_of(0, 0, 9000, 1), 0, PathPolicy::kDecode), ReadPath::kDecode);
  EXPECT_EQ(parse_path_policy("dual"), PathPolicy::kDual);
  EXPECT_EQ(parse_path_policy("both"), std::nullopt);
}

// ---- fake engines ----

struct Call {
  int sequence;  // global order across every fake engine
  std::string method, path;
  Json body;
  std::string authorization;
  std::string kv_auth, raw_body;  // the X-Loom-KV-Auth header, the body as sent
};

std::atomic<int> g_sequence{0};

struct FakeEngineOptions {
  std::string role = "prefill";
  bool kv_address = true;
  int num_blocks = 3;
  int64_t in_storage = 0;
  int64_t bytes_per_block = 100;
  int64_t queued_read_bytes = 0;
  double read_bandwidth = 0.0;
  int probe_status = 200;   // 4xx/5xx: an OpenAI error body
  int completion_status = 200;
};

class FakeEngine {
 public:
  explicit FakeEngine(FakeEngineOptions options) : options_(std::move(options)) {
    server_.Get("/loom/kv/status", [this](const httplib::Request& request, httplib::Response& response) {
      record(request);
      Json status = {{"role", options_.role}, {"kv_transfer_address", nullptr}, {"block_size", 16},
                     {"bytes_per_block", options_.bytes_per_block}, {"queued_read_bytes", options_.queued_read_bytes},
                     {"read_bandwidth", options_.read_bandwidth}, {"has_storage", true}, {"num_running", 0},
                     {"num_waiting", 0}, {"buffer_bytes", 0}, {"buffer_capacity_bytes", 1 << 20}};
      if (options_.kv_address) status["kv_transfer_address"] = kv_address();
      response.set_content(status.dump(), "application/json");
    });
    server_.Post("/loom/kv/probe", [this](const httplib::Request& request, httplib::Response& response) {
      record(request);
      if (options_.probe_status != 200) {
        response.status = options_.probe_status;
        response.set_content(R"({"error":{"message":"bad prompt","type":"invalid_request_error","param":"prompt",)"
                             R"("code":null}})",
                             "application/json");
        return;
      }
      Json blocks = Json::array();
      for (int i = 0; i < options_.num_blocks; ++i) blocks.push_back(fmt::format("{:032x}", i + 1));
      response.set_content(Json{{"prompt_tokens", 16 * options_.num_blocks + 5},
                                {"blocks", blocks},
                                {"bytes_per_block", options_.bytes_per_block},
                                {"in_buffer", 0},
                                {"in_storage", options_.in_storage}}
                               .dump(),
                           "application/json");
    });
    server_.Post("/loom/kv/send", [this](const httplib::Request& request, httplib::Response& response) {
      record(request);
      const Json body = Json::parse(request.body);
      const int64_t num = static_cast<int64_t>(body["blocks"].size());
      const int64_t read = body["read_storage"].get<bool>() ? options_.in_storage : 0;
      response.set_content(Json{{"sent_blocks", num}, {"sent_bytes", num * options_.bytes_per_block},
                                {"skipped_blocks", 0}, {"missing_blocks", 0}, {"read_blocks", read},
                                {"read_bytes", read * options_.bytes_per_block}, {"seconds", 0.5}}
                               .dump(),
                           "application/json");
    });
    auto completion = [this](const httplib::Request& request, httplib::Response& response) {
      record(request);
      const Json body = Json::parse(request.body);
      if (options_.completion_status != 200) {
        response.status = options_.completion_status;
        response.set_content(R"({"error":{"message":"engine trouble","type":"server_error","param":null,"code":null}})",
                             "application/json");
        return;
      }
      if (body.value("stream", false)) {
        response.set_chunked_content_provider("text/event-stream", [this](size_t, httplib::DataSink& sink) {
          for (const std::string& event : sse_events()) sink.write(event.data(), event.size());
          sink.done();
          return true;
        });
        return;
      }
      response.set_content(whole_answer(), "application/json");
    };
    server_.Post("/v1/completions", completion);
    server_.Post("/v1/chat/completions", completion);
    server_.Get("/v1/models", [this](const httplib::Request& request, httplib::Response& response) {
      record(request);
      response.set_content(R"({"object":"list","data":[{"id":"fake"}]})", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeEngine() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }
  std::string kv_address() const { return fmt::format("127.0.0.1:{}", 50000 + port_ % 10000); }
  std::string whole_answer() const { return fmt::format(R"({{"id":"cmpl-1","from":"{}","choices":[]}})", url()); }
  std::vector<std::string> sse_events() const {
    return {"data: {\"n\":1,\"from\":\"" + url() + "\"}\n\n", "data: {\"n\":2}\n\n", "data: [DONE]\n\n"};
  }

  std::vector<Call> all_calls() const {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  // The calls other than status polls.
  std::vector<Call> calls() const {
    std::lock_guard lock(mutex_);
    std::vector<Call> list;
    for (const Call& call : calls_)
      if (call.path != "/loom/kv/status") list.push_back(call);
    return list;
  }
  std::vector<std::string> paths() const {
    std::vector<std::string> list;
    for (const Call& call : calls()) list.push_back(call.method + " " + call.path);
    return list;
  }

 private:
  void record(const httplib::Request& request) {
    Call call{g_sequence.fetch_add(1), request.method, request.path, Json(),
              request.get_header_value("Authorization"), request.get_header_value(server::kKvAuthHeader), request.body};
    if (!request.body.empty()) call.body = Json::parse(request.body, nullptr, false);
    std::lock_guard lock(mutex_);
    calls_.push_back(std::move(call));
  }

  FakeEngineOptions options_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::vector<Call> calls_;
};

// A port nothing listens on.
int closed_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t size = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  close(fd);
  return ntohs(address.sin_port);
}

class RouterFlowTest : public ::testing::Test {
 protected:
  void start(std::vector<std::string> prefill_urls, std::vector<std::string> decode_urls,
             PathPolicy policy = PathPolicy::kDual, std::string api_key = "", std::string kv_secret = "") {
    RouterConfig config;
    config.http.port = 0;
    config.http.num_handler_threads = 8;
    config.prefill_urls = std::move(prefill_urls);
    config.decode_urls = std::move(decode_urls);
    config.scheduler.path_policy = policy;
    config.api_key = std::move(api_key);
    config.kv_secret = std::move(kv_secret);
    config.engine_client.connect_timeout_seconds = 1.0;
    config.engine_client.control_timeout_seconds = 5.0;
    config.engine_client.generate_timeout_seconds = 10.0;
    router_ = std::make_unique<RouterServer>(config);
    router_->connect_engines(0.0);
    router_->bind();
    thread_ = std::thread([this] { router_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", router_->bound_port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    if (router_) router_->shutdown(std::chrono::seconds(5));
    if (thread_.joinable()) thread_.join();
  }
  httplib::Result post(const std::string& path, const std::string& body, const httplib::Headers& headers = {}) {
    return client_->Post(path.c_str(), headers, body, "application/json");
  }
  // The value of one sample line of /metrics ("name{label=\"v\"}"), or -1.
  double metric(const std::string& sample) {
    auto result = client_->Get("/metrics");
    if (!result) return -1;
    const std::string& text = result->body;
    const size_t at = text.find("\n" + sample + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + sample.size() + 2));
  }

  std::unique_ptr<RouterServer> router_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

const std::string kCompletion = R"({"model":"m","prompt":"a long prompt","max_tokens":20,"stream_options":{"x":1}})";

TEST_F(RouterFlowTest, PrefillPathProbesPrefillsPushesThenRelaysTheDecodeAnswer) {
  FakeEngine pe({.role = "prefill", .in_storage = 2});
  FakeEngine de({.role = "decode"});
  start({pe.url()}, {de.url()}, PathPolicy::kPrefill);
  auto result = post("/v1/completions", kCompletion);
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(result->body, de.whole_answer());  // byte for byte

  EXPECT_EQ(pe.paths(), (std::vector<std::string>{"POST /loom/kv/probe", "POST /v1/completions", "POST /loom/kv/send"}));
  EXPECT_EQ(de.paths(), (std::vector<std::string>{"POST /v1/completions"}));
  const std::vector<Call> pe_calls = pe.calls();
  const std::vector<Call> de_calls = de.calls();
  EXPECT_LT(pe_calls[2].sequence, de_calls[0].sequence);  // the push before the decode request
  EXPECT_EQ(pe_calls[0].body["endpoint"], "completions");
  EXPECT_EQ(pe_calls[0].body["request"], Json::parse(kCompletion));
  const Json& prefill = pe_calls[1].body;
  EXPECT_EQ(prefill["max_tokens"], 1);
  EXPECT_EQ(prefill["stream"], false);
  EXPECT_FALSE(prefill.contains("stream_options"));
  EXPECT_EQ(prefill["prompt"], "a long prompt");
  const Json& push = pe_calls[2].body;
  EXPECT_EQ(push["to"], de.kv_address());
  EXPECT_EQ(push["read_storage"], false);
  EXPECT_EQ(push["wait_seconds"], 5.0);
  EXPECT_EQ(push["blocks"].size(), 3u);
  EXPECT_EQ(de_calls[0].body, Json::parse(kCompletion));  // the client's body, untouched

  EXPECT_EQ(metric(R"(loom_router_requests_total{path="prefill"})"), 1);
  EXPECT_EQ(metric(R"(loom_router_storage_read_bytes_total{side="prefill"})"), 200);  // 2 blocks x 100 B
  EXPECT_EQ(metric(R"(loom_router_kv_transfer_bytes_total{direction="pe_to_de"})"), 300);
  EXPECT_EQ(metric(R"(loom_router_kv_transfer_seconds_total{direction="pe_to_de"})"), 0.5);
}

TEST_F(RouterFlowTest, DecodePathReadsOnTheDecodeEngineFirst) {
  // The PE's disk is slow (10 B/s) and the DE's unpaced: dual picks the decode path by itself.
  FakeEngine pe({.role = "prefill", .in_storage = 2, .read_bandwidth = 10});
  FakeEngine de({.role = "decode", .in_storage = 2});
  start({pe.url()}, {de.url()}, PathPolicy::kDual);
  auto result = post("/v1/chat/completions", R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(result->body, de.whole_answer());
  EXPECT_EQ(de.paths(), (std::vector<std::string>{"POST /loom/kv/send", "POST /v1/chat/completions"}));
  EXPECT_EQ(pe.paths(),
            (std::vector<std::string>{"POST /loom/kv/probe", "POST /v1/chat/completions", "POST /loom/kv/send"}));
  const std::vector<Call> pe_calls = pe.calls();
  const std::vector<Call> de_calls = de.calls();
  EXPECT_EQ(pe_calls[0].body["endpoint"], "chat");
  EXPECT_LT(pe_calls[0].sequence, de_calls[0].sequence);  // probe, then the DE's read
  EXPECT_LT(de_calls[0].sequence, pe_calls[1].sequence);  // the DE's read and push before the prefill
  EXPECT_EQ(de_calls[0].body["to"], pe.kv_address());
  EXPECT_EQ(de_calls[0].body["read_storage"], true);
  EXPECT_EQ(de_calls[0].body["wait_seconds"], 0.0);
  EXPECT_LT(pe_calls[2].sequence, de_calls[1].sequence);
  EXPECT_EQ(metric(R"(loom_router_requests_total{path="decode"})"), 1);
  EXPECT_EQ(metric(R"(loom_router_storage_read_bytes_total{side="decode"})"), 200);
  EXPECT_EQ(metric(R"(loom_router_storage_read_bytes_total{side="prefill"})"), 0);
  EXPECT_EQ(metric(R"(loom_router_kv_transfer_bytes_total{direction="de_to_pe"})"), 300);
}

TEST_F(RouterFlowTest, NothingInStorageIsPathNone) {
  FakeEngine pe({.role = "prefill"});
  FakeEngine de({.role = "decode"});
  start({pe.url()}, {de.url()});
  auto result = post("/v1/completions", kCompletion);
  ASSERT_EQ(result->status, 200);
  EXPECT_EQ(pe.paths().size(), 3u);
  EXPECT_EQ(metric(R"(loom_router_requests_total{path="none"})"), 1);
}

TEST_F(RouterFlowTest, StreamsTheDecodeEnginesSseByteForByte) {
  FakeEngine pe({.role = "prefill"});
  FakeEngine de({.role = "decode"});
  start({pe.url()}, {de.url()});
  auto result = client_->Post(
      "/v1/completions", httplib::Headers{},
      R"({"model":"m","prompt":"p","stream":true,"stream_options":{"include_usage":true}})", "application/json");
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
  std::string expected;
  for (const std::string& event : de.sse_events()) expected += event;
  EXPECT_EQ(result->body, expected);
  EXPECT_EQ(pe.calls()[1].body["stream"], false);
  EXPECT_TRUE(de.calls()[0].body["stream"].get<bool>());
}

TEST_F(RouterFlowTest, ADeadPrefillEngineMeansTheDecodeEnginePrefills) {
  FakeEngine de({.role = "decode"});
  start({fmt::format("http://127.0.0.1:{}", closed_port())}, {de.url()});
  auto result = post("/v1/completions", kCompletion);
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(result->body, de.whole_answer());
  EXPECT_EQ(de.paths(), (std::vector<std::string>{"POST /v1/completions"}));
  EXPECT_EQ(metric(R"(loom_router_requests_total{path="direct"})"), 1);
}

TEST_F(RouterFlowTest, AFailingPrefillEngineIsRetriedOnAnother) {
  FakeEngine broken({.role = "prefill", .probe_status = 500});
  FakeEngine pe({.role = "prefill"});
  FakeEngine de({.role = "decode"});
  start({broken.url(), pe.url()}, {de.url()});  // ties go to the first: the broken one
  auto result = post("/v1/completions", kCompletion);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(broken.paths(), (std::vector<std::string>{"POST /loom/kv/probe"}));
  EXPECT_EQ(pe.paths().size(), 3u);
  EXPECT_EQ(metric("loom_router_retries_total"), 1);
  EXPECT_EQ(metric("loom_router_engine_failures_total{engine=\"" + broken.url() + "\"}"), 1);
  // Within --retry-seconds the broken engine is skipped.
  ASSERT_EQ(post("/v1/completions", kCompletion)->status, 200);
  EXPECT_EQ(broken.paths().size(), 1u);
  EXPECT_EQ(pe.paths().size(), 6u);
}

TEST_F(RouterFlowTest, ARejectedProbeReachesTheClientUnchanged) {
  FakeEngine pe({.role = "prefill", .probe_status = 400});
  FakeEngine de({.role = "decode"});
  start({pe.url()}, {de.url()});
  auto result = post("/v1/completions", kCompletion);
  ASSERT_EQ(result->status, 400);
  EXPECT_EQ(Json::parse(result->body)["error"]["message"], "bad prompt");
  EXPECT_TRUE(de.paths().empty());
}

TEST_F(RouterFlowTest, DeadDecodeEnginesAre503AndAFailingOneIsRetried) {
  FakeEngine pe({.role = "prefill"});
  start({pe.url()}, {fmt::format("http://127.0.0.1:{}", closed_port())});
  auto result = post("/v1/completions", kCompletion);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 503);
  EXPECT_EQ(Json::parse(result->body)["error"]["type"], "server_error");
  EXPECT_EQ(client_->Get("/health")->status, 503);
  TearDown();

  FakeEngine failing({.role = "decode", .completion_status = 500});
  FakeEngine de({.role = "decode"});
  start({}, {failing.url(), de.url()});
  result = post("/v1/completions", kCompletion);
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(result->body, de.whole_answer());
  EXPECT_EQ(failing.paths().size(), 1u);
  EXPECT_EQ(metric("loom_router_retries_total"), 1);
}

TEST_F(RouterFlowTest, MultiPromptRequestsGoWholeToADecodeEngine) {
  FakeEngine pe({.role = "prefill"});
  FakeEngine de({.role = "decode"});
  start({pe.url()}, {de.url()});
  ASSERT_EQ(post("/v1/completions", R"({"model":"m","prompt":["a","b"]})")->status, 200);
  ASSERT_EQ(post("/v1/completions", R"({"model":"m","prompt":[1,2,3]})")->status, 200);  // one prompt of token ids
  EXPECT_EQ(pe.paths(), (std::vector<std::string>{"POST /loom/kv/probe", "POST /v1/completions", "POST /loom/kv/send"}));
  EXPECT_EQ(de.paths().size(), 2u);
  EXPECT_EQ(metric(R"(loom_router_requests_total{path="direct"})"), 1);
}

TEST_F(RouterFlowTest, BadRequestsAndOtherRoutes) {
  FakeEngine pe({.role = "prefill"});
  FakeEngine de({.role = "decode"});
  start({pe.url()}, {de.url()});
  auto result = post("/v1/completions", "{not json");
  ASSERT_EQ(result->status, 400);
  EXPECT_EQ(Json::parse(result->body)["error"]["type"], "invalid_request_error");
  EXPECT_EQ(post("/v1/completions", "[1,2]")->status, 400);
  EXPECT_EQ(client_->Get("/nope")->status, 404);
  EXPECT_EQ(client_->Get("/v1/completions")->status, 405);
  EXPECT_TRUE(pe.paths().empty());

  EXPECT_EQ(client_->Get("/health")->status, 200);
  result = client_->Get("/v1/models");
  ASSERT_EQ(result->status, 200);
  EXPECT_EQ(Json::parse(result->body)["data"][0]["id"], "fake");
  result = client_->Get("/loom/router/status");
  ASSERT_EQ(result->status, 200);
  const Json status = Json::parse(result->body);
  ASSERT_EQ(status["engines"].size(), 2u);
  EXPECT_EQ(status["engines"][0]["url"], pe.url());
  EXPECT_EQ(status["engines"][0]["role"], "prefill");
  EXPECT_EQ(status["engines"][1]["healthy"], true);
  EXPECT_EQ(status["engines"][1]["status"]["kv_transfer_address"], de.kv_address());
}

TEST_F(RouterFlowTest, TheApiKeyGuardsTheRouterAndReachesTheEngines) {
  FakeEngine pe({.role = "prefill"});
  FakeEngine de({.role = "decode"});
  start({pe.url()}, {de.url()}, PathPolicy::kDual, "secret");
  EXPECT_EQ(post("/v1/completions", kCompletion)->status, 401);
  auto result = post("/v1/completions", kCompletion, {{"Authorization", "Bearer secret"}});
  ASSERT_EQ(result->status, 200) << result->body;
  for (const Call& call : pe.calls()) EXPECT_EQ(call.authorization, "Bearer secret") << call.path;
  for (const Call& call : de.calls()) EXPECT_EQ(call.authorization, "Bearer secret") << call.path;
}

TEST_F(RouterFlowTest, TheRouterSignsEveryKvCallWithTheEnginesSecret) {
  const std::string secret = "the-engines-kv-secret-0123456789";
  FakeEngine pe({.role = "prefill", .in_storage = 1});
  FakeEngine de({.role = "decode"});
  start({pe.url()}, {de.url()}, PathPolicy::kDecode, "", secret);
  auto result = post("/v1/completions", kCompletion);
  ASSERT_EQ(result->status, 200) << result->body;
  int num_kv_calls = 0;
  for (const FakeEngine* engine : {&pe, &de}) {
    for (const Call& call : engine->all_calls()) {
      if (call.path.rfind("/loom/kv/", 0) != 0) {
        EXPECT_EQ(call.kv_auth, "") << call.path;  // only the KV routes are signed
        continue;
      }
      ++num_kv_calls;
      EXPECT_TRUE(server::kv_request_signed(secret, call.method, call.path, call.raw_body, call.kv_auth,
                                            server::unix_seconds_now()))
          << call.method << " " << call.path << ": " << call.kv_auth;
      EXPECT_FALSE(server::kv_request_signed("another-secret-0123456789abcdef", call.method, call.path,
                                             call.raw_body, call.kv_auth, server::unix_seconds_now()));
    }
  }
  EXPECT_GE(num_kv_calls, 5);  // two status polls, the probe, both sends
}

}  // namespace
}  // namespace loom::router
