// Copies KV blocks from this process's device pools into another process's,
// for the "cuda-ipc" device KV plane (kvtransfer/device/ipc/): the decode
// engine exports its pools' allocations, the prefill engine maps them and
// copies each layer's blocks straight into them, device to device, behind
// the layer's fence (backend.h KvLayerFence).
//
// The CUDA implementation (backend/cuda/cuda_peer_kv_copier.h) is CUDA IPC:
// export = cudaIpcGetMemHandle, import = cudaIpcOpenMemHandle, copies =
// cudaMemcpyAsync on a copy stream of its own, tickets = events. Tests use a
// host-memory copier between planes of one process.
//
// A tensor-parallel engine's pools (KvPoolMemory::num_ranks > 1) are one per
// rank, each on its own GPU: the copier has a stream per rank and rank r's
// copies (into the peer's rank r) run on rank r's.
//
// Ownership: one copier per plane, shared (shared_ptr) by the plane only.
// Thread: every method may be called from any thread (implementations lock);
// copies and waits enqueued from several threads run in the order enqueued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace loom {

class PeerKvCopier {
 public:
  virtual ~PeerKvCopier() = default;

  // The device(s), as /loom/kv/status names them (GPU UUIDs, comma-separated).
  virtual std::string device_name() const = 0;
  // Whether `pool`'s memory is what this copier moves (its kind, its devices rank by rank).
  virtual bool accepts(const KvPoolMemory& pool) const = 0;
  // Bytes another process's import() turns into rank `rank`'s allocation's base
  // (pool.allocations[rank]). Throws Error when the memory cannot be exported.
  virtual std::vector<std::byte> export_allocation(const KvPoolMemory& pool, int32_t rank) = 0;
  // Maps a peer's exported allocation for rank `rank`'s copies; returns its
  // base here. The same handle maps once and stays mapped until the copier
  // goes. Throws Error (the peer is not reachable from that device, the handle is stale).
  virtual std::byte* import(int32_t rank, std::span<const std::byte> handle) = 0;

  // Later copies start after `fence` (every rank's event of a group's fence; an empty fence: nothing to wait for).
  virtual void after(const KvLayerFence& fence) = 0;
  // Enqueues one copy of `bytes` bytes on rank `rank`'s stream; asynchronous.
  virtual void copy(int32_t rank, std::byte* destination, const std::byte* source, int64_t bytes) = 0;
  // A ticket for every copy enqueued so far (on every rank's stream); wait() blocks until they ran.
  using Ticket = uint64_t;
  virtual Ticket record() = 0;
  virtual void wait(Ticket ticket) = 0;
  // Releases a ticket waited on (its resources back to the copier).
  virtual void release(Ticket ticket) = 0;
};

}  // namespace loom
