// What the scheduler tests do after each forward step with the fake backend
// (scheduler_fake_backend.h): take every sampling row's greedy token, then
// finish or extend its request.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "backend/backend.h"
#include "scheduler/scheduler.h"

namespace loom::test {

// For each row of `plan` that samples its next token: the argmax of its logits
// row in `result` goes to outputs[id]; the request finishes once it has
// max_new_tokens.at(id) of them, else the token is appended to it.
inline void take_greedy_tokens(Scheduler& scheduler, const ScheduledBatch& plan, const ForwardResult& result,
                               std::map<SchedulerRequestId, std::vector<int32_t>>& outputs,
                               const std::map<SchedulerRequestId, int32_t>& max_new_tokens) {
  for (size_t row = 0; row < plan.requests.size(); ++row) {
    const ScheduledRequest& entry = plan.requests[row];
    if (!entry.samples_next_token) continue;
    const float* logits = result.logits.data() + row * static_cast<size_t>(result.vocab_size);
    const int32_t token = static_cast<int32_t>(std::max_element(logits, logits + result.vocab_size) - logits);
    outputs[entry.id].push_back(token);
    if (static_cast<int32_t>(outputs[entry.id].size()) >= max_new_tokens.at(entry.id))
      scheduler.finish(entry.id);
    else
      scheduler.append_token(entry.id, token);
  }
}

}  // namespace loom::test
