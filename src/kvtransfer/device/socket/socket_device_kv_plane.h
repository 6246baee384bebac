// The "socket" device KV plane (docs/disaggregation.md "Device to device"):
// a real DeviceKvPlane (kvtransfer/device/device_kv_plane.h) between engines
// whose "device memory" is host memory: the CPU backend's pools. It moves a
// request's KV layer by layer, as the PE's prefill writes it, straight into
// the blocks the DE reserved, across processes and hosts, over TCP.
//
// What it is not: the GPU path (the cuda-ipc plane, kvtransfer/device/ipc/,
// copies GPU to GPU behind each layer's fence event). It refuses CUDA pools
// (bind_pools: kUnsupported), and `--kv-device-plane auto` never picks it for
// a GPU engine. It runs the whole cross-process flow (router, routes,
// reservation, layer streaming, assembly, commit, fallback) between CPU
// engines in CI, with the same handshake and open as cuda-ipc.
//
// Wire (one TCP connection per transfer, PE -> DE, on the DE's plane
// listener, endpoint().address):
//   handshake  the KV link's (kvtransfer/kv_link_session.h: magic LOOMKVL2,
//              challenge-response over the shared secret): a peer without
//              the secret is refused before it sends anything else.
//   then sealed messages (the link's Session: HMAC-SHA256 under the session
//   key, per-direction counters), each request's first byte its op:
//   'O' open   u64 transfer id, u32 layers, u32 blocks, u32 main arrays per
//              layer, u64 main bytes per block, u32 rCache arrays per layer
//              (0: not forked), u64 rCache bytes per block, then the sender's
//              endpoint address (the rest, <= 256 bytes)
//              -> u8 1 accepted / 0 refused, then a reason (text)
//   'L' layer  u32 layer, u32 first block, u32 count, then the piece's bytes:
//              for each main array of the layer (K, V) the `count` blocks
//              back to back, then the rCache array's (forked). Exactly that
//              many bytes, or the transfer fails.
//   'E' end    u8 1 (every block went) / 0 (the sender gave up), then a reason.
// No answers to 'L' or 'E': TCP's flow control is the back-pressure.
//
// Trust (docs/disaggregation.md "Trust model"): each piece is a sealed
// message, so its HMAC (the session key, which only holders of the secret
// derive) is checked over the whole piece before a byte of it is copied into
// a reserved block: a changed, replayed, reordered or injected piece fails
// its tag, nothing of it lands, the transfer fails and the DE recomputes.
// That is the staged path's guarantee (whole verified blocks only) at the
// same cost (one SHA-256 pass over the bytes at each end). The receiver also
// checks that the transfer id is one it expects, from the address the
// reservation named, with the same block layout, and that every piece lies
// inside the reservation. Sends go only to peers the allowlist admits
// (--kv-transfer-peers: loopback only without it); without a secret the
// plane, like the link, refuses to listen off loopback.
//
// Failures: a refused open, a broken connection, a forged or malformed
// piece fail the transfer at the DE at once (progress() kFailed) and make
// the PE's later send_layer() return false; the DE also fails it at its
// deadline. A PE that dies mid-transfer closes the connection: "peer ... died".
//
// Threads: a listener thread; a thread per incoming connection; a thread per
// outgoing transfer (connect, handshake, then the queued pieces in order).
// send_layer copies the layer's bytes out of the pool into the queue on the
// caller's thread and never waits on the peer (a queue over
// max_queued_bytes refuses the piece: the transfer fails, the DE recomputes).
// Every public method may be called from any thread. finish() holds the
// plane's mutex, which every copy into a reserved block holds too, so when
// it returns no write into the blocks is in flight or will start.
//
// Files: socket_device_kv_plane.cc (listener, endpoint, pools, threads),
// socket_device_kv_sender.cc (PE: begin_send .. end_send, the sending
// thread), socket_device_kv_receiver.cc (DE: expect .. finish, accept, the
// connection thread), socket_device_kv_wire.h (ops, limits, piece layout).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/device/device_kv_assembly.h"
#include "kvtransfer/device/device_kv_plane.h"
#include "kvtransfer/device/socket/plane_sockets.h"
#include "kvtransfer/kv_peer_allowlist.h"

