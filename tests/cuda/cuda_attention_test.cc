// Paged attention (prefill + decode kernels, split-KV combine) against the CPU
// backend's paged_attention on the same bf16 values: random block tables,
// block sizes 16 and 32, contexts 1..16K, batches 1..128, GQA ratios 1/4/8;
// the wide (wgmma) prefill, plain and warp-specialized, for head dims 64/128 up
// to 64K contexts; and the default kernels against torch's SDPA on the device
// (bench/cuda/sdpa_check.py) for contexts 1 to 128K.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <unistd.h>

#include <gtest/gtest.h>

#include "backend/cpu/paged_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/step_plan.h"
#include "cuda_test_util.h"
#include "util/fp8.h"

namespace loom::cuda {
namespace {

using test::download_bf16;
using test::random_values;
using test::upload;
using test::upload_bf16;

struct AttentionCase {
  int num_heads = 32, num_kv_heads = 8, head_dim = 128, block_size = 16;
  std::vector<std::pair<int, int>> sequences;  // (num_cached, num_new)
  uint64_t seed = 1;
  bool wide = true;   // PlanShape::wide_prefill where the head size has the wide kernel
  int num_sms = 132;  // 1: any prefill list is wide enough to run wide
  bool pingpong = false;  // wide items on the warp-specialized kernel (kPrefillWidePingPong)
  bool cpu_reference = true;  // false: no CPU reference (the SDPA check's long contexts)
  // > 0: the cache is FP8 (kv_fp8.cuh) with this scale for K and its double for V; the
  // reference runs over its dequantized values, and the same kernels over a bf16 cache
  // of those values must give the same bits.
  float fp8_kv_scale = 0.0f;
  // Non-empty (one sequence only): Q, the sequence's K and V in position order
  // and the output, as raw bf16, to dump_prefix + {q,k,v,out}.bin.
  std::string dump_prefix;
};

void write_bf16(const std::string& path, const std::vector<float>& values) {  // values are bf16 already
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t word;
    std::memcpy(&word, &values[i], 4);
    bits[i] = static_cast<uint16_t>(word >> 16);
  }
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(bits.data()), static_cast<std::streamsize>(bits.size() * 2));
  ASSERT_TRUE(file.good()) << "cannot write " << path;
}

std::string describe(const AttentionCase& c) {
  int64_t max_context = 0;
  for (auto [cached, fresh] : c.sequences) max_context = std::max<int64_t>(max_context, cached + fresh);
  return "heads " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) + " d " +
         std::to_string(c.head_dim) + " bs " + std::to_string(c.block_size) + " batch " +
         std::to_string(c.sequences.size()) + " max context " + std::to_string(max_context);
}

