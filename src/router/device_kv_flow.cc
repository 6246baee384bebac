#include "router/device_kv_flow.h"

#include "server/device_kv_fields.h"
#include "server/json_input.h"
#include "server/json_output.h"

namespace loom::router {

using Json = nlohmann::json;
using server::kDeviceKvField;

std::string prefill_body(Json body, const KvReservation* reservation, const std::string& decode_plane_address) {
  if (reservation != nullptr)  // stream the prompt's KV into the DE's reservation
    body[kDeviceKvField] = {{"send",
                             {{"peer", decode_plane_address},
                              {"transfer_id", reservation->transfer_id},
                              {"main_blocks", reservation->main_blocks},
                              {"residual_blocks", reservation->residual_blocks},
                              {"first_block", reservation->first_block}}}};
  body["max_tokens"] = 1;
  if (body.contains("max_completion_tokens")) body["max_completion_tokens"] = 1;
  body["stream"] = false;
  body.erase("stream_options");
  body.erase("min_tokens");
  if (body.contains("n")) body["n"] = 1;
  return server::dump_json(body);
}

std::string receive_body(const std::string& client_body, const std::string& transfer_id) {
  Json body = server::parse_json_object_body(client_body);
  body[kDeviceKvField] = {{"receive", transfer_id}};
  return server::dump_json(body);
}

bool refuses_device_fields(const HttpReply& reply) {
  const Json body = Json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) return false;
  const Json& error = body["error"];
  const std::string param = error.value("param", Json()).is_string() ? error["param"].get<std::string>() : "";
  return param.rfind(kDeviceKvField, 0) == 0;
}

DevicePrefillVerdict device_prefill_verdict(CallStatus status, bool refused_send) {
  switch (status) {
    case CallStatus::kOk:
      return {DevicePrefillAction::kReceive, "", false};
    case CallStatus::kRejected:
      if (refused_send) return {DevicePrefillAction::kCancelRecompute, "prefill_refused_send", false};
      return {DevicePrefillAction::kCancelReplyNow, "", false};
    case CallStatus::kFailed:
      break;
  }
  return {DevicePrefillAction::kCancelRecompute, "prefill_failed", true};
}

}  // namespace loom::router
