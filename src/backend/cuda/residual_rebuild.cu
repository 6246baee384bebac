// Forked prefills on the wide (wgmma) kernel: a forked sequence's keys and
// values are rebuilt into a scratch pool once per layer (plan_types.h
// ResidualRebuildItem), then attention_wide.cu's kernel runs over them as over
// a plain sequence. The rebuild reads the context once (bK, bV, rK, rV) and
// writes it once, a few per cent of a large prefill's attention time, and the
// prefill then runs at the wide kernel's speed instead of ResidualAttention's
// mma.sync one (which rebuilds every K tile for every 64-row query tile).
//
// A CTA (128 threads) rebuilds one item's up to 64 entries for one kv head
// (blockIdx.y). The kv head's B_k and B_v rows wait in shared memory
// transposed ([rank][head_dim], fp32), the item's rK / rV rows beside them;
// thread t takes the rotate-half pair (d, d + head_dim / 2), d = t mod
// head_dim / 2, of every (128 / (head_dim / 2))-th entry. The residual key is
// rotated as the ResidualAttention kernels rotate it (the fp32 angle, the SFU
// after a Cody-Waite reduction) and added to the base key in fp32, rounded once
// to bf16 as the ResidualAttention prefill's shared K tile is. V gets
// s_v rV B_v^T the same way: rounded into V here, where ResidualAttention
// applies it to P rV after the loop.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_attributes.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/residual_keys.cuh"

