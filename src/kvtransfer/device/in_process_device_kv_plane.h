// A test double of the device-to-device data plane (device_kv_plane.h): the
// engines of one process, each with an InProcessDeviceKvPlane on one shared
// InProcessDeviceKvFabric, "transfer" by memcpy between their pools' host
// memory (the CPU backend's). It is not a feature: it crosses no process
// boundary and refuses CUDA memory. It exists so that everything around a
// plane (reservation, layer-wise assembly, commit into the radix trees,
// fallback, deadlines) runs in one process in CPU CI.
//
// Like a real plane it copies each layer piece as coalesced runs
// (device_kv_runs.h; num_copies() counts them) and checks on the receiver's
// side that the writer is the expected peer, the blocks lie in the
// reservation and the transfer is still open. Test controls: kill() (an
// engine dies: its transfers fail at their peers, its sends fail),
// hold_deliveries() (pieces are snapshotted at send and land only when
// deliver_held() says, in any order, or never), remote_writes() (the sender
// writes into the receiver's memory itself, as CUDA IPC will: a held piece is
// a copy the receiver cannot stop, landing even after finish(), which then
// answers "not free" until the sender's pieces are delivered or dropped and
// its send ended, or the sender died: quiesced()).
//
// Thread: all of it, from any thread (one mutex; copies run under it, so a
// finish() that returns leaves no copy in flight).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvtransfer/device/device_kv_assembly.h"
#include "kvtransfer/device/device_kv_plane.h"

namespace loom {

class InProcessDeviceKvFabric {
 public:
  // Marks endpoint `name` dead: transfers it sends fail at their receivers
  // ("peer NAME died"), and its own sends fail from now on.
  void kill(const std::string& name);
  // While held, sent pieces are copied out of the sender at send time and
  // wait; deliver_held lands those at `order` (indices into the held list, in
  // that order), the others stay held; drop_held loses them all in flight.
  void hold_deliveries(bool hold);
  size_t num_held() const;
  void deliver_held(std::span<const size_t> order);
  void drop_held();
  void remote_writes(bool on);
  // Pieces that landed in blocks after their receiver finished the transfer (remote_writes only).
  int64_t num_late_writes() const;

  int64_t num_copies() const;  // memcpy runs into receivers since start (one per run and array)
  int64_t num_pieces() const;  // layer pieces landed since start

 private:
  friend class InProcessDeviceKvPlane;
  struct Outgoing {
    std::string peer;
    DeviceKvDestination destination;
    bool ended = false;  // end_send came (kept while held pieces may still land)
  };
  struct Incoming {
    std::string peer;
    DeviceKvDestination destination;
    DeviceKvAssembly assembly;
  };
  struct Endpoint {
    KvPoolMemory main, residual;
    bool alive = true;
    std::map<DeviceKvTransferId, Incoming> incoming;
    std::map<DeviceKvTransferId, Outgoing> outgoing;
  };
  // A piece in flight: its bytes, per array of the layer (main K, V, then the rCache), block after block.
  struct Held {
    std::string sender;
    DeviceKvTransferId id = 0;
    int32_t layer = 0, first_block = 0, count = 0;
    std::vector<std::byte> main, residual;
  };

  // Requires mutex_. Lands a piece at its receiver; false when the transfer is over there.
  bool land(const Held& piece, const Endpoint* source, std::span<const int32_t> main_sources,
            std::span<const int32_t> residual_sources);
  // Requires mutex_. remote_writes: whether a live sender may still write transfer `id` into `receiver`.
  bool may_still_write(const std::string& receiver, DeviceKvTransferId id) const;

  mutable std::mutex mutex_;
  std::map<std::string, Endpoint> endpoints_;
  bool hold_ = false, remote_writes_ = false;
  std::vector<Held> held_;
  int64_t num_copies_ = 0, num_pieces_ = 0, num_late_writes_ = 0;
};

class InProcessDeviceKvPlane final : public DeviceKvPlane {
 public:
  // Registers endpoint `name` (unique on the fabric) on `fabric`.
  InProcessDeviceKvPlane(std::shared_ptr<InProcessDeviceKvFabric> fabric, std::string name);
  ~InProcessDeviceKvPlane() override;

  DeviceKvEndpoint endpoint() const override;
  void bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) override;
  void expect(const DeviceKvExpectation& expectation) override;
  DeviceKvProgress progress(DeviceKvTransferId id) const override;
  bool finish(DeviceKvTransferId id) override;
  bool quiesced(DeviceKvTransferId id) const override;
  bool begin_send(const std::string& peer, const DeviceKvDestination& destination, int32_t num_layers) override;
  bool send_layer(DeviceKvTransferId id, const DeviceKvLayerPiece& piece) override;
  void end_send(DeviceKvTransferId id, const std::string& failure) override;

 private:
  std::shared_ptr<InProcessDeviceKvFabric> fabric_;
  const std::string name_;
};

}  // namespace loom
