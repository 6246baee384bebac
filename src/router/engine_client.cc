#include "router/engine_client.h"

#include <cmath>

#include <fmt/format.h>
#include <httplib.h>

#include "server/json_output.h"
#include "server/kv_auth.h"

namespace loom::router {
namespace {

using Json = nlohmann::json;

// An engine's reply that breaks the contract: the engine failed.
struct BadReply {
  std::string message;
};

void set_timeouts(httplib::Client& client, const EngineClientConfig& config, double io_timeout_seconds) {
  auto split = [](double seconds) {
    const double whole = std::floor(seconds);
    return std::pair<time_t, time_t>(static_cast<time_t>(whole), static_cast<time_t>((seconds - whole) * 1e6));
  };
  const auto [connect_seconds, connect_micros] = split(config.connect_timeout_seconds);
  const auto [io_seconds, io_micros] = split(io_timeout_seconds);
  client.set_connection_timeout(connect_seconds, connect_micros);
  client.set_read_timeout(io_seconds, io_micros);
  client.set_write_timeout(io_seconds, io_micros);
}

// The API key, and the KV secret's signature on /loom/kv/* calls and on those asked to be signed.
httplib::Headers request_headers(const EngineClientConfig& config, const std::string& method = "",
                                 const std::string& path = "", const std::string& body = "", bool sign = false) {
  httplib::Headers headers;
  if (!config.api_key.empty()) headers.emplace("Authorization", "Bearer " + config.api_key);
  if (!config.kv_secret.empty() && (sign || path.rfind("/loom/kv/", 0) == 0))
    headers.emplace(server::kKvAuthHeader,
                    server::sign_kv_request(config.kv_secret, method, path, method == "GET" ? "" : body,
                                            server::unix_seconds_now()));
  return headers;
}

Json parse_object(const std::string& body) {
  Json value = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded() || !value.is_object()) throw BadReply{"the reply is not a JSON object"};
  return value;
}

// A number field: `fallback` when absent (nullopt: required), BadReply when of another type.
double number_field(const Json& object, const char* key, std::optional<double> fallback) {
  auto found = object.find(key);
  if (found == object.end() || found->is_null()) {
    if (fallback) return *fallback;
    throw BadReply{fmt::format("'{}' is missing", key)};
  }
  if (!found->is_number()) throw BadReply{fmt::format("'{}' is not a number", key)};
  const double value = found->get<double>();
  if (!std::isfinite(value) || value < 0) throw BadReply{fmt::format("'{}' is negative or not finite", key)};
  return value;
}

int64_t count_field(const Json& object, const char* key, std::optional<double> fallback = 0.0) {
  const double value = number_field(object, key, fallback);
  if (value > 9.0e18) throw BadReply{fmt::format("'{}' is too large", key)};
  return static_cast<int64_t>(value);
}

// Runs `parse` over a kOk reply's body; a BadReply turns the result into kFailed.
template <typename T, typename Parse>
EngineResult<T> typed(EngineResult<HttpReply> raw, Parse parse) {
  EngineResult<T> result;
  result.status = raw.status;
  result.error = std::move(raw.error);
  result.reply = std::move(raw.value);
  if (result.status != CallStatus::kOk) return result;
  try {
    result.value = parse(parse_object(result.reply.body));
  } catch (const BadReply& bad) {
    result.status = CallStatus::kFailed;
    result.error = "malformed reply: " + bad.message;
  } catch (const Json::exception& error) {
    result.status = CallStatus::kFailed;
    result.error = std::string("malformed reply: ") + error.what();
  }
  return result;
}

CallStatus status_of(int http_status) {
  if (http_status >= 200 && http_status < 300) return CallStatus::kOk;
  if (http_status >= 400 && http_status < 500) return CallStatus::kRejected;
  return CallStatus::kFailed;  // 5xx, and anything a proxy should never see (1xx, 3xx)
}

}  // namespace

EngineClient::EngineClient(EngineClientConfig config) : config_(std::move(config)) {}

EngineResult<HttpReply> EngineClient::call(const std::string& method, const std::string& path,
                                           const std::string& body, double timeout_seconds, bool sign) const {
  EngineResult<HttpReply> result;
  httplib::Client client(config_.url);
  if (!client.is_valid()) {
    result.error = "invalid engine URL";
    return result;
  }
  set_timeouts(client, config_, timeout_seconds);
  httplib::Headers headers = request_headers(config_, method, path, body, sign);
  httplib::Result reply =
      method == "GET" ? client.Get(path, headers) : client.Post(path, headers, body, "application/json");
  if (!reply) {
    result.error = fmt::format("{} {}: {}", method, path, httplib::to_string(reply.error()));
    return result;
  }
  result.value.status = reply->status;
  result.value.content_type = reply->get_header_value("Content-Type");
  result.value.body = std::move(reply->body);
  result.reply = result.value;
  result.status = status_of(reply->status);
  if (result.status == CallStatus::kFailed) result.error = fmt::format("{} {}: status {}", method, path, reply->status);
  return result;
}

