#include "engine/device_kv_receiver.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

namespace loom {

DeviceKvReceiver::DeviceKvReceiver(DeviceKvPlane& plane, int32_t num_layers)
    : plane_(plane), num_layers_(num_layers), ids_(std::random_device{}()) {}

DeviceKvReceiver::~DeviceKvReceiver() { drop(); }

DeviceKvReservation DeviceKvReceiver::reserve(KvCacheGroup& caches, const RequestKvKeys& keys,
                                              std::span<const int32_t> prompt, const std::string& peer,
                                              double timeout_seconds) {
  KvCacheManager& main = caches.main();
  const int32_t block_size = main.block_size();
  const int32_t num_full = static_cast<int32_t>(prompt.size()) / block_size;
  Reservation reservation;
  reservation.tokens.assign(prompt.begin(), prompt.begin() + static_cast<size_t>(num_full) * block_size);
  const std::span<const int32_t> tokens(reservation.tokens);
  const bool forked = !keys.residual_namespace.empty();
  KvCacheManager* residual = forked ? caches.residual() : nullptr;
  if (forked && residual == nullptr) fail(ErrorKind::kInvalidArgument, "a forked request on an engine without an rCache pool");
  // The prefix held in every cache the request uses; the rest is received.
  int32_t first_block = main.num_cached_prefix_tokens(keys.key_in(KvCacheId::kMain), tokens) / block_size;
  if (residual)
    first_block = std::min(first_block,
                           residual->num_cached_prefix_tokens(keys.key_in(KvCacheId::kResidual), tokens) / block_size);
  const int32_t num_blocks = num_full - first_block;
  const std::span<const int32_t> held = tokens.first(static_cast<size_t>(first_block) * block_size);
  reservation.main_cache = &main;
  reservation.main = main.lock_prefix(keys.key_in(KvCacheId::kMain), held);
  if (residual) {
    reservation.residual_cache = residual;
    reservation.residual = residual->lock_prefix(keys.key_in(KvCacheId::kResidual), held);
  }
  if (!main.allocate(reservation.main, num_blocks) || (residual && !residual->allocate(reservation.residual, num_blocks)))
    fail(ErrorKind::kCapacity, "no room for {} KV blocks of an incoming transfer", num_blocks);

  DeviceKvReservation result;
  DeviceKvTransferId id = 0;
  while (id == 0 || reservations_.count(id)) id = ids_();
  result.destination.id = id;
  const auto fresh = [&](const KvLease& lease) {
    return std::vector<int32_t>(lease.block_ids().begin() + first_block, lease.block_ids().end());
  };
  result.destination.main_blocks = fresh(reservation.main);
  if (residual) result.destination.residual_blocks = fresh(reservation.residual);
  result.first_block = first_block;
  result.num_layers = num_layers_;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_seconds));
  plane_.expect({result.destination, peer, num_layers_, deadline});  // throws before anything is kept
  reservation.num_blocks = num_blocks;
  reservation.reserved_at = std::chrono::steady_clock::now();
  reservation.release_at = deadline + std::chrono::seconds(static_cast<int64_t>(kClaimGraceSeconds));
  reservations_.emplace(id, std::move(reservation));
  return result;
}

void DeviceKvReceiver::settle(DeviceKvTransferId id, Reservation& reservation, const DeviceKvProgress& progress,
                              bool cancelled) {
  const bool free_now = plane_.finish(id);  // true: from here on nothing writes into the blocks
  if (progress.state == DeviceKvProgress::State::kDone) {
    const int32_t num_tokens = static_cast<int32_t>(reservation.tokens.size());
    reservation.main_cache->commit(reservation.main, reservation.tokens, num_tokens);
    if (reservation.residual_cache) reservation.residual_cache->commit(reservation.residual, reservation.tokens, num_tokens);
    reservation.state = State::kLanded;
    timings_.transfer.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - reservation.reserved_at).count());
    ++num_received_;
    num_received_blocks_ += reservation.num_blocks;
    return;
  }
  spdlog::warn("device KV transfer {} failed ({}): its {} blocks are {}, the request recomputes", id,
               progress.state == DeviceKvProgress::State::kUnknown ? "unknown to the plane" : progress.failure,
               reservation.num_blocks, free_now ? "freed" : "held until the peer's copies stop");
  if (free_now) {
    reservation.main.release();
    reservation.residual.release();
  } else {
    quarantine_.push_back({id, std::move(reservation.main), std::move(reservation.residual),
                           std::chrono::steady_clock::now(), false});
  }
  reservation.state = State::kFailed;
  ++(cancelled ? num_cancelled_ : num_failures_);
}

