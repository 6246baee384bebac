// The workflow API over a real socket against the scripted engine (whose
// registry is a real WorkflowRegistry on a test clock): PUT / progress / GET /
// DELETE, workflow hints in completions bodies, 400s and 404s, TTL expiry,
// /metrics.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include <fmt/format.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/http_server.h"
#include "server/workflow_routes.h"
#include "server_fake_engine.h"
#include "server_tokenizer_fixture.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

// KVFlow Fig. 1: planner -> executor -> expresser -> reviewer -> planner.
const char* kCycle = R"({"agents": [
  {"name": "planner", "after": ["reviewer"]},
  {"name": "executor", "after": ["planner"]},
  {"name": "expresser", "after": ["executor"]},
  {"name": "reviewer", "after": ["expresser"]}]})";

class ServerWorkflowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = std::make_unique<test::FakeEngine>(test::make_server_test_tokenizer(), 256);
    ServerConfig config;
    config.http.port = 0;
    config.served_model_names = {"tiny"};
    config.http.num_handler_threads = 4;
    server_ = std::make_unique<HttpServer>(*engine_, config);
    server_->bind();
    thread_ = std::thread([this] { server_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->bound_port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }
  httplib::Result put(const std::string& path, const std::string& body) {
    return client_->Put(path.c_str(), body, "application/json");
  }
  httplib::Result post(const std::string& path, const std::string& body) {
    return client_->Post(path.c_str(), body, "application/json");
  }
  static Json json_of(const httplib::Result& result) { return Json::parse(result->body); }

  std::unique_ptr<test::FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ServerWorkflowTest, DeclareProgressGetDelete) {
  auto result = put("/v1/workflows/w1", kCycle);
  ASSERT_TRUE(result);
  ASSERT_EQ(result->status, 200) << result->body;
  Json body = json_of(result);
  EXPECT_EQ(body["id"], "w1");
  EXPECT_EQ(body["object"], "workflow");
  EXPECT_EQ(body["has_graph"], true);
  EXPECT_EQ(body["running"], Json::array());
  // Nothing runs yet: every agent is far (null).
  EXPECT_EQ(body["steps_to_execution"], Json::parse(R"({"planner": null, "executor": null, "expresser": null,
                                                         "reviewer": null})"));

  result = post("/v1/workflows/w1/progress", R"({"running": ["executor"]})");
  ASSERT_EQ(result->status, 200) << result->body;
  body = json_of(result);
  EXPECT_EQ(body["follows_requests"], false);
  EXPECT_EQ(body["running"], Json::array({"executor"}));
  EXPECT_EQ(body["steps_to_execution"],
            Json::parse(R"({"executor": 0, "expresser": 1, "reviewer": 2, "planner": 3})"));

  result = post("/v1/workflows/w1/progress", R"({"running": ["executor"], "steps_to_execution": {"planner": 1}})");
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(json_of(result)["steps_to_execution"]["planner"], 1);

  result = client_->Get("/v1/workflows/w1");
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(json_of(result)["steps_to_execution"]["expresser"], 1);

  result = client_->Delete("/v1/workflows/w1");
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(json_of(result), Json::parse(R"({"id": "w1", "object": "workflow.deleted", "deleted": true})"));
  std::vector<httplib::Result> again;
  again.push_back(client_->Delete("/v1/workflows/w1"));
  again.push_back(client_->Get("/v1/workflows/w1"));
  again.push_back(post("/v1/workflows/w1/progress", R"({"running": []})"));
  for (const httplib::Result& result_again : again) {
    ASSERT_EQ(result_again->status, 404) << result_again->body;
    EXPECT_EQ(json_of(result_again)["error"]["code"], "not_found");
  }
}

TEST_F(ServerWorkflowTest, JoinAllAndAnyOnADiamond) {
  auto result = put("/v1/workflows/d", R"({"agents": [{"name": "planner"},
      {"name": "e1", "after": ["planner"]}, {"name": "e2", "after": ["planner"]},
      {"name": "all", "after": ["e1", "e2"], "join": "all"},
      {"name": "any", "after": ["e1", "e2"], "join": "any"}]})");
  ASSERT_EQ(result->status, 200) << result->body;
  result = post("/v1/workflows/d/progress", R"({"running": ["planner"], "steps_to_execution": {"e2": 3}})");
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(json_of(result)["steps_to_execution"],
            Json::parse(R"({"planner": 0, "e1": 1, "e2": 3, "all": 4, "any": 2})"));
}

