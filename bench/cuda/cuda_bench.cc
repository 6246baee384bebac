// Benchmarks of the CUDA backend on the 8B-shape model (random bf16 weights
// drawn on the GPU, as `--model random:llama-8b`):
//   decode   step time at batch 1/16/64/256 with 2K-token contexts, eager and as
//            a CUDA graph, against the bandwidth floor (weight + KV bytes / the GPU's datasheet bandwidth);
//            with prefetch, skinny and rows the switches of 1-2 row steps; launches: each kind of
//            the step's kernels left out in turn (what it costs a graph step)
//            (decode_figures.cc; the shared setup and timing: bench_common.h)
//   prefill  one 8K-token prompt: model FLOPs utilisation against the GPU's dense bf16 peak
//   lora     8 distinct adapters (r=16, all seven projections) in a decode batch
//            of 64 against base only
//   sampling the device sampling kernel on a decode-64 step's logits (greedy and
//            T 0.8 / top-k 50 / top-p 0.9), and a whole step's wall time with
//            the logits copied to the host and sampled there vs sampled on the device
//   attention the attention kernels alone (decode 64 x 2K, prefill 8K causal),
//            to hold against torch's scaled_dot_product_attention (sdpa_reference.py)
//   sharing  the sharing modes (8 rank-16 adapters, all seven projections): the
//            ResidualAttention kernels against plain paged attention (decode 64 x
//            2K; a 1K chunk over an 8K cache), and decode-64 steps of forked and
//            base (ICaRus decoder rows) sequences against isolated ones
// Writes one JSON object (--out) and prints a short table. Times are medians of
// CUDA-event timings after warm-up; the logits' copy to the host is not timed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include <CLI/CLI.hpp>
#include <cuda_profiler_api.h>
#include <nlohmann/json.hpp>

#include "backend/cuda/sampling.h"
#include "bench_main.h"
#include "bench_common.h"
#include "engine/sampler.h"
#include "synthetic/synthetic_model.h"

