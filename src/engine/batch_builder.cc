#include "engine/batch_builder.h"

#include <algorithm>

namespace loom {

Batch build_batch(const ScheduledBatch& scheduled, const Scheduler& scheduler,
                  const std::function<SequenceSharing(SchedulerRequestId)>& sharing_of) {
  Batch batch;
  const int32_t num_tokens = scheduled.num_tokens();
  batch.token_ids.reserve(static_cast<size_t>(num_tokens));
  batch.positions.reserve(static_cast<size_t>(num_tokens));
  batch.adapter_slots.reserve(static_cast<size_t>(num_tokens));
  for (const ScheduledRequest& entry : scheduled.requests) {
    const std::vector<int32_t>& tokens = scheduler.tokens(entry.id);
    const SequenceSharing sharing = sharing_of(entry.id);
    const int32_t slot = sharing.adapter_slot;
    BatchSequence sequence;
    sequence.num_computed_tokens = entry.num_computed_tokens;
    sequence.num_new_tokens = entry.num_new_tokens;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = static_cast<int32_t>(entry.block_ids.size());
    // Entries past this step's tokens (a forked partial hit prefilled in
    // chunks) are neither read nor written by it: the backend sees only its range.
    const int32_t num_step_tokens = entry.num_computed_tokens + entry.num_new_tokens;
    sequence.num_kv_present_tokens = std::min(entry.num_kv_present_tokens, num_step_tokens);
    // Which tokens run through the adapter's LoRA (the backend's adapter_slots).
    int32_t first_adapted_token = 0;
    if (slot >= 0 && sharing.sharing == KvSharing::kActivated) first_adapted_token = sharing.invocation_start;
    const bool no_token_slots = slot < 0 || sharing.sharing == KvSharing::kBase;
    if (slot >= 0 && sharing.sharing == KvSharing::kBase) sequence.decoder_adapter_slot = slot;
    if (slot >= 0 && sharing.sharing == KvSharing::kForked) {
      sequence.forked_adapter_slot = slot;
      sequence.residual_block_table_offset = static_cast<int32_t>(batch.residual_block_tables.size());
      sequence.num_residual_blocks = static_cast<int32_t>(entry.residual_block_ids.size());
      sequence.num_residual_present_tokens = std::min(entry.num_residual_present_tokens, num_step_tokens);
      batch.residual_block_tables.insert(batch.residual_block_tables.end(), entry.residual_block_ids.begin(),
                                         entry.residual_block_ids.end());
    }
    for (int32_t j = entry.num_computed_tokens; j < entry.num_computed_tokens + entry.num_new_tokens; ++j) {
      batch.token_ids.push_back(tokens[static_cast<size_t>(j)]);
      batch.positions.push_back(j);
      batch.adapter_slots.push_back(no_token_slots || j < first_adapted_token ? -1 : slot);
    }
    batch.block_tables.insert(batch.block_tables.end(), entry.block_ids.begin(), entry.block_ids.end());
    batch.sequences.push_back(sequence);
  }
  return batch;
}

Batch build_batch(const ScheduledBatch& scheduled, const Scheduler& scheduler,
                  const std::function<int32_t(SchedulerRequestId)>& adapter_slot_of) {
  return build_batch(scheduled, scheduler, [&](SchedulerRequestId id) {
    return SequenceSharing{adapter_slot_of(id), KvSharing::kIsolated, 0};
  });
}

}  // namespace loom
