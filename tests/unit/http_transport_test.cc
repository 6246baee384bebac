// The HTTP transport over real sockets with a scripted handler: limits and
// their statuses, deadlines, the connection cap, pipelining, disconnect
// detection, and that idle or trickling clients never starve a request.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "server/http_transport.h"
#include "util/error.h"

namespace loom::server {
namespace {

using namespace std::chrono_literals;

class Socket {
 public:
  explicit Socket(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~Socket() { close(); }
  bool connected() const { return connected_; }
  bool send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t sent = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (sent <= 0) return false;
      data.remove_prefix(static_cast<size_t>(sent));
    }
    return true;
  }
  // Reads until `until` appears, the peer closes, or `timeout` passes.
  std::string read(std::chrono::milliseconds timeout, std::string_view until = "") {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (!until.empty() && text.find(until) != std::string::npos) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd waiting{fd_, POLLIN, 0};
      if (::poll(&waiting, 1, static_cast<int>(left.count())) <= 0) break;
      char buffer[65536];
      const ssize_t received = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (received <= 0) {
        closed_by_peer_ = true;
        break;
      }
      text.append(buffer, static_cast<size_t>(received));
    }
    return text;
  }
  bool closed_by_peer() const { return closed_by_peer_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_by_peer_ = false;
};

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0) return -1;
  return std::stoi(response.substr(9, 3));
}

class HttpTransportTest : public ::testing::Test {
 protected:
  void start(TransportConfig config, RequestHandler handler = nullptr) {
    config.host = "127.0.0.1";
    config.port = 0;
    if (!handler)
      handler = [](HttpRequest& request) {
        HttpResponse response;
        response.body = request.method + " " + request.path + " " + std::to_string(request.body.size());
        return response;
      };
    transport_ = std::make_unique<HttpTransport>(
        config, std::move(handler), [](int status, const std::string& message, const std::string& code) {
          HttpResponse response;
          response.status = status;
          response.body = code + ": " + message;
          return response;
        });
    transport_->bind();
    thread_ = std::thread([this] { transport_->run(); });
  }
  void TearDown() override {
    if (transport_) transport_->stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return transport_->bound_port(); }
  std::string request(const std::string& text, std::chrono::milliseconds timeout = 5s) {
    Socket socket(port());
    EXPECT_TRUE(socket.send(text));
    return socket.read(timeout, "\r\n\r\n");
  }

  std::unique_ptr<HttpTransport> transport_;
  std::thread thread_;
};

const std::string kGet = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n";

TEST_F(HttpTransportTest, AnswersAndKeepsAliveAndPipelines) {
  start({});
  Socket socket(port());
  ASSERT_TRUE(socket.send(kGet + "POST /y HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"));
  const std::string text = socket.read(5s, "POST /y 3");
  EXPECT_NE(text.find("GET /x 0"), std::string::npos) << text;
  EXPECT_NE(text.find("POST /y 3"), std::string::npos) << text;
  EXPECT_NE(text.find("Connection: keep-alive"), std::string::npos);
}

TEST_F(HttpTransportTest, PercentDecodesThePathAndKeepsAnyBytes) {
  start({});
  const std::string text = request("GET /%FF%2Fa?q=%41 HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(status_of(text), 200);
  Socket socket(port());
  socket.send("GET /%FF HTTP/1.1\r\nHost: a\r\n\r\n");
  // Read until the whole body: "0" alone already matches the status line.
  const std::string body = "GET /\xff 0";
  const std::string answer = socket.read(5s, body);
  EXPECT_NE(answer.find(body), std::string::npos) << answer;
}

TEST_F(HttpTransportTest, HeaderLimitsAre431) {
  TransportConfig config;
  config.max_header_bytes = 4096;
  config.max_header_count = 16;
  start(config);
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 17; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(status_of(request(many + "\r\n")), 431);
  EXPECT_EQ(status_of(request("GET / HTTP/1.1\r\nX-Big: " + std::string(5000, 'a') + "\r\n\r\n")), 431);
  EXPECT_EQ(status_of(request(kGet)), 200);  // still serving
}

TEST_F(HttpTransportTest, BodyLimitHoldsForContentLengthAndChunked) {
  TransportConfig config;
  config.max_request_bytes = 1000;
  start(config);
  EXPECT_EQ(status_of(request("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n")), 413);
  std::string chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) chunked += "190\r\n" + std::string(400, 'a') + "\r\n";
  EXPECT_EQ(status_of(request(chunked + "0\r\n\r\n")), 413);
  const std::string fits = request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  EXPECT_EQ(status_of(fits), 200);
}

