// The device-to-device KV data plane (issue 41; docs/disaggregation.md
// "Device to device"): moves a request's KV from a prefill engine's (PE)
// device pools straight into a decode engine's (DE), layer by layer as the
// prefill writes it, with no host staging and no per-block descriptors on the
// wire.
//
// One transfer, in the order things happen:
//   DE  Engine::reserve_device_kv: blocks allocated and leased in its
//       KvCacheManager(s), then expect(): the plane accepts writes into
//       exactly those blocks from `peer`, until the deadline.
//   PE  begin_send(peer, destination): the DE's block ids cross once, on the
//       control path; then, per layer the backend reports written
//       (backend.h KvLayerListener), send_layer(): that layer's slices of a
//       run of transfer blocks, as one coalesced transfer (device_kv_runs.h).
//       end_send() when the prompt's last full block went, or when the PE
//       gave up (its request failed).
//   DE  progress() each engine loop: kDone once every layer of every block
//       landed (the engine then commits the blocks into its radix trees),
//       kFailed when the peer died, gave up or the deadline passed (the
//       engine frees the reservation and the request recomputes); finish()
//       in both cases. Where the receiver writes the bytes itself (the socket
//       plane, the double) nothing lands after finish(); where the peer writes
//       straight into this engine's memory (CUDA IPC) the receiver cannot stop
//       a copy already issued, so finish() of a failed transfer may answer
//       "not yet" and the engine keeps the blocks out of its pools until
//       quiesced() (the peer acknowledged its copies drained, or is gone).
//
// Set-up and trust: endpoint() is what /loom/kv/status reports and what the
// router compares to choose this path (router/dual_path_scheduler.h
// choose_kv_path). A real plane's own set-up (CUDA IPC handles of the pools,
// an NCCL communicator) goes over the KV link (kvtransfer/kv_link_*.h: shared
// secret, sealed messages): the link stays the only control path between
// engines. Bytes a plane moves are not digested per block as the staged
// path's are (docs/disaggregation.md "Trust model"); a GPU plane must either
// compute digests where the bytes are or document why the authenticated
// set-up suffices (only a peer that proved the secret gets a handle).
//
// What exists: this interface, the receiver's bookkeeping
// (device_kv_assembly.h), run coalescing (device_kv_runs.h), an in-process
// test double over host memory (in_process_device_kv_plane.h) and the
// "socket" plane between CPU engines across processes
// (socket/socket_device_kv_plane.h: host memory over TCP, each piece sealed),
// and the "cuda-ipc" plane between GPU engines of one host
// (ipc/ipc_device_kv_plane.h: copies GPU to GPU through CUDA IPC).
//
// Ownership: one plane per engine, shared by the engine (which binds its
// pools) and the server (which reports the endpoint).
// Thread: every method may be called from any thread; the engine calls the
// sending half from its engine thread inside a forward (so send_layer must
// only enqueue or copy, never wait on the peer).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace loom {

using DeviceKvTransferId = uint64_t;

// What an engine can do device to device, as /loom/kv/status reports it.
struct DeviceKvEndpoint {
  std::string plane = "none";  // "none": no device-to-device path (the CPU backend, no plane)
  std::string host;            // the machine: planes with same_host_only reach only their own
  std::string device;          // the GPU (UUID or PCI bus id); the test double: its name
  std::string address;         // how peers name this endpoint in begin_send / expect
  bool same_host_only = true;  // CUDA IPC: true; a network plane (NCCL, RDMA): false
};

// Where one transfer's blocks land at the DE: transfer block i goes to main
// block main_blocks[i] and, for a forked request, rCache block residual_blocks[i]
// (empty otherwise, or the same size).
struct DeviceKvDestination {
  DeviceKvTransferId id = 0;
  std::vector<int32_t> main_blocks;
  std::vector<int32_t> residual_blocks;
  int32_t num_blocks() const { return static_cast<int32_t>(main_blocks.size()); }
};

struct DeviceKvExpectation {
  DeviceKvDestination destination;
  std::string peer;  // the sender's endpoint address: writes from anyone else are refused
  int32_t num_layers = 0;
  std::chrono::steady_clock::time_point deadline;
};

struct DeviceKvProgress {
  enum class State { kUnknown, kPending, kDone, kFailed };
  State state = State::kUnknown;
  int32_t num_layers_landed = 0;  // layers whose every block landed
  int64_t num_bytes_landed = 0;
  std::string failure;            // kFailed: why ("peer died", "deadline passed", the sender's reason)
};

// Layer `layer` of transfer blocks [first_block, first_block + n), written at
// the sender: main_sources[i] (and residual_sources[i], forked) is the sender's
// block holding transfer block first_block + i.
struct DeviceKvLayerPiece {
  int32_t layer = 0;
  int32_t first_block = 0;
  std::span<const int32_t> main_sources;
  std::span<const int32_t> residual_sources;
  KvLayerFence fence;  // when the layer's writes are complete (backend.h)
};

class DeviceKvPlane {
 public:
  virtual ~DeviceKvPlane() = default;

  virtual DeviceKvEndpoint endpoint() const = 0;
  // The engine's pools (backend.h Backend::kv_pool_memory; residual empty
  // without an rCache pool), again after every reallocation, with no transfer
  // in flight.
  virtual void bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) = 0;

  // ---- receiving (DE) ----
  // Throws Error(kInvalidArgument) for an id already expected or a block id
  // outside the bound pools.
  virtual void expect(const DeviceKvExpectation& expectation) = 0;
  // kUnknown for an id not expected (or finished).
  virtual DeviceKvProgress progress(DeviceKvTransferId id) const = 0;
  // Ends `id` at the receiver, whatever its state. Returns whether its blocks
  // are free now: true when no write into them is in flight or will start
  // (always for a kDone transfer: every write landed); false when the peer may
  // still write (a plane whose peer writes into this memory itself): then
  // quiesced(id) turns true once it cannot, and until then the blocks must
  // not be reused.
  virtual bool finish(DeviceKvTransferId id) = 0;
  // After finish(id) returned false: whether the peer's writes into its blocks
  // have stopped (its copies acknowledged drained, or the peer gone). May stay
  // false for good (a peer that neither answers nor goes): the blocks then stay
  // out of the pools.
  virtual bool quiesced(DeviceKvTransferId id) const { return true; }

  // ---- sending (PE) ----
  // Registers a transfer to `peer` of num_layers layers. false: the peer is
  // unreachable (the caller falls back; nothing was sent).
  virtual bool begin_send(const std::string& peer, const DeviceKvDestination& destination, int32_t num_layers) = 0;
  // Moves one layer piece (the whole run as one transfer). false: the
  // transfer is over at the other end (the peer died or gave up) and later
  // calls for it are pointless. Never waits on the peer.
  virtual bool send_layer(DeviceKvTransferId id, const DeviceKvLayerPiece& piece) = 0;
  // Nothing more will be sent for `id`: `failure` empty when every block
  // went, else why the sender gives up (the receiver fails the transfer at once).
  virtual void end_send(DeviceKvTransferId id, const std::string& failure) = 0;
};

}  // namespace loom