void DeviceKvReceiver::release_quiesced(std::chrono::steady_clock::time_point now) {
  for (auto it = quarantine_.begin(); it != quarantine_.end();) {
    if (plane_.quiesced(it->id)) {
      spdlog::info("device KV transfer {}: the peer's copies stopped; {} held blocks are freed", it->id,
                   it->main.block_ids().size());
      it->main.release();
      it->residual.release();
      it = quarantine_.erase(it);
      continue;
    }
    if (!it->reported && now - it->since > std::chrono::seconds(60)) {
      spdlog::error("device KV transfer {}: its peer may still write {} blocks a minute after the transfer failed; "
                    "they stay out of the pool", it->id, it->main.block_ids().size());
      it->reported = true;
    }
    ++it;
  }
}

int64_t DeviceKvReceiver::num_quarantined_blocks() const {
  int64_t blocks = 0;
  for (const Quarantined& entry : quarantine_)
    blocks += static_cast<int64_t>(entry.main.block_ids().size() + entry.residual.block_ids().size());
  return blocks;
}

void DeviceKvReceiver::poll() {
  const auto now = std::chrono::steady_clock::now();
  release_quiesced(now);
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    Reservation& reservation = it->second;
    if (reservation.state == State::kPending) {
      const DeviceKvProgress progress = plane_.progress(it->first);
      if (progress.state != DeviceKvProgress::State::kPending) settle(it->first, reservation, progress);
    }
    if (reservation.state != State::kPending && !reservation.claimed && now >= reservation.release_at) {
      it = reservations_.erase(it);  // nobody came for it: the leases go (landed blocks stay cached)
      continue;
    }
    ++it;
  }
}

DeviceKvCancel DeviceKvReceiver::cancel(DeviceKvTransferId id, const std::string& reason) {
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return DeviceKvCancel::kUnknown;
  Reservation& reservation = it->second;
  if (reservation.state != State::kPending) return DeviceKvCancel::kSettled;
  const DeviceKvProgress progress = plane_.progress(id);
  if (progress.state == DeviceKvProgress::State::kDone) {  // every layer is here already: keep them
    settle(id, reservation, progress);
    return DeviceKvCancel::kSettled;
  }
  DeviceKvProgress failed;
  failed.state = DeviceKvProgress::State::kFailed;
  failed.failure = "cancelled: " + reason;
  settle(id, reservation, failed, /*cancelled=*/true);
  reservation.release_at = std::min(reservation.release_at, std::chrono::steady_clock::now() +
                                                                std::chrono::seconds(static_cast<int64_t>(kClaimGraceSeconds)));
  return DeviceKvCancel::kCancelled;
}

bool DeviceKvReceiver::park_if_waiting(std::unique_ptr<PendingRequest>& request) {
  const std::optional<DeviceKvTransferId>& id = request->request.device_kv_receive;
  if (!id) return false;
  auto it = reservations_.find(*id);
  if (it == reservations_.end()) return false;
  it->second.claimed = true;
  if (it->second.state != State::kPending) return false;
  parked_.push_back({*id, std::move(request), std::chrono::steady_clock::now()});
  return true;
}

std::vector<std::unique_ptr<PendingRequest>> DeviceKvReceiver::take_ready() {
  std::vector<std::unique_ptr<PendingRequest>> ready;
  const auto now = std::chrono::steady_clock::now();
  for (auto it = parked_.begin(); it != parked_.end();) {
    auto reservation = reservations_.find(it->id);
    if (reservation != reservations_.end() && reservation->second.state == State::kPending) {
      ++it;
      continue;
    }
    timings_.wait.push_back(std::chrono::duration<double>(now - it->since).count());
    ready.push_back(std::move(it->request));
    it = parked_.erase(it);
  }
  return ready;
}

std::vector<std::unique_ptr<PendingRequest>> DeviceKvReceiver::take_cancelled() {
  std::vector<std::unique_ptr<PendingRequest>> cancelled;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (!it->request->channel->cancelled.load()) {
      ++it;
      continue;
    }
    cancelled.push_back(std::move(it->request));
    it = parked_.erase(it);
  }
  return cancelled;
}

std::vector<std::unique_ptr<PendingRequest>> DeviceKvReceiver::take_all_parked() {
  std::vector<std::unique_ptr<PendingRequest>> all;
  for (Parked& parked : parked_) all.push_back(std::move(parked.request));
  parked_.clear();
  return all;
}

DeviceKvReceiver::Timings DeviceKvReceiver::take_timings() { return std::exchange(timings_, {}); }

void DeviceKvReceiver::release_claimed() {
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    if (it->second.claimed && it->second.state != State::kPending) it = reservations_.erase(it);
    else ++it;
  }
}

void DeviceKvReceiver::drop() {
  // Shutdown or a pool reallocation: every lease goes, quarantined or not (a plane with remote writers must
  // have ended its peers' access to the old pools before bind_pools; device_kv_plane.h).
  for (auto& [id, reservation] : reservations_) plane_.finish(id);
  reservations_.clear();
  quarantine_.clear();
}

bool DeviceKvReceiver::has_pending() const {
  if (!parked_.empty()) return true;
  for (const auto& [id, reservation] : reservations_)
    if (reservation.state == State::kPending) return true;
  return false;
}

}  // namespace loom
