#include "server/http_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include "util/error.h"

namespace loom::server {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

constexpr auto kLingerTime = std::chrono::seconds(2);  // reading what a refused client still sends
constexpr size_t kMaxLingerBytes = 1u << 20;

Clock::duration seconds(double value) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(value));
}

const char* reason_phrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

// Status line and headers of `response`: a body of Content-Length bytes, or a
// stream, chunked unless `chunked` is false (HTTP/1.0: the body ends at close).
std::string head_of(const HttpResponse& response, bool keep_alive, bool chunked = true) {
  std::string head = fmt::format("HTTP/1.1 {} {}\r\nServer: loom\r\nContent-Type: {}\r\n", response.status,
                                 reason_phrase(response.status), response.content_type);
  for (const auto& [name, value] : response.headers) head += name + ": " + value + "\r\n";
  if (response.stream) {
    if (chunked) head += "Transfer-Encoding: chunked\r\n";
  } else
    head += fmt::format("Content-Length: {}\r\n", response.body.size());
  head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return head;
}

// Writes all of `data` to a socket from a handler thread, waiting at most
// `timeout` for the client to make room. False when the client is gone or stalled.
bool write_all(int fd, std::string_view data, Clock::duration timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!data.empty()) {
    const ssize_t sent = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      data.remove_prefix(static_cast<size_t>(sent));
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd waiting{fd, POLLOUT, 0};
    if (::poll(&waiting, 1, static_cast<int>(std::min<int64_t>(left, 1000))) < 0 && errno != EINTR) return false;
  }
  return true;
}

// Whether the peer closed or reset the connection; never blocks. Bytes of a
// pipelined next request mean the client is still there.
bool peer_gone(int fd) {
  char byte;
  const ssize_t received = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (received == 0) return true;
  return received < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

class ChunkedSink : public ResponseSink {
 public:
  ChunkedSink(int fd, Clock::duration timeout, bool chunked) : fd_(fd), timeout_(timeout), chunked_(chunked) {}
  bool write(std::string_view data) override {
    if (failed_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    if (!chunked_) return !(failed_ = !write_all(fd_, data, timeout_));
    std::string chunk = fmt::format("{:x}\r\n", data.size());
    chunk.append(data);
    chunk += "\r\n";
    failed_ = !write_all(fd_, chunk, timeout_);
    return !failed_;
  }
  bool finish() { return !failed_ && (!chunked_ || write_all(fd_, "0\r\n\r\n", timeout_)); }
  bool client_gone() override { return peer_gone(fd_); }

 private:
  int fd_;
  Clock::duration timeout_;
  bool chunked_;
  bool failed_ = false;
};

// Handler threads over a FIFO of jobs, started as jobs need them: a job posted
// while no thread is idle starts one, up to max_threads (beyond that, jobs
// queue); a started thread stays until join(). The queue is bounded by the
// connection cap: a connection has at most one request in the pool.
class HandlerPool {
 public:
  explicit HandlerPool(int max_threads) : max_threads_(static_cast<size_t>(std::max(1, max_threads))) {}
  ~HandlerPool() { join(); }
  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
      // Each idle thread takes one queued job: start another for a job none of them will take.
      if (!stopping_ && jobs_.size() > idle_ && threads_.size() < max_threads_) {
        try {
          threads_.emplace_back([this] { work(); });
        } catch (const std::system_error& error) {  // the system's thread limit: the job waits for a running one
          spdlog::warn("http: no handler thread started beyond {} ({})", threads_.size(), error.what());
        }
      }
    }
    wake_.notify_one();
  }
  // Runs what is queued, then ends the threads.
  void join() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;  // threads_ grows no more
    }
    wake_.notify_all();
    for (auto& thread : threads_)
      if (thread.joinable()) thread.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        ++idle_;
        wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  const size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  size_t idle_ = 0;  // threads waiting for a job
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

class Connection;

struct HttpTransport::Impl {
  TransportConfig config;
  RequestHandler handler;
  ErrorResponder error_responder;

