// The store behind /v1/responses' `store` and `previous_response_id`: each
// stored response's body (GET /v1/responses/{id}) and its conversation (the
// input items of the whole chain, then its output items), which a later
// request's previous_response_id continues.
//
// Bounded three ways (`loom serve` flags): entries, bytes (the serialised body
// plus conversation, a close estimate of what the entry holds) and age. The
// oldest entries go first when a put would pass a bound; an entry older than
// the TTL is gone at the next lookup or put. An entry larger than max_bytes by
// itself is not stored. What is gone answers as unknown (the route's 404).
//
// Thread-safe (one mutex); entries are immutable once stored (shared_ptr to const).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace loom::server {

struct ResponseStoreConfig {
  int64_t max_entries = 1024;              // --responses-store-max-entries (0: nothing is stored)
  int64_t max_bytes = 256LL << 20;         // --responses-store-max-bytes
  double ttl_seconds = 3600.0;             // --responses-store-ttl (0: no expiry)
};

struct StoredResponse {
  nlohmann::json response;                 // the response object as returned
  nlohmann::ordered_json conversation;     // input items of the chain, then this response's output items
};

class ResponseStore {
 public:
  using Clock = std::chrono::steady_clock;
  // `now` replaces the clock (tests); empty: steady_clock.
  explicit ResponseStore(ResponseStoreConfig config, std::function<Clock::time_point()> now = {});

  // Stores `entry` under `id` (replacing one there), then evicts the oldest
  // entries until every bound holds. Returns false when it was not stored
  // (max_entries 0, or the entry alone is larger than max_bytes).
  bool put(const std::string& id, std::shared_ptr<const StoredResponse> entry);
  // Null when unknown, evicted, deleted or expired.
  std::shared_ptr<const StoredResponse> get(const std::string& id);
  // True when `id` was there (and live).
  bool erase(const std::string& id);

  int64_t size() const;
  int64_t bytes() const;
  const ResponseStoreConfig& config() const { return config_; }

 private:
  struct Entry {
    std::string id;
    std::shared_ptr<const StoredResponse> value;
    int64_t bytes = 0;
    Clock::time_point stored_at;
  };
  void expire_locked(Clock::time_point now);
  void remove_locked(std::list<Entry>::iterator it);

  const ResponseStoreConfig config_;
  std::function<Clock::time_point()> now_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // oldest first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  int64_t bytes_ = 0;
};

}  // namespace loom::server
