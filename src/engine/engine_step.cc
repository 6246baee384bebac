// One engine step and its parts (EngineImpl's private half; see engine_impl.h).
#include <algorithm>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/batch_builder.h"
#include "engine/engine_impl.h"

namespace loom {

namespace {

double seconds_between(SteadyTime from, SteadyTime to) { return std::chrono::duration<double>(to - from).count(); }

}  // namespace

void EngineImpl::step() {
  workflow_sync_.sync(pools_.caches());  // before plan(): its allocations evict by the current steps
  // Disk reads (policy 7), the step, then prefetches of the next agents (policy 8: demand loads and admissions go first).
  ScheduledBatch scheduled = scheduler_->plan(pools_.prefetch_request(workflow_sync_.agent_steps()));
  SteadyTime scheduled_at = std::chrono::steady_clock::now();
  note_load_waits(scheduled, scheduled_at);
  pools_.pump_transfers();
  if (!scheduled.blocked_on_load.empty()) {  // --host-load-policy blocking: the step waits for the load
    while (!scheduled.blocked_on_load.empty()) {
      pools_.wait_for_transfer();
      scheduled = scheduler_->resume_after_loads(std::move(scheduled));
      pools_.pump_transfers();  // a load it started
    }
    scheduled_at = std::chrono::steady_clock::now();
    note_load_waits(scheduled, scheduled_at);  // the blocked request's wait ends now
  }
  num_scheduler_waiting_ = scheduler_->num_waiting();
  if (scheduled.empty()) {  // nothing fits, or every waiting request waits on a load: do not spin
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return;
  }
  note_scheduled(scheduled, scheduled_at);
  const std::optional<ForwardResult> result = forward(scheduled);
  if (!result) return;  // forward failed: the batch's requests ended with its error
  if (kv_sender_) kv_sender_->finish_step();
  scheduler_->complete_step(scheduled);
  workflow_sync_.declare_fixed_prefixes(scheduled, active_, pools_.caches());
  pools_.pump_transfers();  // the backups complete_step planned start while we sample
  sample_and_emit(scheduled, *result);
}

void EngineImpl::note_load_waits(const ScheduledBatch& scheduled, SteadyTime now) {
  if (!pools_.has_host_tier()) return;
  for (SchedulerRequestId id : scheduled.waiting_on_load) {
    PendingRequest& request = *active_.at(id);
    if (!request.load_wait_started_at) request.load_wait_started_at = now;
  }
  step_stats_.set_num_waiting_on_load(static_cast<int32_t>(scheduled.waiting_on_load.size()));
  for (const ScheduledRequest& entry : scheduled.requests) {
    PendingRequest& request = *active_.at(entry.id);
    if (!request.load_wait_started_at) continue;
    step_stats_.add_load_wait(seconds_between(*request.load_wait_started_at, now));
    request.load_wait_started_at.reset();
  }
}

void EngineImpl::note_scheduled(const ScheduledBatch& scheduled, SteadyTime scheduled_at) {
  for (const ScheduledRequest& entry : scheduled.requests) {
    PendingRequest& request = *active_.at(entry.id);
    if (!request.first_scheduled_at) {
      request.first_scheduled_at = scheduled_at;
      step_stats_.add_queue_time(seconds_between(request.submitted_at, scheduled_at));
    }
    if (entry.num_prefix_hit_tokens >= 0) {  // admitted this step: its prefix was looked up
      request.num_cached_prompt_tokens = entry.num_prefix_hit_tokens;
      step_stats_.add_prefix_lookup(request.kv_plan.mode_label,
                                    static_cast<int64_t>(request.request.prompt_tokens.size()),
                                    entry.num_prefix_hit_tokens);
    }
  }
}

Batch EngineImpl::build_step_batch(const ScheduledBatch& scheduled) const {
  Batch batch =
      build_batch(scheduled, *scheduler_, [&](SchedulerRequestId id) { return active_.at(id)->kv_plan.sharing; });
  // Device sampling where the backend has it: only token ids come back for the
  // requests that need nothing else (rows that sample nothing this step take a
  // greedy id too, so that their logits stay on the device). Structured outputs
  // stay there too where the backend takes token masks: each gets a mask row,
  // in row order (forward() fills them); so do penalties, logit_bias and min_p
  // where it processes logits (the sampler's edits for this step).
  if (capabilities_.device_sampling) {
    batch.sampling.resize(scheduled.requests.size());
    for (size_t i = 0; i < scheduled.requests.size(); ++i) {
      const PendingRequest& request = *active_.at(scheduled.requests[i].id);
      const bool samples = scheduled.requests[i].samples_next_token;
      if (samples &&
          !request.can_sample_on_device(capabilities_.device_token_masks, capabilities_.device_logit_processing))
        continue;
      const SamplingParams& params = request.request.sampling;
      DeviceSampling& sampling = batch.sampling[i];
      sampling = {true, params.temperature, params.top_k, params.top_p, params.seed,
                  static_cast<uint64_t>(request.num_output_tokens)};
      if (!samples) continue;
      if (request.matcher) sampling.mask_row = batch.num_token_mask_rows++;
      if (params.modifies_logits()) {
        sampling.repetition_penalty = params.repetition_penalty;
        sampling.min_p = params.min_p;
        sampling.edits_begin = static_cast<int32_t>(batch.logit_edits.size());
        request.sampler.append_logit_edits(model_.config.vocab_size, batch.logit_edits);
        sampling.num_edits = static_cast<int32_t>(batch.logit_edits.size()) - sampling.edits_begin;
      }
    }
  }
  return batch;
}

WorkerPool& EngineImpl::host_workers() {
  // A few threads: on a GPU the cores are idle during the forward; on the CPU
  // backend they compete with it, but the masks are needed right after anyway.
  if (!host_workers_)
    host_workers_ = std::make_unique<WorkerPool>(std::min<size_t>(8, std::max(1u, std::thread::hardware_concurrency())));
  return *host_workers_;
}

WorkerPool::Job EngineImpl::start_constraint_masks(const ScheduledBatch& scheduled) {
  std::vector<PendingRequest*> constrained;
  for (const ScheduledRequest& entry : scheduled.requests) {
    PendingRequest& request = *active_.at(entry.id);
    if (entry.samples_next_token && request.matcher) constrained.push_back(&request);
  }
  if (constrained.empty()) return {};
  return host_workers().start(constrained.size(),
                              [constrained](size_t i) { constrained[i]->prepare_constraint_mask(); });
}

std::optional<ForwardResult> EngineImpl::forward(const ScheduledBatch& scheduled) {
  Batch batch = build_step_batch(scheduled);
  if (kv_sender_) batch.kv_layer_listener = kv_sender_->prepare_step(scheduled);
  // Structured outputs' masks are computed while the model's work runs; the
  // tasks end before this returns (so before any request they touch can end).
  WorkerPool::Job masks = start_constraint_masks(scheduled);
  try {
    backend_->enqueue_forward(batch);
    masks.wait();
    // write_device_mask fills every word of its row, so the reused buffer needs no clearing.
    const int32_t vocab_size = model_.config.vocab_size;
    const size_t words_per_row = static_cast<size_t>(vocab_size + 31) / 32;
    mask_words_.resize(static_cast<size_t>(batch.num_token_mask_rows) * words_per_row);
    for (size_t i = 0; i < batch.sampling.size(); ++i) {
      const int32_t row = batch.sampling[i].mask_row;
      if (row >= 0)
        active_.at(scheduled.requests[i].id)
            ->write_device_mask(mask_words_.data() + static_cast<size_t>(row) * words_per_row,
                                static_cast<int32_t>(words_per_row), vocab_size);
    }
    ForwardResult result = backend_->finish_forward(mask_words_);
    LOOM_CHECK(result.logit_token_index.size() == scheduled.requests.size());
    return result;
  } catch (const Error& error) {
    masks.wait();
    spdlog::error("forward pass failed: {}", error.what());
    fail_batch(scheduled, error);
  } catch (const std::exception& error) {
    masks.wait();
    spdlog::error("forward pass failed: {}", error.what());
    fail_batch(scheduled, Error(ErrorKind::kInternal, fmt::format("forward pass failed: {}", error.what())));
  }
  return std::nullopt;
}

void EngineImpl::fail_batch(const ScheduledBatch& scheduled, const Error& error) {
  for (const ScheduledRequest& entry : scheduled.requests) end_request(entry.id, active_.at(entry.id)->failed(error));
}

void EngineImpl::sample_and_emit(const ScheduledBatch& scheduled, const ForwardResult& result) {
  int32_t num_decodes = 0;
  const SteadyTime now = std::chrono::steady_clock::now();
  const bool any_device_sampled = !result.sampled_token_ids.empty();
  // Rows that come back as logits are sampled here: each is one request's own
  // state (sampler, matcher, detokenizer), so on a device backend (whose host
  // cores are otherwise idle) several run in parallel (a structured-output row
  // masks and reads its whole vocabulary row; one drawn on the device still
  // moves its grammar on); what they produce is emitted in row order on this
  // thread (backend_capabilities.h host_cores_idle: not on the CPU backend,
  // which keeps its cores for the forward; a CUDA tensor-parallel group, which
  // samples on the host, is where it pays most).
  std::vector<std::optional<RequestOutput>> outputs(scheduled.requests.size());
  struct RowWork {
    size_t row;
    std::optional<size_t> logits_row;  // none: drawn on the device
  };
  std::vector<RowWork> work;
  size_t num_host_rows = 0;  // result.logits holds only the rows not sampled on the device
  for (size_t row = 0; row < scheduled.requests.size(); ++row) {
    const bool device_sampled = any_device_sampled && result.sampled_token_ids[row] >= 0;
    const size_t logits_row = device_sampled ? 0 : num_host_rows++;
    if (!scheduled.requests[row].samples_next_token) continue;
    if (!device_sampled) work.push_back({row, logits_row});
    else if (active_.at(scheduled.requests[row].id)->matcher) work.push_back({row, std::nullopt});
  }
  auto run_row = [&](const RowWork& item) {
    PendingRequest& request = *active_.at(scheduled.requests[item.row].id);
    outputs[item.row] =
        item.logits_row
            ? request.on_logits(result.logits.data() + *item.logits_row * static_cast<size_t>(result.vocab_size),
                                result.vocab_size, eos_ids_)
            : request.on_device_token({result.sampled_token_ids[item.row], result.sampled_logprobs[item.row], {}},
                                      eos_ids_);
  };
  if (!capabilities_.host_cores_idle || work.size() <= 1) {
    for (const RowWork& item : work) run_row(item);
  } else {
    host_workers().start(work.size(), [&](size_t i) { run_row(work[i]); }).wait();  // rethrows what a row threw
  }
  for (size_t row = 0; row < scheduled.requests.size(); ++row) {
    const ScheduledRequest& entry = scheduled.requests[row];
    if (!entry.samples_next_token) continue;
    if (entry.num_new_tokens == 1) ++num_decodes;
    RequestOutput output = outputs[row] ? std::move(*outputs[row])
                                        : active_.at(entry.id)->on_device_token(
                                              {result.sampled_token_ids[row], result.sampled_logprobs[row], {}}, eos_ids_);
    on_token(entry.id, std::move(output), now);
  }
  if (num_decodes > 0) step_stats_.add_decode_batch(num_decodes);
}

void EngineImpl::on_token(int64_t id, RequestOutput output, SteadyTime now) {
  PendingRequest& request = *active_.at(id);
  if (!request.first_token_at) {
    request.first_token_at = now;
    step_stats_.add_first_token(seconds_between(request.submitted_at, now),
                                seconds_between(*request.first_scheduled_at, now));
  } else {
    step_stats_.add_next_token(seconds_between(*request.last_token_at, now));
  }
  request.last_token_at = now;
  if (output.finished) {
    end_request(id, std::move(output));
  } else {
    scheduler_->append_token(id, output.new_tokens.back().token_id);
    emit(request, std::move(output));
  }
}

}  // namespace loom