namespace loom::cuda {
namespace {

using namespace bench;

int run(int argc, char** argv) {
  CLI::App app{"CUDA backend benchmarks (8B-shape model, random bf16 weights)"};
  std::string out_path = "cuda_bench.json";
  int iterations = 20;
  std::vector<int> batch_sizes = {1, 16, 64, 256};
  int prefill_tokens = 8192;
  app.add_option("--out", out_path, "JSON results");
  app.add_option("--iterations", iterations, "Timed repetitions per figure (median)");
  app.add_option("--batch-sizes", batch_sizes, "Decode batch sizes");
  app.add_option("--prefill-tokens", prefill_tokens, "Prompt length of the prefill figure");
  std::vector<std::string> parts = {"decode", "lora", "sampling", "prefill", "attention", "sharing"};
  app.add_option("--what", parts, "Figures to measure (decode prefetch skinny rows launches lora sampling prefill attention sharing)");
  bool fp8_weights = false;
  app.add_flag("--fp8-weights", fp8_weights, "Linear weights in FP8 (--quantization fp8): the floors count their bytes");
  bool fp8_kv = false;
  app.add_flag("--fp8-kv", fp8_kv, "An FP8 KV cache (--kv-cache-dtype fp8, scales 1): the floors count its bytes");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json results;
  results["device"] = cuda_device_description(0);
  results["peaks"] = {{"bandwidth_bytes_per_s", peaks().bandwidth}, {"bf16_flops", peaks().bf16},
                      {"source", peaks().source}};
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::k8b);
  const auto load_start = std::chrono::steady_clock::now();
  CudaBackendConfig backend_config;
  backend_config.max_adapter_slots = 8;
  backend_config.fp8_weights = fp8_weights;
  if (fp8_kv) backend_config.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  auto owner = make_synthetic_cuda_backend_impl(config, 0, true, backend_config);
  CudaBackend& backend = *owner;
  results["model"] = {{"name", "random:llama-8b"},
                      {"quantization", fp8_weights ? "fp8" : "none"},
                      {"kv_cache_dtype", fp8_kv ? "fp8_e4m3" : "bf16"},
                      {"weight_bytes", backend.model().weight_bytes()},
                      {"load_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count()}};
  const int blocks_per_sequence = kContext / kBlockSize;
  const int num_blocks = kContextGroups * (blocks_per_sequence - 1) + 256;
  backend.allocate_kv_cache({num_blocks, kBlockSize});
  // Random K/V (never time on zeros); an FP8 cache gets them quantized per slot, array by array.
  if (fp8_kv) {
    const KvPoolMemory memory = backend.kv_pool_memory(KvPoolKind::kMain);
    const int64_t slots = static_cast<int64_t>(num_blocks) * kBlockSize;
    DeviceBuffer values(static_cast<size_t>(slots) * config.kv_size() * 2), scales(static_cast<size_t>(slots) * 4);
    for (size_t a = 0; a < memory.arrays.size(); ++a) {
      launch_synthetic_fill_bf16(values.as<bf16>(), slots * config.kv_size(), 12345 + a, false, 1.0f, backend.stream());
      launch_fp8_quantize_rows(values.as<bf16>(), slots, config.kv_size(), config.kv_size(),
                               reinterpret_cast<uint8_t*>(memory.arrays[a]), scales.as<float>(), backend.stream());
    }
  } else {
    const int64_t kv_elements = static_cast<int64_t>(num_blocks) * kBlockSize * backend.kv_bytes_per_token() / 2;
    launch_synthetic_fill_bf16(backend.k_pool(0), kv_elements, 12345, false, 1.0f, backend.stream());
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
  const double copy_bandwidth = measure_copy_bandwidth(backend.stream());
  results["measured_copy_bandwidth_bytes_per_s"] = copy_bandwidth;
  std::printf("device: %s\nmeasured device-to-device copy: %.2f TB/s (read + write)\n", results["device"].get<std::string>().c_str(),
              copy_bandwidth / 1e12);

  Prng prng(1);
  BenchContext context{backend, config, results, prng, iterations, batch_sizes, parts};
  auto wanted = [&](const char* part) { return context.wanted(part); };
  decode_figures(context);

  if (wanted("lora")) {
    const std::vector<int32_t> slots = bind_rank16_adapters(backend, config);
    const Batch base = decode_batch(64, {}, prng, config.vocab_size);
    const Batch mixed = decode_batch(64, slots, prng, config.vocab_size);
    const StepTimes base_times = time_step(backend, base, iterations, true);
    const StepTimes lora_times = time_step(backend, mixed, iterations, true);
    // The other placements and kernels (serving's: split kernels on the side
    // stream). Inline placement is lora_side_groups 0 (the side stream unused).
    using Kernel = CudaMeasureSwitches::LoraKernel;
    backend.measure().lora_pdl_expand = true;
    const StepTimes pdl_times = time_step(backend, mixed, iterations, true);
    backend.measure().lora_pdl_expand = false;
    backend.measure().lora_side_groups = 0;
    const StepTimes inline_times = time_step(backend, mixed, iterations, true);
    // Inline, every launch of the step programmatic (CudaTuning::programmatic_max_rows).
    tune(backend, [](CudaTuning& t) { t.programmatic_max_rows = 1 << 30; });
    const StepTimes inline_programmatic_times = time_step(backend, mixed, iterations, true);
    const StepTimes base_programmatic_times = time_step(backend, base, iterations, true);
    tune(backend, [](CudaTuning& t) { t.programmatic_max_rows = CudaTuning{}.programmatic_max_rows; });
    std::printf("LoRA inline with programmatic launches (graph ms): %.3f (eager %.3f); base model %.3f (eager %.3f)\n",
                inline_programmatic_times.graph_ms, inline_programmatic_times.eager_ms,
                base_programmatic_times.graph_ms, base_programmatic_times.eager_ms);
    results["lora_inline_programmatic"] = {{"graph_ms", inline_programmatic_times.graph_ms},
                                           {"eager_ms", inline_programmatic_times.eager_ms},
                                           {"base_graph_ms", base_programmatic_times.graph_ms},
                                           {"base_eager_ms", base_programmatic_times.eager_ms}};
    backend.measure().lora_kernel = Kernel::kFused;
    const StepTimes fused_inline_times = time_step(backend, mixed, iterations, true);
    backend.measure().lora_side_groups = 0xF;
    const StepTimes fused_times = time_step(backend, mixed, iterations, true);
    backend.measure().lora_kernel = Kernel::kFusedAttention;
    const StepTimes fused_attention_times = time_step(backend, mixed, iterations, true);
    backend.measure().lora_side_groups = 0;
    const StepTimes fused_attention_inline_times = time_step(backend, mixed, iterations, true);
    backend.measure().lora_side_groups = 0xF;
    backend.measure().lora_kernel = Kernel::kSplit;
    std::printf("LoRA fused for q/k/v and o only (graph ms): side stream %.3f (eager %.3f), inline %.3f\n",
                fused_attention_times.graph_ms, fused_attention_times.eager_ms, fused_attention_inline_times.graph_ms);
    results["lora_fused_attention"] = {{"side_stream_graph_ms", fused_attention_times.graph_ms},
                                       {"side_stream_eager_ms", fused_attention_times.eager_ms},
                                       {"inline_graph_ms", fused_attention_inline_times.graph_ms}};
    // Which groups gain from the side stream: each mask puts the groups of its clear bits inline.
    std::printf("LoRA side-stream groups (bit 0 q/k/v, 1 o, 2 gate/up, 3 down; graph ms):");
    for (const uint32_t mask : {0xFu, 0xEu, 0xDu, 0xBu, 0x7u, 0xCu, 0x3u}) {
      backend.measure().lora_side_groups = mask;
      const StepTimes mask_times = time_step(backend, mixed, iterations, true);
      results["lora_side_groups"].push_back({{"mask", mask}, {"graph_ms", mask_times.graph_ms}});
      std::printf(" 0x%X %.3f", mask, mask_times.graph_ms);
    }
    std::printf("\n");
    backend.measure().lora_side_groups = 0xF;
    backend.measure().lora_f32_gate_up = true;
    const StepTimes f32_delta_times = time_step(backend, mixed, iterations, true);
    backend.measure().lora_f32_gate_up = false;
    const StepTimes bf16_delta_times = time_step(backend, mixed, iterations, true);
    results["lora_gate_up_delta"] = {{"f32_graph_ms", f32_delta_times.graph_ms}, {"bf16_graph_ms", bf16_delta_times.graph_ms}};
    std::printf("LoRA gate/up delta (graph ms): fp32 %.3f, bf16 %.3f (default)\n", f32_delta_times.graph_ms,
                bf16_delta_times.graph_ms);
    std::printf("LoRA expand columns per thread (0: 1 column, 128 threads; graph ms):");
    for (const int columns : {2, 1}) {
      backend.measure().lora_expand_columns = columns;
      const StepTimes column_times = time_step(backend, mixed, iterations, true);
      results["lora_expand_columns"].push_back(
          {{"columns", columns}, {"graph_ms", column_times.graph_ms}, {"eager_ms", column_times.eager_ms}});
      std::printf(" %d: %.3f (eager %.3f)", columns, column_times.graph_ms, column_times.eager_ms);
    }
    std::printf("\n");
    // What each launch costs the step (results wrong while skipped): bits 2g / 2g+1 skip group g's shrink / expand.
    std::printf("LoRA launches skipped (graph ms):");
    for (const uint32_t mask : {0x10u, 0x20u, 0x40u, 0x80u, 0xFFu}) {
      backend.measure().lora_skip = mask;
      const StepTimes skip_times = time_step(backend, mixed, iterations, true);
      results["lora_skip"].push_back({{"mask", mask}, {"graph_ms", skip_times.graph_ms}});
      std::printf(" 0x%02X %.3f", mask, skip_times.graph_ms);
    }
    // Every LoRA launch skipped with the groups inline: no fork or join left in the graph, so against the
    // side-stream 0xFF above this isolates what the joins cost (and against the base step, the consumers' adds).
    backend.measure().lora_skip = 0xFF;
    backend.measure().lora_side_groups = 0;
    const StepTimes skip_inline_times = time_step(backend, mixed, iterations, true);
    backend.measure().lora_side_groups = 0xF;
    results["lora_skip_inline_graph_ms"] = skip_inline_times.graph_ms;
    std::printf(" 0xFF inline %.3f\n", skip_inline_times.graph_ms);
    backend.measure().lora_skip = 0;
    results["lora_placements"] = {{"side_stream_graph_ms", lora_times.graph_ms},
                                  {"side_stream_pdl_graph_ms", pdl_times.graph_ms},
                                  {"inline_graph_ms", inline_times.graph_ms},
                                  {"fused_side_stream_graph_ms", fused_times.graph_ms},
                                  {"fused_inline_graph_ms", fused_inline_times.graph_ms}};
    std::printf("LoRA placements (graph ms): side stream %.3f (eager %.3f), + PDL expand %.3f, inline %.3f; fused "
                "kernel side stream %.3f, inline %.3f\n",
                lora_times.graph_ms, lora_times.eager_ms, pdl_times.graph_ms, inline_times.graph_ms,
                fused_times.graph_ms, fused_inline_times.graph_ms);
    results["lora"] = {{"batch", 64}, {"adapters", 8}, {"rank", 16}, {"base_graph_ms", base_times.graph_ms},
                       {"lora_graph_ms", lora_times.graph_ms}, {"base_eager_ms", base_times.eager_ms},
                       {"lora_eager_ms", lora_times.eager_ms}, {"ratio_graph", lora_times.graph_ms / base_times.graph_ms},
                       {"ratio_eager", lora_times.eager_ms / base_times.eager_ms}};
    std::printf("\nmulti-LoRA decode 64 (8 adapters r=16): base %.3f ms, lora %.3f ms, ratio %.3f (graph)\n",
                base_times.graph_ms, lora_times.graph_ms, lora_times.graph_ms / base_times.graph_ms);
    if (wanted("loraprof")) {  // one eager step per kernel choice between cudaProfilerStart/Stop (ncu --profile-from-start off)
      for (const auto kernel : {Kernel::kFused, Kernel::kSplit}) {
        backend.measure().lora_kernel = kernel;
        backend.enqueue_step(mixed);
        LOOM_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
        LOOM_CUDA_CHECK(cudaProfilerStart());
        backend.enqueue_step(mixed);
        LOOM_CUDA_CHECK(cudaStreamSynchronize(backend.stream()));
        LOOM_CUDA_CHECK(cudaProfilerStop());
      }
      backend.measure().lora_kernel = Kernel::kSplit;
    }
    for (int a = 0; a < 8; ++a) backend.set_adapter(a, nullptr);
  }

  if (wanted("sampling")) {
    const int rows = 64;
    Batch batch = decode_batch(rows, {}, prng, config.vocab_size);
    backend.forward(batch);  // the step's logits stay in device_logits()
    DeviceBuffer rows_d(rows * sizeof(SamplingRow)), out_d(rows * 8);
    auto time_kernel = [&](const SamplingRow& row) {
      const std::vector<SamplingRow> host_rows(rows, row);
      LOOM_CUDA_CHECK(cudaMemcpy(rows_d.data(), host_rows.data(), rows_d.size(), cudaMemcpyHostToDevice));
      Timer timer(backend.stream());
      auto run = [&] {
        launch_sampling(backend.device_logits(), rows, config.vocab_size, rows_d.as<SamplingRow>(),
                        out_d.as<int32_t>(), reinterpret_cast<float*>(out_d.as<int32_t>() + rows), backend.stream());
      };
      for (int i = 0; i < 3; ++i) run();
      return timer.median_ms(run, iterations);
    };
    const double greedy_ms = time_kernel({1, 0.0f, 0, 1.0f, 1, 0, 0, 0});
    const double top_ms = time_kernel({1, 0.8f, 50, 0.9f, 1, 0, 0, 0});
    const double top_p_ms = time_kernel({1, 1.0f, 0, 0.95f, 1, 0, 0, 0});
    // Wall time of a whole step as the engine sees it (forward returns on the host).
    SamplingParams host_params;
    host_params.temperature = 0.8f;
    host_params.top_k = 50;
    host_params.top_p = 0.9f;
    std::vector<Sampler> samplers(rows, Sampler(host_params));
    auto wall_ms = [&](auto&& body) {
      std::vector<double> times;
      for (int i = 0; i < iterations; ++i) {
        const auto start = std::chrono::steady_clock::now();
        body();
        times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
      std::sort(times.begin(), times.end());
      return times[times.size() / 2];
    };
    const double host_step_ms = wall_ms([&] {
      const ForwardResult result = backend.forward(batch);
      for (int r = 0; r < rows; ++r) samplers[r].sample(result.logits.data() + static_cast<size_t>(r) * config.vocab_size, config.vocab_size);
    });
    Batch device_batch = batch;
    device_batch.sampling.assign(rows, DeviceSampling{true, 0.8f, 50, 0.9f, 1, 0});
    const double device_step_ms = wall_ms([&] {
      for (DeviceSampling& sampling : device_batch.sampling) ++sampling.step;
      const ForwardResult result = backend.forward(device_batch);
      if (result.sampled_token_ids.size() != static_cast<size_t>(rows)) std::abort();
    });
    results["sampling"] = {{"rows", rows}, {"vocab", config.vocab_size}, {"kernel_greedy_ms", greedy_ms},
                           {"kernel_t0.8_topk50_topp0.9_ms", top_ms}, {"kernel_topp0.95_ms", top_p_ms},
                           {"step_wall_host_sampling_ms", host_step_ms}, {"step_wall_device_sampling_ms", device_step_ms}};
    std::printf("\nsampling 64 rows x %d: kernel greedy %.3f ms, T0.8/top-k 50/top-p 0.9 %.3f ms, top-p 0.95 %.3f ms;"
                " decode-64 step wall (forward + sampling) host %.2f ms, device %.2f ms\n",
                config.vocab_size, greedy_ms, top_ms, top_p_ms, host_step_ms, device_step_ms);
  }

  if (wanted("prefill")) {
    const Batch batch = prefill_batch(prefill_tokens, prng, config.vocab_size);
    const StepTimes times = time_step(backend, batch, std::max(3, iterations / 4), false);
    const double flops = prefill_flops(config, prefill_tokens);
    const double mfu = flops / (times.eager_ms * 1e-3) / peaks().bf16;
    results["prefill"] = {{"tokens", prefill_tokens}, {"ms", times.eager_ms}, {"flops", flops}, {"mfu", mfu},
                          {"tflops", flops / (times.eager_ms * 1e-3) / 1e12}};
    std::printf("\nprefill %d tokens: %.1f ms, %.1f TFLOP/s, MFU %.1f%%\n", prefill_tokens, times.eager_ms,
                flops / (times.eager_ms * 1e-3) / 1e12, 100 * mfu);
    if (fp8_weights) {  // Hopper's dense FP8 peak is twice its bf16 one (the attention stays bf16)
      results["prefill"]["mfu_of_fp8_peak"] = mfu / 2;
      std::printf("prefill with FP8 linear weights: %.1f%% of the dense FP8 peak (2x bf16's)\n", 50 * mfu);
    }
    tune(backend, [](CudaTuning& t) { t.pingpong_prefill = false; });  // the same prefill with attention_wide.cu's kernel
    const double wgmma_ms = time_step(backend, batch, std::max(3, iterations / 4), false).eager_ms;
    tune(backend, [](CudaTuning& t) { t.pingpong_prefill = true; });
    results["prefill"]["wgmma_ms"] = wgmma_ms;
    results["prefill"]["wgmma_mfu"] = flops / (wgmma_ms * 1e-3) / peaks().bf16;
    std::printf("prefill %d tokens, wgmma attention (attention_wide.cu): %.1f ms, MFU %.1f%%\n", prefill_tokens,
                wgmma_ms, 100 * flops / (wgmma_ms * 1e-3) / peaks().bf16);
  }

  if (wanted("attention")) {
    const Batch decode16 = decode_batch(16, {}, prng, config.vocab_size);
    const double decode16_ms = time_attention(backend, decode16, iterations);
    const double kv_element_bytes = fp8_kv ? 1.0 : 2.0;
    const double decode16_bytes = 16.0 * kContext * config.kv_size() * 2 * kv_element_bytes;
    results["attention_decode16"] = {{"batch", 16}, {"ms", decode16_ms}, {"bandwidth_bytes_per_s", decode16_bytes / (decode16_ms * 1e-3)}};
    std::printf("\nattention alone, one layer: decode 16x2K %.3f ms (%.2f TB/s of K/V)\n", decode16_ms,
                decode16_bytes / (decode16_ms * 1e-3) / 1e12);
    const Batch decode = decode_batch(64, {}, prng, config.vocab_size);
    const double decode_ms = time_attention(backend, decode, iterations);
    const double decode_bytes = 64.0 * kContext * config.kv_size() * 2 * kv_element_bytes;
    results["attention"] = {
        {"decode", {{"batch", 64}, {"context", kContext}, {"heads", config.num_heads}, {"kv_heads", config.num_kv_heads},
                    {"head_dim", config.head_dim}, {"ms", decode_ms}, {"kv_bytes", decode_bytes},
                    {"bandwidth_bytes_per_s", decode_bytes / (decode_ms * 1e-3)}}}};
    std::printf("\nattention alone, one layer: decode 64x2K %.3f ms (%.2f TB/s of K/V)\n", decode_ms,
                decode_bytes / (decode_ms * 1e-3) / 1e12);
    // Causal prefill on the three kernels (the ping-pong one is the backend's choice), at the prompt length and 32K.
    nlohmann::json prefill_runs = nlohmann::json::array();
    for (const int tokens : {prefill_tokens, 32768}) {
      const Batch prefill = prefill_batch(tokens, prng, config.vocab_size);
      const double pairs = static_cast<double>(tokens) * (tokens + 1) / 2;
      const double flop = 4.0 * config.num_heads * config.head_dim * pairs;
      const int prefill_iterations = std::max(3, iterations / 2);
      const double wide_ms = time_attention(backend, prefill, prefill_iterations, 0, true);
      const double mma_sync_ms = time_attention(backend, prefill, prefill_iterations, 0, false);
      const double pingpong_ms = time_attention(backend, prefill, prefill_iterations, 0, true, true);
      prefill_runs.push_back({{"tokens", tokens}, {"heads", config.num_heads}, {"kv_heads", config.num_kv_heads},
                              {"head_dim", config.head_dim}, {"causal", true}, {"flops", flop}, {"ms", wide_ms},
                              {"tflops", flop / (wide_ms * 1e-3) / 1e12}, {"mma_sync_ms", mma_sync_ms},
                              {"mma_sync_tflops", flop / (mma_sync_ms * 1e-3) / 1e12}, {"pingpong_ms", pingpong_ms},
                              {"pingpong_tflops", flop / (pingpong_ms * 1e-3) / 1e12}});
      std::printf("attention alone, one layer: prefill %d causal: ping-pong %.3f ms (%.0f TFLOP/s); wgmma kernel %.3f ms "
                  "(%.0f TFLOP/s); mma.sync kernel %.3f ms (%.0f TFLOP/s)\n",
                  tokens, pingpong_ms, flop / (pingpong_ms * 1e-3) / 1e12, wide_ms, flop / (wide_ms * 1e-3) / 1e12,
                  mma_sync_ms, flop / (mma_sync_ms * 1e-3) / 1e12);
    }
    results["attention"]["prefill"] = prefill_runs[0];
    results["attention"]["prefill_runs"] = prefill_runs;
  }

  if (wanted("sharing")) {
    const std::vector<int32_t> slots = bind_rank16_adapters(backend, config);
    backend.allocate_residual_cache({num_blocks, kBlockSize, 16});
    const int64_t residual_elements = static_cast<int64_t>(num_blocks) * kBlockSize *
                                      backend.residual_bytes_per_token(16) / 2;
    launch_synthetic_fill_bf16(backend.residual_pool(0), residual_elements, 777, false, 1.0f, backend.stream());
    // Kernels: decode 64 x 2K, and a 1K-token chunk over an 8K cache.
    const Batch plain_decode = decode_batch(64, slots, prng, config.vocab_size);
    Batch forked_decode = plain_decode;
    make_forked(forked_decode);
    const double plain_decode_ms = time_attention(backend, plain_decode, iterations);
    const double forked_decode_ms = time_attention(backend, forked_decode, iterations, 16);
    Batch plain_chunk = prefill_batch(8192 + 1024, prng, config.vocab_size);
    plain_chunk.sequences[0].num_computed_tokens = 8192;
    plain_chunk.sequences[0].num_new_tokens = 1024;
    plain_chunk.token_ids.erase(plain_chunk.token_ids.begin(), plain_chunk.token_ids.begin() + 8192);
    plain_chunk.positions.erase(plain_chunk.positions.begin(), plain_chunk.positions.begin() + 8192);
    plain_chunk.adapter_slots.assign(1024, 0);
    Batch forked_chunk = plain_chunk;
    make_forked(forked_chunk);
    const double plain_chunk_ms = time_attention(backend, plain_chunk, std::max(3, iterations / 2));
    const double forked_chunk_ms = time_attention(backend, forked_chunk, std::max(3, iterations / 2), 16);
    // The same chunk on ResidualAttention's mma.sync prefill (no scratch rebuild).
    const double forked_chunk_narrow_ms = time_attention(backend, forked_chunk, std::max(3, iterations / 2), 16, false);
    // Steps: 64 decodes of the same 8 adapters, isolated vs forked vs base.
    Batch base_decode = plain_decode;
    make_base(base_decode);
    const StepTimes isolated_step = time_step(backend, plain_decode, iterations, true);
    const StepTimes forked_step = time_step(backend, forked_decode, iterations, true);
    const StepTimes base_step = time_step(backend, base_decode, iterations, true);
    results["sharing"] = {
        {"adapters", 8}, {"rank", 16},
        {"kernel_decode", {{"batch", 64}, {"context", kContext}, {"paged_ms", plain_decode_ms},
                           {"residual_ms", forked_decode_ms}, {"ratio", forked_decode_ms / plain_decode_ms}}},
        {"kernel_chunk", {{"cached", 8192}, {"new", 1024}, {"paged_ms", plain_chunk_ms},
                          {"residual_ms", forked_chunk_ms}, {"ratio", forked_chunk_ms / plain_chunk_ms},
                          {"residual_attention_kernel_ms", forked_chunk_narrow_ms}}},
        {"step_decode64", {{"isolated_graph_ms", isolated_step.graph_ms}, {"forked_graph_ms", forked_step.graph_ms},
                           {"base_graph_ms", base_step.graph_ms}, {"isolated_eager_ms", isolated_step.eager_ms},
                           {"forked_eager_ms", forked_step.eager_ms}, {"base_eager_ms", base_step.eager_ms},
                           {"forked_ratio", forked_step.graph_ms / isolated_step.graph_ms},
                           {"base_ratio", base_step.graph_ms / isolated_step.graph_ms}}}};
    std::printf("\nsharing (8 adapters r=16): ResidualAttention decode 64x2K %.3f ms vs paged %.3f ms (%.2fx); "
                "1K chunk over 8K %.3f vs %.3f ms (%.2fx; on the ResidualAttention prefill kernel %.3f ms)\n",
                forked_decode_ms, plain_decode_ms, forked_decode_ms / plain_decode_ms, forked_chunk_ms, plain_chunk_ms,
                forked_chunk_ms / plain_chunk_ms, forked_chunk_narrow_ms);
    std::printf("decode-64 step (graph ms): isolated %.3f, forked %.3f (%.3fx), base %.3f (%.3fx)\n",
                isolated_step.graph_ms, forked_step.graph_ms, forked_step.graph_ms / isolated_step.graph_ms,
                base_step.graph_ms, base_step.graph_ms / isolated_step.graph_ms);
    for (int a = 0; a < 8; ++a) backend.set_adapter(a, nullptr);
  }

  std::ofstream(out_path) << results.dump(2) << "\n";
  std::printf("\nwrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace
}  // namespace loom::cuda

int main(int argc, char** argv) {
  return loom::cuda::bench::bench_main("loom_cuda_bench", loom::cuda::run, argc, argv);
}
