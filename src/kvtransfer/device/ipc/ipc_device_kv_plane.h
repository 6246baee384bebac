// The "cuda-ipc" device KV plane (docs/disaggregation.md "Device to device"):
// a prefill engine (PE) copies each layer of a request's blocks, as its
// prefill writes them, from its GPU pools straight into the blocks a decode
// engine (DE) of the same host reserved in its GPU pools. No host staging, no
// payload on the wire: the bytes move GPU to GPU (NVLink or PCIe between two
// GPUs, a device copy on one), through the DE's pools mapped into the PE's
// process. The device work is a PeerKvCopier's (backend/peer_kv_copier.h:
// CUDA IPC in serving, host memory in tests); this class is the protocol.
//
// Wire (one TCP connection per transfer, PE -> DE, on the DE's listener;
// the socket plane's handshake and sealed messages, socket_device_kv_plane.h):
//   'O' open    as the socket plane's (id, layers, blocks, the block layout,
//               the sender's address) -> u8 accepted; refused: a reason;
//               accepted: per pool (main, then rCache) u32 ranks, per rank
//               u32 handle bytes and the handle of its allocation, u32
//               arrays, one u64 offset per array from its rank's allocation
//               (no rCache: 0 ranks, 0 arrays).
//   'L' landed  u32 layer, u32 first block, u32 count: the PE's copies of
//               that piece ran (it waited on their ticket); nothing else.
//   'E' end     as the socket plane's; sent after every copy ran.
//   'X' stop    DE -> PE (u8 0, a reason): the DE gave up on the transfer
//               (deadline, cancel); the PE copies nothing more, waits for
//               what it enqueued, answers
//   'A' drained PE -> DE, and closes.
//
// The PE's side. begin_send starts the transfer's thread (connect, handshake,
// open, map the DE's pools). send_layer, on the engine thread inside the
// forward, makes the copy stream wait for the layer's fence and, once the
// pools are mapped, enqueues the piece's copies (a run of blocks per array,
// device_kv_runs.h) and a ticket; before that it keeps the piece's block ids
// and the thread enqueues them once mapped. It never waits on the peer. The
// thread waits on each ticket in order and sends 'L'. end_send waits (up to
// open_wait_seconds) for the mapping when pieces are still unmapped, drops
// them otherwise (the DE recomputes), then waits for the transfer's last
// ticket: when it returns no copy reads the PE's blocks any more, so the
// engine may release and reuse them.
//
// The DE's side. A piece counts as landed when its 'L' comes (its copies ran
// before). A transfer is done when every layer of every block landed.
// finish() of one not done whose peer holds the handles (the open was
// accepted, no 'E' came, the connection is up) answers false: its connection
// thread sends 'X' and the transfer quiesces on 'A' or when the connection
// closes (a PE process that dies takes its copies with it); until then the
// engine keeps the blocks out of its pools. A PE that neither answers nor
// closes within io_timeout_seconds leaves them out for good (logged).
//
// Tensor parallelism: a TP=N engine's pools are N ranks' (KvPoolMemory
// num_ranks, a layer's arrays rank after rank); the open's layout check makes
// both engines the same TP size (no resharding), and rank r's arrays go into
// the peer's rank r on rank r's copy stream.
//
// Trust (docs/disaggregation.md "Trust model"): only a peer that passed the
// shared-secret handshake and opened a transfer this DE expects, from the
// address its reservation named, with the same block layout, receives the
// handles, and with them write access to this engine's pools. Nothing is
// digested: the bytes never touch a CPU. Anyone holding the secret is fully
// trusted, as on the link. Same host only: CUDA IPC does not cross machines.
//
// Threads: PlaneSockets' (a listener, a thread per connection, one per
// outgoing transfer). Every public method from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/peer_kv_copier.h"
#include "kvtransfer/device/device_kv_assembly.h"
#include "kvtransfer/device/device_kv_plane.h"
#include "kvtransfer/device/socket/plane_sockets.h"
#include "kvtransfer/kv_peer_allowlist.h"