  // Declared before the I/O context: connections that die with the context's
  // queued handlers unregister themselves here.
  std::mutex connections_mutex;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;

  std::atomic<bool> draining{false}, stopped{false}, running{false};
  std::atomic<int> num_handling{0};
  std::mutex handling_mutex;
  std::condition_variable handling_done;

  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  HandlerPool pool;
  HandlerPool light_pool{2};  // config.light_paths: never queued behind long requests
  Clock::time_point last_accept_warning{};

  Impl(TransportConfig transport_config, RequestHandler request_handler, ErrorResponder responder)
      : config(std::move(transport_config)), handler(std::move(request_handler)),
        error_responder(std::move(responder)), pool(config.num_handler_threads) {}

  bool is_light(const HttpRequest& request) const {
    if (request.method != "GET") return false;
    for (const auto& path : config.light_paths)
      if (request.path == path) return true;
    return false;
  }

  void accept();
  void refuse(tcp::socket& socket, int status, const std::string& message, const std::string& code);
  void finished_handling() {
    {
      std::lock_guard lock(handling_mutex);
      num_handling.fetch_sub(1);
    }
    handling_done.notify_all();
  }
  std::vector<std::shared_ptr<Connection>> live_connections() {
    std::vector<std::shared_ptr<Connection>> live;
    std::lock_guard lock(connections_mutex);
    for (auto& [raw, weak] : connections)
      if (auto connection = weak.lock()) live.push_back(std::move(connection));
    return live;
  }
};

