// The TCP side of a device KV plane whose control path is the KV link's
// handshake and sealed messages (the "socket" plane, and the "cuda-ipc"
// plane, kvtransfer/device/ipc/): a listener and its accept thread, a thread
// per connection (incoming, or outgoing for one transfer), and the set of
// open sockets, which stop() shuts down so that every thread blocked on one
// returns.
//
// Ownership: one per plane, owned by it; the plane calls stop() first thing
// in its destructor (its threads use the plane's members).
// Thread: every method from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "kvtransfer/worker_threads.h"

namespace loom {

class PlaneSockets {
 public:
  // Binds host:port (0: a free port) by kvlink::listen_for_kv's rules (no
  // secret: loopback only). Throws Error(kInvalidArgument) when it cannot.
  // `what` names the plane in errors and logs.
  PlaneSockets(const std::string& host, int port, bool has_secret, const std::string& what);
  ~PlaneSockets();  // stop() if not stopped
  PlaneSockets(const PlaneSockets&) = delete;
  PlaneSockets& operator=(const PlaneSockets&) = delete;

  // Accepts connections from now on: each runs serve(fd) on a thread of its
  // own, and is closed when serve returns. At most 256 open at once.
  void start(std::function<void(int fd)> serve);
  // Connects to `peer` ("host:port") with `timeout_seconds` I/O timeouts and
  // TCP_NODELAY: the socket (tracked until close()), or -1 with `failure`
  // set (unreachable, malformed, or stopping).
  int connect(const std::string& peer, double timeout_seconds, std::string& failure);
  void close(int fd);
  void start_thread(std::function<void()> run);
  // Refuses new connections, shuts down every open socket and joins every
  // thread, calling wake() (which must notify whatever a thread may wait on)
  // until each has returned. Idempotent.
  void stop(const std::function<void()>& wake);

  bool stopping() const { return stopping_; }
  int port() const { return port_; }
  // This machine's name (endpoints' host) and "announced host:port" (a wildcard listener announces 127.0.0.1).
  const std::string& machine() const { return machine_; }
  std::string address() const;

 private:
  void accept_loop();

  std::string announced_host_, machine_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  std::mutex mutex_;  // guards the threads and open sockets
  kvlink::WorkerThreads threads_;
  std::set<int> sockets_;
  std::function<void(int fd)> serve_;  // set by start(), before the accept thread
  std::thread accept_thread_;
};

}  // namespace loom
