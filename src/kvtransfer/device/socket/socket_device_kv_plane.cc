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
  std::string failure;
  listen_fd_ = kvlink::open_socket(
      options_.host, options_.port, /*passive=*/true,
      [](int fd, const sockaddr* address, socklen_t length) {
        const int yes = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        return ::bind(fd, address, length) == 0 && ::listen(fd, 64) == 0;
      },
      failure);
  if (listen_fd_ < 0)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("device KV plane socket: cannot listen on {}:{}: {}", options_.host, options_.port, failure),
                "choose another --kv-device-plane-port (0 picks a free one)");
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (options_.secret.empty() && !kvlink::is_loopback(reinterpret_cast<const sockaddr*>(&bound))) {
    ::close(listen_fd_);
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("device KV plane socket: refusing to listen on {} without a shared secret: any host that "
                            "reaches it could write KV blocks other requests then read",
                            options_.host),
                "give every engine and the router the same --kv-transfer-secret-file, or keep the link on loopback");
  }
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
  std::vector<Worker> threads;
  {
    std::lock_guard lock(threads_mutex_);
    for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
  }
  // Sending threads wait on their transfer's condition: wake them until they see stopping_.
  for (Worker& worker : threads) {
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
  reap_finished();
  auto done = std::make_shared<std::atomic<bool>>(false);
  threads_.push_back({std::thread([run = std::move(run), done] {
                        run();
                        *done = true;
                      }),
                      done});
}

void SocketDeviceKvPlane::reap_finished() {
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (*it->done) {
      it->thread.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace loom
