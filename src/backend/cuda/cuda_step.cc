// CudaBackend's step (cuda_backend_impl.h): plan and upload, enqueue the
// layers (eagerly or by replaying a captured CUDA graph), the draw that needs
// the host's masks or logit edits after the model's work, and the copy back.
// The pools, adapters and layer kernels are cuda_backend.cc's.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "backend/batch_checks.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/sampling.h"
#include "util/error.h"

namespace loom::cuda {

void CudaBackend::plan_step(const Batch& batch, bool for_graph) {
  check_device_sampling(batch);
  validate_batch(batch,
                 {config_.vocab_size, kv_shape_.num_blocks, kv_shape_.block_size, residual_shape_.num_blocks,
                  residual_shape_.block_size, residual_shape_.max_rank, config_.qk_norm},
                 adapters_);
  residual_rank_ = 0;
  for (const BatchSequence& sequence : batch.sequences)
    if (sequence.forked_adapter_slot >= 0)
      residual_rank_ = std::max(residual_rank_, kv_rank_of_slot_[sequence.forked_adapter_slot]);
  PlanShape shape{kv_shape_.block_size, config_.num_heads, config_.num_kv_heads, num_sms_, decode_ctas_per_sm_};
  shape.wide_prefill = wide_prefill_;
  // The rebuild serves k/v ranks 1..64; a batch whose forked adapters carry no
  // k/v LoRA has nothing to rebuild (its main-cache K/V is whole) and stays narrow.
  shape.forked_wide_prefill_keys = residual_rank_ > 0 ? forked_wide_prefill_keys_ : 0;
  if (residual_rank_ > 0) {
    int32_t& ctas = forked_decode_ctas_per_sm_[residual_rank_];
    if (ctas == 0) ctas = attention_decode_ctas_per_sm(config_.head_dim, residual_rank_);
    shape.forked_decode_ctas_per_sm = ctas;
  }
  plan_.build(batch, shape, residual_shape_.block_size);
  capture_hidden_states_ = batch.capture_hidden_states;
  if (for_graph && !capture_hidden_states_) plan_.pad_for_graph(max_graph_rows_);
  // LoRA groups on the side stream fork and join through events; those steps keep plain launches.
  const bool side_stream = plan_.num_lora_tiles() > 0 && lora_overlap_ != LoraOverlap::kInline && lora_side_groups_ != 0;
  step_programmatic_ = plan_.num_rows() <= programmatic_max_rows_ && !side_stream;
}

void CudaBackend::upload_plan() {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LOOM_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  // Steps may be enqueued back to back (benchmarks): the previous upload must
  // have left plan_host_ before it is overwritten. A captured graph replays the
  // copy from plan_host_ as it is at launch time.
  if (!capturing) LOOM_CUDA_CHECK(cudaEventSynchronize(plan_copied_));
  grow_buffers();
  std::memcpy(plan_host_.data(), plan_.words().data(), plan_.words().size() * sizeof(int32_t));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(plan_device_.data(), plan_host_.data(), plan_.words().size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_));
  if (!capturing) LOOM_CUDA_CHECK(cudaEventRecord(plan_copied_, stream_));
}

void CudaBackend::enqueue_forward(const Batch& batch) {
  plan_step(batch, false);
  if (plan_.num_tokens() == 0) return;
  upload_plan();
  const bool guided = guided_sampling(batch);
  enqueue_kernels(!guided);
  if (guided) enqueue_guided_sampling(batch);
}

static_assert(sizeof(LogitEdit) == sizeof(DeviceLogitEdit) && offsetof(LogitEdit, token) == offsetof(DeviceLogitEdit, token) &&
                  offsetof(LogitEdit, bias) == offsetof(DeviceLogitEdit, bias) &&
                  offsetof(LogitEdit, subtract) == offsetof(DeviceLogitEdit, subtract) &&
                  offsetof(LogitEdit, repeated) == offsetof(DeviceLogitEdit, repeated),
              "the edits are copied to the device as they are");

bool CudaBackend::guided_sampling(const Batch& batch) const {
  if (batch.num_token_mask_rows > 0) return true;
  const std::vector<SamplingRow>& rows = plan_.sampling_rows();
  return std::any_of(rows.begin(), rows.end(), [](const SamplingRow& row) { return processes_logits(row); });
}

