// Wide prefill attention, warp-specialized (FlashAttention-3's ping-pong), for
// sm_90a: the kPrefillWide items and numerics of attention_wide.cu, with the
// tensor cores kept busy while softmax runs.
//
// attention_wide.cu's two warpgroups load each K/V tile together and meet at
// two CTA barriers per tile, so both issue their GEMMs, then both run softmax
// with the tensor cores idle: ~3.1 us a tile where the GEMMs alone take ~2 (its
// 346 TFLOP/s at 32K against SDPA's 615). Here:
//   - a producer warpgroup (which gives its registers to the consumers
//     through setmaxnreg: 40 against 232 a thread) gathers K/V tiles through
//     the block table with cp.async into kStages stages; a stage's `full`
//     mbarrier says it landed (bf16: each producer thread's copies arrive on it
//     as they land, cp.async.mbarrier.arrive.noinc, and the consumers fence them
//     to the async proxy after their wait; FP8: each producer thread waits for
//     its raw copies, decodes them, fences and arrives), its `empty` mbarrier
//     that all 256 consumer threads are done reading it;
//   - the two consumer warpgroups take turns at the tensor cores (named
//     barriers kTurnBarrier + w): in phase j a warpgroup issues S_j = Q K_j^T and
//     O += P_{j-1} V_{j-1} back to back, hands the turn over, then runs softmax
//     on S_j while the other warpgroup's GEMMs run; its own PV_{j-1} overlaps
//     the row maxima only: ptxas schedules the wait for it at the top of the
//     block holding the exponentials (moving them apart measured slower,
//     bench/README.md "Prefill attention at SDPA's pace").
// Both warpgroups run every phase, computing or not (causal rows end early), so
// the turns pair up. Shared memory: Q + 3 stages of K and V (225 KiB at head
// dim 128). The default (CudaTuning::pingpong_prefill; its figures against the
// wgmma kernel: bench/README.md, "The measurements behind the CUDA defaults").
#include <cfloat>

#include "backend/cuda/attention_wide.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_attributes.cuh"
#include "backend/cuda/kv_fp8.cuh"

namespace loom::cuda {

namespace {

constexpr int kConsumerThreads = 256;  // two warpgroups of 64 rows
constexpr int kProducerThreads = 128;  // the third warpgroup: each tile's loaders
constexpr int kPingPongThreads = kConsumerThreads + kProducerThreads;
// Registers a thread after the split (setmaxnreg): 128 x 40 + 256 x 232 <= 64K.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kRows = kAttentionWideRows;
constexpr int kKeys = kWideTileKeys;
// bf16 K/V stages: three, or two for an FP8 cache, whose shared memory also holds
// two raw stages of e4m3 bytes (the same total: 224 KB at head_dim 128).
template <bool kFp8>
constexpr int kStagesOf = kFp8 ? 2 : 3;
constexpr int kQBarrier = 1;     // named barrier: the consumers, once Q has landed
constexpr int kTurnBarrier = 2;  // + w: warpgroup w's turn at the tensor cores

template <int kHeadDim, bool kFp8>
constexpr size_t pingpong_shared_bytes() {
  // Q [128][d], the stages of K and V [128][d] (FP8: + two raw stages of K and V bytes), the mbarriers, + slack to align to 1024 bytes.
  constexpr int kStages = kStagesOf<kFp8>;
  return static_cast<size_t>(kRows + 2 * kStages * kKeys) * kHeadDim * sizeof(bf16) + (kFp8 ? 2 * 2 * kKeys * kHeadDim : 0) +
         2 * kStages * sizeof(uint64_t) + 1024;
}

__device__ __forceinline__ void mbarrier_init(uint32_t barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}
// Arrives on `barrier` once every cp.async this thread issued before has landed
// (without adding to the barrier's expected count: one of its arrivals).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint32_t barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t barrier) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(barrier) : "memory");
}
// Returns once the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t barrier, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(barrier),
      "r"(parity)
      : "memory");
}
template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
__device__ __forceinline__ void named_sync(int barrier, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(barrier), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int barrier, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(barrier), "r"(threads) : "memory");
}

