// Plain structs the host step plan (step_plan.h) writes and the kernels read.
// All int32 so that the whole plan is one array of words, uploaded at once.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#ifdef __CUDACC__
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom::cuda {

// The KV pools' physical layout: per block, head-major, [block][kv head][slot
// in block][head_dim], so that one kv head's keys of a block are one
// contiguous block_size x head_dim run (the attention CTAs work per kv head).
// Slot addressing is backend.h's (slot = block * block_size + offset); this
// gives the first element of (slot, kv head).
LOOM_HOST_DEVICE inline int64_t kv_element_index(int64_t slot, int32_t kv_head, int32_t block_size,
                                                 int32_t num_kv_heads, int32_t head_dim) {
  return ((slot / block_size * num_kv_heads + kv_head) * block_size + slot % block_size) * head_dim;
}
// The tile gathers' addressing of a sequence's paged entries, for one kv head:
// entry `key` lives at block_table[key / block_size] and offset key % block_size,
// and its first element is block * block_stride + head_offset + offset * row_stride.
// The per-CTA products are made once, and power-of-two block sizes (all the
// engine uses) take a shift and a mask: the divisions and 64-bit products per
// 16-byte chunk were a quarter of the decode kernel's stall samples (ncu, H100).
struct PagedGather {
  const int32_t* block_table = nullptr;
  int32_t block_size = 0, block_shift = -1;  // block_shift >= 0 iff block_size is a power of two
  int64_t block_stride = 0, head_offset = 0, row_stride = 0;

  // The KV pools (kv_element_index's layout).
  LOOM_HOST_DEVICE static PagedGather kv(const int32_t* table, int32_t kv_head, int32_t block_size, int32_t num_kv_heads,
                                         int32_t head_dim) {
    PagedGather gather;
    gather.block_table = table;
    gather.block_size = block_size;
    gather.block_shift = log2_if_power_of_two(block_size);
    gather.row_stride = head_dim;
    gather.block_stride = static_cast<int64_t>(num_kv_heads) * block_size * head_dim;
    gather.head_offset = static_cast<int64_t>(kv_head) * block_size * head_dim;
    return gather;
  }
  // Rows of `row_stride` elements per slot, slot = block * block_size + offset (the rCache pools).
  LOOM_HOST_DEVICE static PagedGather rows(const int32_t* table, int32_t block_size, int64_t row_stride) {
    PagedGather gather;
    gather.block_table = table;
    gather.block_size = block_size;
    gather.block_shift = log2_if_power_of_two(block_size);
    gather.row_stride = row_stride;
    gather.block_stride = block_size * row_stride;
    return gather;
  }
  // `key` must be covered by the block table.
  LOOM_HOST_DEVICE int64_t index(int32_t key) const {
    int32_t block_index, offset;
    if (block_shift >= 0) {
      block_index = key >> block_shift;
      offset = key & (block_size - 1);
    } else {
      block_index = key / block_size;
      offset = key - block_index * block_size;
    }
#ifdef __CUDA_ARCH__
    const int32_t block = __ldg(block_table + block_index);
#else
    const int32_t block = block_table[block_index];
#endif
    return block * block_stride + head_offset + offset * row_stride;
  }

  // index(key) for a key known to live in `block` (power-of-two block sizes only).
  LOOM_HOST_DEVICE int64_t index_in_block(int32_t block, int32_t key) const {
    return block * block_stride + head_offset + (key & (block_size - 1)) * row_stride;
  }

  // A tile gather's sources: offset[i] = index of key tile_start + first_row + i * stride,
  // plus `column`; 0 for keys at or past kv_end (their copies zero-fill). N is small
  // and unrolled, so a thread's block-table reads are all in flight together.
  template <int N>
  LOOM_HOST_DEVICE void tile_offsets(int32_t tile_start, int32_t first_row, int32_t stride, int32_t kv_end,
                                     int64_t column, int64_t (&offset)[N]) const {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int i = 0; i < N; ++i) {
      const int32_t key = tile_start + first_row + i * stride;
      offset[i] = key < kv_end ? index(key) + column : 0;
    }
  }

  LOOM_HOST_DEVICE static int32_t log2_if_power_of_two(int32_t value) {
    if (value <= 0 || (value & (value - 1)) != 0) return -1;
    int32_t shift = 0;
    while ((1 << shift) < value) ++shift;
    return shift;
  }
};

