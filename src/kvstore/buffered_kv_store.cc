#include "kvstore/buffered_kv_store.h"

#include <cstring>

#include "util/error.h"

namespace loom {

namespace {

DiskKvStoreConfig buffer_config(const DiskKvStore* storage, int64_t capacity_bytes) {
  DiskKvStoreConfig config = storage != nullptr ? storage->config() : DiskKvStoreConfig{};
  if (storage == nullptr) config.capacity_bytes = capacity_bytes;
  return config;
}

}  // namespace

BufferedKvStore::BufferedKvStore(std::unique_ptr<DiskKvStore> storage, int64_t capacity_bytes)
    : DiskKvStore(buffer_config(storage.get(), capacity_bytes)), storage_(std::move(storage)),
      capacity_bytes_(capacity_bytes) {
  if (capacity_bytes <= 0)
    throw Error(ErrorKind::kInvalidArgument, "a KV buffer needs a positive size", "set --kv-buffer-bytes");
  counters_.capacity_bytes = capacity_bytes;
}

bool BufferedKvStore::contains(const KvBlockHash& hash) { return in_buffer(hash) || in_storage(hash); }

bool BufferedKvStore::in_buffer(const KvBlockHash& hash) const {
  std::lock_guard lock(mutex_);
  return entries_.count(hash) != 0;
}

bool BufferedKvStore::in_storage(const KvBlockHash& hash) { return storage_ != nullptr && storage_->contains(hash); }

bool BufferedKvStore::write_block(const KvBlockHash& hash, std::span<const std::byte> payload) {
  add(hash, payload, nullptr, /*in_transit=*/false);
  if (storage_ != nullptr) return storage_->write_block(hash, payload) || in_buffer(hash);
  return in_buffer(hash);
}

void BufferedKvStore::put(const KvBlockHash& hash, std::span<const std::byte> payload) {
  add(hash, payload, nullptr, /*in_transit=*/true);
}

void BufferedKvStore::put(const KvBlockHash& hash, Payload payload) {
  const std::span<const std::byte> bytes = payload->bytes();
  add(hash, bytes, std::move(payload), /*in_transit=*/true);
}

// `payload`, when given, holds `bytes` (kept as is); else `bytes` are copied.
void BufferedKvStore::add(const KvBlockHash& hash, std::span<const std::byte> bytes, Payload payload,
                          bool in_transit) {
  if (static_cast<int64_t>(bytes.size()) > capacity_bytes_) return;
  {
    std::lock_guard lock(mutex_);
    if (auto it = entries_.find(hash); it != entries_.end()) {
      if (in_transit && !it->second.in_transit) {  // now also awaited by this engine: keep it until read
        outgoing_lru_.erase(it->second.lru);
        it->second.in_transit = true;
        transit_lru_.push_front(hash);
        it->second.lru = transit_lru_.begin();
      }
      touch(it->second);
      return;
    }
  }
  if (!payload) payload = KvPayload::copy_of(bytes);
  {
    std::lock_guard lock(mutex_);
    insert(hash, std::move(payload), in_transit);
  }
  added_.notify_all();
}

void BufferedKvStore::insert(const KvBlockHash& hash, Payload payload, bool in_transit) {
  if (auto it = entries_.find(hash); it != entries_.end()) {
    touch(it->second);
    return;
  }
  const auto size = static_cast<int64_t>(payload->size());
  while (num_bytes_ + size > capacity_bytes_ && !(outgoing_lru_.empty() && transit_lru_.empty())) {
    erase(entries_.find(!outgoing_lru_.empty() ? outgoing_lru_.back() : transit_lru_.back()));
    ++counters_.num_evicted_blocks;
  }
  std::list<KvBlockHash>& lru = in_transit ? transit_lru_ : outgoing_lru_;
  lru.push_front(hash);
  entries_.emplace(hash, Entry{std::move(payload), in_transit, lru.begin()});
  num_bytes_ += size;
  if (remembered_.insert(hash).second) {
    remembered_order_.push_back(hash);
    if (remembered_order_.size() > kMaxRemembered) {
      remembered_.erase(remembered_order_.front());
      remembered_order_.pop_front();
    }
  }
  ++counters_.num_put_blocks;
}

void BufferedKvStore::erase(std::map<KvBlockHash, Entry>::iterator it) {
  num_bytes_ -= static_cast<int64_t>(it->second.payload->size());
  lru_of(it->second).erase(it->second.lru);
  entries_.erase(it);
}

void BufferedKvStore::touch(Entry& entry) {
  std::list<KvBlockHash>& lru = lru_of(entry);
  lru.splice(lru.begin(), lru, entry.lru);
}

void BufferedKvStore::release_sent(std::span<const KvBlockHash> hashes) {
  std::lock_guard lock(mutex_);
  for (const KvBlockHash& hash : hashes)
    if (auto it = entries_.find(hash); it != entries_.end() && !it->second.in_transit) erase(it);
}

BufferedKvStore::Payload BufferedKvStore::get(const KvBlockHash& hash) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(hash);
  if (it == entries_.end()) return nullptr;
  touch(it->second);
  return it->second.payload;
}

