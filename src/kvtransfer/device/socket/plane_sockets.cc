#include "kvtransfer/device/socket/plane_sockets.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "kvtransfer/kv_link_protocol.h"
#include "util/error.h"

namespace loom {

PlaneSockets::PlaneSockets(const std::string& host, int port, bool has_secret, const std::string& what) {
  const kvlink::Listener listener = kvlink::listen_for_kv(host, port, has_secret, what,
                                                          "choose another --kv-device-plane-port (0 picks a free one)");
  listen_fd_ = listener.fd;
  port_ = listener.port;
  announced_host_ = host == "0.0.0.0" || host == "::" || host.empty() ? "127.0.0.1" : host;
  char name[256] = {};
  machine_ = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
}

PlaneSockets::~PlaneSockets() {
  stop([] {});
}

std::string PlaneSockets::address() const { return fmt::format("{}:{}", announced_host_, port_); }

void PlaneSockets::start(std::function<void(int fd)> serve) {
  serve_ = std::move(serve);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

void PlaneSockets::accept_loop() {
  while (!stopping_) {
    const int fd = kvlink::accept_connection(listen_fd_, stopping_);
    if (fd < 0) return;
    {
      std::lock_guard lock(mutex_);
      if (stopping_ || sockets_.size() >= 256) {
        ::close(fd);
        continue;
      }
      sockets_.insert(fd);
    }
    start_thread([this, fd] {
      const int yes = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
      serve_(fd);
      close(fd);
    });
  }
}

int PlaneSockets::connect(const std::string& peer, double timeout_seconds, std::string& failure) {
  int fd = -1;
  try {
    const auto [host, port] = kvlink::split_address(peer);
    fd = kvlink::open_socket(
        host, port, /*passive=*/false,
        [&](int candidate, const sockaddr* address, socklen_t length) {
          {
            std::lock_guard lock(mutex_);
            if (stopping_) return false;
            sockets_.insert(candidate);
          }
          kvlink::set_timeouts(candidate, timeout_seconds);
          if (::connect(candidate, address, length) == 0) return true;
          const int error = errno;
          std::lock_guard lock(mutex_);
          sockets_.erase(candidate);
          errno = error;
          return false;
        },
        failure);
  } catch (const Error& error) {
    failure = error.what();
  }
  if (fd < 0) return -1;
  const int yes = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  return fd;
}

void PlaneSockets::close(int fd) {
  std::lock_guard lock(mutex_);
  sockets_.erase(fd);
  ::close(fd);
}

void PlaneSockets::start_thread(std::function<void()> run) {
  std::lock_guard lock(mutex_);
  threads_.start(std::move(run));
}

void PlaneSockets::stop(const std::function<void()>& wake) {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  ::close(listen_fd_);
  std::vector<kvlink::WorkerThreads::Worker> threads;
  {
    std::lock_guard lock(mutex_);
    for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
    threads = threads_.take_all();
  }
  for (auto& worker : threads) {
    while (!*worker.done) {
      wake();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    worker.thread.join();
  }
}

}  // namespace loom
