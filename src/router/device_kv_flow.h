// The device-to-device branch of one request through the router
// (router/completion_flow.h, docs/disaggregation.md "Device to device"), its
// pure pieces: the bodies the PE and the DE get, and what the router does
// once the PE's prefill answered.
//
// Overlap: the DE's request (receive_body) goes as soon as the DE reserved
// the blocks, beside the PE's prefill (prefill_body with the send); the DE
// parks it until the last layer lands and decodes at once. So when the PE's
// prefill then fails or refuses the send, the DE's request is already
// waiting on a transfer that will not come: the router cancels the
// reservation (POST /loom/kv/reserve/cancel) and that request recomputes at
// once, rather than at the deadline (device_prefill_verdict).
//
// Pure functions; any thread.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "router/engine_client.h"

namespace loom::router {

// The PE's copy of the client's body: one output token, not streamed (min_tokens and n go too: they would ask
// more than one token of the PE). With a reservation, it also carries loom_device_kv.send into it at the DE's
// plane address `decode_plane_address` (server/device_kv_fields.h; the call must be signed).
std::string prefill_body(nlohmann::json body, const KvReservation* reservation = nullptr,
                         const std::string& decode_plane_address = "");

// The client's body for the DE that reserved blocks: it waits for transfer `transfer_id`. Throws
// server::ApiError (400) when `client_body` is not a JSON object.
std::string receive_body(const std::string& client_body, const std::string& transfer_id);

// Whether a 4xx from a PE refuses the device send itself (its fields, signature or peer: the error's param
// starts with loom_device_kv), not the request.
bool refuses_device_fields(const HttpReply& reply);

// What the router does after the PE's prefill on the device path, the DE's request already sent.
enum class DevicePrefillAction {
  kReceive,          // the prefill went (the KV went or goes to the DE; a transfer that failed, the DE recomputes)
  kCancelRecompute,  // the PE failed or refused the send: cancel the reservation; the DE's request recomputes
  kCancelReplyNow,   // the PE rejected the request itself (4xx): cancel the reservation and the DE's request,
                     // and answer the client the PE's 4xx (as the staged flow does)
};

struct DevicePrefillVerdict {
  DevicePrefillAction action = DevicePrefillAction::kReceive;
  std::string fallback_reason;  // kCancelRecompute: the metric label ("prefill_refused_send", "prefill_failed")
  bool prefill_engine_failed = false;  // the PE is to be marked failed (no connection, timeout, 5xx)
};

// `status` of the PE's prefill call; `refused_send`: refuses_device_fields of its reply (kRejected only).
DevicePrefillVerdict device_prefill_verdict(CallStatus status, bool refused_send);

}  // namespace loom::router
