// The engines behind the router and what it knows of each: the last
// /loom/kv/status, whether it failed recently, and the router's own load
// counters (DualPath's seq_e and tok_e, plus the storage bytes it routed there).
//
//   prefill engines (PEs): --prefill URL, index 0..num(kPrefill)-1
//   decode engines (DEs):  --decode URL,  index 0..num(kDecode)-1
//
// An engine that fails (no connection, timeout, 5xx, malformed reply) is
// skipped for retry_seconds, then tried again. Statuses are refreshed by the
// request path itself (refresh_statuses), at most every refresh_seconds and
// by one thread at a time; other threads go on with the last ones.
//
// Threads: every method is safe from any thread (one mutex for the state; the
// HTTP calls run outside it). Assignment objects must not outlive the registry.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/dual_path_scheduler.h"
#include "router/engine_client.h"
#include "router/router_metrics.h"

namespace loom::router {

enum class EngineGroup { kPrefill, kDecode };

struct EngineRegistryConfig {
  std::vector<std::string> prefill_urls, decode_urls;
  EngineClientConfig client;  // url is set per engine
  double retry_seconds = 5.0;
  double refresh_seconds = 0.1;
};

class EngineRegistry {
 public:
  // Borrows `metrics` (engine failures are counted there); it must outlive the registry.
  EngineRegistry(EngineRegistryConfig config, RouterMetrics& metrics);

  size_t num(EngineGroup group) const;
  const EngineClient& client(EngineGroup group, size_t index) const;

  // Every engine's load for the scheduler; `excluded` ones count as unavailable.
  // need_kv_address: engines without a status naming a KV transfer address count as unavailable too.
  std::vector<EngineLoad> loads(EngineGroup group, const std::vector<size_t>& excluded = {},
                                bool need_kv_address = false) const;
  EngineLoad load(EngineGroup group, size_t index) const;
  std::optional<KvStatus> status(EngineGroup group, size_t index) const;
  bool available(EngineGroup group, size_t index) const;
  // Counts a failure and skips the engine for retry_seconds.
  void mark_failed(EngineGroup group, size_t index, const std::string& why);

  // Fetches the status of every engine not in its retry window, unless the last
  // refresh is younger than refresh_seconds (force: now) or another thread is at it.
  void refresh_statuses(bool force = false);
  // At start: fetches every engine's status, retrying for up to `timeout_seconds`
  // (engines may still be loading); logs a line per engine. Returns how many answered.
  int wait_for_engines(double timeout_seconds);

  // /loom/router/status: each engine's URL, group, role, healthy, seq, tok, last status.
  nlohmann::json status_json() const;

  // An engine's share of one request, counted until the object dies.
  class Assignment {
   public:
    Assignment() = default;
    Assignment(Assignment&& other) noexcept;
    Assignment& operator=(Assignment&& other) noexcept;
    ~Assignment();
    void add_tokens(int64_t tokens);
    // Storage bytes routed to this engine's side and not yet read.
    void set_routed_read_bytes(int64_t bytes);
    void release();

   private:
    friend class EngineRegistry;
    EngineRegistry* registry_ = nullptr;
    EngineGroup group_ = EngineGroup::kPrefill;
    size_t index_ = 0;
    int64_t tokens_ = 0, routed_read_bytes_ = 0;
  };
  Assignment assign(EngineGroup group, size_t index);

 private:
  struct Engine {
    explicit Engine(EngineClient engine_client) : client(std::move(engine_client)) {}
    EngineClient client;
    std::optional<KvStatus> status;
    std::chrono::steady_clock::time_point failed_until{};
    std::string last_error;
    int64_t num_requests = 0, num_tokens = 0, routed_read_bytes = 0;
    int64_t num_assigned = 0;  // since start (the last tie-break: idle engines take turns)
  };
  using Clock = std::chrono::steady_clock;
  // Stores a status call's result (failures marked); returns whether it answered.
  bool record_status(EngineGroup group, size_t index, const EngineResult<KvStatus>& result, bool count_failure);
  Engine& engine(EngineGroup group, size_t index);
  const Engine& engine(EngineGroup group, size_t index) const;
  bool available_locked(const Engine& engine, Clock::time_point now) const { return now >= engine.failed_until; }

  EngineRegistryConfig config_;
  RouterMetrics& metrics_;
  std::vector<Engine> prefill_, decode_;
  mutable std::mutex mutex_;
  std::mutex refresh_mutex_;
  Clock::time_point last_refresh_{};
};

const char* engine_group_name(EngineGroup group);  // "prefill" / "decode"

}  // namespace loom::router
