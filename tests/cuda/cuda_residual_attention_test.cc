// ResidualAttention (ForkKV's forked sharing, arXiv:2604.06370 §5.3) on the GPU
// against a naive reconstruction: every forked sequence's K and V are
// materialised on the host (K_j = bK_j + RoPE_j(s_k rK_j B_k^T), V_j = bV_j +
// s_v rV_j B_v^T, in fp32) and the CPU backend's plain paged attention runs
// over them. Block sizes 16 and 32, contexts 1 to 32K, batches 1 to 128,
// ranks 8 / 16 / 64 mixed in one launch, GQA 1 / 4 / 8, head dims 64 and 128.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <gtest/gtest.h>

#include "backend/cpu/paged_attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/step_plan.h"
#include "cuda_test_util.h"
#include "lora/adapter.h"

namespace loom::cuda {
namespace {

using test::download_bf16;
using test::random_values;
using test::upload;
using test::upload_bf16;

struct ResidualCase {
  int num_heads = 32, num_kv_heads = 8, head_dim = 128, block_size = 16;
  std::vector<std::pair<int, int>> sequences;  // (num_cached, num_new)
  std::vector<int> ranks = {16};               // adapter a has ranks[a]; sequence s uses adapter s % ranks.size()
  uint64_t seed = 1;
  // > 0: prefills may take the wide kernel over rebuilt K/V (PlanShape::forked_wide_prefill_keys,
  // with num_sms 1 so that any list fills "the GPU").
  int wide_keys = 0;
};

std::string describe(const ResidualCase& c) {
  int64_t max_context = 0;
  for (auto [cached, fresh] : c.sequences) max_context = std::max<int64_t>(max_context, cached + fresh);
  std::string ranks;
  for (int rank : c.ranks) ranks += std::to_string(rank) + " ";
  return "heads " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) + " d " +
         std::to_string(c.head_dim) + " bs " + std::to_string(c.block_size) + " batch " +
         std::to_string(c.sequences.size()) + " max context " + std::to_string(max_context) + " ranks " + ranks;
}

struct Adapter {
  int rank = 0;
  float scale_k = 0.0f, scale_v = 0.0f;
  std::vector<float> b_k, b_v;  // [kv_size, rank], bf16 values
};

// Rotate-half RoPE of x (head_dim values) at `position`, rounding as the kernels do.
void rotate(std::vector<float>& x, const std::vector<float>& inv_freq, int position) {
  const int half = static_cast<int>(x.size()) / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = inv_freq[i] * static_cast<float>(position);
    const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
    const float s = static_cast<float>(std::sin(static_cast<double>(angle)));
    const float first = x[i], second = x[i + half];
    x[i] = first * c - second * s;
    x[i + half] = second * c + first * s;
  }
}

