// The socket plane's shared part: the listener socket, endpoint, pools and
// the worker threads (the sending half: socket_device_kv_sender.cc; the
// receiving half: socket_device_kv_receiver.cc; the wire format:
// socket_device_kv_wire.h).
#include "kvtransfer/device/socket/socket_device_kv_plane.h"

#include "util/error.h"

namespace loom {

SocketDeviceKvPlane::SocketDeviceKvPlane(SocketDeviceKvPlaneOptions options)
    : options_(std::move(options)),
      sockets_(options_.host, options_.port, !options_.secret.empty(), "device KV plane socket") {
  sockets_.start([this](int fd) { serve(fd); });
}

SocketDeviceKvPlane::~SocketDeviceKvPlane() {
  // Sending threads wait on their transfer's condition: woken until they see the sockets stopping.
  sockets_.stop([this] { wake_senders(); });
}

DeviceKvEndpoint SocketDeviceKvPlane::endpoint() const {
  return {kName, sockets_.machine(), "cpu", sockets_.address(), /*same_host_only=*/false};
}

SocketDeviceKvPlaneStats SocketDeviceKvPlane::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void SocketDeviceKvPlane::bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) {
  if (main.kind != KvPoolMemory::Kind::kHost || (!residual.empty() && residual.kind != KvPoolMemory::Kind::kHost))
    fail(ErrorKind::kUnsupported,
         "the socket device KV plane moves host memory only (CPU engines); GPU engines use cuda-ipc");
  std::lock_guard lock(mutex_);
  main_ = main;
  residual_ = residual;
}


}  // namespace loom
