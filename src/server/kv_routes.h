// The KV transfer routes of a disaggregated engine (loom serve --role
// prefill|decode, DualPath), which `loom router` (src/router/) drives. JSON,
// behind the API key like /v1/, and, when the engine has a KV transfer secret,
// answered only to calls signed with it (server/kv_auth.h; 401 otherwise):
//
//   GET  /loom/kv/status -> {"role", "kv_transfer_address": "host:port" | null, "block_size",
//                            "bytes_per_block", "queued_read_bytes", "read_bandwidth", "has_storage",
//                            "num_requests" (completion requests in flight here), "buffer_bytes",
//                            "buffer_capacity_bytes", "buffer_blocks", "received_blocks", "received_bytes",
//                            "authenticated" (a secret is set), "refused_connections", "forged_messages",
//                            "rejected_blocks" (kv_link_server.h's counts)}
//   POST /loom/kv/probe  {"endpoint": "chat" | "completions", "request": {an OpenAI body}}
//                        -> {"prompt_tokens", "blocks": [32 hex digits, ...], "block_bytes": [payload
//                            bytes of each], "bytes_per_block", "in_buffer", "in_storage"}
//        the content hashes of the full KV blocks of the request's (first) prompt, in every
//        cache it uses (Engine::kv_block_hashes), and how many this engine holds in its
//        buffer, and in its storage tier only. The request is parsed exactly as the
//        completion routes parse it (the same 400 / 404 errors).
//   POST /loom/kv/send   {"blocks": [hex, ...], "block_bytes": [...] (optional: each block's size as
//                         the probe gave it; default the main cache's), "to": "host:port",
//                         "read_storage": false, "wait_seconds": 0}
//                        -> {"sent_blocks", "sent_bytes", "skipped_blocks", "missing_blocks",
//                            "read_blocks", "read_bytes", "seconds"}
//        pushes the blocks to the engine whose KV link listens at `to`
//        (kvtransfer/kv_link_client.h); 403 (kv_peer_not_allowed) when `to` is not
//        an allowed peer (--kv-transfer-peers; loopback only without it), 502 when
//        the link fails (its handshake included), 400 on an engine without a KV buffer.
//   POST /loom/kv/reserve {"endpoint", "request" (as for probe), "peer": the prefill engine's device
//                          plane address, "timeout_seconds": (0, 600]}
//                        -> {"transfer_id": 16 hex digits, "main_blocks": [ids], "residual_blocks": [ids]
//                            (forked; else []), "first_block", "num_blocks", "num_layers", "timeout_seconds"}
//        the decode engine's half of a device-to-device transfer (Engine::reserve_device_kv):
//        blocks for the prompt's full blocks it does not hold, leased, expected from `peer`
//        until the timeout; the prefill request then names them (server/device_kv_fields.h
//        "send"), the decode request the id ("receive"). 400 (device_kv_unavailable) on an
//        engine without a device plane, 503 (device_kv_no_room) when the blocks cannot be had now.
//   POST /loom/kv/reserve/cancel {"transfer_id": 16 hex digits, "reason": text (optional, for the log)}
//                        -> {"transfer_id", "state": "cancelled" | "settled"}
//        fails a reservation now rather than at its deadline (Engine::cancel_device_kv): the
//        router calls it when the PE side failed after reserving. Nothing more lands, the
//        fresh blocks are freed, the request waiting for it (or still to come) recomputes at
//        once. "settled": it had landed (then it stays) or failed already. 404
//        (device_kv_unknown_transfer) for an id this engine does not hold (nothing changes),
//        400 for a malformed id, 400 (device_kv_unavailable) without a device plane.
//   "device_kv" in the status: {"plane", "host", "device", "address", "same_host_only"}
//        (kvtransfer/device/device_kv_plane.h DeviceKvEndpoint; plane "none" without one).
//
// Runs on HTTP handler threads; everything it touches is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "kvstore/buffered_kv_store.h"
#include "kvtransfer/device/device_kv_plane.h"
#include "kvtransfer/kv_link_client.h"
#include "kvtransfer/kv_link_server.h"
#include "server/openai_request.h"

namespace loom::server {

// What a server knows of its engine's KV transfer set-up (ServerConfig::kv_transfer).
struct KvTransferSetup {
  std::string role = "both";                // "prefill", "decode" or "both"
  std::shared_ptr<BufferedKvStore> store;   // null: no KV buffer (role both without a link)
  std::shared_ptr<KvDataPlane> plane;       // null: payloads inline on the link's TCP (declared before its users)
  // The device-to-device plane (kvtransfer/device/device_kv_plane.h; the
  // engine's EngineConfig::device_kv_plane); null: "none" in the status.
  std::shared_ptr<DeviceKvPlane> device_plane;
  std::shared_ptr<KvLinkServer> link;       // null: no KV link
  std::shared_ptr<KvLinkClient> client;     // sends (pooled connections); null: no KV link
  std::string link_address;                 // "host:port" the router hands to peers ("" without a link)
  std::string secret;                       // the KV transfer secret ("": none): the link's key, and /loom/kv/*'s (kv_auth.h)
  int32_t block_size = 0;
  int64_t bytes_per_block = 0;              // main cache's; the payload size of its blocks
  int64_t read_bandwidth = 0;               // --disk-kv-read-bandwidth (0: unpaced)
};

// What this server's KV transfer routes did since start (thread-safe).
struct KvTransferCounters {
  std::atomic<int64_t> sent_blocks{0}, sent_bytes{0}, skipped_blocks{0}, missing_blocks{0};
  std::atomic<int64_t> storage_read_blocks{0}, storage_read_bytes{0}, failed_sends{0};
  std::atomic<double> send_seconds{0};
};

struct KvRouteContext {
  Engine* engine = nullptr;
  const ParseContext* parse = nullptr;
  const KvTransferSetup* setup = nullptr;
  const std::atomic<int32_t>* num_requests = nullptr;  // completion requests in flight at this server
  KvTransferCounters* counters = nullptr;
};

std::string kv_status_body(const KvRouteContext& context);
std::string kv_probe_body(const KvRouteContext& context, std::string_view body);
std::string kv_send_body(const KvRouteContext& context, std::string_view body);
std::string kv_reserve_body(const KvRouteContext& context, std::string_view body);
std::string kv_reserve_cancel_body(const KvRouteContext& context, std::string_view body);
// Prometheus samples of the KV buffer, the link and the sends, each labelled
// `model_label` first (MetricsExporter::model_label); "" without a KV buffer:
//   loom_kv_buffer_bytes / _blocks / _capacity_bytes (gauges),
//   loom_kv_link_blocks_total{direction="sent"|"received"|"skipped"|"missing"},
//   loom_kv_link_bytes_total{direction="sent"|"received"},
//   loom_kv_link_channel_bytes_total{direction="sent"|"received"} (of those, through the data plane),
//   loom_kv_link_rejected_total{what="connection"|"message"|"block"} (refused by the link),
//   loom_kv_link_seconds_total (sending), loom_kv_link_failures_total,
//   loom_kv_link_storage_read_bytes_total (storage reads for sends: DualPath's DE-side reads).
std::string kv_transfer_metrics(const KvRouteContext& context, const std::string& model_label);

}  // namespace loom::server
