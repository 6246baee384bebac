// A scripted Engine for server tests: no model, outputs derived from the prompt.
// Each request produces max_new_tokens tokens, id = (last prompt id + 1 + i) %
// vocab, one output per token, `token_delay` apart; every token's text is its
// decoded string. Knobs make submit fail the way the real engine does;
// set_script() makes every request output given text pieces instead.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace loom::test {

class FakeEngine : public Engine {
 public:
  explicit FakeEngine(std::shared_ptr<const Tokenizer> tokenizer, int32_t max_context = 256,
                      int32_t max_workflows = 4096)
      : max_context_(max_context), max_workflows_(max_workflows) {
    model_.path = "/models/fake";
    model_.tokenizer = std::move(tokenizer);
  }

  // The workflow registry's clock (seconds) and TTL, so tests can expire workflows.
  static constexpr int kWorkflowTtlSeconds = 60;
  std::atomic<int64_t> workflow_clock_seconds{0};
  std::atomic<bool> queue_full{false};
  std::atomic<int> token_delay_ms{0};
  std::atomic<int> num_submitted{0}, num_cancelled{0}, num_live{0};
  EngineRequest last_request;  // guarded by mutex_

  EngineRequest last() {
    std::lock_guard lock(mutex_);
    return last_request;
  }

  // From now on each request outputs these text pieces, one output each (token
  // id 1), and finishes with `finish` (kStop unless told) after the last;
  // empty: back to the default.
  void set_script(std::vector<std::string> pieces, FinishReason finish = FinishReason::kStop) {
    std::lock_guard lock(mutex_);
    script_ = std::move(pieces);
    script_finish_ = finish;
  }

  std::unique_ptr<RequestStream> submit(EngineRequest request) override {
    check(request);
    return start(std::move(request));
  }
  // All or none, as the real engine: every request is checked before any starts.
  std::vector<std::unique_ptr<RequestStream>> submit_all(std::vector<EngineRequest> requests) override {
    for (const EngineRequest& request : requests) check(request);
    std::vector<std::unique_ptr<RequestStream>> streams;
    for (EngineRequest& request : requests) streams.push_back(start(std::move(request)));
    return streams;
  }

  // Fake sharing rules: "activated" needs "alora" in the path; no choice = isolated.
  void load_adapter(const std::string& name, const std::string& path,
                    std::optional<KvSharing> sharing = std::nullopt) override {
    if (path.find("missing") != std::string::npos) fail(ErrorKind::kNotFound, "{}: no adapter_config.json", path);
    if (sharing == KvSharing::kActivated && path.find("alora") == std::string::npos)
      fail(ErrorKind::kInvalidArgument, "adapter '{}' has no alora_invocation_tokens", name);
    std::lock_guard lock(mutex_);
    adapters_[name] = path;
    sharing_[name] = sharing.value_or(KvSharing::kIsolated);
  }
  void unload_adapter(const std::string& name) override {
    std::lock_guard lock(mutex_);
    if (!adapters_.erase(name)) fail(ErrorKind::kNotFound, "unknown adapter '{}'", name);
  }
  std::vector<AdapterInfo> adapters() const override {
    std::lock_guard lock(mutex_);
    std::vector<AdapterInfo> list;
    for (const auto& [name, path] : adapters_) list.push_back({name, path, 8, 0, sharing_.at(name)});
    return list;
  }
  EngineMetrics take_metrics() override {
    EngineMetrics metrics;
    metrics.num_running = num_live;
    metrics.kv_blocks_in_use = num_live;
    metrics.time_to_first_token = {0.003, 0.2};
    registry_.expire_unseen();
    metrics.num_workflows_active = registry_.snapshot()->num_workflows();
    metrics.eviction_policy = "workflow";
    return metrics;
  }
  WorkflowRegistry& workflows() override { return registry_; }
  const LoadedModel& model() const override { return model_; }
  int32_t max_context_tokens() const override { return max_context_; }
  void shutdown(bool) override {}

