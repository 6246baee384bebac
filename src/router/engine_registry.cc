#include "router/engine_registry.h"

#include <algorithm>
#include <thread>

#include <spdlog/spdlog.h>

namespace loom::router {

const char* engine_group_name(EngineGroup group) { return group == EngineGroup::kPrefill ? "prefill" : "decode"; }

EngineRegistry::EngineRegistry(EngineRegistryConfig config, RouterMetrics& metrics)
    : config_(std::move(config)), metrics_(metrics) {
  auto make = [&](const std::string& url) {
    EngineClientConfig client = config_.client;
    client.url = url;
    return Engine(EngineClient(std::move(client)));
  };
  for (const std::string& url : config_.prefill_urls) prefill_.push_back(make(url));
  for (const std::string& url : config_.decode_urls) decode_.push_back(make(url));
}

size_t EngineRegistry::num(EngineGroup group) const {
  return group == EngineGroup::kPrefill ? prefill_.size() : decode_.size();
}

EngineRegistry::Engine& EngineRegistry::engine(EngineGroup group, size_t index) {
  return group == EngineGroup::kPrefill ? prefill_.at(index) : decode_.at(index);
}

const EngineRegistry::Engine& EngineRegistry::engine(EngineGroup group, size_t index) const {
  return group == EngineGroup::kPrefill ? prefill_.at(index) : decode_.at(index);
}

const EngineClient& EngineRegistry::client(EngineGroup group, size_t index) const {
  return engine(group, index).client;  // immutable after construction: no lock
}

EngineLoad EngineRegistry::load(EngineGroup group, size_t index) const {
  std::lock_guard lock(mutex_);
  const Engine& e = engine(group, index);
  EngineLoad load;
  load.available = available_locked(e, Clock::now());
  load.num_requests = e.num_requests;
  load.num_tokens = e.num_tokens;
  load.num_assigned = e.num_assigned;
  load.queued_read_bytes = e.routed_read_bytes + (e.status ? e.status->queued_read_bytes : 0);
  load.read_bandwidth = e.status ? e.status->read_bandwidth : 0.0;
  return load;
}

std::vector<EngineLoad> EngineRegistry::loads(EngineGroup group, const std::vector<size_t>& excluded,
                                              bool need_kv_address) const {
  std::vector<EngineLoad> loads;
  for (size_t i = 0; i < num(group); ++i) {
    EngineLoad load = this->load(group, i);
    if (std::find(excluded.begin(), excluded.end(), i) != excluded.end()) load.available = false;
    if (need_kv_address) {
      std::optional<KvStatus> known = status(group, i);
      if (!known || !known->kv_transfer_address) load.available = false;
    }
    loads.push_back(load);
  }
  return loads;
}

std::optional<KvStatus> EngineRegistry::status(EngineGroup group, size_t index) const {
  std::lock_guard lock(mutex_);
  return engine(group, index).status;
}

bool EngineRegistry::available(EngineGroup group, size_t index) const {
  std::lock_guard lock(mutex_);
  return available_locked(engine(group, index), Clock::now());
}

void EngineRegistry::mark_failed(EngineGroup group, size_t index, const std::string& why) {
  const std::string& url = client(group, index).url();
  {
    std::lock_guard lock(mutex_);
    Engine& e = engine(group, index);
    e.failed_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(config_.retry_seconds));
    e.last_error = why;
  }
  metrics_.count_engine_failure(url);
  spdlog::warn("{} engine {} failed ({}); skipped for {} s", engine_group_name(group), url, why,
               config_.retry_seconds);
}

bool EngineRegistry::record_status(EngineGroup group, size_t index, const EngineResult<KvStatus>& result,
                                   bool count_failure) {
  if (result.status == CallStatus::kFailed) {
    if (count_failure) mark_failed(group, index, result.error);
    return false;
  }
  std::lock_guard lock(mutex_);
  Engine& e = engine(group, index);
  // A 4xx (an engine without the KV routes) is reachable but cannot take part in transfers.
  e.status = result.ok() ? std::optional<KvStatus>(result.value) : std::nullopt;
  return true;
}

void EngineRegistry::refresh_statuses(bool force) {
  std::unique_lock refreshing(refresh_mutex_, std::try_to_lock);
  if (!refreshing.owns_lock()) return;
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard lock(mutex_);
    if (!force && now - last_refresh_ < std::chrono::duration<double>(config_.refresh_seconds)) return;
    last_refresh_ = now;
  }
  for (EngineGroup group : {EngineGroup::kPrefill, EngineGroup::kDecode})
    for (size_t i = 0; i < num(group); ++i)
      if (available(group, i)) record_status(group, i, client(group, i).kv_status(), /*count_failure=*/true);
}