EngineResult<HttpReply> EngineClient::post(const std::string& path, const std::string& body, bool sign) const {
  return call("POST", path, body, config_.generate_timeout_seconds, sign);
}

EngineResult<HttpReply> EngineClient::get(const std::string& path) const {
  return call("GET", path, "", config_.control_timeout_seconds);
}

EngineResult<KvStatus> EngineClient::kv_status() const {
  return typed<KvStatus>(call("GET", "/loom/kv/status", "", config_.control_timeout_seconds), [](Json object) {
    KvStatus status;
    auto role = object.find("role");
    if (role == object.end() || !role->is_string()) throw BadReply{"'role' is missing or not a string"};
    status.role = role->get<std::string>();
    auto address = object.find("kv_transfer_address");
    if (address != object.end() && address->is_string() && !address->get<std::string>().empty())
      status.kv_transfer_address = address->get<std::string>();
    else if (address != object.end() && !address->is_null() && !address->is_string())
      throw BadReply{"'kv_transfer_address' is neither a string nor null"};
    status.block_size = count_field(object, "block_size");
    status.bytes_per_block = count_field(object, "bytes_per_block");
    status.queued_read_bytes = count_field(object, "queued_read_bytes");
    status.read_bandwidth = number_field(object, "read_bandwidth", 0.0);
    auto storage = object.find("has_storage");
    status.has_storage = storage != object.end() && storage->is_boolean() && storage->get<bool>();
    status.num_running = count_field(object, "num_running");
    status.num_waiting = count_field(object, "num_waiting");
    status.buffer_bytes = count_field(object, "buffer_bytes");
    status.buffer_capacity_bytes = count_field(object, "buffer_capacity_bytes");
    auto device = object.find("device_kv");
    if (device != object.end() && device->is_object()) {
      auto text = [&](const char* key) {
        auto field = device->find(key);
        return field != device->end() && field->is_string() ? field->get<std::string>() : std::string();
      };
      status.device_kv.plane = text("plane").empty() ? "none" : text("plane");
      status.device_kv.host = text("host");
      status.device_kv.device = text("device");
      status.device_kv.address = text("address");
      auto same_host = device->find("same_host_only");
      status.device_kv.same_host_only = same_host == device->end() || !same_host->is_boolean() || same_host->get<bool>();
    }
    status.raw = std::move(object);
    return status;
  });
}

EngineResult<KvProbe> EngineClient::probe(std::string_view endpoint, const Json& request) const {
  const std::string body = server::dump_json(Json{{"endpoint", endpoint}, {"request", request}});
  return typed<KvProbe>(call("POST", "/loom/kv/probe", body, config_.control_timeout_seconds), [](const Json& object) {
    KvProbe probe;
    probe.prompt_tokens = count_field(object, "prompt_tokens", std::nullopt);
    auto blocks = object.find("blocks");
    if (blocks == object.end() || !blocks->is_array()) throw BadReply{"'blocks' is missing or not an array"};
    for (const Json& block : *blocks) {
      if (!block.is_string()) throw BadReply{"'blocks' holds a non-string"};
      probe.blocks.push_back(block.get<std::string>());
    }
    if (auto sizes = object.find("block_bytes"); sizes != object.end() && !sizes->is_null()) {
      if (!sizes->is_array() || sizes->size() != probe.blocks.size())
        throw BadReply{"'block_bytes' does not list one size per block"};
      for (const Json& size : *sizes) {
        if (!size.is_number_integer() || size.get<int64_t>() <= 0) throw BadReply{"'block_bytes' holds a bad size"};
        probe.block_bytes.push_back(size.get<int64_t>());
      }
    }
    probe.bytes_per_block = count_field(object, "bytes_per_block", std::nullopt);
    probe.in_buffer = count_field(object, "in_buffer");
    probe.in_storage = count_field(object, "in_storage", std::nullopt);
    if (probe.in_buffer + probe.in_storage > static_cast<int64_t>(probe.blocks.size()))
      throw BadReply{"in_buffer + in_storage exceed the blocks"};
    return probe;
  });
}

EngineResult<KvSendResult> EngineClient::send_blocks(const KvSendRequest& request) const {
  Json send = {{"blocks", request.blocks},
               {"to", request.to},
               {"read_storage", request.read_storage},
               {"wait_seconds", request.wait_seconds}};
  if (!request.block_bytes.empty()) send["block_bytes"] = request.block_bytes;
  const std::string body = server::dump_json(send);
  // The engine may wait wait_seconds for blocks, then read storage and send.
  const double timeout = request.wait_seconds + config_.generate_timeout_seconds;
  return typed<KvSendResult>(call("POST", "/loom/kv/send", body, timeout), [](const Json& object) {
    KvSendResult sent;
    sent.sent_blocks = count_field(object, "sent_blocks");
    sent.sent_bytes = count_field(object, "sent_bytes", std::nullopt);
    sent.skipped_blocks = count_field(object, "skipped_blocks");
    sent.missing_blocks = count_field(object, "missing_blocks");
    sent.read_blocks = count_field(object, "read_blocks");
    sent.read_bytes = count_field(object, "read_bytes");
    sent.seconds = number_field(object, "seconds", std::nullopt);
    return sent;
  });
}

