// The router's calls to one engine (`loom serve --role prefill|decode|both`),
// over HTTP with cpp-httplib's client: the KV routes of the disaggregation
// contract (GET /loom/kv/status, POST /loom/kv/probe, /send, /reserve,
// /reserve/cancel) as
// typed results, plain OpenAI calls as raw replies, and a streamed call whose
// body is read piece by piece (UpstreamResponse) for relaying SSE.
//
// Errors are values, never exceptions: every call ends as
//   kOk        the engine answered 2xx with what the contract says;
//   kRejected  the engine answered 4xx: the request's fault; `reply` holds the
//              engine's status, content type and body, to pass on unchanged;
//   kFailed    the engine failed: no connection, a timeout, 5xx, or a reply
//              that does not parse or lacks a field (`error` says which).
//
// Each call opens its own connection (a fresh httplib::Client), so an
// EngineClient is immutable after construction and usable from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/dual_path_scheduler.h"

namespace loom::router {

struct EngineClientConfig {
  std::string url;                         // "http://127.0.0.1:8001"
  std::string api_key;                     // sent as "Authorization: Bearer KEY" ("" = none)
  std::string kv_secret;                   // signs each /loom/kv/* call (server/kv_auth.h; "" = unsigned)
  double connect_timeout_seconds = 2.0;
  double control_timeout_seconds = 5.0;    // status and probe: each read or write
  // Prefill and generation calls, and the gap between two pieces of a stream.
  double generate_timeout_seconds = 600.0;
};

enum class CallStatus { kOk, kRejected, kFailed };

struct HttpReply {
  int status = 0;  // 0: no reply at all
  std::string content_type;
  std::string body;
};

template <typename T>
struct EngineResult {
  CallStatus status = CallStatus::kFailed;
  T value{};        // kOk only
  HttpReply reply;  // what came back, if anything
  std::string error;  // kFailed: what went wrong, for logs
  bool ok() const { return status == CallStatus::kOk; }
};

// GET /loom/kv/status.
struct KvStatus {
  std::string role;  // "prefill", "decode" or "both"
  std::optional<std::string> kv_transfer_address;  // "host:port"; nullopt when it has none
  int64_t block_size = 0;
  int64_t bytes_per_block = 0;
  int64_t queued_read_bytes = 0;
  double read_bandwidth = 0.0;  // bytes/s; 0 = unpaced / unknown
  bool has_storage = false;
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t buffer_bytes = 0;
  int64_t buffer_capacity_bytes = 0;
  DeviceKvInfo device_kv;  // "device_kv"; an older engine without it: plane "none"
  nlohmann::json raw;  // the whole reply, for /loom/router/status
};

// POST /loom/kv/probe.
struct KvProbe {
  int64_t prompt_tokens = 0;
  std::vector<std::string> blocks;  // content hashes of the prompt's full blocks, in order
  std::vector<int64_t> block_bytes;  // each block's payload bytes (empty: the engine did not say)
  int64_t bytes_per_block = 0;
  int64_t in_buffer = 0;   // blocks in the engine's memory buffer
  int64_t in_storage = 0;  // more blocks only in its storage tier
};

// POST /loom/kv/send: push `blocks` to the engine whose kv_transfer_address is `to`.
struct KvSendRequest {
  std::vector<std::string> blocks;
  std::vector<int64_t> block_bytes;  // as the probe gave them (empty: the main cache's size for all)
  std::string to;
  bool read_storage = false;
  double wait_seconds = 0.0;
};

struct KvSendResult {
  int64_t sent_blocks = 0, sent_bytes = 0, skipped_blocks = 0, missing_blocks = 0, read_blocks = 0, read_bytes = 0;
  double seconds = 0.0;
};

// POST /loom/kv/reserve on a DE (server/kv_routes.h): blocks reserved for a
// device-to-device transfer from the PE whose plane address is `peer`.
struct KvReserveRequest {
  std::string endpoint;  // "chat" or "completions"
  nlohmann::json request;  // the client's OpenAI body
  std::string peer;
  double timeout_seconds = 60.0;
};

struct KvReservation {
  std::string transfer_id;  // 16 hex digits
  std::vector<int64_t> main_blocks, residual_blocks;
  int64_t first_block = 0;
};

// A POST whose reply is read as it arrives, on a thread of its own: the head
// (status, content type) first, then the body in pieces. Owned by one handler
// thread; the destructor cancels the call and joins its thread.
class UpstreamResponse {
 public:
  ~UpstreamResponse();
  UpstreamResponse(const UpstreamResponse&) = delete;
  UpstreamResponse& operator=(const UpstreamResponse&) = delete;

  // Blocks until the head arrived (true; `head` filled, body empty) or the
  // call failed before it (false; error() says why).
  bool wait_head(HttpReply& head);
  // Blocks for the next piece of the body: true with `piece` filled, false at
  // the end of the body or on failure (then failed() tells which).
  bool next_piece(std::string& piece);
  bool failed() const;
  std::string error() const;
  // Stops reading (the client left): the connection is closed and the thread ends.
  void cancel();

 private:
  friend class EngineClient;
  UpstreamResponse() = default;
  void start(const EngineClientConfig& config, std::string path, std::string body, bool sign);

  static constexpr size_t kMaxBufferedBytes = 1u << 20;  // back-pressure on the engine beyond
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool has_head_ = false, finished_ = false, failed_ = false, cancelled_ = false;
  HttpReply head_;
  std::deque<std::string> pieces_;
  size_t buffered_bytes_ = 0;
  std::string error_;
  std::shared_ptr<void> client_;  // the httplib::Client, for cancel()
  std::thread thread_;
};

class EngineClient {
 public:
  explicit EngineClient(EngineClientConfig config);

  const std::string& url() const { return config_.url; }

  EngineResult<KvStatus> kv_status() const;
  // `endpoint`: "chat" or "completions"; `request`: the client's OpenAI body.
  EngineResult<KvProbe> probe(std::string_view endpoint, const nlohmann::json& request) const;
  EngineResult<KvSendResult> send_blocks(const KvSendRequest& request) const;
  EngineResult<KvReservation> reserve(const KvReserveRequest& request) const;
  // POST /loom/kv/reserve/cancel: fails reservation `transfer_id` on this DE now (the PE side failed);
  // the value is the engine's "state" ("cancelled" or "settled"). An unknown id is kRejected (404).
  EngineResult<std::string> cancel_reservation(const std::string& transfer_id, const std::string& reason) const;
  // A whole POST (a prefill) or GET (/v1/models): kOk for 2xx, with the reply.
  // `sign`: signed with the KV secret (a body carrying loom_device_kv: server/device_kv_fields.h).
  EngineResult<HttpReply> post(const std::string& path, const std::string& body, bool sign = false) const;
  EngineResult<HttpReply> get(const std::string& path) const;
  // A POST read as it arrives (generation, streamed or not); `sign` as for post.
  std::unique_ptr<UpstreamResponse> post_streaming(const std::string& path, std::string body, bool sign = false) const;

 private:
  EngineResult<HttpReply> call(const std::string& method, const std::string& path, const std::string& body,
                               double timeout_seconds, bool sign = false) const;
  EngineClientConfig config_;
};

}  // namespace loom::router
