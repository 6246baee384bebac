// The cuda-ipc plane's shared part: sockets, endpoint, pools, stats (the
// sending half: ipc_device_kv_sender.cc; the receiving half:
// ipc_device_kv_receiver.cc; ipc_device_kv_plane.h describes the protocol).
#include "kvtransfer/device/ipc/ipc_device_kv_plane.h"

#include "util/error.h"

namespace loom {

IpcDeviceKvPlane::IpcDeviceKvPlane(IpcDeviceKvPlaneOptions options, std::shared_ptr<PeerKvCopier> copier)
    : options_(std::move(options)),
      copier_(std::move(copier)),
      sockets_(options_.host, options_.port, !options_.secret.empty(), "device KV plane cuda-ipc") {
  if (!copier_) fail(ErrorKind::kInvalidArgument, "the cuda-ipc plane needs a copier");
  sockets_.start([this](int fd) { serve(fd); });
}

IpcDeviceKvPlane::~IpcDeviceKvPlane() {
  sockets_.stop([this] { wake_senders(); });
}

DeviceKvEndpoint IpcDeviceKvPlane::endpoint() const {
  return {kName, sockets_.machine(), copier_->device_name(), sockets_.address(), /*same_host_only=*/true};
}

IpcDeviceKvPlaneStats IpcDeviceKvPlane::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void IpcDeviceKvPlane::bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) {
  auto exported = [&](const KvPoolMemory& pool) {
    Exported result;
    if (pool.empty()) return result;
    if (!copier_->accepts(pool))
      fail(ErrorKind::kUnsupported, "the cuda-ipc device KV plane moves its copier's GPUs' pools (one per "
                                    "tensor-parallel rank); this engine's pool is elsewhere");
    for (int32_t rank = 0; rank < pool.num_ranks; ++rank) result.handles.push_back(copier_->export_allocation(pool, rank));
    for (size_t a = 0; a < pool.arrays.size(); ++a)
      result.offsets.push_back(
          static_cast<uint64_t>(pool.arrays[a] - pool.allocations[static_cast<size_t>(pool.rank_of_array(a))]));
    return result;
  };
  Exported main_export = exported(main), residual_export = exported(residual);
  std::lock_guard lock(mutex_);
  main_ = main;
  residual_ = residual;
  main_export_ = std::move(main_export);
  residual_export_ = std::move(residual_export);
}

}  // namespace loom