EngineResult<KvReservation> EngineClient::reserve(const KvReserveRequest& request) const {
  const std::string body = server::dump_json(Json{{"endpoint", request.endpoint},
                                                  {"request", request.request},
                                                  {"peer", request.peer},
                                                  {"timeout_seconds", request.timeout_seconds}});
  return typed<KvReservation>(call("POST", "/loom/kv/reserve", body, config_.control_timeout_seconds),
                              [](const Json& object) {
    KvReservation reservation;
    auto id = object.find("transfer_id");
    if (id == object.end() || !id->is_string() || id->get<std::string>().size() != 16)
      throw BadReply{"'transfer_id' is missing or not 16 hex digits"};
    reservation.transfer_id = id->get<std::string>();
    auto ids = [&](const char* key, std::vector<int64_t>& out) {
      auto list = object.find(key);
      if (list == object.end() || !list->is_array()) throw BadReply{fmt::format("'{}' is missing or not a list", key)};
      for (const Json& block : *list) {
        if (!block.is_number_integer() || block.get<int64_t>() < 0) throw BadReply{fmt::format("'{}' holds a bad id", key)};
        out.push_back(block.get<int64_t>());
      }
    };
    ids("main_blocks", reservation.main_blocks);
    ids("residual_blocks", reservation.residual_blocks);
    reservation.first_block = count_field(object, "first_block", std::nullopt);
    return reservation;
  });
}

EngineResult<std::string> EngineClient::cancel_reservation(const std::string& transfer_id,
                                                           const std::string& reason) const {
  const std::string body = server::dump_json(Json{{"transfer_id", transfer_id}, {"reason", reason}});
  return typed<std::string>(call("POST", "/loom/kv/reserve/cancel", body, config_.control_timeout_seconds),
                            [](const Json& object) {
    auto state = object.find("state");
    if (state == object.end() || !state->is_string()) throw BadReply{"'state' is missing or not a string"};
    return state->get<std::string>();
  });
}

std::unique_ptr<UpstreamResponse> EngineClient::post_streaming(const std::string& path, std::string body,
                                                               bool sign) const {
  std::unique_ptr<UpstreamResponse> response(new UpstreamResponse());
  response->start(config_, path, std::move(body), sign);
  return response;
}

// ---- UpstreamResponse ----

void UpstreamResponse::start(const EngineClientConfig& config, std::string path, std::string body, bool sign) {
  auto client = std::make_shared<httplib::Client>(config.url);
  client_ = client;
  if (!client->is_valid()) {
    std::lock_guard lock(mutex_);
    finished_ = failed_ = true;
    error_ = "invalid engine URL";
    return;
  }
  set_timeouts(*client, config, config.generate_timeout_seconds);
  httplib::Headers headers = request_headers(config, "POST", path, body, sign);
  thread_ = std::thread([this, client, path = std::move(path), body = std::move(body), headers]() mutable {
    httplib::Request request;
    request.method = "POST";
    request.path = path;
    request.headers = std::move(headers);
    request.set_header("Content-Type", "application/json");
    request.body = std::move(body);
    request.response_handler = [this](const httplib::Response& response) {
      std::lock_guard lock(mutex_);
      head_.status = response.status;
      head_.content_type = response.get_header_value("Content-Type");
      has_head_ = true;
      changed_.notify_all();
      return !cancelled_;
    };
    request.content_receiver = [this](const char* data, size_t size, uint64_t, uint64_t) {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return cancelled_ || buffered_bytes_ < kMaxBufferedBytes; });
      if (cancelled_) return false;
      pieces_.emplace_back(data, size);
      buffered_bytes_ += size;
      changed_.notify_all();
      return true;
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    const bool ok = client->send(request, response, error);
    std::lock_guard lock(mutex_);
    finished_ = true;
    if (!ok && !cancelled_) {
      failed_ = true;
      error_ = fmt::format("POST {}: {}", path, httplib::to_string(error));
    }
    changed_.notify_all();
  });
}

UpstreamResponse::~UpstreamResponse() {
  cancel();
  if (thread_.joinable()) thread_.join();
}

bool UpstreamResponse::wait_head(HttpReply& head) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return has_head_ || finished_; });
  if (!has_head_) return false;
  head = head_;
  return true;
}

bool UpstreamResponse::next_piece(std::string& piece) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !pieces_.empty() || finished_; });
  if (pieces_.empty()) return false;
  piece = std::move(pieces_.front());
  pieces_.pop_front();
  buffered_bytes_ -= piece.size();
  changed_.notify_all();
  return true;
}

bool UpstreamResponse::failed() const {
  std::lock_guard lock(mutex_);
  return failed_;
}

std::string UpstreamResponse::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void UpstreamResponse::cancel() {
  {
    std::lock_guard lock(mutex_);
    if (cancelled_ || finished_) return;
    cancelled_ = true;
    changed_.notify_all();
  }
  if (client_) std::static_pointer_cast<httplib::Client>(client_)->stop();
}

}  // namespace loom::router