TEST_F(ServerWorkflowTest, BadBodiesAndIdsAre400WithTheField) {
  struct Case {
    std::string path, body, param;
  };
  const std::vector<Case> cases = {
      {"/v1/workflows/w", "{not json", ""},
      {"/v1/workflows/w", R"({"agents": [{"name": "a", "aftr": []}]})", "agents[0].aftr"},
      {"/v1/workflows/w", R"({"agents": [{"name": "a", "join": "some"}]})", "agents[0].join"},
      {"/v1/workflows/w", R"({"agents": [{"name": "a", "after": ["b", "b"]}]})", "agents[0].after[1]"},
      {"/v1/workflows/w", R"({"agents": [{"name": "a"}, {"name": "a"}]})", "agents[1].name"},
      {"/v1/workflows/bad%20id", R"({"agents": []})", "id"},
  };
  for (const Case& c : cases) {
    auto result = put(c.path, c.body);
    ASSERT_TRUE(result);
    ASSERT_EQ(result->status, 400) << c.body << " -> " << result->body;
    const Json error = json_of(result)["error"];
    EXPECT_EQ(error["type"], "invalid_request_error");
    if (c.param.empty()) {
      EXPECT_TRUE(error["param"].is_null()) << result->body;
    } else {
      EXPECT_EQ(error["param"], c.param) << result->body;
    }
  }
  // Nothing was created by the failed PUTs; an agent named only in `after` is declared implicitly.
  EXPECT_EQ(client_->Get("/v1/workflows/w")->status, 404);
  auto implicit = put("/v1/workflows/w2", R"({"agents": [{"name": "a", "after": ["b"]}]})");
  ASSERT_EQ(implicit->status, 200) << implicit->body;
  EXPECT_EQ(json_of(implicit)["steps_to_execution"], Json::parse(R"({"a": null, "b": null})"));
  EXPECT_EQ(client_->Get("/v1/workflows/w")->status, 404);

  ASSERT_EQ(put("/v1/workflows/w", kCycle)->status, 200);
  auto result = post("/v1/workflows/w/progress", R"({"running": ["planner", "planner"]})");
  EXPECT_EQ(result->status, 400) << result->body;
  result = post("/v1/workflows/w/progress", R"({"steps_to_execution": {"planner": -1}})");
  EXPECT_EQ(result->status, 400) << result->body;
  EXPECT_EQ(json_of(result)["error"]["param"], "steps_to_execution.planner") << result->body;
}

TEST_F(ServerWorkflowTest, CompletionHintsReachTheEngineAndCreateTheWorkflow) {
  auto result = post("/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 1, "workflow": "w2",
                                             "agent": "planner", "fixed_prefix_tokens": 2})");
  ASSERT_EQ(result->status, 200) << result->body;
  // The fake engine does not call note_request; the request carried the hints.
  const EngineRequest last = engine_->last();
  EXPECT_EQ(last.workflow, "w2");
  EXPECT_EQ(last.agent, "planner");
  EXPECT_EQ(last.fixed_prefix_tokens, 2);

  result = post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                            "workflow": "w2", "agent": "expresser"})");
  ASSERT_EQ(result->status, 200) << result->body;
  EXPECT_EQ(engine_->last().agent, "expresser");
  EXPECT_FALSE(engine_->last().fixed_prefix_tokens.has_value());

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"prompt": [1], "agent": "planner"})", "agent"},
      {R"({"prompt": [1], "workflow": "a/b"})", "workflow"},
      {R"({"prompt": [1], "workflow": 3})", "workflow"},
      {R"({"prompt": [1], "workflow": "w", "agent": "a", "fixed_prefix_tokens": -1})", "fixed_prefix_tokens"},
      {R"({"prompt": [1], "workflow": "w", "agent": "a", "fixed_prefix_tokens": 1.5})", "fixed_prefix_tokens"},
  };
  for (const auto& [body, param] : bad) {
    result = post("/v1/completions", body);
    ASSERT_EQ(result->status, 400) << body << " -> " << result->body;
    EXPECT_EQ(json_of(result)["error"]["param"], param) << result->body;
  }
}