std::vector<BufferedKvStore::Payload> BufferedKvStore::wait_for(std::span<const KvBlockHash> hashes,
                                                               std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<Payload> payloads(hashes.size());
  std::unique_lock lock(mutex_);
  while (true) {
    bool all = true;
    for (size_t i = 0; i < hashes.size(); ++i) {
      if (payloads[i]) continue;
      if (auto it = entries_.find(hashes[i]); it != entries_.end()) {
        touch(it->second);
        payloads[i] = it->second.payload;
      } else if (remembered_.count(hashes[i]) == 0) {
        all = false;  // not written yet: the engine's write-through may still bring it
      }
    }
    if (all || added_.wait_until(lock, deadline) == std::cv_status::timeout) break;
  }
  // One last look after a timeout (a block may have come with the wake-up).
  for (size_t i = 0; i < hashes.size(); ++i)
    if (!payloads[i])
      if (auto it = entries_.find(hashes[i]); it != entries_.end()) payloads[i] = it->second.payload;
  return payloads;
}

std::vector<bool> BufferedKvStore::read_storage(std::span<const KvBlockHash> hashes,
                                                std::span<const std::span<std::byte>> destinations) {
  int64_t bytes = 0;
  for (const std::span<std::byte>& destination : destinations) bytes += static_cast<int64_t>(destination.size());
  queued_read_bytes_ += bytes;
  std::vector<bool> ok;
  try {
    ok = storage_->read_blocks(hashes, destinations);
  } catch (...) {
    queued_read_bytes_ -= bytes;
    throw;
  }
  queued_read_bytes_ -= bytes;
  return ok;
}

std::vector<bool> BufferedKvStore::read_blocks(std::span<const KvBlockHash> hashes,
                                               std::span<const std::span<std::byte>> destinations) {
  LOOM_CHECK(hashes.size() == destinations.size());
  std::vector<bool> ok(hashes.size(), false);
  std::vector<size_t> from_storage;
  for (size_t i = 0; i < hashes.size(); ++i) {
    Payload payload;
    {
      std::lock_guard lock(mutex_);
      if (auto it = entries_.find(hashes[i]); it != entries_.end() && it->second.payload->size() == destinations[i].size()) {
        payload = it->second.payload;
        ++counters_.num_hit_blocks;
        if (it->second.in_transit) {
          erase(it);  // delivered: the engine has it now
        } else {
          touch(it->second);
        }
      }
    }
    if (payload) {
      std::memcpy(destinations[i].data(), payload->data(), payload->size());
      ok[i] = true;
    } else {
      from_storage.push_back(i);
    }
  }
  if (from_storage.empty() || storage_ == nullptr) return ok;
  std::vector<KvBlockHash> storage_hashes;
  std::vector<std::span<std::byte>> storage_destinations;
  for (size_t i : from_storage) {
    storage_hashes.push_back(hashes[i]);
    storage_destinations.push_back(destinations[i]);
  }
  const std::vector<bool> read = read_storage(storage_hashes, storage_destinations);
  for (size_t j = 0; j < from_storage.size(); ++j) {
    if (!read[j]) continue;
    ok[from_storage[j]] = true;
    add(storage_hashes[j], storage_destinations[j], nullptr, /*in_transit=*/false);  // may go on to the decode engine
  }
  return ok;
}

std::pair<int64_t, int64_t> BufferedKvStore::load_from_storage(std::span<const KvBlockHash> hashes,
                                                                std::span<const int64_t> payload_bytes) {
  LOOM_CHECK(hashes.size() == payload_bytes.size());
  if (storage_ == nullptr) return {0, 0};
  std::vector<KvBlockHash> wanted;
  std::vector<std::shared_ptr<KvPayload>> buffers;
  std::vector<std::span<std::byte>> destinations;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (payload_bytes[i] <= 0 || in_buffer(hashes[i]) || !storage_->contains(hashes[i])) continue;
    wanted.push_back(hashes[i]);
    buffers.push_back(KvPayload::allocate(static_cast<size_t>(payload_bytes[i])));
    destinations.push_back(buffers.back()->bytes());
  }
  if (wanted.empty()) return {0, 0};
  const std::vector<bool> ok = read_storage(wanted, destinations);
  int64_t num_read = 0, num_bytes = 0;
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (!ok[i]) continue;
    put(wanted[i], Payload(std::move(buffers[i])));
    ++num_read;
    num_bytes += static_cast<int64_t>(destinations[i].size());
  }
  return {num_read, num_bytes};
}

DiskKvStoreStats BufferedKvStore::stats() const { return storage_ != nullptr ? storage_->stats() : DiskKvStoreStats{}; }

KvBufferStats BufferedKvStore::buffer_stats() const {
  std::lock_guard lock(mutex_);
  KvBufferStats stats = counters_;
  stats.num_blocks = static_cast<int64_t>(entries_.size());
  stats.num_bytes = num_bytes_;
  return stats;
}

}  // namespace loom
