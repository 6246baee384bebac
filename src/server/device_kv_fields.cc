#include "server/device_kv_fields.h"

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_input.h"
#include "server/kv_auth.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

std::vector<int32_t> block_ids(const Json& send, const char* key, bool required) {
  const std::string param = field_path(std::string(kDeviceKvField) + ".send", key);
  auto found = send.find(key);
  if (found == send.end() || found->is_null()) {
    if (required) bad(param, fmt::format("'{}' is required", param));
    return {};
  }
  if (!found->is_array()) bad(param, fmt::format("'{}' must be a list of block ids", param));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < found->size(); ++i) {
    const Json& id = (*found)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      bad(field_path(param, i), "a block id must be a non-negative integer");
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

DeviceKvTransferId transfer_id(const Json& value, const std::string& param) {
  std::optional<DeviceKvTransferId> id;
  if (value.is_string()) id = parse_transfer_id(value.get_ref<const std::string&>());
  if (!id) bad(param, fmt::format("'{}' must be a transfer id (16 hex digits, as /loom/kv/reserve gave it)", param));
  return *id;
}

}  // namespace

std::string transfer_id_text(DeviceKvTransferId id) { return fmt::format("{:016x}", id); }

std::optional<DeviceKvTransferId> parse_transfer_id(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  DeviceKvTransferId id = 0;
  for (char c : text) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) return std::nullopt;
    id = (id << 4) | static_cast<DeviceKvTransferId>(digit);
  }
  return id;
}

void apply_device_kv_fields(const HttpRequest& request, const DeviceKvFieldsPolicy& policy, ParsedRequest& parsed) {
  if (request.body.find(kDeviceKvField) == std::string::npos) return;  // the common case: no second parse
  const Json body = parse_json_object_body(request.body);
  auto field = body.find(kDeviceKvField);
  if (field == body.end() || field->is_null()) return;
  if (!policy.secret.empty() &&
      !kv_request_signed(policy.secret, request.method, request.path, request.body, request.header(kKvAuthHeader),
                         unix_seconds_now()))
    throw ApiError(401,
                   fmt::format("'{}' is honoured only in a request signed with the KV transfer secret ({} header, "
                               "as loom router sends it)",
                               kDeviceKvField, kKvAuthHeader),
                   "authentication_error", kDeviceKvField, "invalid_kv_signature");
  if (!policy.has_plane)
    throw ApiError(400, "this engine has no device KV plane (--kv-device-plane)", "invalid_request_error",
                   kDeviceKvField, "device_kv_unavailable");
  if (!field->is_object() || field->size() != 1 || (!field->contains("send") && !field->contains("receive")))
    bad(kDeviceKvField, fmt::format("'{}' must be {{\"send\": {{...}}}} or {{\"receive\": ID}}", kDeviceKvField));
  if (parsed.num_choices() != 1)
    bad(kDeviceKvField, fmt::format("'{}' needs a request of one prompt and n = 1", kDeviceKvField));
  EngineRequest& engine = parsed.engine_template;
  if (field->contains("receive")) {
    engine.device_kv_receive = transfer_id((*field)["receive"], std::string(kDeviceKvField) + ".receive");
    return;
  }
  const Json& send = (*field)["send"];
  const std::string param = std::string(kDeviceKvField) + ".send";
  if (!send.is_object()) bad(param, fmt::format("'{}' must be an object", param));
  DeviceKvSend out;
  auto peer = send.find("peer");
  if (peer == send.end() || !peer->is_string()) bad(param + ".peer", "'peer' must be the decode engine's plane address");
  out.peer = peer->get<std::string>();
  const KvPeerAllowlist loopback;
  const KvPeerAllowlist& peers = policy.peers ? *policy.peers : loopback;
  if (!peers.allows(out.peer))
    throw ApiError(403,
                   fmt::format("'{}' is not an allowed KV peer of this engine ({}); list it in --kv-transfer-peers",
                               out.peer, peers.describe()),
                   "permission_error", param + ".peer", "kv_peer_not_allowed");
  out.destination.id = transfer_id(send.contains("transfer_id") ? send["transfer_id"] : Json(), param + ".transfer_id");
  out.destination.main_blocks = block_ids(send, "main_blocks", true);
  out.destination.residual_blocks = block_ids(send, "residual_blocks", false);
  if (!out.destination.residual_blocks.empty() &&
      out.destination.residual_blocks.size() != out.destination.main_blocks.size())
    bad(param + ".residual_blocks", "'residual_blocks' must be empty or as long as 'main_blocks'");
  auto first = send.find("first_block");
  if (first == send.end() || !first->is_number_integer() || first->get<int64_t>() < 0 ||
      first->get<int64_t>() > INT32_MAX)
    bad(param + ".first_block", "'first_block' must be a non-negative integer");
  out.first_block = static_cast<int32_t>(first->get<int64_t>());
  engine.device_kv_send = std::move(out);
}

}  // namespace loom::server
