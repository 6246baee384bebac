#include "kvevents/kv_event_publisher.h"

#include <zmq.h>

#include <array>
#include <cerrno>
#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "util/error.h"

namespace loom {

namespace {

// vLLM's rule (ZmqEventPublisher._socket_setup): bind "stable" addresses, connect the others.
bool binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

}  // namespace

struct KvEventPublisher::Socket {
  void* context = nullptr;
  void* pub = nullptr;

  ~Socket() {
    if (pub != nullptr) zmq_close(pub);
    if (context != nullptr) zmq_ctx_term(context);  // waits for the linger set below
  }
  // One frame; ZMQ_DONTWAIT: a PUB socket never waits, it drops at the high-water mark.
  void send(const void* data, size_t size, bool more) {
    if (zmq_send(pub, data, size, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0 && zmq_errno() != EAGAIN)
      spdlog::warn("KV events: sending failed: {}", zmq_strerror(zmq_errno()));
  }
};

KvEventPublisher::KvEventPublisher(const KvEventsConfig& config)
    : socket_(std::make_unique<Socket>()), topic_(config.topic) {
  socket_->context = zmq_ctx_new();
  if (socket_->context == nullptr) fail(ErrorKind::kInternal, "KV events: zmq_ctx_new failed: {}", zmq_strerror(zmq_errno()));
  socket_->pub = zmq_socket(socket_->context, ZMQ_PUB);
  if (socket_->pub == nullptr) fail(ErrorKind::kInternal, "KV events: zmq_socket failed: {}", zmq_strerror(zmq_errno()));
  const int high_water_mark = config.send_high_water_mark;
  const int linger_ms = 500;
  zmq_setsockopt(socket_->pub, ZMQ_SNDHWM, &high_water_mark, sizeof(high_water_mark));
  zmq_setsockopt(socket_->pub, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
  const bool bind = binds(config.endpoint);
  const int status = bind ? zmq_bind(socket_->pub, config.endpoint.c_str())
                          : zmq_connect(socket_->pub, config.endpoint.c_str());
  if (status != 0)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("KV events: cannot {} a ZMQ PUB socket at '{}': {}", bind ? "bind" : "connect",
                            config.endpoint, zmq_strerror(zmq_errno())),
                "give --kv-events-config an endpoint such as tcp://*:5557 (bind, subscribers connect) or "
                "tcp://HOST:PORT (connect to a subscriber that binds), on a free port");
  spdlog::info("KV events: publishing on {} ({}), topic '{}'", config.endpoint, bind ? "bound" : "connected",
               config.topic);
}

KvEventPublisher::~KvEventPublisher() {
  batcher_.all_blocks_cleared();
  flush();
}

void KvEventPublisher::flush() {
  if (batcher_.empty()) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string payload = batcher_.take_batch(now);
  std::array<unsigned char, 8> sequence{};
  for (size_t i = 0; i < sequence.size(); ++i)
    sequence[i] = static_cast<unsigned char>((next_sequence_ >> (8 * (sequence.size() - 1 - i))) & 0xff);
  ++next_sequence_;
  socket_->send(topic_.data(), topic_.size(), true);
  socket_->send(sequence.data(), sequence.size(), true);
  socket_->send(payload.data(), payload.size(), false);
}

}  // namespace loom