void CudaBackend::enqueue_guided_sampling(const Batch& batch) {
  LOOM_CHECK(!plan_.sampling_rows().empty());  // check_device_sampling: masks and edits come with sampling rows
  const PlanSections& sections = plan_.sections();
  const int32_t num_rows = plan_.num_logit_launch_rows();
  const SamplingRow* rows = plan_pointer<SamplingRow>(sections.sampling);
  int32_t* token_ids = sampled_.as<int32_t>();
  float* logprobs = reinterpret_cast<float*>(sampled_.as<int32_t>() + num_rows);
  // Steps may be enqueued back to back (enqueue_forward): the previous uploads
  // from the pinned buffers must be done before they are refilled.
  LOOM_CUDA_CHECK(cudaEventSynchronize(guided_copied_));
  if (batch.num_token_mask_rows > 0) {
    const int32_t words = (config_.vocab_size + 31) / 32;
    const size_t bytes = static_cast<size_t>(batch.num_token_mask_rows) * words * sizeof(uint32_t);
    token_masks_host_.reserve(bytes);
    token_masks_.reserve(bytes);
    batch.fill_token_masks(token_masks_host_.as<uint32_t>(), words);
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(token_masks_.data(), token_masks_host_.data(), bytes, cudaMemcpyHostToDevice, stream_));
    launch_apply_token_masks(logits_.as<float>(), num_rows, config_.vocab_size, rows, token_masks_.as<uint32_t>(), words,
                             stream_);
  }
  const size_t num_edits = batch.logit_edits.size();
  logit_edits_.reserve(std::max<size_t>(num_edits, 1) * sizeof(LogitEdit));
  edit_originals_.reserve(std::max<size_t>(num_edits, 1) * sizeof(float));
  raw_lse_.reserve(static_cast<size_t>(num_rows) * sizeof(float));
  if (num_edits > 0) {
    logit_edits_host_.reserve(num_edits * sizeof(LogitEdit));
    std::memcpy(logit_edits_host_.data(), batch.logit_edits.data(), num_edits * sizeof(LogitEdit));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(logit_edits_.data(), logit_edits_host_.data(), num_edits * sizeof(LogitEdit),
                                    cudaMemcpyHostToDevice, stream_));
  }
  LOOM_CUDA_CHECK(cudaEventRecord(guided_copied_, stream_));
  launch_process_logits(logits_.as<float>(), num_rows, config_.vocab_size, rows, logit_edits_.as<DeviceLogitEdit>(),
                        edit_originals_.as<float>(), raw_lse_.as<float>(), stream_);
  launch_sampling(logits_.as<float>(), num_rows, config_.vocab_size, rows, token_ids, logprobs, stream_);
  launch_raw_logprobs(logits_.as<float>(), num_rows, config_.vocab_size, rows, logit_edits_.as<DeviceLogitEdit>(),
                      edit_originals_.as<float>(), raw_lse_.as<float>(), token_ids, logprobs, stream_);
}

void CudaBackend::enqueue_kernels(bool with_sampling) {
  const PlanSections& sections = plan_.sections();
  const int32_t n = plan_.num_rows();
  const int32_t hidden = config_.hidden_size;
  // Eager steps leave it out: two more API calls a layer cost more host time than the overlap saves.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LOOM_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
  step_prefetch_ = capture != cudaStreamCaptureStatusNone && n <= l2_prefetch_.max_rows &&
                   (l2_prefetch_.o_proj > 0 || l2_prefetch_.gate_up > 0 || l2_prefetch_.qkv > 0);
  launch_embedding(plan_pointer<int32_t>(sections.token_ids), n, model_.embed_tokens(), hidden, residual_.as<float>(),
                   stream_);
  if (capture_hidden_states_) capture_hidden_states(0, nullptr);
  const float* lora_delta = nullptr;
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    lora_delta = run_layer(layer, lora_delta);
    if (capture_hidden_states_) capture_hidden_states(layer + 1, lora_delta);
  }

  const int32_t num_rows = plan_.num_logit_launch_rows();
  launch_add_rms_norm(residual_.as<float>(), delta_.as<float>(), nullptr, model_.final_norm(), config_.rms_norm_eps,
                      hidden, plan_pointer<int32_t>(sections.logit_rows), num_rows, normed_.as<__nv_bfloat16>(),
                      chain(), lora_delta, plan_pointer<int32_t>(sections.lora_row_of_token));
  linear(normed_.as<__nv_bfloat16>(), num_rows, hidden, model_.lm_head(), config_.vocab_size, logits_.data(), false,
         config_.vocab_size);
  if (with_sampling && !plan_.sampling_rows().empty())
    launch_sampling(logits_.as<float>(), num_rows, config_.vocab_size, plan_pointer<SamplingRow>(sections.sampling),
                    sampled_.as<int32_t>(), reinterpret_cast<float*>(sampled_.as<int32_t>() + num_rows), chain());
  if (prefetch_forked_) {  // a captured step must join every stream it forked
    LOOM_CUDA_CHECK(cudaEventRecord(prefetch_join_, prefetch_stream_));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, prefetch_join_, 0));
    prefetch_forked_ = false;
  }
}

