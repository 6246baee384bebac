// The device-to-device KV fields of a completion body (docs/disaggregation.md
// "Device to device"): `loom router` adds them, clients never do.
//
//   "loom_device_kv": {"send": {"peer": "host:port", "transfer_id": "16 hex digits",
//                               "main_blocks": [ids], "residual_blocks": [ids] (forked; else [] or absent),
//                               "first_block": n}}
//        on a prefill engine: stream the prompt's KV into that reservation while
//        prefilling it (EngineRequest::device_kv_send); what POST /loom/kv/reserve
//        answered on the decode engine, and its device plane's address.
//   "loom_device_kv": {"receive": "16 hex digits"}
//        on a decode engine: wait for that reservation's transfer, then decode from
//        its blocks, or recompute when it failed (EngineRequest::device_kv_receive).
//
// Trust: with a KV transfer secret the field is honoured only in a request
// signed with it (server/kv_auth.h's X-Loom-KV-Auth over the method, path and
// body: 401 otherwise), exactly as /loom/kv/* are; without one (loopback only)
// unsigned. A send's peer must pass --kv-transfer-peers (403
// kv_peer_not_allowed). An engine without a device plane, a request of
// several choices, or a malformed field is 400; nothing is queued then.
//
// Thread: any (pure functions of their arguments).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvtransfer/device/device_kv_plane.h"
#include "kvtransfer/kv_peer_allowlist.h"
#include "server/http_types.h"
#include "server/openai_request.h"

namespace loom::server {

inline constexpr const char* kDeviceKvField = "loom_device_kv";

struct DeviceKvFieldsPolicy {
  bool has_plane = false;                 // the engine has a device KV plane
  std::string secret;                     // the KV transfer secret ("": none, unsigned accepted)
  const KvPeerAllowlist* peers = nullptr; // where a send may go (null: loopback only)
};

// A transfer id as the routes write it (16 lower-case hex digits) and back;
// nullopt for anything else.
std::string transfer_id_text(DeviceKvTransferId id);
std::optional<DeviceKvTransferId> parse_transfer_id(std::string_view text);

// Reads the field of `request` (a POST to a completion route whose body
// `parsed` came from) into parsed.engine_template; nothing when absent.
// Throws ApiError as the header says.
void apply_device_kv_fields(const HttpRequest& request, const DeviceKvFieldsPolicy& policy, ParsedRequest& parsed);

}  // namespace loom::server
