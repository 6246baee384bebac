// The DE's half of device-to-device KV transfers (kvtransfer/device/
// device_kv_plane.h): reservations, their landing in the radix trees, and
// the requests that wait for them.
//
// reserve(): the prompt's full blocks this engine does not hold on the
// device get fresh blocks in every cache the request uses (main, and the
// rCache for forked), allocated on leases so that nothing evicts or reuses
// them; the blocks it holds are leased too (so they stay). The plane then
// expects exactly those destination blocks from the peer. Until the transfer
// is done the blocks are private to the reservation: in no tree, read by no
// request.
//
// poll() (each engine loop): a transfer done (every layer of every block
// landed) is committed into each cache's tree under the request's key, so
// the request finds it as a device prefix hit; a failed one (peer died, gave
// up, deadline) is finished at the plane and its leases released: the fresh
// blocks go back to the free list (no orphans) and the request recomputes.
// A reservation whose request never comes is released at its deadline plus
// kClaimGraceSeconds (landed blocks then stay cached as any committed block).
// cancel() (the router, when the PE side failed) fails one in flight at once,
// as its deadline would; its record stays kClaimGraceSeconds more so that a
// request still on its way finds it failed and recomputes.
// Late writes: on a plane whose peer writes into this engine's memory itself
// (CUDA IPC), a failed transfer's finish() may answer that the peer can still
// write. Its leases then move to a quarantine instead of being released: the
// blocks stay out of the free list (nothing allocates or reads them) until the
// plane says quiesced(), checked at each poll(); a peer that never quiesces
// keeps them for good (counted in num_quarantined_blocks, logged), which costs
// capacity but never correctness.
//
// Requests: one submitted with device_kv_receive of a transfer still in
// flight is parked here (outside the scheduler) and handed back by
// take_ready() once its transfer settled; its reservation's leases are
// released after the step that admitted it (release_claimed).
//
// Thread: engine thread only. The KvCacheGroup must outlive the receiver's
// leases (drop() before the pools are reallocated).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_request.h"
#include "kv/kv_cache_group.h"
#include "kvtransfer/device/device_kv_plane.h"

namespace loom {

class DeviceKvReceiver {
 public:
  static constexpr double kClaimGraceSeconds = 30.0;

  DeviceKvReceiver(DeviceKvPlane& plane, int32_t num_layers);
  ~DeviceKvReceiver();

  // Throws Error(kCapacity) when the blocks cannot be had now (nothing changed).
  DeviceKvReservation reserve(KvCacheGroup& caches, const RequestKvKeys& keys, std::span<const int32_t> prompt,
                              const std::string& peer, double timeout_seconds);
  void poll();
  // Engine::cancel_device_kv: fails reservation `id` now if it is still in
  // flight (settled as a failure, counted as cancelled: plane finished,
  // leases released, its parked request ready); one the plane finished
  // landing commits as usual.
  DeviceKvCancel cancel(DeviceKvTransferId id, const std::string& reason);
  // Whether `request` must wait (its transfer is known and in flight): then it is kept here.
  bool park_if_waiting(std::unique_ptr<PendingRequest>& request);
  // Parked requests whose transfer settled, in arrival order.
  std::vector<std::unique_ptr<PendingRequest>> take_ready();
  // Parked requests whose channel was cancelled.
  std::vector<std::unique_ptr<PendingRequest>> take_cancelled();
  std::vector<std::unique_ptr<PendingRequest>> take_all_parked();
  void release_claimed();
  // Ends every transfer and releases every lease (shutdown, pool reallocation).
  void drop();
  // A transfer in flight or a parked request: the engine loop must keep polling.
  // (Settled reservations kept for a late request need no polling: the next
  // loop iteration, which any request causes, releases those past their grace.)
  bool has_pending() const;

  int64_t num_received() const { return num_received_; }
  int64_t num_failures() const { return num_failures_; }      // failed at the plane (not cancelled)
  int64_t num_cancelled() const { return num_cancelled_; }
  int64_t num_received_blocks() const { return num_received_blocks_; }
  // Seconds, since the last call: from each reservation to its every layer landed (transfers received whole),
  // and each parked request's wait for its transfer to settle. TTFT through the device path breaks down into
  // these (docs/disaggregation.md).
  struct Timings {
    std::vector<double> transfer, wait;
  };
  Timings take_timings();
  // Blocks (main and rCache) held back because a failed transfer's peer may still write them.
  int64_t num_quarantined_blocks() const;
  size_t num_reservations() const { return reservations_.size(); }

 private:
  enum class State { kPending, kLanded, kFailed };
  struct Reservation {
    State state = State::kPending;
    std::vector<int32_t> tokens;  // the prompt's full blocks' tokens
    KvCacheManager* main_cache = nullptr;
    KvCacheManager* residual_cache = nullptr;  // forked only
    KvLease main, residual;
    int32_t num_blocks = 0;       // fresh blocks
    bool claimed = false;
    std::chrono::steady_clock::time_point reserved_at;
    std::chrono::steady_clock::time_point release_at;
  };
  // `cancelled`: a failure the router asked for (cancel()), counted apart from the plane's.
  void settle(DeviceKvTransferId id, Reservation& reservation, const DeviceKvProgress& progress,
              bool cancelled = false);

  struct Quarantined {
    DeviceKvTransferId id = 0;
    KvLease main, residual;
    std::chrono::steady_clock::time_point since;
    bool reported = false;  // logged as stuck
  };
  // poll(): releases the quarantined leases whose peer has quiesced.
  void release_quiesced(std::chrono::steady_clock::time_point now);

  DeviceKvPlane& plane_;
  const int32_t num_layers_;
  std::vector<Quarantined> quarantine_;
  std::mt19937_64 ids_;
  std::map<DeviceKvTransferId, Reservation> reservations_;
  struct Parked {
    DeviceKvTransferId id = 0;
    std::unique_ptr<PendingRequest> request;
    std::chrono::steady_clock::time_point since;
  };
  std::deque<Parked> parked_;
  Timings timings_;
  int64_t num_received_ = 0, num_failures_ = 0, num_cancelled_ = 0, num_received_blocks_ = 0;
};

}  // namespace loom
