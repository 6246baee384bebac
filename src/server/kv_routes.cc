#include "server/kv_routes.h"

#include <chrono>
#include <cmath>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "kvtransfer/kv_link_client.h"
#include "server/api_error.h"
#include "server/device_kv_fields.h"
#include "server/json_input.h"
#include "server/json_output.h"

namespace loom::server {

namespace {

using Json = nlohmann::json;

// 32 hex digits, high first (KvBlockHash::hex) -> the hash.
KvBlockHash parse_block_hash(const Json& value, size_t index) {
  const std::string param = field_path("blocks", index);
  if (!value.is_string()) throw ApiError(400, "a block must be a string of 32 hex digits", "invalid_request_error", param);
  const std::string& text = value.get_ref<const std::string&>();
  if (text.size() != 32) throw ApiError(400, "a block must be 32 hex digits", "invalid_request_error", param);
  KvBlockHash hash;
  for (size_t i = 0; i < 32; ++i) {
    const char c = text[i];
    uint64_t digit = 0;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint64_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      digit = static_cast<uint64_t>(c - 'A' + 10);
    } else {
      throw ApiError(400, "a block must be 32 hex digits", "invalid_request_error", param);
    }
    uint64_t& half = i < 16 ? hash.high : hash.low;
    half = (half << 4) | digit;
  }
  return hash;
}

double read_seconds(const Json& object, const char* key) {
  if (!object.contains(key) || object[key].is_null()) return 0;
  if (!object[key].is_number() || !std::isfinite(object[key].get<double>()) || object[key].get<double>() < 0 ||
      object[key].get<double>() > 600)
    throw ApiError(400, fmt::format("'{}' must be a number of seconds in [0, 600]", key), "invalid_request_error", key);
  return object[key].get<double>();
}

}  // namespace

std::string kv_status_body(const KvRouteContext& context) {
  const KvTransferSetup& setup = *context.setup;
  Json status = {{"role", setup.role},
                 {"kv_transfer_address", setup.link_address.empty() ? Json(nullptr) : Json(setup.link_address)},
                 {"block_size", setup.block_size},
                 {"bytes_per_block", setup.bytes_per_block},
                 {"read_bandwidth", setup.read_bandwidth},
                 {"num_requests", context.num_requests != nullptr ? context.num_requests->load() : 0}};
  if (setup.store) {
    const KvBufferStats buffer = setup.store->buffer_stats();
    status["queued_read_bytes"] = setup.store->queued_read_bytes();
    status["has_storage"] = setup.store->has_storage();
    status["buffer_bytes"] = buffer.num_bytes;
    status["buffer_blocks"] = buffer.num_blocks;
    status["buffer_capacity_bytes"] = buffer.capacity_bytes;
  } else {
    status["queued_read_bytes"] = 0;
    status["has_storage"] = false;
    status["buffer_bytes"] = 0;
    status["buffer_blocks"] = 0;
    status["buffer_capacity_bytes"] = 0;
  }
  const KvLinkServerStats link = setup.link ? setup.link->stats() : KvLinkServerStats{};
  status["received_blocks"] = link.num_received_blocks;
  status["received_bytes"] = link.num_received_bytes;
  status["authenticated"] = !setup.secret.empty();
  status["refused_connections"] = link.num_refused_connections;
  status["forged_messages"] = link.num_forged_messages;
  status["rejected_blocks"] = link.num_rejected_blocks;
  status["data_plane"] = setup.plane ? setup.plane->name() : "tcp";
  const KvLinkClientStats client = setup.client ? setup.client->stats() : KvLinkClientStats{};
  status["channel_bytes_sent"] = client.num_channel_bytes;
  status["channel_bytes_received"] = link.num_channel_bytes;
  status["channels"] = client.num_channels + link.num_channels;
  // What the router compares to choose the device-to-device path (router/dual_path_scheduler.h choose_kv_path).
  const DeviceKvEndpoint device = setup.device_plane ? setup.device_plane->endpoint() : DeviceKvEndpoint{};
  status["device_kv"] = {{"plane", device.plane},     {"host", device.host},
                         {"device", device.device},   {"address", device.address},
                         {"same_host_only", device.same_host_only}};
  return dump_json(status);
}