AttentionVariant run_case(const AttentionCase& c) {  // returns the plan's prefill variant
  SCOPED_TRACE(describe(c));
  Prng prng(c.seed);
  Batch batch;
  int num_blocks_total = 0;
  for (auto [cached, fresh] : c.sequences) num_blocks_total += (cached + fresh + c.block_size - 1) / c.block_size;
  const int num_blocks = num_blocks_total + 3;
  // A random permutation of the pool's blocks, handed out to the sequences.
  std::vector<int32_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  for (int i = num_blocks - 1; i > 0; --i) std::swap(blocks[i], blocks[prng.next_below(i + 1)]);
  int next_block = 0;
  for (auto [cached, fresh] : c.sequences) {
    BatchSequence sequence;
    sequence.num_computed_tokens = cached;
    sequence.num_new_tokens = fresh;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = (cached + fresh + c.block_size - 1) / c.block_size;
    for (int b = 0; b < sequence.num_blocks; ++b) batch.block_tables.push_back(blocks[next_block++]);
    for (int i = 0; i < fresh; ++i) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(cached + i);
      batch.adapter_slots.push_back(-1);
    }
    batch.sequences.push_back(sequence);
  }
  const int n = batch.num_tokens();
  const int q_size = c.num_heads * c.head_dim, kv_size = c.num_kv_heads * c.head_dim;
  const int64_t num_slots = static_cast<int64_t>(num_blocks) * c.block_size;
  const std::vector<float> q = random_values(prng, static_cast<size_t>(n) * q_size, 2.0f);
  std::vector<float> k_pool = random_values(prng, num_slots * kv_size, 1.0f);
  std::vector<float> v_pool = random_values(prng, num_slots * kv_size, 1.0f);
  std::vector<uint8_t> k_fp8, v_fp8;  // CPU layout
  if (c.fp8_kv_scale > 0.0f) {
    // Entries e4m3(x / scale); what a kernel reads is bf16(e4m3 * scale).
    auto quantize = [](std::vector<float>& pool, std::vector<uint8_t>& bytes, float scale) {
      bytes.resize(pool.size());
      for (size_t i = 0; i < pool.size(); ++i) {
        bytes[i] = float_to_e4m3(pool[i] / scale);
        pool[i] = test::round_to_bf16(e4m3_to_float(bytes[i]) * scale);
      }
    };
    quantize(k_pool, k_fp8, c.fp8_kv_scale);
    quantize(v_pool, v_fp8, 2.0f * c.fp8_kv_scale);
  }

  cpu::TokenPlacement placement;
  cpu::place_tokens(batch, c.block_size, placement);
  std::vector<float> expected(static_cast<size_t>(n) * q_size), scratch;
  const cpu::AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, c.block_size};
  if (c.cpu_reference)
    cpu::paged_attention(q.data(), batch, placement, shape, k_pool.data(), v_pool.data(), 16, scratch, expected.data());

  StepPlan plan;
  PlanShape plan_shape{c.block_size, c.num_heads, c.num_kv_heads, c.num_sms, attention_decode_ctas_per_sm(c.head_dim)};
  plan_shape.wide_prefill = c.wide && attention_wide_supports_head_dim(c.head_dim);
  plan.build(batch, plan_shape);
  auto device_layout = [&](const std::vector<float>& pool) {
    return test::kv_pool_device_layout(pool, num_slots, c.num_kv_heads, c.head_dim, c.block_size);
  };
  DeviceBuffer plan_d = upload(plan.words()), q_d = upload_bf16(q), k_d = upload_bf16(device_layout(k_pool)),
               v_d = upload_bf16(device_layout(v_pool)), out_d(static_cast<size_t>(n) * q_size * 2);
  auto device_bytes = [&](const std::vector<uint8_t>& bytes) {  // the same reordering, of bytes (none without FP8)
    if (bytes.empty()) return DeviceBuffer();
    const std::vector<float> ordered = device_layout(std::vector<float>(bytes.begin(), bytes.end()));
    return upload(std::vector<uint8_t>(ordered.begin(), ordered.end()));
  };
  DeviceBuffer k_fp8_d = device_bytes(k_fp8), v_fp8_d = device_bytes(v_fp8);
  const size_t partial_rows = static_cast<size_t>(std::max(plan.num_partials(), 1)) * c.num_kv_heads * kAttentionMaxRows;
  DeviceBuffer partial_out(partial_rows * c.head_dim * 4), partial_lse(partial_rows * 4);
  LOOM_CUDA_CHECK(cudaMemset(out_d.data(), 0xff, out_d.size()));  // NaN poison: every element must be written
  const int32_t* words = plan_d.as<int32_t>();
  AttentionParams params = test::plan_attention_params(plan, words, c.num_heads, c.num_kv_heads, c.head_dim, c.block_size);
  params.q = q_d.as<bf16>();
  params.k_cache = k_d.as<bf16>();
  params.v_cache = v_d.as<bf16>();
  params.out = out_d.as<bf16>();
  params.partial_out = partial_out.as<float>();
  params.partial_lse = partial_lse.as<float>();
  const AttentionParams bf16_params = params;
  if (c.fp8_kv_scale > 0.0f) {
    params.k_cache = params.v_cache = nullptr;
    params.k_cache_fp8 = k_fp8_d.as<uint8_t>();
    params.v_cache_fp8 = v_fp8_d.as<uint8_t>();
    params.k_scale = c.fp8_kv_scale;
    params.v_scale = 2.0f * c.fp8_kv_scale;
  }
  // The plan's prefill path: the wide kernel when any sequence's own items fill the GPU.
  const AttentionVariant variant =
      plan.num_wide_prefill_items() > 0 ? AttentionVariant::kPrefillWide : AttentionVariant::kPrefill;
  const AttentionVariant prefill = c.pingpong ? AttentionVariant::kPrefillWidePingPong : AttentionVariant::kPrefillWide;
  auto run_all = [&](const AttentionParams& run) {
    launch_attention(run, AttentionVariant::kPrefill,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().prefill_items),
                     plan.num_prefill_items(), nullptr);
    launch_attention(run, prefill, reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().wide_prefill_items),
                     plan.num_wide_prefill_items(), nullptr);
    launch_attention(run, AttentionVariant::kDecode,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().decode_items),
                     plan.num_decode_items(), nullptr);
    launch_attention_combine(run, reinterpret_cast<const AttentionCombineItem*>(words + plan.sections().combine_items),
                             plan.num_combine_items(), nullptr);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  };
  run_all(params);
  const std::vector<float> out = download_bf16(out_d.data(), static_cast<size_t>(n) * q_size);
  if (c.fp8_kv_scale > 0.0f) {  // the FP8 cache reads as the bf16 cache of its values, bit for bit
    DeviceBuffer bf16_out_d(out_d.size());
    AttentionParams plain = bf16_params;
    plain.out = bf16_out_d.as<bf16>();
    run_all(plain);
    std::vector<uint16_t> fp8_bits(out_d.size() / 2), bf16_bits(out_d.size() / 2);
    LOOM_CUDA_CHECK(cudaMemcpy(fp8_bits.data(), out_d.data(), out_d.size(), cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(bf16_bits.data(), bf16_out_d.data(), out_d.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(fp8_bits, bf16_bits) << "an FP8 cache read otherwise than the bf16 cache of its values";
  }
  if (c.pingpong && plan.num_wide_prefill_items() > 0) {
    // The same arithmetic in the same order as the wgmma kernel: equal bit for bit
    // (a stage read before it landed or after it was refilled would show here).
    DeviceBuffer wide_d(out_d.size());
    AttentionParams wide = params;
    wide.out = wide_d.as<bf16>();
    launch_attention(wide, AttentionVariant::kPrefillWide,
                     reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().wide_prefill_items),
                     plan.num_wide_prefill_items(), nullptr);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> pingpong_bits(out_d.size() / 2), wide_bits(out_d.size() / 2);
    LOOM_CUDA_CHECK(cudaMemcpy(pingpong_bits.data(), out_d.data(), out_d.size(), cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(wide_bits.data(), wide_d.data(), wide_d.size(), cudaMemcpyDeviceToHost));
    // Only the wide list's sequences ran twice (the others are in `out` only): compare theirs.
    size_t differing = 0;
    std::vector<bool> wide_sequence(batch.sequences.size(), false);
    for (const AttentionWorkItem& item : plan.wide_prefill_items()) wide_sequence[item.sequence] = true;
    for (size_t s = 0; s < batch.sequences.size(); ++s) {
      const BatchSequence& sequence = batch.sequences[s];
      if (!wide_sequence[s]) continue;
      const size_t begin = static_cast<size_t>(sequence.token_offset) * q_size;
      const size_t end = begin + static_cast<size_t>(sequence.num_new_tokens) * q_size;
      for (size_t i = begin; i < end; ++i) differing += pingpong_bits[i] != wide_bits[i];
    }
    EXPECT_EQ(differing, 0u) << "ping-pong output values differing from the wgmma kernel's";
  }
  if (!c.dump_prefix.empty()) {
    const BatchSequence& sequence = batch.sequences.at(0);
    const int64_t context = sequence.num_computed_tokens + sequence.num_new_tokens;
    std::vector<float> k(static_cast<size_t>(context) * kv_size), v(k.size());
    for (int64_t position = 0; position < context; ++position) {
      const int64_t slot = static_cast<int64_t>(batch.block_tables[sequence.block_table_offset + position / c.block_size]) *
                               c.block_size + position % c.block_size;
      std::copy_n(k_pool.begin() + slot * kv_size, kv_size, k.begin() + position * kv_size);
      std::copy_n(v_pool.begin() + slot * kv_size, kv_size, v.begin() + position * kv_size);
    }
    write_bf16(c.dump_prefix + "q.bin", q);
    write_bf16(c.dump_prefix + "k.bin", k);
    write_bf16(c.dump_prefix + "v.bin", v);
    write_bf16(c.dump_prefix + "out.bin", out);
  }
  if (!c.cpu_reference) return variant;
  const bool long_reduction = placement.max_context_length > 256;
  EXPECT_TRUE(test::close_bf16(out, expected, long_reduction))
      << plan.num_prefill_items() << " prefill items, " << plan.num_wide_prefill_items()
      << (c.pingpong ? " ping-pong" : " wide") << " prefill items, " << plan.num_decode_items() << " decode items, "
      << plan.num_combine_items() << " combined";
  return variant;
}

TEST(CudaAttention, DecodeSingleTokenContexts1To16K) {
  LOOM_REQUIRE_GPU();
  for (int context : {1, 2, 15, 16, 17, 63, 64, 65, 1000, 4096, 16384}) {
    AttentionCase c;
    c.sequences = {{context - 1, 1}};
    c.seed = context;
    run_case(c);
  }
}

TEST(CudaAttention, DecodeBatchesWithGqaRatios1And4And8) {
  LOOM_REQUIRE_GPU();
  struct Heads { int heads, kv_heads; };
  for (Heads h : {Heads{8, 8}, Heads{32, 8}, Heads{32, 4}}) {
    for (int batch_size : {1, 7, 64, 128}) {
      AttentionCase c;
      c.num_heads = h.heads;
      c.num_kv_heads = h.kv_heads;
      c.block_size = batch_size % 2 == 0 ? 16 : 32;
      c.seed = 100 * batch_size + h.heads + h.kv_heads;
      Prng prng(c.seed);
      for (int s = 0; s < batch_size; ++s) c.sequences.push_back({static_cast<int>(prng.next_below(2048)), 1});
      run_case(c);
    }
  }
}

TEST(CudaAttention, PrefillCausalWithAndWithoutCache) {
  LOOM_REQUIRE_GPU();
  for (int block_size : {16, 32}) {
    AttentionCase c;
    c.block_size = block_size;
    c.num_heads = 8;
    c.num_kv_heads = 8;  // GQA 1
    c.sequences = {{0, 1000}};
    run_case(c);
    c.num_heads = 32;
    c.num_kv_heads = 4;  // GQA 8
    c.sequences = {{0, 300}, {77, 129}, {500, 17}, {3, 5}, {0, 1}};
    c.seed = 2;
    run_case(c);
  }
}

TEST(CudaAttention, ChunkedPrefillOverLongCacheSplitsKv) {
  LOOM_REQUIRE_GPU();
  AttentionCase c;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.block_size = 32;
  c.sequences = {{16384 - 128, 128}};
  run_case(c);
  c.num_kv_heads = 8;
  c.block_size = 16;
  c.sequences = {{8000, 3}, {12000, 40}};
  c.seed = 3;
  run_case(c);
}

TEST(CudaAttention, MixedBatchEveryHeadDim) {
  LOOM_REQUIRE_GPU();
  for (int head_dim : {16, 32, 64, 128}) {
    AttentionCase c;
    c.head_dim = head_dim;
    c.num_heads = 9;  // SmolLM2: 9 heads over 3 kv heads
    c.num_kv_heads = 3;
    c.seed = head_dim;
    Prng prng(head_dim);
    for (int s = 0; s < 24; ++s) {
      const int fresh = s % 3 == 0 ? 1 + static_cast<int>(prng.next_below(40)) : 1;
      c.sequences.push_back({static_cast<int>(prng.next_below(3000)), fresh});
    }
    run_case(c);
  }
}

TEST(CudaAttention, WidePrefillHeadDims64And128GqaAndBlockSizes) {
  LOOM_REQUIRE_GPU();
  struct Heads { int heads, kv_heads; };
  for (int head_dim : {64, 128}) {
    for (Heads h : {Heads{8, 8}, Heads{32, 8}, Heads{32, 4}}) {
      // 16 and 32 are the engine's; 8 and 256 the ping-pong producer's other
      // block-table shapes (16 and 1 entries a tile), 24 its fallback.
      for (int block_size : {8, 16, 24, 32, 256}) {
        AttentionCase c;
        c.head_dim = head_dim;
        c.num_heads = h.heads;
        c.num_kv_heads = h.kv_heads;
        c.block_size = block_size;
        c.num_sms = 1;
        c.seed = head_dim + h.heads + h.kv_heads + block_size;
        // Cached prefixes 0 to 3000, rows not a multiple of 128, tiles cut by the end.
        c.sequences = {{0, 1000}, {77, 129}, {3000, 300}, {500, 17}, {3, 5}, {0, 1}, {128, 128}};
        EXPECT_EQ(run_case(c), AttentionVariant::kPrefillWide);
        c.pingpong = true;
        EXPECT_EQ(run_case(c), AttentionVariant::kPrefillWide);
      }
    }
  }
}

TEST(CudaAttention, WidePrefillLongContexts) {
  LOOM_REQUIRE_GPU();
  AttentionCase c;  // 8B shape
  c.sequences = {{0, 4096}};
  EXPECT_EQ(run_case(c), AttentionVariant::kPrefillWide);
  c.sequences = {{65536 - 256, 256}, {32768 - 640, 640}};  // chunks over 64K and 32K cached keys
  c.num_sms = 1;
  c.seed = 5;
  EXPECT_EQ(run_case(c), AttentionVariant::kPrefillWide);
  c.pingpong = true;
  EXPECT_EQ(run_case(c), AttentionVariant::kPrefillWide);
  c.sequences = {{0, 4096}};
  EXPECT_EQ(run_case(c), AttentionVariant::kPrefillWide);
  c.pingpong = false;
  c.sequences = {{65536 - 256, 256}, {32768 - 640, 640}};
  c.wide = false;  // the mma.sync kernel, split over the same chunks
  EXPECT_EQ(run_case(c), AttentionVariant::kPrefill);
}

// The script that compares dumped cases with torch SDPA: $LOOM_SOURCE_DIR's,
// the working directory's (the device runs from the repository root), or the
// source tree this binary was built from.
std::string sdpa_check_script() {
  const char* relative = "bench/cuda/sdpa_check.py";
  if (const char* root = std::getenv("LOOM_SOURCE_DIR")) return std::string(root) + "/" + relative;
  if (std::filesystem::exists(relative)) return relative;
  return std::string(LOOM_TEST_SOURCE_DIR) + "/" + relative;
}

// The backend's default kernels (decode, the ping-pong prefill) against torch's
// scaled_dot_product_attention in fp32 on the device, with SDPA's own bf16
// error as the yardstick: contexts 1 to 128K, cached prefixes 0 to 127K.
// An FP8 KV cache (--kv-cache-dtype fp8): every variant (decode, split-KV decode,
// prefill, wide and ping-pong prefill) reads bf16(e4m3 * scale), equal bit for bit
// to the same kernels over a bf16 cache of those values, and near the CPU
// reference over them; scales 1 (vLLM's default) and an arbitrary one.
TEST(CudaAttention, Fp8CacheReadsAsItsDequantizedValues) {
  LOOM_REQUIRE_GPU();
  for (const float scale : {1.0f, 0.0137f}) {
    for (const bool pingpong : {false, true}) {
      AttentionCase c;
      c.fp8_kv_scale = scale;
      c.pingpong = pingpong;
      c.num_sms = 1;  // the prefills run wide
      c.sequences = {{0, 700}, {1500, 1}, {9000, 1}, {33, 200}};
      c.seed = 71;
      run_case(c);
      c.head_dim = 64;
      c.block_size = 32;
      c.seed = 72;
      run_case(c);
    }
    AttentionCase narrow;  // the mma.sync prefill and every head size
    narrow.fp8_kv_scale = scale;
    narrow.wide = false;
    for (int head_dim : {16, 32, 64, 128}) {
      narrow.head_dim = head_dim;
      narrow.sequences = {{0, 130}, {2000, 1}, {40, 9}};
      narrow.seed = 73 + head_dim;
      run_case(narrow);
    }
  }
}

TEST(CudaAttention, MatchesTorchSdpaToLongContexts) {
  LOOM_REQUIRE_GPU();
  if (std::system("python3 -c 'import torch; assert torch.cuda.is_available()' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no python3 with CUDA torch";
  const std::string script = sdpa_check_script();
  ASSERT_TRUE(std::filesystem::exists(script)) << script;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom_sdpa_check_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Context { int cached, fresh; };
  const Context contexts[] = {{0, 1},    {0, 130},   {1000, 1},    {0, 1000},          {0, 8192},
                              {0, 32768}, {4096, 600}, {65536 - 512, 512}, {131072 - 1024, 1024}};
  std::ofstream cases(dir / "cases.txt");
  int index = 0;
  for (const Context& context : contexts) {
    AttentionCase c;  // 8B shape: 32 / 8 heads, d 128, block size 16
    c.sequences = {{context.cached, context.fresh}};
    c.cpu_reference = false;
    c.pingpong = CudaTuning{}.pingpong_prefill;
    c.seed = 100 + index;
    c.dump_prefix = (dir / ("case" + std::to_string(index) + "_")).string();
    run_case(c);
    cases << c.dump_prefix << ' ' << context.cached << ' ' << context.fresh << ' ' << c.num_heads << ' '
          << c.num_kv_heads << ' ' << c.head_dim << '\n';
    ++index;
  }
  cases.close();
  const int status = std::system(("python3 " + script + " " + (dir / "cases.txt").string()).c_str());
  std::filesystem::remove_all(dir);
  EXPECT_EQ(status, 0) << "sdpa_check.py: a case is further from fp32 SDPA than SDPA's own bf16 (see its output)";
}

// Which prefill kernel a sequence runs on is the sequence's own choice: a
// prompt whose wide items fill the GPU runs wide, a shorter one narrow, alone
// or beside others (once, a step whose prefills filled the GPU together put
// them all on the wide kernel, so a sequence's numbers followed its company).
TEST(CudaPrefillPlan, EachSequenceChoosesItsKernelAlone) {  // no GPU needed
  auto batch_of = [](const std::vector<int32_t>& lengths) {
    Batch batch;
    for (int32_t length : lengths) {
      BatchSequence sequence;
      sequence.num_new_tokens = length;
      sequence.token_offset = batch.num_tokens();
      sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
      sequence.num_blocks = (length + 15) / 16;
      for (int b = 0; b < sequence.num_blocks; ++b) batch.block_tables.push_back(static_cast<int32_t>(batch.block_tables.size()));
      for (int i = 0; i < length; ++i) {
        batch.token_ids.push_back(0);
        batch.positions.push_back(i);
        batch.adapter_slots.push_back(-1);
      }
      batch.sequences.push_back(sequence);
    }
    return batch;
  };
  PlanShape shape{16, 32, 8, 132, 3, 2};
  shape.wide_prefill = true;
  StepPlan plan;
  // 600 tokens x 4 rows / 128 = 19 wide items x 8 kv heads >= 132 SMs: wide. 300 tokens: 10 x 8 < 132: narrow.
  auto sequences_on = [](const std::vector<AttentionWorkItem>& items) {
    std::vector<int32_t> sequences;
    for (const AttentionWorkItem& item : items)
      if (std::find(sequences.begin(), sequences.end(), item.sequence) == sequences.end())
        sequences.push_back(item.sequence);
    return sequences;
  };
  plan.build(batch_of({600, 300}), shape, 16);
  EXPECT_EQ(sequences_on(plan.wide_prefill_items()), std::vector<int32_t>{0});
  EXPECT_EQ(sequences_on(plan.prefill_items()), std::vector<int32_t>{1});
  plan.build(batch_of({300}), shape, 16);
  EXPECT_EQ(plan.num_wide_prefill_items(), 0);
  EXPECT_EQ(sequences_on(plan.prefill_items()), std::vector<int32_t>{0});
  plan.build(batch_of({600}), shape, 16);
  EXPECT_EQ(sequences_on(plan.wide_prefill_items()), std::vector<int32_t>{0});
  EXPECT_EQ(plan.num_prefill_items(), 0);
  // Two short prompts that would fill the GPU together stay narrow.
  plan.build(batch_of({300, 300}), shape, 16);
  EXPECT_EQ(plan.num_wide_prefill_items(), 0);
  // Without the wide kernel, everything is narrow.
  shape.wide_prefill = false;
  plan.build(batch_of({600, 300}), shape, 16);
  EXPECT_EQ(plan.num_wide_prefill_items(), 0);
}

}  // namespace
}  // namespace loom::cuda