void run_case(const ResidualCase& c) {
  SCOPED_TRACE(describe(c));
  Prng prng(c.seed);
  const int q_size = c.num_heads * c.head_dim, kv_size = c.num_kv_heads * c.head_dim;
  const int num_adapters = static_cast<int>(c.ranks.size());
  const int max_rank = *std::max_element(c.ranks.begin(), c.ranks.end());
  const int stride = residual_rank_stride(max_rank);

  Batch batch;
  int num_blocks_total = 0;
  for (auto [cached, fresh] : c.sequences) num_blocks_total += (cached + fresh + c.block_size - 1) / c.block_size;
  const int num_blocks = num_blocks_total + 3;
  // Random permutations of both pools' blocks, handed out to the sequences.
  auto permutation = [&] {
    std::vector<int32_t> blocks(num_blocks);
    std::iota(blocks.begin(), blocks.end(), 0);
    for (int i = num_blocks - 1; i > 0; --i) std::swap(blocks[i], blocks[prng.next_below(i + 1)]);
    return blocks;
  };
  const std::vector<int32_t> main_blocks = permutation(), residual_blocks = permutation();
  int next_block = 0;
  for (size_t s = 0; s < c.sequences.size(); ++s) {
    const auto [cached, fresh] = c.sequences[s];
    BatchSequence sequence;
    sequence.num_computed_tokens = cached;
    sequence.num_new_tokens = fresh;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.residual_block_table_offset = static_cast<int32_t>(batch.residual_block_tables.size());
    sequence.num_blocks = sequence.num_residual_blocks = (cached + fresh + c.block_size - 1) / c.block_size;
    sequence.forked_adapter_slot = static_cast<int32_t>(s) % num_adapters;
    for (int b = 0; b < sequence.num_blocks; ++b, ++next_block) {
      batch.block_tables.push_back(main_blocks[next_block]);
      batch.residual_block_tables.push_back(residual_blocks[next_block]);
    }
    for (int i = 0; i < fresh; ++i) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(cached + i);
      batch.adapter_slots.push_back(sequence.forked_adapter_slot);
    }
    batch.sequences.push_back(sequence);
  }
  const int n = batch.num_tokens();
  const int64_t num_slots = static_cast<int64_t>(num_blocks) * c.block_size;
  const std::vector<float> q = random_values(prng, static_cast<size_t>(n) * q_size, 2.0f);
  const std::vector<float> k_pool = random_values(prng, num_slots * kv_size, 1.0f);
  const std::vector<float> v_pool = random_values(prng, num_slots * kv_size, 1.0f);
  // rCache slots: rK and rV of the owning sequence's rank, zeros past it (the write kernel's layout).
  std::vector<float> residual_pool(num_slots * 2 * stride, 0.0f);
  std::vector<Adapter> adapters(num_adapters);
  for (int a = 0; a < num_adapters; ++a) {
    Adapter& adapter = adapters[a];
    adapter.rank = c.ranks[a];
    adapter.scale_k = 16.0f / static_cast<float>(adapter.rank);
    adapter.scale_v = 8.0f / static_cast<float>(adapter.rank);
    adapter.b_k = random_values(prng, static_cast<size_t>(kv_size) * adapter.rank, 0.25f);
    adapter.b_v = random_values(prng, static_cast<size_t>(kv_size) * adapter.rank, 0.25f);
  }
  std::vector<float> inv_freq(c.head_dim / 2);
  for (int i = 0; i < c.head_dim / 2; ++i)
    inv_freq[i] = static_cast<float>(1.0 / std::pow(500000.0, 2.0 * i / c.head_dim));

  // The naive reconstruction, into the main pools of a plain batch.
  std::vector<float> k_materialised = k_pool, v_materialised = v_pool;
  Batch plain = batch;
  for (BatchSequence& sequence : plain.sequences) sequence.forked_adapter_slot = -1;
  std::fill(plain.adapter_slots.begin(), plain.adapter_slots.end(), -1);
  std::vector<float> delta(c.head_dim);
  for (const BatchSequence& sequence : batch.sequences) {
    const Adapter& adapter = adapters[sequence.forked_adapter_slot];
    for (int j = 0; j < sequence.num_computed_tokens + sequence.num_new_tokens; ++j) {
      const int64_t slot = static_cast<int64_t>(batch.block_tables[sequence.block_table_offset + j / c.block_size]) *
                               c.block_size + j % c.block_size;
      const int64_t residual_slot =
          static_cast<int64_t>(batch.residual_block_tables[sequence.residual_block_table_offset + j / c.block_size]) *
              c.block_size + j % c.block_size;
      float* r_k = residual_pool.data() + residual_slot * 2 * stride;
      float* r_v = r_k + stride;
      for (int i = 0; i < adapter.rank; ++i) {
        r_k[i] = test::round_to_bf16(static_cast<float>(prng.next_below(2001)) / 1000.0f - 1.0f);
        r_v[i] = test::round_to_bf16(static_cast<float>(prng.next_below(2001)) / 1000.0f - 1.0f);
      }
      for (int h = 0; h < c.num_kv_heads; ++h) {
        for (int d = 0; d < c.head_dim; ++d) {
          const float* b = adapter.b_k.data() + (static_cast<int64_t>(h) * c.head_dim + d) * adapter.rank;
          float sum = 0.0f;
          for (int i = 0; i < adapter.rank; ++i) sum += r_k[i] * b[i];
          delta[d] = adapter.scale_k * sum;
        }
        rotate(delta, inv_freq, j);
        for (int d = 0; d < c.head_dim; ++d) {
          k_materialised[slot * kv_size + h * c.head_dim + d] += delta[d];
          const float* b = adapter.b_v.data() + (static_cast<int64_t>(h) * c.head_dim + d) * adapter.rank;
          float sum = 0.0f;
          for (int i = 0; i < adapter.rank; ++i) sum += r_v[i] * b[i];
          v_materialised[slot * kv_size + h * c.head_dim + d] += adapter.scale_v * sum;
        }
      }
    }
  }
  cpu::TokenPlacement placement;
  cpu::place_tokens(plain, c.block_size, placement);
  std::vector<float> expected(static_cast<size_t>(n) * q_size), scratch;
  const cpu::AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, c.block_size};
  cpu::paged_attention(q.data(), plain, placement, shape, k_materialised.data(), v_materialised.data(), 16, scratch,
                       expected.data());

  StepPlan plan;
  PlanShape plan_shape{c.block_size, c.num_heads, c.num_kv_heads, c.wide_keys > 0 ? 1 : 132,
                       attention_decode_ctas_per_sm(c.head_dim), attention_decode_ctas_per_sm(c.head_dim, max_rank)};
  plan_shape.wide_prefill = c.wide_keys > 0;
  plan_shape.forked_wide_prefill_keys = c.wide_keys;
  plan.build(batch, plan_shape, c.block_size);
  ASSERT_EQ(plan.num_prefill_items() + plan.num_decode_items(), 0);
  if (c.wide_keys > 0) {
    ASSERT_GT(plan.num_forked_wide_items(), 0);
  }
  if (c.wide_keys == 1000) {
    EXPECT_EQ(plan.forked_wide_passes().size(), 2u);
    EXPECT_GT(plan.num_forked_prefill_items(), 0);
  }
  const size_t scratch_entries = static_cast<size_t>(plan.num_scratch_keys()) * kv_size;
  DeviceBuffer scratch_kv(std::max<size_t>(2 * scratch_entries * 2, 16));
  auto device_layout = [&](const std::vector<float>& pool) {
    return test::kv_pool_device_layout(pool, num_slots, c.num_kv_heads, c.head_dim, c.block_size);
  };
  DeviceBuffer plan_d = upload(plan.words()), q_d = upload_bf16(q), k_d = upload_bf16(device_layout(k_pool)),
               v_d = upload_bf16(device_layout(v_pool)), residual_d = upload_bf16(residual_pool),
               out_d(static_cast<size_t>(n) * q_size * 2), inv_freq_d = test::upload_f32(inv_freq);
  std::vector<DeviceBuffer> b_buffers;
  std::vector<LoraModuleRef> modules(static_cast<size_t>(num_adapters) * kNumLoraTargets);
  for (int a = 0; a < num_adapters; ++a) {
    b_buffers.push_back(upload_bf16(adapters[a].b_k));
    modules[a * kNumLoraTargets + kLoraTargetK] = {nullptr, b_buffers.back().as<bf16>(), adapters[a].rank,
                                                   adapters[a].scale_k};
    b_buffers.push_back(upload_bf16(adapters[a].b_v));
    modules[a * kNumLoraTargets + kLoraTargetV] = {nullptr, b_buffers.back().as<bf16>(), adapters[a].rank,
                                                   adapters[a].scale_v};
  }
  DeviceBuffer modules_d = upload(modules);
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
  params.residual_pool = residual_d.as<bf16>();
  params.residual_block_tables = words + plan.sections().residual_block_tables;
  params.residual_block_size = c.block_size;
  params.residual_rank_stride = stride;
  params.lora_modules = modules_d.as<LoraModuleRef>();
  params.num_layers = 1;
  params.layer = 0;
  params.inv_freq = inv_freq_d.as<float>();
  launch_attention(params, AttentionVariant::kPrefill,
                   reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_prefill_items),
                   plan.num_forked_prefill_items(), nullptr, max_rank);
  launch_attention(params, AttentionVariant::kDecode,
                   reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_decode_items),
                   plan.num_forked_decode_items(), nullptr, max_rank);
  launch_forked_wide_passes(params, plan.forked_wide_passes().data(), plan.forked_wide_passes().size(),
                            reinterpret_cast<const ResidualRebuildItem*>(words + plan.sections().rebuild_items),
                            reinterpret_cast<const AttentionWorkItem*>(words + plan.sections().forked_wide_items),
                            scratch_kv.as<bf16>(), scratch_kv.as<bf16>() + scratch_entries, nullptr, max_rank);
  launch_attention_combine(params, reinterpret_cast<const AttentionCombineItem*>(words + plan.sections().combine_items),
                           plan.num_combine_items(), nullptr);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> out = download_bf16(out_d.data(), static_cast<size_t>(n) * q_size);
  // The kernel keeps the rebuilt K in bf16 and rounds P·rV to bf16 for the
  // up-projection, where the reference keeps both in fp32: a few elements of a
  // short context leave bf16's elementwise band (measured NMSE ~5e-6), so the
  // bound is on NMSE and the largest error. A wrong key, rank or RoPE gives NMSE ~1.
  const test::Closeness closeness = test::compare(out, expected);
  EXPECT_FALSE(closeness.has_nan);
  EXPECT_LE(closeness.nmse, 2e-5) << closeness.describe();
  EXPECT_LE(closeness.max_abs_error, 1e-2) << closeness.describe();
  std::printf("[ residual attention ] %s: NMSE %.2g, max |err| %.2g\n", describe(c).c_str(), closeness.nmse,
              closeness.max_abs_error);
}

