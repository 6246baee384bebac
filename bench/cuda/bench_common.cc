#include "bench_common.h"

#include <algorithm>
#include <cmath>

#include "synthetic/synthetic_model.h"

namespace loom::cuda::bench {

Batch decode_batch(int batch_size, const std::vector<int32_t>& slots, Prng& prng, int vocab) {
  Batch batch;
  const int blocks_per_sequence = kContext / kBlockSize;
  for (int s = 0; s < batch_size; ++s) {
    BatchSequence sequence;
    sequence.num_computed_tokens = kContext - 1;
    sequence.num_new_tokens = 1;
    sequence.token_offset = s;
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = blocks_per_sequence;
    const int group = s % kContextGroups;
    for (int b = 0; b < blocks_per_sequence - 1; ++b) batch.block_tables.push_back(group * (blocks_per_sequence - 1) + b);
    batch.block_tables.push_back(kContextGroups * (blocks_per_sequence - 1) + s);
    batch.sequences.push_back(sequence);
    batch.token_ids.push_back(static_cast<int32_t>(prng.next_below(vocab)));
    batch.positions.push_back(kContext - 1);
    batch.adapter_slots.push_back(slots.empty() ? -1 : slots[s % slots.size()]);
  }
  return batch;
}

Batch prefill_batch(int num_tokens, Prng& prng, int vocab) {
  Batch batch;
  BatchSequence sequence;
  sequence.num_new_tokens = num_tokens;
  sequence.num_blocks = num_tokens / kBlockSize;
  batch.sequences.push_back(sequence);
  for (int t = 0; t < num_tokens; ++t) {
    batch.token_ids.push_back(static_cast<int32_t>(prng.next_below(vocab)));
    batch.positions.push_back(t);
    batch.adapter_slots.push_back(-1);
  }
  for (int b = 0; b < sequence.num_blocks; ++b) batch.block_tables.push_back(b);
  return batch;
}

StepTimes time_step(CudaBackend& backend, const Batch& batch, int iterations, bool with_graph) {
  Timer timer(backend.stream());
  for (int i = 0; i < 3; ++i) backend.enqueue_step(batch);  // grow buffers, load modules
  LOOM_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
  StepTimes times;
  times.eager_ms = timer.median_ms([&] { backend.enqueue_step(batch); }, iterations);
  if (with_graph) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    LOOM_CUDA_CHECK(cudaStreamBeginCapture(backend.stream(), cudaStreamCaptureModeThreadLocal));
    backend.enqueue_step(batch);
    LOOM_CUDA_CHECK(cudaStreamEndCapture(backend.stream(), &graph));
    LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) LOOM_CUDA_CHECK(cudaGraphLaunch(exec, backend.stream()));
    times.graph_ms = timer.median_ms([&] { LOOM_CUDA_CHECK(cudaGraphLaunch(exec, backend.stream())); }, iterations);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  return times;
}

double decode_floor_ms(const CudaBackend& backend, int batch_size) {
  const ModelConfig& config = backend.config();
  const double embedding = static_cast<double>(config.vocab_size) * config.hidden_size * 2;
  const double weights = static_cast<double>(backend.model().weight_bytes()) - embedding;
  const double kv = static_cast<double>(batch_size) * kContext * backend.kv_bytes_per_token();
  return (weights + kv) / peaks().bandwidth * 1e3;
}