namespace {

// {"endpoint": "chat" | "completions", "request": {an OpenAI body}} -> the engine request of its first prompt,
// parsed exactly as the completion routes parse it.
EngineRequest first_prompt_request(const KvRouteContext& context, const Json& call) {
  const std::string endpoint = call.value("endpoint", std::string("chat"));
  if (endpoint != "chat" && endpoint != "completions")
    throw ApiError(400, "'endpoint' must be \"chat\" or \"completions\"", "invalid_request_error", "endpoint");
  if (!call.contains("request") || !call["request"].is_object())
    throw ApiError(400, "'request' must be the OpenAI request body (an object)", "invalid_request_error", "request");
  const ParsedRequest parsed = parse_openai_request(
      endpoint == "chat" ? Endpoint::kChatCompletions : Endpoint::kCompletions, dump_json(call["request"]),
      *context.parse);
  EngineRequest request = parsed.engine_request(0);
  request.prompt_tokens = parsed.prompts.front();
  return request;
}

}  // namespace

std::string kv_reserve_body(const KvRouteContext& context, std::string_view body) {
  const Json reserve = parse_json_object_body(body);
  if (!context.setup->device_plane)
    throw ApiError(400, "this engine has no device KV plane (--kv-device-plane)", "invalid_request_error", "",
                   "device_kv_unavailable");
  if (!reserve.contains("peer") || !reserve["peer"].is_string() || reserve["peer"].get<std::string>().empty())
    throw ApiError(400, "'peer' must be the prefill engine's device plane address (its /loom/kv/status device_kv)",
                   "invalid_request_error", "peer");
  const double timeout = read_seconds(reserve, "timeout_seconds");
  if (timeout <= 0)
    throw ApiError(400, "'timeout_seconds' must be a number of seconds in (0, 600]", "invalid_request_error",
                   "timeout_seconds");
  const EngineRequest request = first_prompt_request(context, reserve);
  DeviceKvReservation reservation;
  try {
    reservation = context.engine->reserve_device_kv(request, reserve["peer"].get<std::string>(), timeout);
  } catch (const Error& error) {
    if (error.kind() == ErrorKind::kCapacity)
      throw ApiError(503, error.what(), "server_error", "", "device_kv_no_room");
    if (error.kind() == ErrorKind::kUnsupported)
      throw ApiError(400, error.what(), "invalid_request_error", "", "device_kv_unavailable");
    throw;
  }
  return dump_json(Json{{"transfer_id", transfer_id_text(reservation.destination.id)},
                        {"main_blocks", reservation.destination.main_blocks},
                        {"residual_blocks", reservation.destination.residual_blocks},
                        {"first_block", reservation.first_block},
                        {"num_blocks", reservation.destination.num_blocks()},
                        {"num_layers", reservation.num_layers},
                        {"timeout_seconds", timeout}});
}

std::string kv_reserve_cancel_body(const KvRouteContext& context, std::string_view body) {
  const Json cancel = parse_json_object_body(body);
  if (!context.setup->device_plane)
    throw ApiError(400, "this engine has no device KV plane (--kv-device-plane)", "invalid_request_error", "",
                   "device_kv_unavailable");
  const auto id_field = cancel.find("transfer_id");
  const std::optional<DeviceKvTransferId> id = id_field != cancel.end() && id_field->is_string()
                                                   ? parse_transfer_id(id_field->get<std::string>())
                                                   : std::nullopt;
  if (!id)
    throw ApiError(400, "'transfer_id' must be a transfer id (16 hex digits, as /loom/kv/reserve gave it)",
                   "invalid_request_error", "transfer_id");
  std::string reason = "the router cancelled it";
  if (const auto given = cancel.find("reason"); given != cancel.end() && !given->is_null()) {
    if (!given->is_string() || given->get<std::string>().size() > 512)
      throw ApiError(400, "'reason' must be a string of at most 512 bytes", "invalid_request_error", "reason");
    reason = given->get<std::string>();
  }
  const DeviceKvCancel outcome = context.engine->cancel_device_kv(*id, reason);
  if (outcome == DeviceKvCancel::kUnknown)
    throw ApiError(404,
                   fmt::format("no device KV reservation '{}' here (never made, or released since)",
                               transfer_id_text(*id)),
                   "invalid_request_error", "transfer_id", "device_kv_unknown_transfer");
  return dump_json(Json{{"transfer_id", transfer_id_text(*id)},
                        {"state", outcome == DeviceKvCancel::kCancelled ? "cancelled" : "settled"}});
}