TEST_F(HttpTransportTest, MalformedRequestsAre400) {
  start({});
  EXPECT_EQ(status_of(request("GARBAGE\r\n\r\n")), 400);
  EXPECT_EQ(status_of(request("POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n")), 400);
  EXPECT_EQ(status_of(request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")), 400);
}

TEST_F(HttpTransportTest, DeadlinesCloseSlowAndIdleClients) {
  TransportConfig config;
  config.header_timeout_seconds = 0.3;
  config.body_timeout_seconds = 0.3;
  config.keep_alive_timeout_seconds = 0.3;
  start(config);
  Socket slow_headers(port());
  slow_headers.send("GET / HTTP/1.1\r\n");
  EXPECT_EQ(status_of(slow_headers.read(3s)), 408);
  Socket slow_body(port());
  slow_body.send("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");  // lies: 7 bytes never come
  EXPECT_EQ(status_of(slow_body.read(3s)), 408);
  Socket idle(port());
  const auto start_time = std::chrono::steady_clock::now();
  EXPECT_EQ(idle.read(3s), "");
  EXPECT_TRUE(idle.closed_by_peer());
  EXPECT_LT(std::chrono::steady_clock::now() - start_time, 2s);
}

TEST_F(HttpTransportTest, ConnectionCapAnswers503) {
  TransportConfig config;
  config.max_connections = 2;
  start(config);
  Socket first(port()), second(port());
  std::this_thread::sleep_for(100ms);  // both accepted
  Socket third(port());
  EXPECT_EQ(status_of(third.read(3s)), 503);
  first.close();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(status_of(request(kGet)), 200);
}

TEST_F(HttpTransportTest, IdleAndTricklingClientsDoNotStarveARequest) {
  TransportConfig config;
  config.num_handler_threads = 2;  // far fewer threads than slow clients
  start(config);
  std::vector<std::unique_ptr<Socket>> idle, trickling;
  for (int i = 0; i < 200; ++i) idle.push_back(std::make_unique<Socket>(port()));
  for (int i = 0; i < 50; ++i) {
    trickling.push_back(std::make_unique<Socket>(port()));
    trickling.back()->send("POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nab");
  }
  for (int i = 0; i < 50; ++i) {
    trickling.push_back(std::make_unique<Socket>(port()));
    trickling.back()->send("GET / HTTP/1.1\r\nX-Slow: ");
  }
  std::this_thread::sleep_for(200ms);
  const auto start_time = std::chrono::steady_clock::now();
  EXPECT_EQ(status_of(request(kGet, 3s)), 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start_time, 2s);
}

// Threads in this process (Linux: one entry each under /proc/self/task).
int num_threads() {
  int count = 0;
  if (DIR* tasks = ::opendir("/proc/self/task")) {
    while (const dirent* entry = ::readdir(tasks))
      if (entry->d_name[0] != '.') ++count;
    ::closedir(tasks);
  }
  return count;
}

TEST_F(HttpTransportTest, HandlerThreadsStartAsRequestsNeedThemUpToTheLimit) {
  // The default limit starts no thread of its own until requests come.
  const int before = num_threads();
  start({});
  EXPECT_LT(num_threads() - before, 8) << "threads started ahead of any request";
  EXPECT_EQ(status_of(request(kGet)), 200);
  TearDown();
  transport_.reset();

  // Shared with the handler threads: must outlive the test body (TearDown joins the handlers).
  static std::atomic<int> inside, most;
  static std::atomic<bool> release;
  inside = most = 0;
  release = false;
  TransportConfig config;
  config.num_handler_threads = 6;
  start(config, [](HttpRequest&) {
    const int now = ++inside;
    for (int seen = most; now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    for (int i = 0; i < 500 && !release; ++i) std::this_thread::sleep_for(10ms);
    --inside;
    return HttpResponse{};
  });
  std::vector<std::unique_ptr<Socket>> clients;
  for (int i = 0; i < 10; ++i) {
    clients.push_back(std::make_unique<Socket>(port()));
    clients.back()->send(kGet);
  }
  for (int i = 0; i < 300 && inside < 6; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(inside, 6) << "six requests handled at once, the other four queued";
  release = true;
  for (auto& client : clients) EXPECT_EQ(status_of(client->read(5s, "\r\n\r\n")), 200);
  EXPECT_EQ(most, 6);
}

TEST_F(HttpTransportTest, HandlerSeesTheClientLeave) {
  // Shared with the handler thread: must outlive the test body (TearDown joins the handlers).
  static std::atomic<bool> saw_gone;
  saw_gone = false;
  start({}, [](HttpRequest& request) {
    for (int i = 0; i < 300; ++i) {
      if (request.client_gone()) {
        saw_gone = true;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    return HttpResponse{};
  });
  {
    Socket socket(port());
    socket.send(kGet);
    std::this_thread::sleep_for(100ms);
  }
  for (int i = 0; i < 200 && !saw_gone; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(saw_gone);
}

TEST_F(HttpTransportTest, StreamsAreChunked) {
  start({}, [](HttpRequest&) {
    HttpResponse response;
    response.stream = [](ResponseSink& sink) {
      sink.write("hello ");
      sink.write("");
      sink.write("world");
    };
    return response;
  });
  Socket socket(port());
  socket.send(kGet);
  const std::string text = socket.read(5s, "0\r\n\r\n");
  EXPECT_NE(text.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(text.find("6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n"), std::string::npos) << text;
}

TEST_F(HttpTransportTest, HandlerExceptionsAreAGeneric500) {
  start({}, [](HttpRequest&) -> HttpResponse { throw std::runtime_error("secret internal detail"); });
  const std::string text = request(kGet);
  EXPECT_EQ(status_of(text), 500);
  Socket socket(port());
  socket.send(kGet);
  const std::string answer = socket.read(5s, "internal server error");
  EXPECT_NE(answer.find("internal_error: internal server error"), std::string::npos) << answer;
  EXPECT_EQ(answer.find("secret"), std::string::npos);
}

TEST_F(HttpTransportTest, StopAcceptingLetsRequestsInFlightFinish) {
  std::atomic<bool> release{false};
  start({}, [&](HttpRequest&) {
    while (!release) std::this_thread::sleep_for(5ms);
    HttpResponse response;
    response.body = "done";
    return response;
  });
  Socket busy(port()), idle(port());
  busy.send(kGet);
  std::this_thread::sleep_for(100ms);
  transport_->stop_accepting();
  EXPECT_EQ(idle.read(2s), "");  // closed: it had no request
  EXPECT_TRUE(idle.closed_by_peer());
  Socket late(port());
  EXPECT_FALSE(late.connected() && late.send(kGet) && status_of(late.read(1s)) == 200);
  EXPECT_FALSE(transport_->wait_for_handlers(100ms));
  release = true;
  EXPECT_TRUE(transport_->wait_for_handlers(2s));
  const std::string text = busy.read(2s, "done");
  EXPECT_NE(text.find("Connection: close"), std::string::npos);
  EXPECT_NE(text.find("done"), std::string::npos);
}

TEST_F(HttpTransportTest, TrailersCountAgainstTheHeaderCaps) {
  TransportConfig config;
  config.max_header_count = 8;
  start(config);
  std::string chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n";
  for (int i = 0; i < 20; ++i) chunked += "X-T" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(status_of(request(chunked + "\r\n")), 431);
  // A chunk extension that never ends cannot grow the read buffer past its cap.
  Socket endless(port());
  endless.send("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;");
  const std::string extension(64 * 1024, 'e');
  for (int i = 0; i < 4 && endless.send(extension); ++i) {
  }
  EXPECT_EQ(status_of(endless.read(5s, "\r\n\r\n")), 400);
}

TEST_F(HttpTransportTest, HeadGetsTheHeadAndHttp10StreamsAreUnchunked) {
  start({}, [](HttpRequest&) {
    HttpResponse response;
    response.stream = [](ResponseSink& sink) { sink.write("abc"); };
    return response;
  });
  Socket head(port());
  head.send("HEAD / HTTP/1.1\r\nHost: a\r\n\r\n");
  const std::string head_text = head.read(3s);
  EXPECT_EQ(head_text.substr(head_text.find("\r\n\r\n") + 4), "");
  EXPECT_TRUE(head.closed_by_peer());
  Socket old(port());
  old.send("GET / HTTP/1.0\r\n\r\n");
  const std::string old_text = old.read(3s);
  EXPECT_EQ(old_text.find("chunked"), std::string::npos) << old_text;
  EXPECT_EQ(old_text.substr(old_text.find("\r\n\r\n") + 4), "abc");
}

TEST_F(HttpTransportTest, AnAbandonedResponseWritesNothing) {
  start({}, [](HttpRequest&) {
    HttpResponse response;
    response.abandon = true;
    return response;
  });
  Socket socket(port());
  socket.send(kGet);
  EXPECT_EQ(socket.read(3s), "");
  EXPECT_TRUE(socket.closed_by_peer());
}

TEST_F(HttpTransportTest, LightPathsDoNotQueueBehindLongRequests) {
  static std::atomic<bool> release;
  release = false;
  TransportConfig config;
  config.num_handler_threads = 1;
  config.light_paths = {"/health"};
  start(config, [](HttpRequest& request) {
    while (request.path == "/slow" && !release) std::this_thread::sleep_for(5ms);
    return HttpResponse{};
  });
  Socket slow(port());
  slow.send("GET /slow HTTP/1.1\r\n\r\n");
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(status_of(request("GET /health HTTP/1.1\r\n\r\n", 2s)), 200);
  release = true;
  EXPECT_EQ(status_of(slow.read(3s, "\r\n\r\n")), 200);
}

TEST_F(HttpTransportTest, APortInUseIsRefused) {
  start({});
  TransportConfig config;
  config.port = port();
  HttpTransport second(config, [](HttpRequest&) { return HttpResponse{}; },
                       [](int, const std::string&, const std::string&) { return HttpResponse{}; });
  try {
    second.bind();
    FAIL() << "bound a port in use";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("in use"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace loom::server