// One client connection. Lives on the I/O thread except while a handler thread
// owns it (phase kHandling), between dispatch() and the post back to the I/O
// thread; nothing else touches it meanwhile (a shutdown() of the socket is the
// one exception, safe from any thread).
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpTransport::Impl& transport, tcp::socket socket)
      : transport_(transport), socket_(std::move(socket)), deadline_(transport.io),
        // Bounds what chunk framing (extensions, trailers) can make the read buffer hold.
        buffer_(transport.config.max_header_bytes + size_t{64} * 1024) {}
  ~Connection() {
    std::lock_guard lock(transport_.connections_mutex);
    transport_.connections.erase(this);
  }

  void start() { wait_for_request(); }

  // I/O thread: close if idle (graceful shutdown); requests being read or
  // handled go on.
  void close_if_idle() {
    if (phase_ == Phase::kIdle) close();
  }
  // I/O thread: close now; a handler thread writing to it fails at once.
  void abort() {
    if (phase_ == Phase::kHandling) {
      ::shutdown(socket_.native_handle(), SHUT_RDWR);
      return;
    }
    close();
  }

 private:
  enum class Phase { kIdle, kHeaders, kBody, kHandling, kRefusing, kClosed };
  using Parser = http::request_parser<http::string_body>;

  void arm(Clock::duration timeout) {
    timed_out_ = false;
    const uint64_t generation = ++deadline_generation_;
    deadline_.expires_after(timeout);
    deadline_.async_wait([self = shared_from_this(), generation](const error_code& error) {
      if (!error && generation == self->deadline_generation_) self->on_deadline();
    });
  }
  void disarm() {
    ++deadline_generation_;
    deadline_.cancel();
  }

  void wait_for_request() {
    phase_ = Phase::kIdle;
    if (transport_.draining.load()) return close();
    if (buffer_.size() > 0) return read_headers();  // a pipelined request is already here
    arm(seconds(transport_.config.keep_alive_timeout_seconds));
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& error) {
      if (self->phase_ != Phase::kIdle) return;
      if (error) return self->close();
      self->read_headers();
    });
  }

  void read_headers() {
    phase_ = Phase::kHeaders;
    parser_.emplace();
    parser_->header_limit(transport_.config.max_header_bytes);
    parser_->body_limit(static_cast<uint64_t>(transport_.config.max_request_bytes));
    arm(seconds(transport_.config.header_timeout_seconds));
    http::async_read_header(socket_, buffer_, *parser_, [self = shared_from_this()](const error_code& error, size_t) {
      if (self->phase_ != Phase::kHeaders) return;
      if (error) return self->on_read_error(error);
      self->on_headers();
    });
  }

  void on_headers() {
    const auto& message = parser_->get();
    int num_headers = 0;
    for (auto it = message.begin(); it != message.end(); ++it) ++num_headers;
    if (num_headers > transport_.config.max_header_count)
      return refuse(431, fmt::format("more than {} request header lines (--max-header-count)",
                                     transport_.config.max_header_count),
                    "headers_too_large");
    if (parser_->is_done()) return dispatch();
    if (boost::beast::iequals(message[http::field::expect], "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      ::send(socket_.native_handle(), kContinue.data(), kContinue.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    phase_ = Phase::kBody;
    arm(seconds(transport_.config.body_timeout_seconds));
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](const error_code& error, size_t) {
      if (self->phase_ != Phase::kBody) return;
      if (error) return self->on_read_error(error);
      self->dispatch();
    });
  }

  void on_read_error(const error_code& error) {
    if (timed_out_) {
      timed_out_ = false;
      return refuse(408, phase_ == Phase::kHeaders ? "the request headers did not arrive in time (--header-timeout)"
                                                   : "the request body did not arrive in time (--body-timeout)",
                    "request_timeout");
    }
    if (error == http::error::header_limit)
      return refuse(431, fmt::format("the request headers exceed {} bytes (--max-header-bytes)",
                                     transport_.config.max_header_bytes),
                    "headers_too_large");
    if (error == http::error::body_limit)
      return refuse(413, fmt::format("the request body is larger than {} bytes (--max-request-bytes)",
                                     transport_.config.max_request_bytes),
                    "request_too_large");
    if (error.category() == http::make_error_code(http::error::bad_method).category() &&
        error != http::error::end_of_stream && error != http::error::partial_message)
      return refuse(400, "malformed HTTP request (" + error.message() + ")", "bad_request");
    close();  // the client closed or reset the connection
  }

  void on_deadline() {
    switch (phase_) {
      case Phase::kIdle:
      case Phase::kRefusing:
        return close();
      case Phase::kHeaders:
      case Phase::kBody:
        timed_out_ = true;
        socket_.cancel();  // the read completes with operation_aborted -> on_read_error -> 408
        return;
      default:
        return;
    }
  }

  void dispatch() {
    disarm();
    phase_ = Phase::kHandling;
    auto message = parser_->release();
    parser_.reset();
    // Trailers of a chunked body land among the headers: hold them to the same caps.
    int num_fields = 0;
    size_t field_bytes = 0;
    for (const auto& field : message) {
      ++num_fields;
      field_bytes += field.name_string().size() + field.value().size() + 4;
    }
    if (num_fields > transport_.config.max_header_count || field_bytes > transport_.config.max_header_bytes)
      return refuse(431, "the request headers and trailers exceed --max-header-count / --max-header-bytes",
                    "headers_too_large");
    const bool keep_alive = message.keep_alive();
    const bool http10 = message.version() < 11;
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    request.path = decode_path(request.target);
    for (const auto& field : message)
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    request.body = std::move(message.body());
    const int fd = socket_.native_handle();
    request.client_gone = [fd] { return peer_gone(fd); };
    request.arrived_while_draining = transport_.draining.load();
    transport_.num_handling.fetch_add(1);
    HandlerPool& pool = transport_.is_light(request) ? transport_.light_pool : transport_.pool;
    pool.post([self = shared_from_this(), request = std::move(request), keep_alive, http10]() mutable {
      self->handle(request, keep_alive, http10);
    });
  }

  // Handler thread.
  void handle(HttpRequest& request, bool keep_alive, bool http10) {
    HttpResponse response;
    try {
      response = transport_.handler(request);
    } catch (const std::exception& error) {
      spdlog::error("{} {}: handler failed: {}", request.method, request.path, error.what());
      response = transport_.error_responder(500, "internal server error", "internal_error");
    }
    const bool is_head = request.method == "HEAD";
    keep_alive = keep_alive && !response.close_connection && !response.abandon && !transport_.draining.load() &&
                 !is_head && !(http10 && response.stream);
    const int fd = socket_.native_handle();
    const auto timeout = seconds(transport_.config.write_timeout_seconds);
    bool written = !response.abandon && write_all(fd, head_of(response, keep_alive, !http10), timeout);
    if (is_head) {
      // The head only: the client expects no body (and the connection closes).
    } else if (written && response.stream) {
      ChunkedSink sink(fd, timeout, !http10);
      try {
        response.stream(sink);
      } catch (const std::exception& error) {
        spdlog::error("{} {}: stream failed: {}", request.method, request.path, error.what());
        written = false;
      }
      written = written && sink.finish();
    } else if (written) {
      written = write_all(fd, response.body, timeout);
    }
    const bool reuse = written && keep_alive;
    asio::post(transport_.io, [self = shared_from_this(), reuse] {
      self->transport_.finished_handling();
      if (reuse && !self->transport_.stopped.load())
        self->wait_for_request();
      else
        self->close();
    });
  }

  // Answers an error raised while reading, then closes gracefully: our side
  // shut down, the client's pending bytes read and dropped for a moment.
  void refuse(int status, const std::string& message, const std::string& code) {
    disarm();
    phase_ = Phase::kRefusing;
    parser_.reset();
    const HttpResponse response = transport_.error_responder(status, message, code);
    auto text = std::make_shared<std::string>(head_of(response, false) + response.body);
    arm(kLingerTime);
    asio::async_write(socket_, asio::buffer(*text), [self = shared_from_this(), text](const error_code& error, size_t) {
      if (error || self->phase_ != Phase::kRefusing) return self->close();
      error_code ignored;
      self->socket_.shutdown(tcp::socket::shutdown_send, ignored);
      self->drain();
    });
  }
  void drain() {
    socket_.async_read_some(asio::buffer(discard_), [self = shared_from_this()](const error_code& error, size_t n) {
      self->num_discarded_ += n;
      if (error || self->phase_ != Phase::kRefusing || self->num_discarded_ > kMaxLingerBytes) return self->close();
      self->drain();
    });
  }

  void close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    disarm();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  static std::string decode_path(std::string_view target) {
    const std::string_view path = target.substr(0, target.find('?'));
    std::string decoded;
    decoded.reserve(path.size());
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    for (size_t i = 0; i < path.size(); ++i) {
      if (path[i] == '%' && i + 2 < path.size() && hex(path[i + 1]) >= 0 && hex(path[i + 2]) >= 0) {
        decoded += static_cast<char>(hex(path[i + 1]) * 16 + hex(path[i + 2]));
        i += 2;
      } else {
        decoded += path[i];
      }
    }
    return decoded;
  }

  HttpTransport::Impl& transport_;
  tcp::socket socket_;
  asio::steady_timer deadline_;
  uint64_t deadline_generation_ = 0;
  boost::beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  Phase phase_ = Phase::kIdle;
  bool timed_out_ = false;
  std::array<char, 16384> discard_{};
  size_t num_discarded_ = 0;
};

