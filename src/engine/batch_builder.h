// Turns a scheduler StepPlan into a backend Batch.
//
//   plan.requests[i] ─► batch.sequences[i]
//     tokens [num_cached_tokens, num_cached_tokens + num_new_tokens) of the
//     request, positions equal to the token indices, the request's adapter
//     slot on every token, block table = the plan's block ids.
//   Logits: one row per sequence (its last new token), in plan order.
#pragma once

#include <functional>

#include "backend/backend.h"
#include "scheduler/scheduler.h"

namespace loom {

Batch build_batch(const StepPlan& plan, const Scheduler& scheduler,
                  const std::function<int32_t(SchedulerRequestId)>& adapter_slot_of);

}  // namespace loom