std::string kv_probe_body(const KvRouteContext& context, std::string_view body) {
  const Json probe = parse_json_object_body(body);
  const EngineRequest request = first_prompt_request(context, probe);
  const std::vector<KvBlockName> names = context.engine->kv_block_hashes(request);
  Json blocks = Json::array(), block_bytes = Json::array();
  int64_t in_buffer = 0, in_storage = 0;
  BufferedKvStore* store = context.setup->store.get();
  for (const auto& [hash, bytes] : names) {
    blocks.push_back(hash.hex());
    block_bytes.push_back(bytes);
    if (store == nullptr) continue;
    if (store->in_buffer(hash)) {
      ++in_buffer;
    } else if (store->in_storage(hash)) {
      ++in_storage;
    }
  }
  return dump_json(Json{{"prompt_tokens", request.prompt_tokens.size()},
                        {"blocks", std::move(blocks)},
                        {"block_bytes", std::move(block_bytes)},
                        {"bytes_per_block", context.setup->bytes_per_block},
                        {"in_buffer", in_buffer},
                        {"in_storage", in_storage}});
}

std::string kv_send_body(const KvRouteContext& context, std::string_view body) {
  const Json send = parse_json_object_body(body);
  BufferedKvStore* store = context.setup->store.get();
  KvLinkClient* client = context.setup->client.get();  // made with the link, beside the buffer
  if (store == nullptr || client == nullptr)
    throw ApiError(400, "this engine has no KV buffer to send from", "invalid_request_error", "",
                   "kv_transfer_disabled");
  if (!send.contains("blocks") || !send["blocks"].is_array())
    throw ApiError(400, "'blocks' must be a list of block hashes", "invalid_request_error", "blocks");
  if (!send.contains("to") || !send["to"].is_string())
    throw ApiError(400, "'to' must be the peer's KV link address (host:port)", "invalid_request_error", "to");
  const std::string to = send["to"].get<std::string>();
  if (!client->allows_peer(to))
    throw ApiError(403,
                   fmt::format("'{}' is not an allowed KV link peer of this engine ({}); list it in "
                               "--kv-transfer-peers",
                               to, client->peers().describe()),
                   "permission_error", "to", "kv_peer_not_allowed");
  std::vector<KvBlockHash> hashes;
  hashes.reserve(send["blocks"].size());
  for (size_t i = 0; i < send["blocks"].size(); ++i) hashes.push_back(parse_block_hash(send["blocks"][i], i));
  // Each block's size: block_bytes as the probe gave it, else the main cache's.
  std::vector<int64_t> sizes(hashes.size(), context.setup->bytes_per_block);
  if (send.contains("block_bytes") && !send["block_bytes"].is_null()) {
    const Json& list = send["block_bytes"];
    if (!list.is_array() || list.size() != hashes.size())
      throw ApiError(400, "'block_bytes' must list one size per block", "invalid_request_error", "block_bytes");
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_number_integer() || list[i].get<int64_t>() <= 0 ||
          list[i].get<int64_t>() > static_cast<int64_t>(256) << 20)
        throw ApiError(400, "a block size must be a positive integer", "invalid_request_error",
                       field_path("block_bytes", i));
      sizes[i] = list[i].get<int64_t>();
    }
  }
  KvSendOptions options;
  options.read_storage = read_bool(send, "read_storage", false);
  options.wait = std::chrono::milliseconds(static_cast<int64_t>(read_seconds(send, "wait_seconds") * 1000));
  KvSendReport report;
  KvTransferCounters* counters = context.counters;
  try {
    report = client->send(to, hashes, sizes, *store, options);
  } catch (const Error& error) {
    if (error.kind() == ErrorKind::kInvalidArgument) throw ApiError(400, error.what(), "invalid_request_error", "to");
    if (counters != nullptr) ++counters->failed_sends;
    throw ApiError(502, error.what(), "server_error", "", "kv_link_failed");
  }
  if (counters != nullptr) {
    counters->sent_blocks += report.sent_blocks;
    counters->sent_bytes += report.sent_bytes;
    counters->skipped_blocks += report.skipped_blocks;
    counters->missing_blocks += report.missing_blocks;
    counters->storage_read_blocks += report.read_blocks;
    counters->storage_read_bytes += report.read_bytes;
    counters->send_seconds += report.seconds;
  }
  return dump_json(Json{{"sent_blocks", report.sent_blocks},
                        {"sent_bytes", report.sent_bytes},
                        {"skipped_blocks", report.skipped_blocks},
                        {"missing_blocks", report.missing_blocks},
                        {"read_blocks", report.read_blocks},
                        {"read_bytes", report.read_bytes},
                        {"seconds", report.seconds}});
}

