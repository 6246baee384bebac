// The HTTP/1.1 transport under the OpenAI routes: an event-driven front end
// (Boost.Asio for sockets and timers, Boost.Beast's parser for framing) in
// front of a pool of handler threads.
//
//   accept ──> [I/O thread] wait for bytes ─> read headers ─> read body ──┐
//                 ▲  (keep-alive timeout)   (header deadline,  (body      │ complete request
//                 │                          byte/count caps)  deadline,  ▼
//                 │                                             size cap) [handler pool]
//                 └──────────── next request on the connection ◀── run handler, write response
//
// Idle and slow clients cost a socket and a small buffer on the one I/O thread,
// never a handler thread: a handler thread is taken only by a request whose
// headers and body have fully arrived, so no number of idle or trickling
// connections can starve the others. Every phase has a deadline:
//   - idle between requests:   keep_alive_timeout, then the connection closes;
//   - headers (from the first byte): header_timeout, then 408;
//   - body: body_timeout, then 408; max_request_bytes whatever the transfer
//     encoding (Content-Length or chunked), then 413;
//   - headers over max_header_bytes or max_header_count: 431;
//   - malformed framing: 400; more than max_connections open: 503 at accept;
//   - each write of a response: write_timeout, then the connection closes;
//   - chunk framing (extensions, trailers): the read buffer holds at most
//     max_header_bytes + 64 KiB, trailers count against the header caps.
// HEAD gets the head only; an HTTP/1.0 stream is sent unchunked and then closed.
// After an error response the connection is closed gracefully (our side shut
// down, the client's remaining bytes read and dropped for a moment) so the
// client sees the status rather than a reset.
//
// Threads: run() is the I/O thread; handlers run on the pool's threads and
// write their response there (streams included); stop_accepting(), stop() and
// the counters are safe from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/http_types.h"

namespace loom::server {

struct TransportConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                            // 0: an ephemeral port
  size_t max_request_bytes = 8u << 20;        // body, after de-chunking: 413 beyond
  uint32_t max_header_bytes = 64u << 10;      // request line + headers: 431 beyond
  int max_header_count = 128;                 // header lines: 431 beyond
  double header_timeout_seconds = 10.0;       // first byte to end of headers: 408 beyond
  double body_timeout_seconds = 60.0;         // end of headers to end of body: 408 beyond
  double keep_alive_timeout_seconds = 5.0;    // idle between requests (and before the first one)
  double write_timeout_seconds = 60.0;        // one write of a response (a chunk of a stream)
  int max_connections = 4096;                 // open connections; 503 beyond
  // Requests handled at once (a stream holds one); threads start as requests need them. By default
  // as many as the engine's waiting queue holds (--max-waiting-requests), so that an agent fan-out
  // waits in the scheduler, which orders it (and refuses beyond its limit), not in the transport.
  int num_handler_threads = 1024;
  // GET paths answered by two threads of their own (/health, /metrics), so that
  // probes never queue behind num_handler_threads long requests.
  std::vector<std::string> light_paths;
};

// Answers one complete request; runs on a handler thread. Exceptions escaping
// it become a generic 500 (their text is logged, never sent).
using RequestHandler = std::function<HttpResponse(HttpRequest&)>;
// Builds the response for an error the transport raises itself (400, 408, 413,
// 431, 500, 503): `code` is a short machine-readable name ("request_too_large").
using ErrorResponder = std::function<HttpResponse(int status, const std::string& message, const std::string& code)>;

class HttpTransport {
 public:
  HttpTransport(TransportConfig config, RequestHandler handler, ErrorResponder error_responder);
  ~HttpTransport();  // stop(), then joins the handler threads
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds and listens (SO_REUSEADDR, never SO_REUSEPORT: a port in use is an
  // error). Throws Error(kInvalidArgument) naming host:port and the reason.
  void bind();
  int bound_port() const { return bound_port_; }

  // Runs the I/O loop on the calling thread until stop().
  void run();
  // Graceful first half: closes the listener and idle connections; requests
  // being read or handled go on, their connections close after the response.
  void stop_accepting();
  // Waits until no request is being handled (true) or `timeout` passes (false).
  bool wait_for_handlers(std::chrono::milliseconds timeout);
  // Ends everything: closes every connection (a handler blocked writing fails
  // at once), lets handler threads finish, and makes run() return. Idempotent.
  void stop();

  int num_connections() const;
  int num_handling() const;

  struct Impl;  // opaque; public so the connection class in the .cc can name it

 private:
  std::unique_ptr<Impl> impl_;
  int bound_port_ = 0;
};

}  // namespace loom::server