TEST(CudaResidualAttention, DecodeContexts1To32K) {
  LOOM_REQUIRE_GPU();
  for (int context : {1, 2, 17, 64, 65, 1000, 4096, 32768}) {
    ResidualCase c;
    c.sequences = {{context - 1, 1}};
    c.seed = context;
    run_case(c);
  }
}

TEST(CudaResidualAttention, DecodeBatchesMixedRanksGqa1And4And8) {
  LOOM_REQUIRE_GPU();
  struct Heads { int heads, kv_heads; };
  for (Heads h : {Heads{8, 8}, Heads{32, 8}, Heads{32, 4}}) {
    for (int batch_size : {1, 7, 64, 128}) {
      ResidualCase c;
      c.num_heads = h.heads;
      c.num_kv_heads = h.kv_heads;
      c.block_size = batch_size % 2 == 0 ? 16 : 32;
      c.ranks = {8, 16, 64};
      c.seed = 100 * batch_size + h.heads + h.kv_heads;
      Prng prng(c.seed);
      for (int s = 0; s < batch_size; ++s) c.sequences.push_back({static_cast<int>(prng.next_below(2048)), 1});
      run_case(c);
    }
  }
}

TEST(CudaResidualAttention, PrefillAndChunkedPrefillOverCache) {
  LOOM_REQUIRE_GPU();
  for (int block_size : {16, 32}) {
    ResidualCase c;
    c.block_size = block_size;
    c.num_heads = 32;
    c.num_kv_heads = 4;  // GQA 8
    c.ranks = {16, 8, 64};
    c.sequences = {{0, 300}, {77, 129}, {500, 17}, {3, 5}, {0, 1}};
    c.seed = 2 + block_size;
    run_case(c);
  }
  ResidualCase c;  // a chunk over an 8K cached context, split into KV chunks
  c.sequences = {{8192, 128}};
  c.ranks = {16};
  run_case(c);
}

