// The HTTP request and response as the routes see them, independent of the
// transport (server/http_transport.h) that reads and writes them.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::server {

// One complete request: headers within their limits, the body fully read and
// de-chunked, within --max-request-bytes.
struct HttpRequest {
  std::string method;  // as sent ("GET", "POST", ...)
  std::string target;  // raw request target ("/v1/models?x=1")
  std::string path;    // target's path, percent-decoded (may hold any bytes)
  std::vector<std::pair<std::string, std::string>> headers;  // in order, names as sent
  std::string body;
  // True once the client has closed or reset its connection (checked without
  // blocking). Handlers that wait on the engine poll it to cancel abandoned work.
  std::function<bool()> client_gone = [] { return false; };
  // Whether the server had begun draining (stop_accepting) when the request
  // had fully arrived: such requests are refused; earlier ones may finish.
  bool arrived_while_draining = false;

  // The first header named `name` (ASCII case-insensitive), or "".
  std::string_view header(std::string_view name) const;
};

// Where a streamed body goes. write() sends one chunk (chunked transfer
// encoding); false means the client is gone or too slow, and the stream should
// end. Called on the handler's worker thread only.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual bool write(std::string_view data) = 0;
  // True once the client has closed or reset its connection (never blocks), so a
  // stream with nothing to write yet (queued, prefilling) ends without waiting for a write to fail.
  virtual bool client_gone() { return false; }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  // A streamed body (then `body` is unused): run once on the worker thread after
  // the status line and headers went out; returns when the stream has ended.
  std::function<void(ResponseSink&)> stream;
  // Close the connection after this response even if the client keeps it alive.
  bool close_connection = false;
  // Write nothing and close (the client is gone; a reply would only be garbage
  // for a half-closed client still reading).
  bool abandon = false;
};

}  // namespace loom::server