std::vector<const void*> CudaBackend::graph_buffers() const {
  return {residual_.data(), delta_.data(),     normed_.data(),       qkv_.data(),           q_.data(),
          attention_out_.data(), gate_up_.data(), activation_.data(), lora_v_.data(),   lora_out_.data(),
          partial_out_.data(), partial_lse_.data(), logits_.data(),   sampled_.data(),       plan_device_.data(),
          kv_pool_.data(),  residual_pool_.data(), lora_table_->device_table()};
}

void CudaBackend::clear_graphs() {
  for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
  graphs_.clear();
}

void CudaBackend::run_graph(bool with_sampling) {
  // A graph holds the buffers' addresses: when one has grown, none is valid.
  std::vector<const void*> buffers = graph_buffers();
  if (buffers != graph_buffers_) {
    clear_graphs();
    graph_buffers_ = std::move(buffers);
  }
  const GraphKey key{plan_.launch_counts(), residual_rank_, lora_max_rank_, with_sampling};
  const int64_t now = graph_stats_.captures + graph_stats_.replays;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    LOOM_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
    it->second.last_used = now;
    ++graph_stats_.replays;
    return;
  }
  // First step of this shape: run it eagerly, then record the same launches
  // (capture runs nothing) for the next steps of the shape.
  enqueue_kernels(with_sampling);
  if (graphs_.size() >= kMaxGraphs) {
    auto oldest = std::min_element(graphs_.begin(), graphs_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    cudaGraphExecDestroy(oldest->second.exec);
    graphs_.erase(oldest);
    ++graph_stats_.evictions;
  }
  cudaGraph_t graph = nullptr;
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_kernels(with_sampling);
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  LOOM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  LOOM_CUDA_CHECK(status);
  graphs_.emplace(key, CapturedGraph{exec, now});
  ++graph_stats_.captures;
}

std::vector<CacheGauge> CudaBackend::cache_gauges() const {
  CacheGauge graphs{"cuda_graphs", static_cast<int64_t>(graphs_.size()), static_cast<int64_t>(kMaxGraphs), -1,
                    graph_stats_.evictions};
  return {graphs, gemm_->cache_gauge()};
}

ForwardResult CudaBackend::finish_forward() {
  ForwardResult result;
  result.vocab_size = config_.vocab_size;
  if (plan_.num_tokens() == 0) return result;
  const size_t num_rows = plan_.logit_rows().size();
  const size_t launch_rows = static_cast<size_t>(plan_.num_logit_launch_rows());  // padded rows after the real ones
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  const std::vector<SamplingRow>& sampling = plan_.sampling_rows();
  // With device sampling only the rows left to the host travel, packed in row order.
  const size_t num_host_rows = sampling.empty() ? num_rows : num_rows - plan_.num_device_sampled_rows();
  logits_host_.reserve(std::max<size_t>(num_host_rows * vocab, 1) * sizeof(float));
  if (sampling.empty()) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(logits_host_.data(), logits_.data(), num_rows * vocab * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  } else {
    sampled_host_.reserve(launch_rows * 2 * sizeof(int32_t));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(sampled_host_.data(), sampled_.data(), launch_rows * 2 * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream_));
    for (size_t row = 0, host_row = 0; row < num_rows; ++row) {
      if (sampling[row].on_device) continue;
      LOOM_CUDA_CHECK(cudaMemcpyAsync(logits_host_.as<float>() + host_row++ * vocab, logits_.as<float>() + row * vocab,
                                      vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
  }
  if (capture_hidden_states_) {
    result.hidden_states.resize((config_.num_layers + 1) * num_rows * config_.hidden_size);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(result.hidden_states.data(), hidden_states_.data(),
                                    result.hidden_states.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  result.logits.assign(logits_host_.as<float>(), logits_host_.as<float>() + num_host_rows * vocab);
  if (!sampling.empty()) {
    const int32_t* tokens = sampled_host_.as<int32_t>();
    result.sampled_token_ids.assign(tokens, tokens + num_rows);
    const float* logprobs = reinterpret_cast<const float*>(tokens + launch_rows);
    result.sampled_logprobs.assign(logprobs, logprobs + num_rows);
  }
  result.logit_token_index = plan_.logit_tokens();
  return result;
}

ForwardResult CudaBackend::forward(const Batch& batch) {
  use_device();
  plan_step(batch, graphs_enabled_);
  if (plan_.num_tokens() > 0) {
    upload_plan();
    const bool guided = guided_sampling(batch);
    if (plan_.is_padded()) {
      run_graph(!guided);
    } else {
      enqueue_kernels(!guided);
      ++graph_stats_.eager_steps;
    }
    if (guided) enqueue_guided_sampling(batch);
  }
  return finish_forward();
}

}  // namespace loom::cuda