int EngineRegistry::wait_for_engines(double timeout_seconds) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_seconds));
  int num_answered = 0;
  for (EngineGroup group : {EngineGroup::kPrefill, EngineGroup::kDecode}) {
    for (size_t i = 0; i < num(group); ++i) {
      const EngineClient& engine_client = client(group, i);
      EngineResult<KvStatus> result = engine_client.kv_status();
      while (result.status == CallStatus::kFailed && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        result = engine_client.kv_status();
      }
      if (!record_status(group, i, result, /*count_failure=*/true)) continue;  // mark_failed logged it
      ++num_answered;
      if (!result.ok()) {
        spdlog::warn("{} engine {}: no /loom/kv/status (status {}{}): served without KV transfers",
                     engine_group_name(group), engine_client.url(), result.reply.status,
                     result.reply.status == 401 ? ": give the router the engines' --kv-transfer-secret-file "
                                                  "(and --api-key)"
                                                : "");
        continue;
      }
      const KvStatus& status = result.value;
      spdlog::info("{} engine {}: role {}, KV transfer address {}, {} bytes per block{}", engine_group_name(group),
                   engine_client.url(), status.role, status.kv_transfer_address.value_or("none"),
                   status.bytes_per_block, status.has_storage ? ", storage tier" : "");
      const char* opposite = group == EngineGroup::kPrefill ? "decode" : "prefill";
      if (status.role == opposite)
        spdlog::warn("engine {} is listed as --{} but its role is {}", engine_client.url(),
                     engine_group_name(group), status.role);
    }
  }
  {
    std::lock_guard lock(mutex_);
    last_refresh_ = Clock::now();
  }
  return num_answered;
}

nlohmann::json EngineRegistry::status_json() const {
  nlohmann::json engines = nlohmann::json::array();
  std::lock_guard lock(mutex_);
  const Clock::time_point now = Clock::now();
  for (EngineGroup group : {EngineGroup::kPrefill, EngineGroup::kDecode}) {
    for (const Engine& e : group == EngineGroup::kPrefill ? prefill_ : decode_) {
      engines.push_back({{"url", e.client.url()},
                         {"group", engine_group_name(group)},
                         {"role", e.status ? nlohmann::json(e.status->role) : nlohmann::json(nullptr)},
                         {"healthy", available_locked(e, now)},
                         {"seq", e.num_requests},
                         {"tok", e.num_tokens},
                         {"routed_read_bytes", e.routed_read_bytes},
                         {"last_error", e.last_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.last_error)},
                         {"status", e.status ? e.status->raw : nlohmann::json(nullptr)}});
    }
  }
  return nlohmann::json{{"engines", engines}};
}

// ---- Assignment ----

EngineRegistry::Assignment EngineRegistry::assign(EngineGroup group, size_t index) {
  Assignment assignment;
  assignment.registry_ = this;
  assignment.group_ = group;
  assignment.index_ = index;
  std::lock_guard lock(mutex_);
  ++engine(group, index).num_requests;
  ++engine(group, index).num_assigned;
  return assignment;
}

EngineRegistry::Assignment::Assignment(Assignment&& other) noexcept { *this = std::move(other); }

EngineRegistry::Assignment& EngineRegistry::Assignment::operator=(Assignment&& other) noexcept {
  if (this == &other) return *this;
  release();
  registry_ = std::exchange(other.registry_, nullptr);
  group_ = other.group_;
  index_ = other.index_;
  tokens_ = std::exchange(other.tokens_, 0);
  routed_read_bytes_ = std::exchange(other.routed_read_bytes_, 0);
  return *this;
}

EngineRegistry::Assignment::~Assignment() { release(); }

void EngineRegistry::Assignment::add_tokens(int64_t tokens) {
  if (!registry_) return;
  std::lock_guard lock(registry_->mutex_);
  registry_->engine(group_, index_).num_tokens += tokens;
  tokens_ += tokens;
}

void EngineRegistry::Assignment::set_routed_read_bytes(int64_t bytes) {
  if (!registry_) return;
  std::lock_guard lock(registry_->mutex_);
  registry_->engine(group_, index_).routed_read_bytes += bytes - routed_read_bytes_;
  routed_read_bytes_ = bytes;
}

void EngineRegistry::Assignment::release() {
  if (!registry_) return;
  {
    std::lock_guard lock(registry_->mutex_);
    Engine& e = registry_->engine(group_, index_);
    --e.num_requests;
    e.num_tokens -= tokens_;
    e.routed_read_bytes -= routed_read_bytes_;
  }
  registry_ = nullptr;
  tokens_ = routed_read_bytes_ = 0;
}

}  // namespace loom::router