namespace loom::cuda {

namespace {

constexpr int kRebuildThreads = 128;

size_t rebuild_shared_bytes(int32_t head_dim, int32_t max_rank) {
  return (2 * static_cast<size_t>(max_rank) * head_dim + 2 * static_cast<size_t>(kAttentionTileKeys) * max_rank) *
         sizeof(float);
}

template <int kHeadDim>
__global__ void __launch_bounds__(kRebuildThreads)
    residual_rebuild_kernel(AttentionParams p, const ResidualRebuildItem* items, int32_t max_rank, bf16* scratch_k,
                            bf16* scratch_v) {
  constexpr int kHalf = kHeadDim / 2;
  constexpr int kEntriesAtOnce = kRebuildThreads / kHalf;
  static_assert(kRebuildThreads % kHalf == 0, "whole entries per pass");
  extern __shared__ float rebuild_shared[];
  float* bk = rebuild_shared;                 // [max_rank][kHeadDim]
  float* bv = bk + max_rank * kHeadDim;       // [max_rank][kHeadDim]
  float* rk = bv + max_rank * kHeadDim;       // [kAttentionTileKeys][max_rank]
  float* rv = rk + kAttentionTileKeys * max_rank;

  const ResidualRebuildItem item = items[blockIdx.x];
  const int kv_head = blockIdx.y;
  const int tid = threadIdx.x;
  const AttentionSequence sequence = p.sequences[item.sequence];
  const AttentionSequence scratch = p.sequences[item.scratch_sequence];
  const LoraModuleRef module_k = lora_module(p.lora_modules, sequence.forked_slot, p.num_layers, p.layer, kLoraTargetK);
  const LoraModuleRef module_v = lora_module(p.lora_modules, sequence.forked_slot, p.num_layers, p.layer, kLoraTargetV);
  const int rank_k = module_k.rank, rank_v = module_v.rank;
  for (int index = tid; index < max_rank * kHeadDim; index += kRebuildThreads) {
    const int j = index / kHeadDim;
    const int64_t row = static_cast<int64_t>(kv_head) * kHeadDim + index % kHeadDim;
    bk[index] = j < rank_k ? __bfloat162float(module_k.b[row * rank_k + j]) : 0.0f;
    bv[index] = j < rank_v ? __bfloat162float(module_v.b[row * rank_v + j]) : 0.0f;
  }
  const int num_entries = item.key_end - item.key_begin;
  const PagedGather residual = PagedGather::rows(p.residual_block_tables + sequence.residual_block_table_offset,
                                                 p.residual_block_size, 2 * static_cast<int64_t>(p.residual_rank_stride));
  for (int index = tid; index < num_entries * max_rank; index += kRebuildThreads) {
    const int e = index / max_rank;
    const int j = index % max_rank;
    const bf16* entry = p.residual_pool + residual.index(item.key_begin + e);
    rk[index] = j < rank_k ? __bfloat162float(entry[j]) : 0.0f;
    rv[index] = j < rank_v ? __bfloat162float(entry[p.residual_rank_stride + j]) : 0.0f;
  }
  __syncthreads();

  const int d = tid % kHalf;
  const float inv_freq = p.inv_freq[d];
  const PagedGather base = PagedGather::kv(p.block_tables + sequence.block_table_offset, kv_head, p.block_size,
                                           p.num_kv_heads, kHeadDim);
  const PagedGather out = PagedGather::kv(p.block_tables + scratch.block_table_offset, kv_head, p.block_size,
                                          p.num_kv_heads, kHeadDim);
  for (int e = tid / kHalf; e < num_entries; e += kEntriesAtOnce) {
    const int key = item.key_begin + e;
    float x = 0.0f, y = 0.0f, vx = 0.0f, vy = 0.0f;
    for (int j = 0; j < rank_k; ++j) {
      const float r = rk[e * max_rank + j];
      x = fmaf(r, bk[j * kHeadDim + d], x);
      y = fmaf(r, bk[j * kHeadDim + d + kHalf], y);
    }
    for (int j = 0; j < rank_v; ++j) {
      const float r = rv[e * max_rank + j];
      vx = fmaf(r, bv[j * kHeadDim + d], vx);
      vy = fmaf(r, bv[j * kHeadDim + d + kHalf], vy);
    }
    x *= module_k.scale;
    y *= module_k.scale;
    float sine, cosine;
    reduced_sincos(__fmul_rn(inv_freq, static_cast<float>(key)), sine, cosine);
    const int64_t source = base.index(key) + d, destination = out.index(key) + d;
    // The bCache entry as the attention kernels read it (an FP8 cache: bf16(e4m3 * scale), kv_fp8.cuh).
    auto cached = [&](bool is_key, int64_t index) {
      if (p.k_cache_fp8 != nullptr)
        return __bfloat162float(__float2bfloat16_rn(is_key ? kv_fp8_decode(p.k_cache_fp8[index], p.k_scale)
                                                           : kv_fp8_decode(p.v_cache_fp8[index], p.v_scale)));
      return __bfloat162float(is_key ? p.k_cache[index] : p.v_cache[index]);
    };
    scratch_k[destination] = __float2bfloat16_rn(cached(true, source) + (x * cosine - y * sine));
    scratch_k[destination + kHalf] = __float2bfloat16_rn(cached(true, source + kHalf) + (y * cosine + x * sine));
    scratch_v[destination] = __float2bfloat16_rn(cached(false, source) + module_v.scale * vx);
    scratch_v[destination + kHalf] = __float2bfloat16_rn(cached(false, source + kHalf) + module_v.scale * vy);
  }
}

template <int kHeadDim>
void launch_rebuild(const AttentionParams& params, const ResidualRebuildItem* items, int32_t num_items,
                    int32_t max_rank, bf16* scratch_k, bf16* scratch_v, cudaStream_t stream) {
  const size_t shared = rebuild_shared_bytes(kHeadDim, max_rank);
  // The opt-in above 48 KB (rank 64: 96 KB), for the largest rank.
  allow_dynamic_shared_memory<residual_rebuild_kernel<kHeadDim>>(rebuild_shared_bytes(kHeadDim, kResidualMaxRank));
  residual_rebuild_kernel<kHeadDim><<<dim3(num_items, params.num_kv_heads), kRebuildThreads, shared, stream>>>(
      params, items, max_rank, scratch_k, scratch_v);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_forked_wide_prefill(const AttentionParams& params, const ResidualRebuildItem* rebuild_items,
                                int32_t num_rebuild_items, const AttentionWorkItem* wide_items,
                                int32_t num_wide_items, bf16* scratch_k, bf16* scratch_v, cudaStream_t stream,
                                int32_t residual_rank, AttentionVariant variant) {
  if (num_rebuild_items <= 0 || num_wide_items <= 0) return;
  if (residual_rank <= 0 || residual_rank > kResidualMaxRank)
    throw_unsupported("cuda forked wide prefill: k/v LoRA rank (supported: 1 to 64)", residual_rank);
  switch (params.head_dim) {
    case 64:
      launch_rebuild<64>(params, rebuild_items, num_rebuild_items, residual_rank, scratch_k, scratch_v, stream);
      break;
    case 128:
      launch_rebuild<128>(params, rebuild_items, num_rebuild_items, residual_rank, scratch_k, scratch_v, stream);
      break;
    default:
      throw_unsupported("cuda forked wide prefill: head_dim (supported: 64, 128)", params.head_dim);
  }
  AttentionParams wide = params;
  wide.k_cache = scratch_k;
  wide.v_cache = scratch_v;
  wide.k_cache_fp8 = wide.v_cache_fp8 = nullptr;  // the scratch is bf16 whatever the pool's dtype
  launch_attention(wide, variant, wide_items, num_wide_items, stream);
}

void launch_forked_wide_passes(const AttentionParams& params, const ForkedWidePass* passes, size_t num_passes,
                               const ResidualRebuildItem* rebuild_items, const AttentionWorkItem* wide_items,
                               bf16* scratch_k, bf16* scratch_v, cudaStream_t stream, int32_t residual_rank,
                               AttentionVariant variant) {
  for (size_t p = 0; p < num_passes; ++p) {  // in order: each overwrites the scratch
    const ForkedWidePass& pass = passes[p];
    launch_forked_wide_prefill(params, rebuild_items + pass.rebuild_begin, pass.rebuild_end - pass.rebuild_begin,
                               wide_items + pass.item_begin, pass.item_end - pass.item_begin, scratch_k, scratch_v,
                               stream, residual_rank, variant);
  }
}

}  // namespace loom::cuda