namespace loom {

namespace kvlink {
class Session;
}

struct IpcDeviceKvPlaneOptions {
  std::string host = "127.0.0.1";  // where it listens (--kv-transfer-host)
  int port = 0;                    // 0: a free port
  std::string secret;              // the KV transfer secret ("": none, loopback only)
  KvPeerAllowlist peers;           // where it sends (--kv-transfer-peers)
  double io_timeout_seconds = 30.0;
  double open_wait_seconds = 2.0;  // end_send's wait for a mapping still on its way
};

struct IpcDeviceKvPlaneStats {
  int64_t pieces_sent = 0, bytes_sent = 0;          // copies that ran, PE side
  int64_t pieces_received = 0, bytes_received = 0;  // landed, DE side
  int64_t refused_connections = 0;                  // failed the handshake
  int64_t rejected_opens = 0;                       // well sealed, but not a transfer expected from that peer
  int64_t stopped_transfers = 0;                    // 'X' sent (DE)
};

class IpcDeviceKvPlane final : public DeviceKvPlane {
 public:
  static constexpr const char* kName = "cuda-ipc";
  // Listens on options.host:options.port. Throws Error(kInvalidArgument)
  // when it cannot bind, or off loopback without a secret.
  IpcDeviceKvPlane(IpcDeviceKvPlaneOptions options, std::shared_ptr<PeerKvCopier> copier);
  ~IpcDeviceKvPlane() override;
  IpcDeviceKvPlane(const IpcDeviceKvPlane&) = delete;
  IpcDeviceKvPlane& operator=(const IpcDeviceKvPlane&) = delete;

  // plane "cuda-ipc", this machine, the copier's device, "host:port", same host only.
  DeviceKvEndpoint endpoint() const override;
  // Pools the copier accepts only (Error(kUnsupported) otherwise); exports them.
  void bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) override;
  void expect(const DeviceKvExpectation& expectation) override;
  DeviceKvProgress progress(DeviceKvTransferId id) const override;
  bool finish(DeviceKvTransferId id) override;
  bool quiesced(DeviceKvTransferId id) const override;
  bool begin_send(const std::string& peer, const DeviceKvDestination& destination, int32_t num_layers) override;
  bool send_layer(DeviceKvTransferId id, const DeviceKvLayerPiece& piece) override;
  void end_send(DeviceKvTransferId id, const std::string& failure) override;

  int port() const { return sockets_.port(); }
  IpcDeviceKvPlaneStats stats() const;

 private:
  struct Exported {  // a bound pool as the open's answer gives it
    std::vector<std::vector<std::byte>> handles;  // [rank]: its allocation's
    std::vector<uint64_t> offsets;                // [array]: from its rank's allocation
  };
  struct Incoming {
    std::string peer;
    DeviceKvDestination destination;
    DeviceKvAssembly assembly;
    std::chrono::steady_clock::time_point deadline;
    bool opened = false;    // a connection accepted the open: the peer may write until it ends or goes
    bool writing = false;   // opened, and neither 'E' nor the connection's end came
    bool stopping = false;  // finish() came while writing: stop the peer, keep the blocks until it quiesced
  };
  struct Outgoing;
  struct Piece;
  // ipc_device_kv_receiver.cc
  void serve(int fd);
  // After an accepted open: 'L' / 'E' / 'A' from the peer, 'X' to it once finish() stops the transfer.
  void serve_transfer(int fd, kvlink::Session& session, DeviceKvTransferId id, const std::string& sender);
  // ipc_device_kv_sender.cc
  void send_loop(std::shared_ptr<Outgoing> outgoing);
  // Requires mutex_ and the mapping: the piece's copies and their ticket (its fence was waited for already).
  void enqueue_copies(Outgoing& outgoing, const DeviceKvLayerPiece& piece);
  void drain(Outgoing& outgoing);  // marks it broken, waits for and releases its tickets
  void wake_senders();

  const IpcDeviceKvPlaneOptions options_;
  const std::shared_ptr<PeerKvCopier> copier_;
  PlaneSockets sockets_;

  mutable std::mutex mutex_;  // guards everything below
  KvPoolMemory main_, residual_;
  Exported main_export_, residual_export_;
  mutable std::map<DeviceKvTransferId, Incoming> incoming_;  // mutable: progress() settles deadlines
  std::map<DeviceKvTransferId, std::shared_ptr<Outgoing>> outgoing_;
  IpcDeviceKvPlaneStats stats_;
};

}  // namespace loom