 private:
  void check(const EngineRequest& request) {
    {
      std::lock_guard lock(mutex_);
      if (!request.adapter.empty() && !adapters_.count(request.adapter))
        fail(ErrorKind::kNotFound, "unknown adapter '{}'", request.adapter);
      last_request = request;
    }
    if (queue_full) fail(ErrorKind::kCapacity, "the waiting queue is full");
    if (static_cast<int64_t>(request.prompt_tokens.size()) + request.max_new_tokens > max_context_)
      fail(ErrorKind::kCapacity, "over the context");
  }
  std::unique_ptr<RequestStream> start(EngineRequest request) {
    ++num_submitted;
    ++num_live;
    std::vector<std::string> script;
    FinishReason script_finish;
    {
      std::lock_guard lock(mutex_);
      script = script_;
      script_finish = script_finish_;
    }
    return std::make_unique<Stream>(*this, std::move(request), std::move(script), script_finish);
  }

  class Stream : public RequestStream {
   public:
    Stream(FakeEngine& engine, EngineRequest request, std::vector<std::string> script, FinishReason script_finish)
        : engine_(engine), request_(std::move(request)), script_(std::move(script)), script_finish_(script_finish) {}
    ~Stream() override { cancel(); }
    std::optional<RequestOutput> next(std::chrono::milliseconds timeout) override {
      if (done_) return std::nullopt;
      const int delay = engine_.token_delay_ms;
      if (delay > 0) {
        if (timeout.count() < delay) {
          std::this_thread::sleep_for(timeout);
          return std::nullopt;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      }
      if (!script_.empty()) return next_scripted();
      const int vocab = engine_.model_.tokenizer->vocab_size();
      RequestOutput output;
      const TokenId id = (request_.prompt_tokens.back() + 1 + produced_) % vocab;
      output.new_tokens.push_back({id, -0.5f, {{id, -0.5f}, {(id + 1) % vocab, -1.5f}}});
      output.text_delta = engine_.model_.tokenizer->decode({id});
      ++produced_;
      output.num_prompt_tokens = static_cast<int32_t>(request_.prompt_tokens.size());
      output.num_output_tokens = produced_;
      if (produced_ >= request_.max_new_tokens) {
        output.finished = true;
        output.finish_reason = FinishReason::kLength;
        finish();
      }
      return output;
    }
    void cancel() override {
      if (done_) return;
      ++engine_.num_cancelled;
      finish();
    }
    const std::string& request_id() const override { return id_; }

   private:
    RequestOutput next_scripted() {
      RequestOutput output;
      output.new_tokens.push_back({1, -0.5f, {{1, -0.5f}}});
      output.text_delta = script_[static_cast<size_t>(produced_++)];
      output.num_prompt_tokens = static_cast<int32_t>(request_.prompt_tokens.size());
      output.num_output_tokens = produced_;
      if (produced_ >= static_cast<int32_t>(script_.size())) {
        output.finished = true;
        output.finish_reason = script_finish_;
        finish();
      }
      return output;
    }
    void finish() {
      done_ = true;
      --engine_.num_live;
    }
    FakeEngine& engine_;
    EngineRequest request_;
    std::vector<std::string> script_;
    FinishReason script_finish_;
    std::string id_ = "fake";
    int32_t produced_ = 0;
    bool done_ = false;
  };

  mutable std::mutex mutex_;
  std::vector<std::string> script_;  // guarded by mutex_
  FinishReason script_finish_ = FinishReason::kStop;
  std::map<std::string, std::string> adapters_;
  std::map<std::string, KvSharing> sharing_;
  LoadedModel model_;
  int32_t max_context_;
  int32_t max_workflows_;
  WorkflowRegistry registry_{WorkflowRegistryConfig{
      std::chrono::seconds(kWorkflowTtlSeconds), max_workflows_,
      [this] { return std::chrono::steady_clock::time_point(std::chrono::seconds(workflow_clock_seconds.load())); }}};
};

}  // namespace loom::test
