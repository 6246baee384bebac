// The socket plane's shared part: the listener socket, endpoint, pools and
// the worker threads (the sending half: socket_device_kv_sender.cc; the
// receiving half: socket_device_kv_receiver.cc; the wire format:
// socket_device_kv_wire.h).
#include "kvtransfer/device/socket/socket_device_kv_plane.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include "kvtransfer/kv_link_protocol.h"
#include "util/error.h"

namespace loom {

SocketDeviceKvPlane::SocketDeviceKvPlane(SocketDeviceKvPlaneOptions options) : options_(std::move(options)) {
  const kvlink::Listener listener =
      kvlink::listen_for_kv(options_.host, options_.port, !options_.secret.empty(), "device KV plane socket",
                            "choose another --kv-device-plane-port (0 picks a free one)");
  listen_fd_ = listener.fd;
  port_ = listener.port;
  const std::string& host = options_.host;
  announced_host_ = host == "0.0.0.0" || host == "::" || host.empty() ? "127.0.0.1" : host;
  char name[256] = {};
  machine_ = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
  accept_thread_ = std::thread([this] { accept_loop(); });
}

SocketDeviceKvPlane::~SocketDeviceKvPlane() {
  stopping_ = true;
  wake_senders();
  ::shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  ::close(listen_fd_);
  std::vector<kvlink::WorkerThreads::Worker> threads;
  {
    std::lock_guard lock(threads_mutex_);
    for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
    threads = threads_.take_all();
  }
  // Sending threads wait on their transfer's condition: wake them until they see stopping_.
  for (auto& worker : threads) {
    while (!*worker.done) {
      wake_senders();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    worker.thread.join();
  }
}

DeviceKvEndpoint SocketDeviceKvPlane::endpoint() const {
  return {kName, machine_, "cpu", fmt::format("{}:{}", announced_host_, port_), /*same_host_only=*/false};
}

SocketDeviceKvPlaneStats SocketDeviceKvPlane::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void SocketDeviceKvPlane::bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) {
  if (main.kind != KvPoolMemory::Kind::kHost || (!residual.empty() && residual.kind != KvPoolMemory::Kind::kHost))
    fail(ErrorKind::kUnsupported,
         "the socket device KV plane moves host memory only (CPU engines); GPU engines need a GPU plane");
  std::lock_guard lock(mutex_);
  main_ = main;
  residual_ = residual;
}

void SocketDeviceKvPlane::start_thread(std::function<void()> run) {
  std::lock_guard lock(threads_mutex_);
  threads_.start(std::move(run));
}

}  // namespace loom