// Forked prefills on the wgmma kernel over K/V rebuilt into a scratch pool,
// beside the ResidualAttention kernels (a scratch budget that leaves some
// sequences narrow), against the same naive reconstruction.
TEST(CudaResidualAttention, WidePrefillOverRebuiltKeyValues) {
  LOOM_REQUIRE_GPU();
  for (int block_size : {16, 32}) {
    ResidualCase c;
    c.block_size = block_size;
    c.num_kv_heads = 4;  // GQA 8
    c.ranks = {16, 8, 64};
    c.sequences = {{0, 300}, {77, 129}, {500, 17}, {3, 5}, {0, 1}, {1000, 40}};
    c.seed = 20 + block_size;
    // Contexts of 1040 entries (over the budget: narrow), then 517, 300 and 206 (wide, in two passes).
    c.wide_keys = 1000;
    run_case(c);
  }
  ResidualCase chunk;  // a 1K chunk over an 8K cached context, GQA 4
  chunk.sequences = {{8192, 1024}};
  chunk.wide_keys = 65536;
  run_case(chunk);
  ResidualCase gqa1;  // GQA 1, rank 4, and head dim 64
  gqa1.num_heads = gqa1.num_kv_heads = 6;
  gqa1.head_dim = 64;
  gqa1.ranks = {4};
  gqa1.sequences = {{0, 700}, {2000, 300}};
  gqa1.wide_keys = 65536;
  run_case(gqa1);
}

