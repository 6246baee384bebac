#include "kvevents/kv_event_publisher.h"

#include <zmq.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

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

std::array<unsigned char, 8> big_endian(uint64_t value) {
  std::array<unsigned char, 8> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<unsigned char>((value >> (8 * (bytes.size() - 1 - i))) & 0xff);
  return bytes;
}

}  // namespace

struct KvEventPublisher::Replay {
  void* router = nullptr;  // used by the thread only (after the constructor)
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::mutex mutex;  // guards the buffer
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::string>>> buffer;
  size_t capacity = 0;

  void add(uint64_t sequence, const std::string& payload) {
    auto shared = std::make_shared<const std::string>(payload);
    std::lock_guard lock(mutex);
    buffer.emplace_back(sequence, std::move(shared));
    while (buffer.size() > capacity) buffer.pop_front();
  }

  // Answers requests until stopping: [identity, empty, start] -> the batches from start on, then the end marker.
  void serve() {
    while (!stopping) {
      zmq_pollitem_t item{router, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 100) <= 0 || (item.revents & ZMQ_POLLIN) == 0) continue;
      std::vector<std::string> frames;
      int more = 1;
      while (more != 0) {
        zmq_msg_t message;
        zmq_msg_init(&message);
        if (zmq_msg_recv(&message, router, ZMQ_DONTWAIT) < 0) {
          zmq_msg_close(&message);
          break;
        }
        frames.emplace_back(static_cast<const char*>(zmq_msg_data(&message)), zmq_msg_size(&message));
        more = zmq_msg_more(&message);
        zmq_msg_close(&message);
      }
      if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) {
        spdlog::warn("KV events: a replay request of {} frames, not [empty, 8-byte start]: ignored",
                     frames.empty() ? 0 : frames.size() - 1);
        continue;
      }
      uint64_t start = 0;
      for (const char byte : frames[2]) start = (start << 8) | static_cast<unsigned char>(byte);
      std::vector<std::pair<uint64_t, std::shared_ptr<const std::string>>> found;  // cheap to copy under the lock
      {
        std::lock_guard lock(mutex);
        for (const auto& entry : buffer)
          if (entry.first >= start) found.push_back(entry);
      }
      const std::string& identity = frames[0];
      auto reply = [&](const void* sequence, size_t sequence_size, const std::string& payload) {
        zmq_send(router, identity.data(), identity.size(), ZMQ_SNDMORE);
        zmq_send(router, "", 0, ZMQ_SNDMORE);
        zmq_send(router, sequence, sequence_size, ZMQ_SNDMORE);
        zmq_send(router, payload.data(), payload.size(), 0);
      };
      for (const auto& [sequence, payload] : found) {
        const std::array<unsigned char, 8> bytes = big_endian(sequence);
        reply(bytes.data(), bytes.size(), *payload);
      }
      const std::array<unsigned char, 8> end = big_endian(~uint64_t{0});  // -1 as vLLM's END_SEQ
      reply(end.data(), end.size(), std::string());
    }
  }
};

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
  if (!config.replay_endpoint.empty()) {
    replay_ = std::make_unique<Replay>();
    replay_->capacity = static_cast<size_t>(std::max(config.replay_buffer_batches, 1));
    replay_->router = zmq_socket(socket_->context, ZMQ_ROUTER);
    if (replay_->router == nullptr)
      fail(ErrorKind::kInternal, "KV events: zmq_socket failed: {}", zmq_strerror(zmq_errno()));
    const int no_linger = 0, no_send_limit = 0;  // a replay is never cut short by ZMQ's default HWM (1000)
    zmq_setsockopt(replay_->router, ZMQ_LINGER, &no_linger, sizeof(no_linger));
    zmq_setsockopt(replay_->router, ZMQ_SNDHWM, &no_send_limit, sizeof(no_send_limit));
    if (zmq_bind(replay_->router, config.replay_endpoint.c_str()) != 0) {
      const std::string why = zmq_strerror(zmq_errno());
      zmq_close(replay_->router);
      replay_.reset();
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("KV events: cannot bind the replay socket at '{}': {}", config.replay_endpoint, why),
                  "give replay_endpoint a free address such as tcp://*:5558");
    }
    replay_->thread = std::thread([replay = replay_.get()] { replay->serve(); });
    spdlog::info("KV events: replay on {} (the last {} batches)", config.replay_endpoint, replay_->capacity);
  }
  spdlog::info("KV events: publishing on {} ({}), topic '{}'", config.endpoint, bind ? "bound" : "connected",
               config.topic);
}

KvEventPublisher::~KvEventPublisher() {
  batcher_.all_blocks_cleared();
  flush();
  if (replay_) {
    replay_->stopping = true;
    replay_->thread.join();
    zmq_close(replay_->router);
  }
}

void KvEventPublisher::flush() {
  if (batcher_.empty()) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string payload = batcher_.take_batch(now);
  const std::array<unsigned char, 8> sequence = big_endian(next_sequence_);
  if (replay_) replay_->add(next_sequence_, payload);
  ++next_sequence_;
  socket_->send(topic_.data(), topic_.size(), true);
  socket_->send(sequence.data(), sequence.size(), true);
  socket_->send(payload.data(), payload.size(), false);
}

}  // namespace loom