DevicePeaks device_peaks(int device) {
  cudaDeviceProp properties{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  DevicePeaks result;
  result.name = properties.name;
  struct Known {
    const char* name_part;
    double bandwidth, bf16;
  };
  // NVIDIA datasheets (dense bf16, no sparsity). The first name part the device's name contains wins, so the
  // PCIe, NVL and 80GB parts come before their family's base entry (a bare H100 is the SXM part, a bare A100
  // the 40GB one).
  static const Known kKnown[] = {
      {"H200", 4.8e12, 989e12},          {"H100 PCIe", 2.0e12, 756e12},     {"H100 NVL", 3.9e12, 835e12},
      {"H100", 3.35e12, 989e12},         {"H800", 3.35e12, 989e12},         {"A100-SXM4-80GB", 2.039e12, 312e12},
      {"A100 80GB PCIe", 1.935e12, 312e12}, {"A100", 1.555e12, 312e12},     {"L40S", 0.864e12, 362e12},
  };
  for (const Known& known : kKnown) {
    if (result.name.find(known.name_part) == std::string::npos) continue;
    result.bandwidth = known.bandwidth;
    result.bf16 = known.bf16;
    result.source = std::string("NVIDIA datasheet for ") + known.name_part;
    break;
  }
  if (result.source.empty()) {
    int memory_khz = 0, bus_bits = 0, sm_khz = 0;
    cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, device);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
    cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, device);
    result.bandwidth = 2.0 * memory_khz * 1e3 * bus_bits / 8;  // double data rate
    result.bf16 = 4096.0 * properties.multiProcessorCount * sm_khz * 1e3;
    result.source = "derived from the device's clocks, bus width and SM count";
  }
  std::printf("peaks: %.2f TB/s, %.0f TFLOP/s dense bf16 (%s: %s)\n", result.bandwidth / 1e12, result.bf16 / 1e12,
              result.name.c_str(), result.source.c_str());
  return result;
}

const DevicePeaks& peaks() {
  static const DevicePeaks device_zero = device_peaks(0);
  return device_zero;
}

double prefill_flops(const ModelConfig& config, int64_t tokens) {
  const double hidden = config.hidden_size, q = config.q_size(), kv = config.kv_size(), inter = config.intermediate_size;
  const double linear_per_token = 2.0 * (hidden * (q + 2 * kv) + q * hidden + hidden * 2 * inter + inter * hidden);
  const double pairs = static_cast<double>(tokens) * (tokens + 1) / 2;
  const double attention_per_layer = 4.0 * config.num_heads * config.head_dim * pairs;
  return config.num_layers * (linear_per_token * tokens + attention_per_layer) + 2.0 * hidden * config.vocab_size;
}

double measure_copy_bandwidth(cudaStream_t stream) {
  const size_t bytes = 4ull << 30;
  DeviceBuffer a(bytes), b(bytes);
  LOOM_CUDA_CHECK(cudaMemsetAsync(a.data(), 1, bytes, stream));
  Timer timer(stream);
  const double ms = timer.median_ms([&] { LOOM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream)); }, 5);
  return 2.0 * bytes / (ms * 1e-3);
}

void make_forked(Batch& batch) {
  batch.residual_block_tables = batch.block_tables;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    BatchSequence& sequence = batch.sequences[s];
    sequence.forked_adapter_slot = batch.adapter_slots[sequence.token_offset];
    sequence.residual_block_table_offset = sequence.block_table_offset;
    sequence.num_residual_blocks = sequence.num_blocks;
    sequence.num_residual_present_tokens = sequence.num_computed_tokens;
  }
}

void make_base(Batch& batch) {
  for (BatchSequence& sequence : batch.sequences) {
    sequence.decoder_adapter_slot = batch.adapter_slots[sequence.token_offset];
    std::fill_n(batch.adapter_slots.begin() + sequence.token_offset, sequence.num_new_tokens, -1);
  }
}

