#include "engine/batch_builder.h"

namespace loom {

Batch build_batch(const StepPlan& plan, const Scheduler& scheduler,
                  const std::function<int32_t(SchedulerRequestId)>& adapter_slot_of) {
  Batch batch;
  const int32_t num_tokens = plan.num_tokens();
  batch.token_ids.reserve(static_cast<size_t>(num_tokens));
  batch.positions.reserve(static_cast<size_t>(num_tokens));
  batch.adapter_slots.reserve(static_cast<size_t>(num_tokens));
  for (const ScheduledRequest& entry : plan.requests) {
    const std::vector<int32_t>& tokens = scheduler.tokens(entry.id);
    const int32_t slot = adapter_slot_of(entry.id);
    BatchSequence sequence;
    sequence.num_cached_tokens = entry.num_cached_tokens;
    sequence.num_new_tokens = entry.num_new_tokens;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = static_cast<int32_t>(entry.block_ids.size());
    for (int32_t j = entry.num_cached_tokens; j < entry.num_cached_tokens + entry.num_new_tokens; ++j) {
      batch.token_ids.push_back(tokens[static_cast<size_t>(j)]);
      batch.positions.push_back(j);
      batch.adapter_slots.push_back(slot);
    }
    batch.block_tables.insert(batch.block_tables.end(), entry.block_ids.begin(), entry.block_ids.end());
    batch.sequences.push_back(sequence);
  }
  return batch;
}

}  // namespace loom