namespace loom {

struct SocketDeviceKvPlaneOptions {
  std::string host = "127.0.0.1";  // where it listens (--kv-transfer-host)
  int port = 0;                    // 0: a free port
  std::string secret;              // the KV transfer secret ("": none, loopback only)
  KvPeerAllowlist peers;           // where it sends (--kv-transfer-peers)
  double io_timeout_seconds = 30.0;
  int64_t max_queued_bytes = int64_t{1} << 30;  // outgoing bytes not yet written, all transfers together
};

struct SocketDeviceKvPlaneStats {
  int64_t pieces_sent = 0, bytes_sent = 0;
  int64_t pieces_received = 0, bytes_received = 0;  // landed in reserved blocks
  int64_t refused_connections = 0;  // failed the handshake
  int64_t forged_messages = 0;      // a message whose tag failed
  int64_t rejected_pieces = 0;      // well sealed but not for an open transfer, or outside its reservation
};

class SocketDeviceKvPlane final : public DeviceKvPlane {
 public:
  static constexpr const char* kName = "socket";
  // Binds options.host:options.port and starts listening. Throws
  // Error(kInvalidArgument) when it cannot bind, or when the address is not
  // loopback and there is no secret.
  explicit SocketDeviceKvPlane(SocketDeviceKvPlaneOptions options);
  // Closes every connection (a peer sees this engine die) and joins the threads.
  ~SocketDeviceKvPlane() override;
  SocketDeviceKvPlane(const SocketDeviceKvPlane&) = delete;
  SocketDeviceKvPlane& operator=(const SocketDeviceKvPlane&) = delete;

  // plane "socket", host: this machine's name, device "cpu", address: the
  // listener's "host:port" (a wildcard host announced as 127.0.0.1), not same-host-only.
  DeviceKvEndpoint endpoint() const override;
  // Host pools only (Error(kUnsupported) for CUDA memory).
  void bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) override;
  void expect(const DeviceKvExpectation& expectation) override;
  DeviceKvProgress progress(DeviceKvTransferId id) const override;
  bool finish(DeviceKvTransferId id) override;
  // false (nothing started) for a peer the allowlist refuses, an id already
  // sending or unbound pools; an unreachable peer shows later (send_layer false).
  bool begin_send(const std::string& peer, const DeviceKvDestination& destination, int32_t num_layers) override;
  bool send_layer(DeviceKvTransferId id, const DeviceKvLayerPiece& piece) override;
  void end_send(DeviceKvTransferId id, const std::string& failure) override;

  int port() const { return sockets_.port(); }
  SocketDeviceKvPlaneStats stats() const;

 private:
  struct Incoming {
    std::string peer;
    DeviceKvDestination destination;
    DeviceKvAssembly assembly;
    std::chrono::steady_clock::time_point deadline;
    bool opened = false;  // a connection carries it (one only)
  };
  struct Outgoing;
  void serve(int fd);
  void send_loop(std::shared_ptr<Outgoing> outgoing);
  // Requires mutex_: lands one verified 'L' body's piece into transfer `id`;
  // false (the transfer failed) when it does not fit the reservation.
  bool land_piece(DeviceKvTransferId id, std::span<const std::byte> body);
  void wake_senders();   // takes mutex_: wakes every sending thread (shutdown)

  const SocketDeviceKvPlaneOptions options_;
  PlaneSockets sockets_;  // the listener, the connections' threads

  mutable std::mutex mutex_;  // guards pools, transfers, queues, counts
  KvPoolMemory main_, residual_;
  mutable std::map<DeviceKvTransferId, Incoming> incoming_;  // mutable: progress() settles deadlines
  std::map<DeviceKvTransferId, std::shared_ptr<Outgoing>> outgoing_;
  int64_t queued_bytes_ = 0;
  SocketDeviceKvPlaneStats stats_;
};

}  // namespace loom