double time_attention(CudaBackend& backend, const Batch& batch, int iterations, int32_t residual_rank, bool wide,
                      bool pingpong) {
  const ModelConfig& config = backend.config();
  StepPlan plan;
  PlanShape shape{kBlockSize, config.num_heads, config.num_kv_heads, 132, attention_decode_ctas_per_sm(config.head_dim),
                  residual_rank > 0 ? attention_decode_ctas_per_sm(config.head_dim, residual_rank) : 0};
  shape.wide_prefill = wide && attention_wide_supports_head_dim(config.head_dim);
  shape.forked_wide_prefill_keys = shape.wide_prefill ? CudaTuning{}.forked_wide_prefill_keys : 0;
  plan.build(batch, shape, kBlockSize);
  const size_t scratch_entries = static_cast<size_t>(plan.num_scratch_keys()) * config.kv_size();
  DeviceBuffer scratch(std::max<size_t>(2 * scratch_entries * 2, 16));
  DeviceBuffer plan_d(plan.words().size() * 4);
  LOOM_CUDA_CHECK(cudaMemcpy(plan_d.data(), plan.words().data(), plan.words().size() * 4, cudaMemcpyHostToDevice));
  const size_t n = batch.token_ids.size();
  DeviceBuffer q(n * config.q_size() * 2), out(n * config.q_size() * 2);
  launch_synthetic_fill_bf16(q.as<bf16>(), n * config.q_size(), 99, false, 2.0f, backend.stream());
  const size_t partial_rows = static_cast<size_t>(std::max(plan.num_partials(), 1)) * config.num_kv_heads * kAttentionMaxRows;
  DeviceBuffer partial_out(partial_rows * config.head_dim * 4), partial_lse(partial_rows * 4);
  AttentionParams params;
  params.q = q.as<bf16>();
  params.k_cache = backend.k_pool(0);
  params.v_cache = backend.v_pool(0);
  params.k_cache_fp8 = backend.kv_pools().k_pool_fp8(0);  // set (and k_cache null) for an FP8 cache
  params.v_cache_fp8 = backend.kv_pools().v_pool_fp8(0);
  const int32_t* words = plan_d.as<int32_t>();
  params.block_tables = words + plan.sections().block_tables;
  params.sequences = reinterpret_cast<const AttentionSequence*>(words + plan.sections().sequences);
  params.out = out.as<bf16>();
  params.partial_out = partial_out.as<float>();
  params.partial_lse = partial_lse.as<float>();
  params.num_heads = config.num_heads;
  params.num_kv_heads = config.num_kv_heads;
  params.head_dim = config.head_dim;
  params.block_size = kBlockSize;
  params.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  if (residual_rank > 0) {
    params.residual_pool = backend.residual_pool(0);
    params.residual_block_tables = words + plan.sections().residual_block_tables;
    params.residual_block_size = kBlockSize;
    params.residual_rank_stride = residual_rank_stride(backend.residual_cache_shape().max_rank);
    params.lora_modules = backend.device_lora_modules();
    params.num_layers = config.num_layers;
    params.layer = 0;
    params.inv_freq = backend.model().inverse_frequencies();
  }
  auto run = [&] {
    launch_attention(params, AttentionVariant::kPrefill,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().prefill_items),
                     plan.num_prefill_items(), backend.stream());
    launch_attention(params, pingpong ? AttentionVariant::kPrefillWidePingPong : AttentionVariant::kPrefillWide,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().wide_prefill_items),
                     plan.num_wide_prefill_items(), backend.stream());
    launch_attention(params, AttentionVariant::kDecode,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().decode_items),
                     plan.num_decode_items(), backend.stream());
    launch_attention(params, AttentionVariant::kPrefill,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_prefill_items),
                     plan.num_forked_prefill_items(), backend.stream(), residual_rank);
    launch_attention(params, AttentionVariant::kDecode,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_decode_items),
                     plan.num_forked_decode_items(), backend.stream(), residual_rank);
    launch_forked_wide_passes(params, plan.forked_wide_passes().data(), plan.forked_wide_passes().size(),
                              reinterpret_cast<const ResidualRebuildItem*>(words + plan.sections().rebuild_items),
                              reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_wide_items),
                              scratch.as<bf16>(), scratch.as<bf16>() + scratch_entries, backend.stream(), residual_rank);
    launch_attention_combine(params, reinterpret_cast<const AttentionCombineItem*>(words + plan.sections().combine_items),
                             plan.num_combine_items(), backend.stream());
  };
  for (int i = 0; i < 3; ++i) run();
  Timer timer(backend.stream());
  return timer.median_ms(run, iterations);
}

std::vector<int32_t> bind_rank16_adapters(Backend& backend, const ModelConfig& config) {
  SyntheticModelOptions options;
  options.num_adapters = 8;
  options.rank = 16;
  options.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const auto specs = synthetic_adapter_specs(options, config);
  std::vector<int32_t> slots;
  for (int a = 0; a < 8; ++a) {
    backend.set_adapter(a, std::make_shared<LoraAdapter>(make_synthetic_adapter(specs[a], config, 0)));
    slots.push_back(a);
  }
  return slots;
}

}  // namespace loom::cuda::bench