// kFp8: the main pool is an FP8 cache; the producer copies each tile's bytes into a
// raw stage with cp.async, decodes them into the bf16 stage (kv_fp8.cuh) and publishes it.
template <int kHeadDim, bool kFp8>
__global__ void __launch_bounds__(kPingPongThreads, 1)
    attention_pingpong_kernel(AttentionParams p, const AttentionWorkItem* items) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks a row
  constexpr uint32_t kQBytes = kRows * kHeadDim * sizeof(bf16);
  constexpr uint32_t kTileBytes = kKeys * kHeadDim * sizeof(bf16);
  constexpr int kOut = kHeadDim / 2;  // O accumulators a thread
  constexpr int kStages = kStagesOf<kFp8>;
  constexpr uint32_t kRawTileBytes = kKeys * kHeadDim;  // FP8: one raw stage's K (V follows)

  extern __shared__ __align__(16) unsigned char shared_raw[];
  const WideShared shared = wide_shared_base(shared_raw);
  unsigned char* base = shared.pointer;
  const uint32_t q_address = shared.address;
  const uint32_t k_address = q_address + kQBytes;                      // [kStages]
  const uint32_t v_address = k_address + kStages * kTileBytes;         // [kStages]
  const uint32_t full_barriers = v_address + kStages * kTileBytes;     // [kStages] x 8 bytes
  const uint32_t empty_barriers = full_barriers + kStages * 8;         // [kStages] x 8 bytes
  unsigned char* raw_stages = base + kQBytes + 2 * kStages * kTileBytes + 2 * kStages * 8;  // FP8: [2][K|V], 16-byte aligned

  const AttentionWorkItem item = items[blockIdx.x];
  if (item.sequence < 0) return;  // the whole CTA, before any barrier
  const int kv_head = blockIdx.y;
  const AttentionSequence sequence = p.sequences[item.sequence];
  const int group = p.num_heads / p.num_kv_heads;
  const int total_rows = sequence.num_queries() * group;
  const int tid = threadIdx.x;
  const int32_t* block_table = p.block_tables + sequence.block_table_offset;
  const int num_tiles = (item.kv_end + kKeys - 1) / kKeys;

  if (tid == 0) {
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(full_barriers + 8 * stage, kProducerThreads);
      mbarrier_init(empty_barriers + 8 * stage, kConsumerThreads);
    }
  }
  __syncthreads();  // the last CTA-wide barrier: the roles part here

  if (tid >= kConsumerThreads) {
    // Producer: tile t into stage t % kStages once every consumer is done with
    // tile t - kStages; thread i copies chunk i % kChunks of rows i / kChunks + kLoadRows * pass.
    registers_decrease<kProducerRegisters>();
    const int producer_tid = tid - kConsumerThreads;
    const int lane = tid % 32;
    constexpr int kLoadRows = kProducerThreads / kChunks;
    constexpr int kPasses = kKeys / kLoadRows;
    static_assert(kProducerThreads % kChunks == 0 && kPasses % 4 == 0, "whole rows per pass");
    const PagedGather kv_gather = PagedGather::kv(block_table, kv_head, p.block_size, p.num_kv_heads, kHeadDim);
    const int shift = kv_gather.block_shift;  // launch_attention_pingpong sends only power-of-two sizes >= 4
    const int load_row = producer_tid / kChunks;
    const int load_chunk = producer_tid % kChunks;
    // A tile spans at most 32 blocks: lane b of each warp reads the tile's b-th
    // block-table entry once, and every copy takes its block from a shuffle.
    // (Reading the table per few copies put a dependent L2 round trip in front
    // of them; one warp issuing a whole tile could not keep up with the GEMMs.)
    const int table_entries = max(kKeys >> shift, 1);
    auto tile_blocks = [&](int t) -> int32_t {
      const int entry = ((t * kKeys) >> shift) + lane;
      return lane < table_entries && (entry << shift) < item.kv_end ? __ldg(block_table + entry) : 0;
    };
    auto publish = [&](int t) {  // once this thread's copies of tile t have landed
      fence_proxy_async_shared();
      mbarrier_arrive(full_barriers + 8 * (t % kStages));
    };
    int32_t blocks = tile_blocks(0);
    if constexpr (kFp8) {
      // Tile t's e4m3 bytes land in raw stage t % 2 by cp.async, 16 entries a copy
      // (tile t + 1's in flight while tile t is decoded); then this thread decodes
      // its own copies into the bf16 stage the consumers read, and publishes it.
      constexpr int kRawChunks = kHeadDim / 16;
      constexpr int kRawRows = kProducerThreads / kRawChunks;
      constexpr int kRawPasses = kKeys / kRawRows;
      static_assert(kProducerThreads % kRawChunks == 0 && kKeys % kRawRows == 0, "whole rows per pass");
      const int raw_row = producer_tid / kRawChunks;
      const int raw_chunk = producer_tid % kRawChunks;
      auto issue = [&](int t, int32_t tile_block_entries) {
        unsigned char* raw = raw_stages + (t % 2) * 2 * kRawTileBytes;
#pragma unroll
        for (int pass = 0; pass < kRawPasses; ++pass) {
          const int r = raw_row + pass * kRawRows;
          const int32_t block = __shfl_sync(0xffffffffu, tile_block_entries, r >> shift);
          const bool valid = t * kKeys + r < item.kv_end;
          const int64_t offset = valid ? kv_gather.index_in_block(block, t * kKeys + r) + raw_chunk * 16 : 0;
          const int destination = (r * kRawChunks + raw_chunk) * 16;
          cp_async_16(raw + destination, p.k_cache_fp8 + offset, valid);
          cp_async_16(raw + kRawTileBytes + destination, p.v_cache_fp8 + offset, valid);
        }
        cp_async_commit();
      };
      auto decode = [&](int t) {
        const unsigned char* raw = raw_stages + (t % 2) * 2 * kRawTileBytes;
        unsigned char* k_stage = base + kQBytes + (t % kStages) * kTileBytes;
        unsigned char* v_stage = base + kQBytes + (kStages + t % kStages) * kTileBytes;
#pragma unroll
        for (int pass = 0; pass < kRawPasses; ++pass) {
          const int r = raw_row + pass * kRawRows;
          const int source = (r * kRawChunks + raw_chunk) * 16;
          const uint4 k_bits = *reinterpret_cast<const uint4*>(raw + source);
          const uint4 v_bits = *reinterpret_cast<const uint4*>(raw + kRawTileBytes + source);
          const uint32_t first = swizzled_chunk_offset(r, 2 * raw_chunk, kKeys);
          const uint32_t second = swizzled_chunk_offset(r, 2 * raw_chunk + 1, kKeys);
          kv_fp8_store8(k_stage + first, make_uint2(k_bits.x, k_bits.y), p.k_scale);
          kv_fp8_store8(k_stage + second, make_uint2(k_bits.z, k_bits.w), p.k_scale);
          kv_fp8_store8(v_stage + first, make_uint2(v_bits.x, v_bits.y), p.v_scale);
          kv_fp8_store8(v_stage + second, make_uint2(v_bits.z, v_bits.w), p.v_scale);
        }
      };
      if (num_tiles > 0) issue(0, blocks);
      for (int t = 0; t < num_tiles; ++t) {
        if (t + 1 < num_tiles) {
          blocks = tile_blocks(t + 1);
          issue(t + 1, blocks);  // into the raw stage tile t - 1 was decoded from
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        if (t >= kStages) mbarrier_wait(empty_barriers + 8 * (t % kStages), ((t / kStages) - 1) & 1);
        decode(t);
        publish(t);
      }
    } else {
      // Each thread's copies of tile t arrive on full[t % kStages] as they land
      // (cp.async.mbarrier.arrive.noinc), so publishing a tile never waits for
      // the next tile's stage to be released; the consumers fence the copies to
      // the async proxy after their wait. (Publishing tile t - 1 only once tile
      // t was issued tied it to the release of tile t - 2, and the consumers'
      // wait for a tile held 17% of the kernel's stall samples: ncu, H200, 8K.)
      // Byte addresses: a block's bytes fit 32 bits (kv heads x block size x head
      // dim), so each copy's source is one wide multiply-add from this thread's bases.
      constexpr uint32_t kRowBytes = kHeadDim * sizeof(bf16);
      const uint32_t block_bytes = static_cast<uint32_t>(kv_gather.block_stride * sizeof(bf16));
      const int block_mask = p.block_size - 1;
      const int64_t thread_offset = (kv_gather.head_offset + load_chunk * 8) * static_cast<int64_t>(sizeof(bf16));
      const unsigned char* k_thread = reinterpret_cast<const unsigned char*>(p.k_cache) + thread_offset;
      const unsigned char* v_thread = reinterpret_cast<const unsigned char*>(p.v_cache) + thread_offset;
      // A pass moves 8 rows on, so each copy's swizzle (row % 8) is this thread's first row's.
      static_assert(kLoadRows % 8 == 0, "passes keep row % 8");
      const uint32_t destination_base = swizzled_chunk_offset(load_row, load_chunk, kKeys);
      for (int t = 0; t < num_tiles; ++t) {
        const int stage = t % kStages;
        if (t >= kStages) mbarrier_wait(empty_barriers + 8 * stage, ((t / kStages) - 1) & 1);
        const uint32_t k_stage = k_address + stage * kTileBytes;
        const uint32_t v_stage = v_address + stage * kTileBytes;
        const int tile_start = t * kKeys;
#pragma unroll 4
        for (int pass = 0; pass < kPasses; ++pass) {
          const int r = load_row + pass * kLoadRows;
          const int key = tile_start + r;
          // Keys at or past kv_end have block 0 (tile_blocks): a real block, zero-filled.
          const uint32_t block = static_cast<uint32_t>(__shfl_sync(0xffffffffu, blocks, r >> shift));
          const uint64_t offset = static_cast<uint64_t>(block) * block_bytes + static_cast<uint32_t>(key & block_mask) * kRowBytes;
          const uint32_t destination = destination_base + pass * kLoadRows * 128;
          const bool valid = key < item.kv_end;
          cp_async_16(k_stage + destination, k_thread + offset, valid);
          cp_async_16(v_stage + destination, v_thread + offset, valid);
        }
        cp_async_mbarrier_arrive_noinc(full_barriers + 8 * stage);
        blocks = tile_blocks(t + 1);  // in flight while the copies land
      }
      // Every copy lands before the producer exits (its arrivals are still pending).
      cp_async_commit();
      cp_async_wait<0>();
    }
    return;
  }

  registers_increase<kConsumerRegisters>();
  const int warpgroup = tid / 128;
  const int warp = (tid / 32) % 4;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int quad = lane % 4;

  wide_load_q<kHeadDim>(p, item, sequence, kv_head, group, total_rows, tid, kConsumerThreads, base);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_shared();
  named_sync(kQBarrier, kConsumerThreads);

  const WideRowLimits limits = wide_row_limits(sequence, item, group, total_rows, warpgroup, warp, g);
  const int(&row_limit)[2] = limits.row;
  const int warpgroup_limit = limits.warpgroup;
  const int active_tiles = (warpgroup_limit + kKeys - 1) / kKeys;  // tiles starting before the limit
  const int min_row_limit = min(row_limit[0], row_limit[1]);
  const float scale_log2 = p.scale * 1.4426950408889634f;

  float o[kOut];
#pragma unroll
  for (int i = 0; i < kOut; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  float s[64];
  uint32_t a[kKeys / 16][4];  // P of the previous tile, bf16 pairs: PV's A fragments

  // Phase j issues S_j and PV_{j-1}. The phases are peeled so that every wgmma
  // sits on a path the whole warpgroup takes (ptxas serializes wgmma on paths
  // it cannot prove uniform): phase 0 (S only), phases 1..active-1 (both), phase
  // `active` (PV only), then phases that only pass the turn on and release tiles.
  // The wait acquires the producer's writes; the proxy fence (bf16; the FP8
  // producer fences its own stores before arriving) orders them before wgmma.
  auto wait_full = [&](int j) {
    mbarrier_wait(full_barriers + 8 * (j % kStages), (j / kStages) & 1);
    if constexpr (!kFp8) fence_proxy_async_shared();  // the producer's cp.async writes, before wgmma reads them
  };
  // Warpgroup 0 takes the first turn; each passes the turn on after issuing its
  // GEMMs, warpgroup 1 not after its last phase (so the arrivals pair up).
  auto begin_turn = [&] { named_sync(kTurnBarrier + warpgroup, kConsumerThreads); };
  auto end_turn = [&](int j) {
    if (warpgroup == 0 || j < num_tiles) named_arrive(kTurnBarrier + (warpgroup ^ 1), kConsumerThreads);
  };
  // Tile j - 1's K (read in phase j - 1) and V (read in phase j) are done with.
  auto release = [&](int j) {
    if (j >= 1) mbarrier_arrive(empty_barriers + 8 * ((j - 1) % kStages));
  };
  auto issue_s = [&](int j) {  // S_j = Q K_j^T
    wide_issue_qk<kHeadDim>(s, q_address, k_address + (j % kStages) * kTileBytes, warpgroup);
  };
  auto issue_pv = [&](int j) {  // O += P_{j-1} V_{j-1}
    wide_issue_pv<kHeadDim>(o, a, v_address + ((j - 1) % kStages) * kTileBytes);
  };
  // Softmax of S_j in place (s becomes exp2 of the shifted scores), once S_j is done.
  float rescale[2], tile_sum[2];
  auto softmax = [&](int j) {
    fence_accumulators(s);
    wide_softmax_tile(s, j * kKeys, row_limit, min_row_limit, scale_log2, quad, row_max, rescale, tile_sum);
  };
  // Once PV_{j-1} is done with o and a: rescale o, add the tile's sum, pack P_j.
  auto finish_softmax = [&] {
    fence_accumulators(o);
    wide_rescale(o, row_sum, rescale, tile_sum);
    pack_probabilities(s, a);
  };

  if (warpgroup == 1) named_arrive(kTurnBarrier, kConsumerThreads);
  int j = 0;
  if (active_tiles > 0) {
    wait_full(0);
    begin_turn();
    issue_s(0);
    end_turn(0);
    wgmma_wait<0>();
    softmax(0);
    finish_softmax();
    for (j = 1; j < active_tiles; ++j) {
      wait_full(j);
      begin_turn();
      issue_s(j);
      issue_pv(j);
      end_turn(j);
      wgmma_wait<1>();  // S_j (committed first) is done; PV_{j-1} may still run
      softmax(j);
      wgmma_wait<0>();  // PV_{j-1} has read a and V_{j-1}, and written o
      release(j);
      finish_softmax();
    }
    begin_turn();
    issue_pv(j);
    end_turn(j);
    wgmma_wait<0>();
    fence_accumulators(o);
    release(j);
    ++j;
  }
  for (; j <= num_tiles; ++j) {
    begin_turn();
    end_turn(j);
    // Tile j - 1 is not read here, but waiting for it keeps this warpgroup from
    // releasing a stage's next use before the producer has filled the current one.
    if (j >= 1) wait_full(j - 1);
    release(j);
  }

  wide_store_rows<kHeadDim>(p, item, sequence, kv_head, group, total_rows, warpgroup, warp, g, quad, o, row_sum);
}

template <int kHeadDim, bool kFp8>
void launch_pingpong_for(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                         cudaStream_t stream) {
  constexpr size_t kShared = pingpong_shared_bytes<kHeadDim, kFp8>();
  allow_dynamic_shared_memory<attention_pingpong_kernel<kHeadDim, kFp8>>(kShared);
  const dim3 grid(num_items, params.num_kv_heads);
  attention_pingpong_kernel<kHeadDim, kFp8><<<grid, kPingPongThreads, kShared, stream>>>(params, items);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <int kHeadDim>
void launch_pingpong(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                     cudaStream_t stream) {
  if (params.k_cache_fp8 != nullptr) return launch_pingpong_for<kHeadDim, true>(params, items, num_items, stream);
  launch_pingpong_for<kHeadDim, false>(params, items, num_items, stream);
}

}  // namespace

size_t attention_pingpong_shared_bytes(int32_t head_dim) {
  // The larger of the two layouts (bf16's three stages; FP8's two and its raw stages).
  return head_dim == 128 ? std::max(pingpong_shared_bytes<128, false>(), pingpong_shared_bytes<128, true>())
                         : std::max(pingpong_shared_bytes<64, false>(), pingpong_shared_bytes<64, true>());
}

void launch_attention_pingpong(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                               cudaStream_t stream) {
  if (num_items == 0) return;
  // The producer reads a tile's block table with one warp's shuffle: block
  // sizes that are powers of two from 4 (all the engine uses). Others take
  // the kPrefillWide kernel, which computes the same.
  if (params.block_size < 4 || (params.block_size & (params.block_size - 1)) != 0)
    return launch_attention_wide(params, items, num_items, stream);
  switch (params.head_dim) {
    case 64: return launch_pingpong<64>(params, items, num_items, stream);
    case 128: return launch_pingpong<128>(params, items, num_items, stream);
    default: throw_unsupported("cuda ping-pong prefill attention: head_dim (supported: 64, 128)", params.head_dim);
  }
}

}  // namespace loom::cuda
