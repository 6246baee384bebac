#include "backend/cuda/lora_launcher.h"

#include <algorithm>

#include "backend/batch_checks.h"
#include "backend/cuda/cuda_check.h"
#include "util/error.h"

namespace loom::cuda {

LoraLauncher::LoraLauncher(const ModelConfig& config, int32_t num_slots, bool side_stream)
    : config_(config),
      side_stream_(side_stream),
      adapters_(num_slots),
      kv_rank_of_slot_(num_slots, 0),
      table_(num_slots, config) {
  max_splits_ = lora_splits(std::max({config_.hidden_size, config_.q_size(), config_.intermediate_size}));
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
}

LoraLauncher::~LoraLauncher() {
  cudaEventDestroy(fork_);
  cudaEventDestroy(join_);
  cudaStreamDestroy(stream_);
}

void LoraLauncher::set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter, cudaStream_t stream) {
  if (slot < 0 || slot >= num_slots())
    fail(ErrorKind::kInvalidArgument, "cuda backend: adapter slot {} outside [0, {})", slot, num_slots());
  if (adapter != nullptr) {
    validate_adapter(*adapter, config_);
    if (adapter->max_rank() > kLoraMaxRank)
      fail(ErrorKind::kUnsupported, "adapter '{}': rank {} above the cuda backend's {}", adapter->name,
           adapter->max_rank(), kLoraMaxRank);
  }
  table_.set(slot, adapter.get(), stream);
  kv_rank_of_slot_[slot] = adapter != nullptr ? adapter->max_kv_rank() : 0;
  adapters_[slot] = std::move(adapter);
}

bool LoraLauncher::gate_up_bf16() const {
#ifdef LOOM_CUDA_MEASURE
  if (measure_.lora_f32_gate_up) return false;
#endif
  return true;
}

void LoraLauncher::prepare(const StepPlan& plan) {
  max_rank_ = table_.max_rank();
  if (plan.num_lora_rows() == 0) return;
  const size_t rows = static_cast<size_t>(plan.num_lora_rows());
  const size_t qkv = static_cast<size_t>(config_.q_size()) + 2 * config_.kv_size();
  v_.reserve(3 * static_cast<size_t>(max_splits_) * rows * max_rank_ * sizeof(float));
  out_.reserve(rows * std::max({qkv, 2 * static_cast<size_t>(config_.intermediate_size),
                                static_cast<size_t>(config_.hidden_size)}) *
               sizeof(float));
}

bool LoraLauncher::forks(const StepPlan& plan) const {
  if (plan.num_lora_tiles() == 0 || !side_stream_) return false;
#ifdef LOOM_CUDA_MEASURE
  if (measure_.lora_side_groups == 0) return false;
#endif
  return true;
}

void LoraLauncher::launch_group(int group, const LoraParams& params, Launch launch, bool shrink_sums_read) {
#ifdef LOOM_CUDA_MEASURE
  LoraVariant variant;
  const auto kernel = measure_.lora_kernel;
  variant.fused = kernel == CudaMeasureSwitches::LoraKernel::kFused ||
                  (kernel == CudaMeasureSwitches::LoraKernel::kFusedAttention && group <= 1);
  // The rCache writes read the split path's shrink sums (QkvParams::lora_v).
  if (shrink_sums_read) variant.fused = false;
  variant.expand_columns = measure_.lora_expand_columns;
  variant.programmatic_expand = measure_.lora_pdl_expand;
  variant.skip = static_cast<int32_t>(measure_.lora_skip >> (2 * group) & 3);
  launch_lora_variant(params, launch, variant);
#else
  (void)group;
  (void)shrink_sums_read;
  launch_lora(params, launch);
#endif
}

LoraLauncher::Pending LoraLauncher::begin(const DevicePlan& device_plan, int layer,
                                          std::initializer_list<LoraTarget> targets, const __nv_bfloat16* x,
                                          int32_t x_stride, int32_t width, Launch main) {
  const StepPlan& plan = device_plan.plan();
  if (plan.num_lora_tiles() == 0) return Pending::kNone;
  const PlanSections& sections = plan.sections();
  LoraParams params;
  params.modules = table_.device_table();
  params.num_layers = config_.num_layers;
  params.layer = layer;
  params.sorted_tokens = device_plan.pointer<int32_t>(sections.lora_tokens);
  params.tiles = device_plan.pointer<LoraTile>(sections.lora_tiles);
  params.num_tiles = plan.num_lora_tiles();
  params.num_rows = plan.num_lora_rows();
  params.max_rank = max_rank_;
  params.x = x;
  params.x_stride = x_stride;
  params.v = v_.as<float>();
  params.max_splits = max_splits_;
  params.y = out_.data();
  // gate/up's delta (the widest, read by SwiGLU, which rounds to bf16 anyway) travels as bf16.
  params.y_is_bf16 = gate_up_bf16() && *targets.begin() == LoraTarget::kGate;
  params.y_stride = width;
  params.write_by_lora_row = true;
  const int32_t hidden = config_.hidden_size;
  const int32_t q_size = config_.q_size();
  const int32_t kv_size = config_.kv_size();
  const int32_t intermediate = config_.intermediate_size;
  for (LoraTarget target : targets) {
    LoraTargetArgs& args = params.targets[params.num_targets++];
    args.target = static_cast<int32_t>(target);
    switch (target) {
      case LoraTarget::kQ: args = {args.target, hidden, q_size, 0}; break;
      case LoraTarget::kK: args = {args.target, hidden, kv_size, q_size}; break;
      case LoraTarget::kV: args = {args.target, hidden, kv_size, q_size + kv_size}; break;
      case LoraTarget::kO: args = {args.target, q_size, hidden, 0}; break;
      case LoraTarget::kGate: args = {args.target, hidden, intermediate, 0}; break;
      case LoraTarget::kUp: args = {args.target, hidden, intermediate, intermediate}; break;
      case LoraTarget::kDown: args = {args.target, intermediate, hidden, 0}; break;
    }
  }
  const LoraTarget first = *targets.begin();
  const int group = first == LoraTarget::kQ ? 0 : first == LoraTarget::kO ? 1 : first == LoraTarget::kGate ? 2 : 3;
  const bool shrink_sums_read = group == 0 && plan.has_residual_writes();
  bool side = side_stream_;
#ifdef LOOM_CUDA_MEASURE
  side = side && (measure_.lora_side_groups >> group & 1) != 0;
#endif
  if (!side) {
    launch_group(group, params, main, shrink_sums_read);
    return Pending::kInline;
  }
  // The shrink and expand read x and write only out_: they overlap the base GEMM.
  LOOM_CUDA_CHECK(cudaEventRecord(fork_, main.stream));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
  launch_group(group, params, stream_, shrink_sums_read);
  LOOM_CUDA_CHECK(cudaEventRecord(join_, stream_));
  return Pending::kSide;
}

const float* LoraLauncher::end(Pending pending, cudaStream_t main) {
  if (pending == Pending::kNone) return nullptr;
  if (pending == Pending::kSide) LOOM_CUDA_CHECK(cudaStreamWaitEvent(main, join_, 0));
  return out_.as<float>();
}

}  // namespace loom::cuda
