#include "server/response_store.h"

#include "server/json_output.h"

namespace loom::server {

ResponseStore::ResponseStore(ResponseStoreConfig config, std::function<Clock::time_point()> now)
    : config_(config), now_(now ? std::move(now) : [] { return Clock::now(); }) {}

void ResponseStore::remove_locked(std::list<Entry>::iterator it) {
  bytes_ -= it->bytes;
  index_.erase(it->id);
  entries_.erase(it);
}

void ResponseStore::expire_locked(Clock::time_point now) {
  if (config_.ttl_seconds <= 0) return;
  const auto ttl = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config_.ttl_seconds));
  while (!entries_.empty() && now - entries_.front().stored_at >= ttl) remove_locked(entries_.begin());
}

bool ResponseStore::put(const std::string& id, std::shared_ptr<const StoredResponse> entry) {
  const int64_t size = static_cast<int64_t>(dump_json(entry->response).size() +
                                            entry->conversation.dump(-1, ' ', false,
                                                                     nlohmann::ordered_json::error_handler_t::replace)
                                                .size() +
                                            id.size());
  std::lock_guard lock(mutex_);
  const Clock::time_point now = now_();
  expire_locked(now);
  if (auto it = index_.find(id); it != index_.end()) remove_locked(it->second);
  if (config_.max_entries <= 0 || size > config_.max_bytes) return false;
  while (!entries_.empty() &&
         (static_cast<int64_t>(entries_.size()) + 1 > config_.max_entries || bytes_ + size > config_.max_bytes))
    remove_locked(entries_.begin());
  entries_.push_back(Entry{id, std::move(entry), size, now});
  index_[id] = std::prev(entries_.end());
  bytes_ += size;
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mutex_);
  expire_locked(now_());
  const auto it = index_.find(id);
  return it == index_.end() ? nullptr : it->second->value;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  expire_locked(now_());
  const auto it = index_.find(id);
  if (it == index_.end()) return false;
  remove_locked(it->second);
  return true;
}

int64_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(entries_.size());
}

int64_t ResponseStore::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace loom::server