void HttpTransport::Impl::refuse(tcp::socket& socket, int status, const std::string& message,
                                 const std::string& code) {
  // Best effort: the answer fits the socket's send buffer of a fresh connection.
  const HttpResponse response = error_responder(status, message, code);
  const std::string text = head_of(response, false) + response.body;
  ::send(socket.native_handle(), text.data(), text.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

void HttpTransport::Impl::accept() {
  acceptor.async_accept([this](const error_code& error, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (error) {
      // Out of descriptors (EMFILE) or a transient failure: back off, do not spin.
      if (Clock::now() - last_accept_warning > std::chrono::seconds(10)) {
        spdlog::warn("accept failed: {} (logged at most every 10 s)", error.message());
        last_accept_warning = Clock::now();
      }
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](const error_code& timer_error) {
        if (!timer_error) accept();
      });
      return;
    }
    int num_open;
    {
      std::lock_guard lock(connections_mutex);
      num_open = static_cast<int>(connections.size());
    }
    if (num_open >= config.max_connections) {
      refuse(socket, 503, fmt::format("too many open connections (--max-connections {})", config.max_connections),
             "server_busy");
    } else {
      auto connection = std::make_shared<Connection>(*this, std::move(socket));
      {
        std::lock_guard lock(connections_mutex);
        connections.emplace(connection.get(), connection);
      }
      connection->start();
    }
    accept();
  });
}

