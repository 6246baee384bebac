// One POST /v1/completions or /v1/chat/completions through the router:
//
//   1. parse the body (400 for malformed JSON or a non-object); a completions
//      request with several prompts skips disaggregation (path "direct");
//   2. choose a DE and a PE (router/dual_path_scheduler.h) from the engines'
//      loads;
//   3. probe the PE: the prompt's full blocks and how many only its storage holds;
//   4. choose the read path for those storage blocks ("none", "prefill", "decode");
//   5. path decode: the DE reads them from storage and pushes them to the PE;
//   6. prefill on the PE (the body with max_tokens 1, not streamed; output dropped);
//   6'. device path instead (choose_kv_path: both engines report one device KV
//      plane): POST /loom/kv/reserve on the DE first; then, at once, step 8's
//      request goes to that DE carrying loom_device_kv.receive (signed), beside
//      the prefill (overlap: the DE parks it until the last layer landed and
//      decodes at once); the prefill carries loom_device_kv.send
//      (server/device_kv_fields.h, signed), so the PE streams the KV into the
//      reservation layer by layer; no step 7. A reserve that fails (reason
//      reserve_failed) falls back to the staged push. A PE that then fails or
//      refuses the send fields (prefill_failed, prefill_refused_send) gets the
//      reservation cancelled (POST /loom/kv/reserve/cancel): the DE's request
//      recomputes at once, no other PE is tried (path "recompute"). A PE that
//      rejects the request itself (4xx): cancel, the DE's request is dropped,
//      the client gets the 4xx. router/device_kv_flow.h; every fallback is
//      counted and logged;
//   7. the PE pushes the prompt's blocks to the DE (waiting for its own writes);
//   8. the client's original body goes to the DE; its answer is relayed as it
//      comes (status, content type, body; SSE piece by piece).
//
// Failures: a PE that fails in 3-7 (no connection, timeout, 5xx, malformed
// reply) is marked failed and the request goes once to another PE; with none
// left, straight to 8 (the DE prefills itself). On the device path a PE that
// fails its prefill is marked failed too, but no other PE is tried: the DE's
// request is in flight already and recomputes once the reservation is
// cancelled (6'). A 502 from the PE's push is
// the link's failure, not the PE's: the request goes on to 8, where the DE
// recomputes what it did not receive. A DE that fails before anything was
// relayed is marked failed and another DE is tried; none left: 503. 4xx from
// an engine at 3, 6 or 8 goes to the client unchanged.
//
// Runs on a transport handler thread; a streamed answer keeps it until the
// stream ends.
#pragma once

#include "router/engine_registry.h"
#include "router/router_metrics.h"
#include "router/router_server.h"
#include "server/http_types.h"

namespace loom::router {

struct FlowContext {
  const RouterConfig* config = nullptr;
  EngineRegistry* engines = nullptr;
  RouterMetrics* metrics = nullptr;
};

// Throws server::ApiError for the client's mistakes (400) and for "no decode
// engine" (503).
server::HttpResponse handle_completion(const FlowContext& context, server::HttpRequest& request, bool chat);

}  // namespace loom::router