// Attention tiles: a work item covers up to kAttentionMaxRows "rows" of one
// sequence and one kv head, a row being a (new token, query head of the kv
// head's group) pair, numbered token-major: row = i * group + h. Packing the
// group's heads into rows lets GQA read each K/V tile once per group.
inline constexpr int32_t kAttentionMaxRows = 64;  // rows of a split-KV partial (kPrefill, kDecode)
inline constexpr int32_t kAttentionWideRows = 128;
inline constexpr int32_t kAttentionTileKeys = 64;

enum class AttentionVariant : int32_t {
  kPrefill = 0,      // 64 rows, 4 warps x 16 rows, each warp over all keys of a tile
  kDecode = 1,       // 16 rows, 4 warps over a quarter of each tile's keys, merged at the end
  kPrefillWide = 2,  // 128 rows, 2 warpgroups x 64 rows on wgmma (attention_wide.cu); never split
  // kPrefillWide's items on the warp-specialized kernel (attention_pingpong.cu);
  // plans never pick it: CudaTuning::pingpong_prefill maps kPrefillWide to it.
  kPrefillWidePingPong = 3,
};
inline constexpr int32_t attention_variant_rows(AttentionVariant variant) {
  return variant == AttentionVariant::kPrefill ? 64 : variant == AttentionVariant::kDecode ? 16 : kAttentionWideRows;
}

// Forked prefills on the wide kernel: per layer, a forked sequence's K and V
// are first rebuilt into a scratch pool (kv_element_index's layout), K_j = bK_j +
// RoPE_j(s_k rK_j B_k^T) and V_j = bV_j + s_v rV_j B_v^T in bf16, and the wide
// kernel then runs over them as over a plain sequence: `scratch_sequence` is the
// sequence's copy whose block table numbers scratch blocks (forked_slot -1).
// An item rebuilds entries [key_begin, key_end) for one kv head (blockIdx.y).
struct ResidualRebuildItem {
  int32_t sequence = 0;          // the forked sequence: main and rCache tables, adapter slot
  int32_t scratch_sequence = 0;  // its scratch copy
  int32_t key_begin = 0;
  int32_t key_end = 0;
};

// One pass of a step's forked wide prefills: rebuild items [rebuild_begin,
// rebuild_end) fill the scratch, then wide items [item_begin, item_end) attend
// over it; the next pass overwrites the scratch (host-side, StepPlan).
struct ForkedWidePass {
  int32_t rebuild_begin = 0, rebuild_end = 0, item_begin = 0, item_end = 0;
};

// A sequence's queries: its new tokens i < num_new_tokens (activation row
// token_offset + i, KV index num_computed_tokens + i), then its decoder rows
// (base sharing, ICaRus) k < num_decoder_rows: activation row
// decoder_row_offset + k, paired with the last num_decoder_rows new tokens
// (same position, same keys; they write no K/V). Query q's rows in the
// attention tiles are q * group + h, so a decoder row's heads sit right after
// the base rows' and share their K/V tiles.
// Forked sequences (forked_slot >= 0) also read rCache entries through their
// residual block table (ResidualAttention).
struct AttentionSequence {
  int32_t token_offset = 0;
  int32_t num_computed_tokens = 0;
  int32_t num_new_tokens = 0;
  int32_t block_table_offset = 0;
  int32_t decoder_row_offset = 0;
  int32_t num_decoder_rows = 0;
  int32_t forked_slot = -1;  // adapter slot of a forked sequence, -1 otherwise
  int32_t residual_block_table_offset = 0;

  LOOM_HOST_DEVICE int32_t num_queries() const { return num_new_tokens + num_decoder_rows; }
  // Activation row of query q.
  LOOM_HOST_DEVICE int64_t query_row(int32_t q) const {
    return q < num_new_tokens ? static_cast<int64_t>(token_offset) + q
                              : static_cast<int64_t>(decoder_row_offset) + (q - num_new_tokens);
  }
  // Index among the new tokens whose keys query q sees (its own included).
  LOOM_HOST_DEVICE int32_t query_token(int32_t q) const {
    return q < num_new_tokens ? q : q - num_decoder_rows;
  }
};