HttpTransport::HttpTransport(TransportConfig config, RequestHandler handler, ErrorResponder error_responder)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(handler), std::move(error_responder))) {}

HttpTransport::~HttpTransport() {
  stop();
  impl_->pool.join();
  impl_->light_pool.join();
}

void HttpTransport::bind() {
  const TransportConfig& config = impl_->config;
  error_code error;
  const auto address = asio::ip::make_address(config.host == "localhost" ? "127.0.0.1" : config.host, error);
  if (error) fail(ErrorKind::kInvalidArgument, "cannot bind {}:{}: not an IP address (--host)", config.host, config.port);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(config.port));
  tcp::acceptor& acceptor = impl_->acceptor;
  auto check = [&](const char* step) {
    if (error)
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("cannot {} {}:{}: {}", step, config.host, config.port, error.message()),
                  error == asio::error::address_in_use ? "another process is listening there; stop it or pick --port"
                                                       : "");
  };
  acceptor.open(endpoint.protocol(), error);
  check("open a socket for");
  acceptor.set_option(tcp::acceptor::reuse_address(true), error);  // TIME_WAIT only; a live listener still conflicts
  acceptor.bind(endpoint, error);
  check("bind");
  acceptor.listen(SOMAXCONN, error);
  check("listen on");
  bound_port_ = acceptor.local_endpoint().port();
}

void HttpTransport::run() {
  impl_->accept();
  auto guard = asio::make_work_guard(impl_->io);
  impl_->running = true;
  for (;;) {
    try {
      impl_->io.run();
      break;
    } catch (const std::exception& error) {  // e.g. bad_alloc building a response: keep serving
      spdlog::error("HTTP I/O thread: {}", error.what());
    }
  }
  impl_->running = false;
}

void HttpTransport::stop_accepting() {
  impl_->draining = true;
  asio::post(impl_->io, [impl = impl_.get()] {
    error_code ignored;
    impl->acceptor.close(ignored);
    impl->accept_retry.cancel();
    for (auto& connection : impl->live_connections()) connection->close_if_idle();
  });
}

bool HttpTransport::wait_for_handlers(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->handling_mutex);
  return impl_->handling_done.wait_for(lock, timeout, [this] { return impl_->num_handling.load() == 0; });
}

void HttpTransport::stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->draining = true;
  auto closed = std::make_shared<std::promise<void>>();
  asio::post(impl_->io, [impl = impl_.get(), closed] {
    error_code ignored;
    impl->acceptor.close(ignored);
    impl->accept_retry.cancel();
    for (auto& connection : impl->live_connections()) connection->abort();
    closed->set_value();
  });
  // The I/O thread may not be running (never started, or already returned).
  if (impl_->running.load()) closed->get_future().wait_for(std::chrono::seconds(2));
  impl_->pool.join();  // handlers on aborted connections fail their writes and return
  impl_->light_pool.join();
  impl_->io.stop();
}

int HttpTransport::num_connections() const {
  std::lock_guard lock(impl_->connections_mutex);
  return static_cast<int>(impl_->connections.size());
}

int HttpTransport::num_handling() const { return impl_->num_handling.load(); }

}  // namespace loom::server
