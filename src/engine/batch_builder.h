// Turns a scheduler ScheduledBatch into a backend Batch.
//
//   scheduled.requests[i] ─► batch.sequences[i]
//     tokens [num_computed_tokens, num_computed_tokens + num_new_tokens) of the
//     request, positions equal to the token indices, block table = the entry's
//     block ids, num_kv_present_tokens from the entry.
//   Per-token adapter slots and sequence fields by the request's KV sharing
//   (engine/request_kv.h, backend.h "KV sharing modes"):
//     isolated / base model   the slot (or -1) on every token
//     activated               -1 for tokens before the invocation start S, the
//                             slot from S on (token index j >= S)
//     base                    -1 on every token (base rows write K/V) and
//                             decoder_adapter_slot = the slot
//     forked                  the slot on every token, forked_adapter_slot = the
//                             slot, the rCache block table and present count
//   Logits: one row per sequence (its last new token), in scheduled order.
#pragma once

#include <functional>

#include "backend/backend.h"
#include "engine/request_kv.h"
#include "scheduler/scheduler.h"

namespace loom {

Batch build_batch(const ScheduledBatch& scheduled, const Scheduler& scheduler,
                  const std::function<SequenceSharing(SchedulerRequestId)>& sharing_of);

// Every request isolated (or the base model when its slot is -1).
Batch build_batch(const ScheduledBatch& scheduled, const Scheduler& scheduler,
                  const std::function<int32_t(SchedulerRequestId)>& adapter_slot_of);

}  // namespace loom