struct AttentionWorkItem {
  int32_t sequence = 0;
  int32_t row_begin = 0;       // first row of the tile
  int32_t kv_begin = 0;        // KV entries [kv_begin, kv_end) of this item
  int32_t kv_end = 0;
  int32_t partial_index = -1;  // -1: write the output; else a split-KV partial slot
  int32_t padding[3] = {0, 0, 0};
};

struct AttentionCombineItem {
  int32_t sequence = 0;
  int32_t row_begin = 0;
  int32_t num_rows = 0;
  int32_t first_partial = 0;
  int32_t num_partials = 0;
  int32_t padding[3] = {0, 0, 0};
};

// LoRA rows are the batch tokens that carry an adapter, grouped by adapter slot.
// A tile is up to kLoraTileRows consecutive rows of one group.
inline constexpr int32_t kLoraTileRows = 16;
inline constexpr int32_t kLoraMaxRank = 256;

struct LoraTile {
  int32_t slot = 0;
  int32_t first_row = 0;
  int32_t num_rows = 0;
  int32_t padding = 0;
};

// Device sampling of one logits row (backend.h DeviceSampling; sampling.h).
struct SamplingRow {
  int32_t on_device = 0;  // 0: leave the row to the host (the kernel writes token -1)
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint32_t seed_lo = 0, seed_hi = 0, step_lo = 0, step_hi = 0;
  int32_t mask_row = -1;  // >= 0: the token mask row applied before the draw (launch_apply_token_masks)
  // Logit processing (launch_process_logits): backend.h DeviceSampling's fields of the same names.
  float repetition_penalty = 1.0f, min_p = 0.0f;
  int32_t edits_begin = 0, num_edits = 0;
};
// backend.h's LogitEdit as the kernels read it (backend.h needs C++20, the
// kernels are C++17; cuda_step.cc checks that the layouts agree).
struct DeviceLogitEdit {
  int32_t token = 0;
  float bias = 0.0f;
  float subtract = 0.0f;
  int32_t repeated = 0;
};
// True when launch_process_logits changes the row (edits, or min_p while drawing at a temperature).
LOOM_HOST_DEVICE inline bool processes_logits(const SamplingRow& row) {
  return row.on_device && (row.num_edits > 0 || (row.min_p > 0.0f && row.temperature > 0.0f));
}

// ForkKV rCache on the device: per layer, slots of 2 * rank_stride bf16
// values [rK: rank_stride][rV: rank_stride] (slot = backend.h's block * block_size
// + offset), rank_stride = residual_rank_stride(max_rank). Values past an
// adapter's rank are written as zeros. ResidualAttention reads up to
// kResidualMaxRank of each half.
inline constexpr int32_t kResidualMaxRank = 64;
LOOM_HOST_DEVICE inline int32_t residual_rank_stride(int32_t max_rank) { return (max_rank + 7) / 8 * 8; }

// One adapter module on the device; rank 0 = the adapter does not target it.
struct LoraModuleRef {
  const __nv_bfloat16* a = nullptr;  // [rank, in_features]
  const __nv_bfloat16* b = nullptr;  // [out_features, rank]
  int32_t rank = 0;
  float scale = 0.0f;
};

// The device module table is [slot][layer][target] (DeviceLoraTable); target is
// a LoraTarget index, kLoraTargets == lora/adapter.h's kNumLoraTargets.
inline constexpr int32_t kLoraTargets = 7;
inline constexpr int32_t kLoraTargetK = 1, kLoraTargetV = 2;  // LoraTarget::kK, LoraTarget::kV
LOOM_HOST_DEVICE inline const LoraModuleRef& lora_module(const LoraModuleRef* table, int32_t slot, int32_t num_layers,
                                                         int32_t layer, int32_t target) {
  return table[(static_cast<int64_t>(slot) * num_layers + layer) * kLoraTargets + target];
}

}  // namespace loom::cuda