TEST(CudaForkedWidePlan, ScratchTablesCopiesAndBudget) {  // no GPU needed
  Batch batch;
  const int32_t block_size = 16;
  const std::vector<std::pair<int, int>> shapes = {{100, 200}, {0, 1000}, {30, 2}, {500, 700}};
  for (size_t s = 0; s < shapes.size(); ++s) {
    BatchSequence sequence;
    sequence.num_computed_tokens = shapes[s].first;
    sequence.num_new_tokens = shapes[s].second;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.residual_block_table_offset = static_cast<int32_t>(batch.residual_block_tables.size());
    sequence.num_blocks = sequence.num_residual_blocks = (shapes[s].first + shapes[s].second + 15) / 16;
    sequence.forked_adapter_slot = static_cast<int32_t>(s);
    for (int b = 0; b < sequence.num_blocks; ++b) {
      batch.block_tables.push_back(1000 + b);
      batch.residual_block_tables.push_back(2000 + b);
    }
    for (int i = 0; i < shapes[s].second; ++i) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(shapes[s].first + i);
      batch.adapter_slots.push_back(static_cast<int32_t>(s));
    }
    batch.sequences.push_back(sequence);
  }
  PlanShape shape{block_size, 32, 8, 16, 3, 2};
  shape.wide_prefill = true;
  shape.forked_wide_prefill_keys = 1300;  // holds the 1200-, the 1008- or the 304-entry context, no two together
  StepPlan plan;
  plan.build(batch, shape, block_size);
  // Each sequence qualifies alone (its own wide items fill 16 SMs, its context fits the scratch), so all three
  // prefills go wide, longest first, in three passes over the scratch; sequence 2 (8 rows) is a decode.
  const int32_t contexts[] = {300, 1000, 32, 1200};
  const int32_t order[] = {3, 1, 0};
  ASSERT_EQ(plan.sequences().size(), 7u);
  ASSERT_EQ(plan.forked_wide_passes().size(), 3u);
  EXPECT_EQ(plan.num_scratch_keys(), 1200);  // the largest pass
  for (int p = 0; p < 3; ++p) {
    const int32_t s = order[p];
    const AttentionSequence& copy = plan.sequences()[4 + p];
    EXPECT_EQ(copy.forked_slot, -1);
    EXPECT_EQ(copy.num_computed_tokens + copy.num_new_tokens, contexts[s]);
    const int32_t* table = plan.words().data() + plan.sections().block_tables + copy.block_table_offset;
    for (int b = 0; b < (contexts[s] + 15) / 16; ++b) EXPECT_EQ(table[b], b) << "pass " << p;  // the scratch from its start
    const ForkedWidePass& pass = plan.forked_wide_passes()[p];
    EXPECT_EQ(pass.rebuild_end - pass.rebuild_begin, (contexts[s] + 63) / 64);
    for (int i = pass.rebuild_begin; i < pass.rebuild_end; ++i) {
      const ResidualRebuildItem& item = plan.rebuild_items()[i];
      EXPECT_EQ(item.sequence, s);
      EXPECT_EQ(item.scratch_sequence, 4 + p);
      EXPECT_EQ(item.key_begin, 64 * (i - pass.rebuild_begin));
    }
    EXPECT_EQ(pass.item_end - pass.item_begin, (shapes[s].second * 4 + 127) / 128);  // group 4
    for (int i = pass.item_begin; i < pass.item_end; ++i) {
      EXPECT_EQ(plan.forked_wide_items()[i].sequence, 4 + p);
      EXPECT_EQ(plan.forked_wide_items()[i].partial_index, -1);
    }
  }
  EXPECT_TRUE(plan.forked_prefill_items().empty());
  ASSERT_FALSE(plan.forked_decode_items().empty());
  for (const AttentionWorkItem& item : plan.forked_decode_items()) EXPECT_EQ(item.sequence, 2);

  // Batch invariance: sequence 0 alone takes the wide path it took beside the others.
  Batch alone = batch;
  alone.sequences = {batch.sequences[0]};
  alone.token_ids.resize(200);
  alone.positions.resize(200);
  alone.adapter_slots.resize(200);
  plan.build(alone, shape, block_size);
  ASSERT_EQ(plan.forked_wide_passes().size(), 1u);
  EXPECT_EQ(plan.num_forked_wide_items(), (200 * 4 + 127) / 128);

  // A context over the scratch budget stays narrow, whatever shares its step.
  shape.forked_wide_prefill_keys = 1100;
  plan.build(batch, shape, block_size);
  for (const ResidualRebuildItem& item : plan.rebuild_items()) EXPECT_NE(item.sequence, 3);
  std::vector<bool> narrow(4, false);
  for (const AttentionWorkItem& item : plan.forked_prefill_items()) narrow[item.sequence] = true;
  EXPECT_TRUE(narrow[3] && !narrow[0] && !narrow[1]);

  // Too few wide items to fill the GPU unsplit: everything stays on ResidualAttention.
  shape.forked_wide_prefill_keys = 1300;
  shape.num_sms = 4096;
  plan.build(batch, shape, block_size);
  EXPECT_EQ(plan.num_forked_wide_items(), 0);
  EXPECT_EQ(plan.num_rebuild_items(), 0);
  EXPECT_EQ(plan.num_scratch_keys(), 0);
  EXPECT_EQ(plan.sequences().size(), 4u);
  // And none without the budget.
  shape.num_sms = 16;
  shape.forked_wide_prefill_keys = 0;
  plan.build(batch, shape, block_size);
  EXPECT_EQ(plan.num_forked_wide_items(), 0);
}

TEST(CudaResidualAttention, HeadDim64AndEachRankTier) {
  LOOM_REQUIRE_GPU();
  for (int rank : {4, 8, 16, 32, 64}) {  // 4: B rows too short for 16-byte loads
    ResidualCase c;
    c.head_dim = 64;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.ranks = {rank};
    c.seed = rank;
    c.sequences = {{100, 1}, {0, 40}, {31, 2}};
    run_case(c);
  }
}

}  // namespace
}  // namespace loom::cuda
