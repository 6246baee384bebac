// CudaBackend's step (cuda_backend_impl.h): plan and upload, the model's pass
// (eagerly or by replaying a captured CUDA graph), the draw that needs the
// host's masks or logit edits, and the copy back.
#include <algorithm>
#include <cstddef>

#include "backend/batch_checks.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "util/error.h"

namespace loom::cuda {

void CudaBackend::plan_step(const Batch& batch, bool for_graph) {
  check_device_sampling(batch);
  const KvCacheShape main = pools_.main_shape();
  const ResidualCacheShape residual = pools_.residual_shape();
  validate_batch(batch,
                 {rank_.model_vocab_size, main.num_blocks, main.block_size, residual.num_blocks, residual.block_size,
                  residual.max_rank, config_.qk_norm},
                 lora_.adapters());
  int32_t residual_rank = 0;
  for (const BatchSequence& sequence : batch.sequences)
    if (sequence.forked_adapter_slot >= 0)
      residual_rank = std::max(residual_rank, lora_.kv_rank(sequence.forked_adapter_slot));
  PlanShape shape{main.block_size, config_.num_heads, config_.num_kv_heads, num_sms_, decode_ctas_per_sm_};
  shape.wide_prefill = wide_prefill_;
  // The rebuild serves k/v ranks 1..64; a batch whose forked adapters carry no
  // k/v LoRA has nothing to rebuild (its main-cache K/V is whole) and stays narrow.
  shape.forked_wide_prefill_keys =
      residual_rank > 0 && wide_prefill_ ? std::max(tuning_.forked_wide_prefill_keys, int32_t{0}) : 0;
  if (residual_rank > 0) {
    int32_t& ctas = forked_decode_ctas_per_sm_[residual_rank];
    if (ctas == 0) ctas = attention_decode_ctas_per_sm(config_.head_dim, residual_rank);
    shape.forked_decode_ctas_per_sm = ctas;
  }
  StepPlan& plan = plan_.plan();
  plan.build(batch, shape, residual.block_size);
  const bool listened = batch.kv_layer_listener != nullptr;  // per-layer events: an eager step
  if (for_graph && !batch.capture_hidden_states && !listened) plan.pad_for_graph(tuning_.max_graph_rows);
  // LoRA groups on the side stream fork and join through events; those steps keep plain launches (as do
  // steps with a KV listener, whose events sit between the layers' kernels).
  step_ = {stream_, plan.num_rows() <= tuning_.programmatic_max_rows && !lora_.forks(plan) && !listened, residual_rank,
           batch.capture_hidden_states};
  if (listened) {
    if (layer_events_.empty()) {
      layer_events_.resize(config_.num_layers);
      for (cudaEvent_t& event : layer_events_) LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
    step_.kv_listener = batch.kv_layer_listener;
    step_.layer_events = layer_events_.data();
  }
  guided_ = DeviceSampler::guided(plan.sampling_rows(), batch.num_token_mask_rows);
}

void CudaBackend::prepare_step() {
  const StepPlan& plan = plan_.plan();
  buffers_.grow(plan, config_, step_.capture_hidden_states, model_.fp8());
  lora_.prepare(plan);
  sampler_.grow(plan.num_logit_launch_rows());
  vocab_gather_.grow(plan.num_logit_launch_rows());
  // The scratch was taken with the rCache for the plan's whole budget (allocate_residual_cache).
  LOOM_CHECK(plan.num_scratch_keys() <= pools_.scratch_keys());
  plan_.upload(stream_);
}

float* CudaBackend::whole_logits() {
  return vocab_gather_.active() ? vocab_gather_.whole() : buffers_.logits.as<float>();
}

void CudaBackend::enqueue_kernels(bool with_sampling) {
  runner_.enqueue(step_);
  const StepPlan& plan = plan_.plan();
  vocab_gather_.enqueue(buffers_.logits.as<float>(), plan.num_logit_launch_rows(), stream_);
  if (with_sampling && !plan.sampling_rows().empty())
    sampler_.enqueue_draw(whole_logits(), plan.num_logit_launch_rows(),
                          plan_.pointer<SamplingRow>(plan.sections().sampling), Launch(stream_, step_.programmatic));
  prefetcher_.end_step(stream_);  // a captured step must join every stream it forked
}

void CudaBackend::enqueue_guided_draw(std::span<const uint32_t> token_masks) {
  const StepPlan& plan = plan_.plan();
  LOOM_CHECK(!plan.sampling_rows().empty());  // check_device_sampling: masks and edits come with sampling rows
  sampler_.enqueue_guided_draw(whole_logits(), plan.num_logit_launch_rows(),
                               plan_.pointer<SamplingRow>(plan.sections().sampling), token_masks,
                               batch_->num_token_mask_rows, batch_->logit_edits, stream_);
}

KvPoolMemory CudaBackend::kv_pool_memory(KvPoolKind pool) {
  KvPoolMemory memory;
  memory.kind = KvPoolMemory::Kind::kCuda;
  memory.device = device_;
  const bool main = pool == KvPoolKind::kMain;
  memory.arrays_per_layer = main ? 2 : 1;
  memory.num_blocks = main ? pools_.main_shape().num_blocks : pools_.residual_shape().num_blocks;
  memory.bytes_per_block = static_cast<int64_t>(pools_.device_bytes_per_block(pool));
  if (memory.num_blocks == 0) return memory;
  const HostKvTier::DevicePool arrays = pools_.device_pool(pool);  // array a at data + a * stride
  for (int32_t a = 0; a < pools_.num_arrays(pool); ++a)
    memory.arrays.push_back(static_cast<std::byte*>(arrays.data) + static_cast<size_t>(a) * arrays.array_stride_bytes);
  memory.devices = {device_};
  memory.allocations = {static_cast<std::byte*>(main ? pools_.main_allocation() : pools_.residual_allocation())};
  return memory;
}

std::vector<const void*> CudaBackend::graph_addresses() const {
  std::vector<const void*> addresses = buffers_.addresses();
  for (const void* address : lora_.buffers()) addresses.push_back(address);
  addresses.push_back(sampler_.device_address());
  for (const void* address : vocab_gather_.addresses()) addresses.push_back(address);
  addresses.push_back(plan_.device_data());
  addresses.push_back(pools_.main_base());
  addresses.push_back(pools_.residual_pool(0));
  return addresses;
}

void CudaBackend::enqueue_step(const Batch& batch, std::span<const uint32_t> token_masks) {
  plan_step(batch, false);
  if (plan_.plan().num_tokens() == 0) return;
  prepare_step();
  enqueue_kernels(!guided_);
  if (guided_) {
    batch_ = &batch;
    enqueue_guided_draw(token_masks);
    batch_ = nullptr;
  }
}

void CudaBackend::enqueue_forward(const Batch& batch) {
  use_device();
  if (batch_ != nullptr) {  // the previous step was abandoned (its caller failed before the finish)
    batch_ = nullptr;
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  plan_step(batch, tuning_.cuda_graphs);
  if (plan_.plan().num_tokens() == 0) {
    batch_ = &batch;
    return;
  }
  prepare_step();
  if (plan_.plan().is_padded()) {
    // A graph holds the buffers' addresses: when one has grown, none is valid.
    graphs_.check_addresses(graph_addresses());
    const GraphCache::Key key{plan_.plan().launch_counts(), step_.residual_rank, lora_.max_rank(), !guided_};
    graphs_.run(key, stream_, [&] { enqueue_kernels(!guided_); });
  } else {
    enqueue_kernels(!guided_);
    graphs_.count_eager_step();
  }
  batch_ = &batch;
}

ForwardResult CudaBackend::finish_forward(std::span<const uint32_t> token_masks) {
  if (batch_ == nullptr) fail(ErrorKind::kInternal, "finish_forward without enqueue_forward");
  struct Done {  // the step ends here whatever happens
    const Batch*& batch;
    ~Done() { batch = nullptr; }
  } done{batch_};
  ForwardResult result;
  result.vocab_size = vocab_gather_.vocab_size();  // a tensor-parallel rank's: the whole vocabulary
  const StepPlan& plan = plan_.plan();
  if (plan.num_tokens() == 0) return result;
  if (guided_) enqueue_guided_draw(token_masks);
  const size_t num_rows = plan.logit_rows().size();
  const size_t vocab = static_cast<size_t>(result.vocab_size);
  const std::vector<SamplingRow>& sampling = plan.sampling_rows();
  const float* logits = whole_logits();
  // With device sampling only the rows left to the host travel, packed in row
  // order; of a tensor-parallel group's whole logits, rank 0's copy alone.
  const size_t num_host_rows = vocab_gather_.active() && rank_.shard.rank != 0 ? 0
                               : sampling.empty()                              ? num_rows
                                                                               : num_rows - plan.num_device_sampled_rows();
  logits_host_.reserve(std::max<size_t>(num_host_rows * vocab, 1) * sizeof(float));
  if (sampling.empty()) {
    if (num_host_rows > 0)
      LOOM_CUDA_CHECK(cudaMemcpyAsync(logits_host_.data(), logits, num_rows * vocab * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_));
  } else {
    sampler_.enqueue_copy_to_host(plan.num_logit_launch_rows(), stream_);
    for (size_t row = 0, host_row = 0; row < num_rows && num_host_rows > 0; ++row) {
      if (sampling[row].on_device) continue;
      LOOM_CUDA_CHECK(cudaMemcpyAsync(logits_host_.as<float>() + host_row++ * vocab, logits + row * vocab,
                                      vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
  }
  if (step_.capture_hidden_states) {
    result.hidden_states.resize((config_.num_layers + 1) * num_rows * config_.hidden_size);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(result.hidden_states.data(), buffers_.hidden_states.data(),
                                    result.hidden_states.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  result.logits.assign(logits_host_.as<float>(), logits_host_.as<float>() + num_host_rows * vocab);
  if (!sampling.empty()) {
    const int32_t* tokens = sampler_.host_results();
    result.sampled_token_ids.assign(tokens, tokens + num_rows);
    const float* logprobs = reinterpret_cast<const float*>(tokens + plan.num_logit_launch_rows());
    result.sampled_logprobs.assign(logprobs, logprobs + num_rows);
  }
  result.logit_token_index = plan.logit_tokens();
  return result;
}

ForwardResult CudaBackend::forward(const Batch& batch) {
  if (batch.num_token_mask_rows > 0)
    fail(ErrorKind::kInvalidArgument, "forward(): {} token mask rows need enqueue_forward / finish_forward",
         batch.num_token_mask_rows);
  enqueue_forward(batch);
  return finish_forward({});
}

}  // namespace loom::cuda