std::string kv_transfer_metrics(const KvRouteContext& context, const std::string& model_label) {
  const KvTransferSetup& setup = *context.setup;
  if (!setup.store) return "";
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto sample = [&](const char* name, const std::string& labels, auto value) {
    out += fmt::format("{}{{{}{}}} {}\n", name, model_label, labels.empty() ? "" : "," + labels, value);
  };
  const KvBufferStats buffer = setup.store->buffer_stats();
  family("loom_kv_buffer_bytes", "gauge", "Payload bytes in the KV buffer (blocks moving between engines)");
  sample("loom_kv_buffer_bytes", "", buffer.num_bytes);
  family("loom_kv_buffer_blocks", "gauge", "Blocks in the KV buffer");
  sample("loom_kv_buffer_blocks", "", buffer.num_blocks);
  family("loom_kv_buffer_capacity_bytes", "gauge", "The KV buffer's size (--kv-buffer-bytes)");
  sample("loom_kv_buffer_capacity_bytes", "", buffer.capacity_bytes);
  const KvLinkServerStats link = setup.link ? setup.link->stats() : KvLinkServerStats{};
  KvTransferCounters none;
  const KvTransferCounters& sent = context.counters != nullptr ? *context.counters : none;
  family("loom_kv_link_blocks_total", "counter",
         "KV blocks this engine sent to / received from other engines, skipped (the peer had them) and missing "
         "(not here to send: the peer recomputes them)");
  sample("loom_kv_link_blocks_total", "direction=\"sent\"", sent.sent_blocks.load());
  sample("loom_kv_link_blocks_total", "direction=\"received\"", link.num_received_blocks);
  sample("loom_kv_link_blocks_total", "direction=\"skipped\"", sent.skipped_blocks.load());
  sample("loom_kv_link_blocks_total", "direction=\"missing\"", sent.missing_blocks.load());
  family("loom_kv_link_bytes_total", "counter", "KV payload bytes sent to / received from other engines");
  sample("loom_kv_link_bytes_total", "direction=\"sent\"", sent.sent_bytes.load());
  sample("loom_kv_link_bytes_total", "direction=\"received\"", link.num_received_bytes);
  const KvLinkClientStats client = setup.client ? setup.client->stats() : KvLinkClientStats{};
  family("loom_kv_link_channel_bytes_total", "counter",
         "Of loom_kv_link_bytes_total: payload bytes through a data plane's channel (NCCL), not inline on TCP");
  sample("loom_kv_link_channel_bytes_total", "direction=\"sent\"", client.num_channel_bytes);
  sample("loom_kv_link_channel_bytes_total", "direction=\"received\"", link.num_channel_bytes);
  family("loom_kv_link_rejected_total", "counter",
         "What the KV link refused: connections that failed the handshake (no or a wrong secret, an older Loom), "
         "messages whose authentication tag failed (the connection closed), blocks whose payload did not match "
         "its digest (dropped)");
  sample("loom_kv_link_rejected_total", "what=\"connection\"", link.num_refused_connections);
  sample("loom_kv_link_rejected_total", "what=\"message\"", link.num_forged_messages);
  sample("loom_kv_link_rejected_total", "what=\"block\"", link.num_rejected_blocks);
  family("loom_kv_link_seconds_total", "counter", "Seconds spent in sends (bandwidth = sent bytes / seconds)");
  sample("loom_kv_link_seconds_total", "", sent.send_seconds.load());
  family("loom_kv_link_failures_total", "counter", "Sends that failed (the peer unreachable or gone mid-way)");
  sample("loom_kv_link_failures_total", "", sent.failed_sends.load());
  family("loom_kv_link_storage_read_bytes_total", "counter",
         "Bytes read from the storage tier to be sent on (DualPath's storage -> decode engine -> prefill engine path)");
  sample("loom_kv_link_storage_read_bytes_total", "", sent.storage_read_bytes.load());
  return out;
}

}  // namespace loom::server