TEST_F(ServerWorkflowTest, UnseenWorkflowsExpireAfterTheTtl) {
  ASSERT_EQ(put("/v1/workflows/old", kCycle)->status, 200);
  engine_->workflow_clock_seconds = test::FakeEngine::kWorkflowTtlSeconds / 2;
  ASSERT_EQ(put("/v1/workflows/young", kCycle)->status, 200);
  auto metrics = client_->Get("/metrics");
  EXPECT_NE(metrics->body.find("loom_workflows_active{model_name=\"tiny\"} 2\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("loom_kv_eviction_policy_info{model_name=\"tiny\",policy=\"workflow\"} 1\n"), std::string::npos);

  engine_->workflow_clock_seconds = test::FakeEngine::kWorkflowTtlSeconds + 1;
  EXPECT_EQ(client_->Get("/v1/workflows/old")->status, 404);
  EXPECT_EQ(client_->Get("/v1/workflows/young")->status, 200);
  metrics = client_->Get("/metrics");
  EXPECT_NE(metrics->body.find("loom_workflows_active{model_name=\"tiny\"} 1\n"), std::string::npos) << metrics->body;
}

// The route functions without a socket: caps and hostile input.
// Each returns a 200 body or throws ApiError, whose body always serialises.
ApiError route_error(const std::function<void()>& call) {
  try {
    call();
  } catch (const ApiError& error) {
    EXPECT_NO_THROW(Json::parse(error.body())) << error.message();
    return error;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "not an ApiError: " << error.what();
    return ApiError(-1, "other exception");
  }
  ADD_FAILURE() << "no error";
  return ApiError(0, "no error");
}

TEST(WorkflowRoutesTest, NewWorkflowsBeyondTheCapGet503AndNothingIsLost) {
  test::FakeEngine engine(test::make_server_test_tokenizer(), 256, /*max_workflows=*/2);
  ASSERT_NO_THROW(put_workflow(engine, "a", kCycle));
  ASSERT_NO_THROW(put_workflow(engine, "b", R"({"agents": [{"name": "x"}]})"));
  const ApiError full = route_error([&] { put_workflow(engine, "c", kCycle); });
  EXPECT_EQ(full.status(), 503);
  EXPECT_EQ(full.code(), "too_many_workflows");
  EXPECT_NE(full.message().find("--max-workflows"), std::string::npos) << full.message();
  // The known ones are intact and still change; a request's hints cannot add one either.
  EXPECT_EQ(Json::parse(get_workflow(engine, "a"))["has_graph"], true);
  EXPECT_NO_THROW(put_workflow(engine, "b", kCycle));
  EXPECT_NO_THROW(post_workflow_progress(engine, "a", R"({"running": ["planner"]})"));
  EXPECT_FALSE(engine.workflows().note_request("d", "planner"));
  EXPECT_EQ(route_error([&] { get_workflow(engine, "c"); }).status(), 404);
  EXPECT_EQ(route_error([&] { get_workflow(engine, "d"); }).status(), 404);
  // Room again after a DELETE.
  EXPECT_NO_THROW(delete_workflow(engine, "b"));
  EXPECT_NO_THROW(put_workflow(engine, "c", kCycle));
}

TEST(WorkflowRoutesTest, OversizedGraphsAndHostileBodiesAre400) {
  test::FakeEngine engine(test::make_server_test_tokenizer());
  Json graph = {{"agents", Json::array()}};
  for (int32_t i = 0; i <= engine.workflows().max_agents_per_workflow(); ++i)
    graph["agents"].push_back({{"name", fmt::format("a{}", i)}});
  ApiError error = route_error([&] { put_workflow(engine, "w", graph.dump()); });
  EXPECT_EQ(error.status(), 400);
  EXPECT_EQ(error.param(), "agents");
  Json predecessors = {{"agents", {{{"name", "a"}, {"after", Json::array()}}}}};
  for (int32_t i = 0; i <= engine.workflows().max_agents_per_workflow(); ++i)
    predecessors["agents"][0]["after"].push_back(fmt::format("p{}", i));
  error = route_error([&] { put_workflow(engine, "w", predecessors.dump()); });
  EXPECT_EQ(error.status(), 400);
  EXPECT_EQ(error.param(), "agents[0].after");

  // 1e999 used to escape as nlohmann's out_of_range (a 500 with its text).
  ASSERT_NO_THROW(put_workflow(engine, "w", kCycle));
  error = route_error([&] { post_workflow_progress(engine, "w", R"({"steps_to_execution": {"planner": 1e999}})"); });
  EXPECT_EQ(error.status(), 400);
  EXPECT_EQ(error.param(), "steps_to_execution.planner");
  error = route_error([&] { put_workflow(engine, "w", "{\"agents\": [{\"name\": \"\xff\"}]}"); });
  EXPECT_EQ(error.status(), 400);
  EXPECT_EQ(error.param(), "agents[0].name");
  error = route_error([&] { put_workflow(engine, "w", "{\"agents\": " + std::string(100000, '[') + "}"); });
  EXPECT_EQ(error.status(), 400);
  // An id with invalid UTF-8 (from a URL): 400 whose body still serialises.
  error = route_error([&] { put_workflow(engine, "w\xff", kCycle); });
  EXPECT_EQ(error.status(), 400);
  EXPECT_EQ(error.param(), "id");
  EXPECT_EQ(Json::parse(get_workflow(engine, "w"))["has_graph"], true);  // the failed calls changed nothing
}

}  // namespace
}  // namespace loom::server
