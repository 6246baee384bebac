// Batched multi-LoRA (SGMV-style): rows are the tokens that carry an adapter,
// grouped by adapter slot and cut into tiles of <= 16 rows (plan_types.h).
//   shrink: v[row, j] = x[token] . A[j]      one CTA per (tile, target); a warp per rank j
//   expand: y[token, o] += scale * v[row] . B[o]   one CTA per (tile, 256 outputs, target)
// Each tile reads its adapter's A and B once; ranks may differ between adapters
// and modules (the module table gives each one's rank; 0 = not targeted).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

#include <algorithm>

namespace loom::cuda {

namespace {

constexpr int kShrinkThreads = 128;
constexpr int kLoraShrinkChunk = 512;  // input features per shrink CTA
constexpr int kExpandThreads = 256;

__device__ __forceinline__ void load8(const bf16* source, float (&out)[8]) {
  const uint4 packed = *reinterpret_cast<const uint4*>(source);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 pair = __bfloat1622float2(pairs[k]);
    out[2 * k] = pair.x;
    out[2 * k + 1] = pair.y;
  }
}

__device__ __forceinline__ void unpack8(const uint4& packed, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 pair = __bfloat1622float2(pairs[k]);
    out[2 * k] = pair.x;
    out[2 * k + 1] = pair.y;
  }
}

__device__ __forceinline__ const LoraModuleRef& module_of(const LoraParams& p, int slot, int target) {
  return lora_module(p.modules, slot, p.num_layers, p.layer, target);
}

// Decode steps give each LoRA launch only a few rows, so these kernels are
// latency-bound: each issues all of its global loads up front (one round trip)
// rather than walking ranks or rows one dependent load at a time.
//
// Shrink: one CTA per (tile, target, 512-feature chunk of the input). Thread t
// takes rank j0 + t / 8 and the 64 features (t % 8) * 64.. of the chunk, holds
// that slice of A in registers, dots it with the tile's x rows (staged in
// shared memory) and the 8 threads of a rank sum by shuffles. Partial sums per
// chunk go to v[target][chunk]; the expand kernel adds the chunks (no atomics:
// deterministic).
__global__ void __launch_bounds__(kShrinkThreads) lora_shrink_kernel(LoraParams p) {
  // Launched programmatically (inline in a programmatic step), x is the previous
  // kernel's output. The expand may be a programmatic launch too: let its CTAs
  // start their prologue now; they wait for this grid before reading v.
  pdl_wait();
  pdl_trigger();
  const LoraTile tile = p.tiles[blockIdx.x];
  if (tile.num_rows == 0) return;  // padding of a graph-captured step's list
  const LoraTargetArgs target = p.targets[blockIdx.y];
  const LoraModuleRef module = module_of(p, tile.slot, target.target);
  const int chunk_begin = blockIdx.z * kLoraShrinkChunk;
  if (module.rank == 0 || chunk_begin >= target.in_features) return;
  const int chunk = min(kLoraShrinkChunk, target.in_features - chunk_begin);
  __shared__ __align__(16) bf16 x_tile[kLoraTileRows][kLoraShrinkChunk];
  const int segment = threadIdx.x % 8;
  const int first_feature = segment * 64;
  float* v = p.v + (static_cast<int64_t>(blockIdx.y) * p.max_splits + blockIdx.z) * p.num_rows * p.max_rank;

  __shared__ int32_t tokens[kLoraTileRows];
  if (threadIdx.x < kLoraTileRows)
    tokens[threadIdx.x] = threadIdx.x < tile.num_rows ? p.sorted_tokens[tile.first_row + threadIdx.x] : 0;
  for (int j0 = 0; j0 < module.rank; j0 += kShrinkThreads / 8) {
    const int j = j0 + threadIdx.x / 8;
    uint4 a[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int feature = first_feature + 8 * i;
      a[i] = j < module.rank && feature < chunk
                 ? *reinterpret_cast<const uint4*>(module.a + static_cast<int64_t>(j) * target.in_features + chunk_begin + feature)
                 : make_uint4(0, 0, 0, 0);
    }
    if (j0 == 0) {  // stage x once, while the A loads are in flight; every load independent
      __syncthreads();  // tokens
      constexpr int kVectorsPerRow = kLoraShrinkChunk / 8;
#pragma unroll
      for (int i = 0; i < kLoraTileRows * kVectorsPerRow / kShrinkThreads; ++i) {
        const int index = threadIdx.x + i * kShrinkThreads;
        const int r = index / kVectorsPerRow;
        const int c = (index % kVectorsPerRow) * 8;
        if (r < tile.num_rows && c < chunk)
          *reinterpret_cast<uint4*>(&x_tile[r][c]) =
              *reinterpret_cast<const uint4*>(p.x + static_cast<int64_t>(tokens[r]) * p.x_stride + chunk_begin + c);
      }
      __syncthreads();
    }
    float a_values[64];
#pragma unroll
    for (int i = 0; i < 8; ++i) unpack8(a[i], &a_values[8 * i]);
#pragma unroll
    for (int r = 0; r < kLoraTileRows; ++r) {
      if (r >= tile.num_rows) break;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (first_feature + 8 * i >= chunk) break;
        float x[8];
        load8(&x_tile[r][first_feature + 8 * i], x);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum += a_values[8 * i + e] * x[e];
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      if (segment == 0 && j < module.rank) v[static_cast<int64_t>(tile.first_row + r) * p.max_rank + j] = sum;
    }
  }
}

// Expand: one CTA per (tile, 256 * kColumns outputs, target), kColumns output
// columns per thread (256 apart). The old y values and B's rows are loaded
// first, then the chunk sums of v are gathered into shared memory, then each
// row gets scale * v . B[o]. More columns per thread: fewer CTAs, more loads in
// flight per CTA, which matters on the side stream, where the expand gets only
// the SMs the base GEMM leaves. Serving runs one column per thread (bench/README.md,
// "The measurements behind the CUDA defaults").
template <int kColumns, int kThreads>
__global__ void __launch_bounds__(kThreads) lora_expand_kernel(LoraParams p) {
  const LoraTile tile = p.tiles[blockIdx.x];
  if (tile.num_rows == 0) {  // padding of a graph-captured step's list
    pdl_wait();  // every CTA waits (launch.cuh), so later kernels' waits cover the shrink
    return;
  }
  const LoraTargetArgs target = p.targets[blockIdx.z];
  const LoraModuleRef module = module_of(p, tile.slot, target.target);
  const int first_output = blockIdx.y * kThreads * kColumns;
  if (first_output >= target.out_features) {
    pdl_wait();
    return;
  }
  int output[kColumns];
  bool has_output[kColumns];
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
    output[c] = first_output + threadIdx.x + c * kThreads;
    has_output[c] = output[c] < target.out_features;
  }
  if (module.rank == 0) {
    pdl_wait();
    if (p.write_by_lora_row)  // every LoRA row's columns get written
#pragma unroll
      for (int c = 0; c < kColumns; ++c)
        if (has_output[c])
          for (int r = 0; r < tile.num_rows; ++r) {
            const int64_t index = static_cast<int64_t>(tile.first_row + r) * p.y_stride + target.y_column + output[c];
            if (p.y_is_bf16) {
              static_cast<bf16*>(p.y)[index] = __float2bfloat16_rn(0.0f);
            } else {
              static_cast<float*>(p.y)[index] = 0.0f;
            }
          }
    return;
  }
  extern __shared__ float v_tile[];  // [kLoraTileRows][rank]
  const int rank = module.rank;

  // 1. This thread's old y values (one per row and column) and, for ranks up to 16, its rows of B.
  int32_t token[kLoraTileRows];
  float y_old[kColumns][kLoraTileRows];
#pragma unroll
  for (int r = 0; r < kLoraTileRows; ++r) {
    token[r] = r < tile.num_rows ? p.sorted_tokens[tile.first_row + r] : -1;
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      y_old[c][r] = 0.0f;
      if (r < tile.num_rows && has_output[c] && !p.write_by_lora_row) {
        const int64_t index = static_cast<int64_t>(token[r]) * p.y_stride + target.y_column + output[c];
        y_old[c][r] = p.y_is_bf16 ? __bfloat162float(static_cast<const bf16*>(p.y)[index]) : static_cast<const float*>(p.y)[index];
      }
    }
  }
  float b_first[kColumns][16];
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
    const bf16* b_row = module.b + static_cast<int64_t>(has_output[c] ? output[c] : 0) * rank;
    if (rank % 8 == 0) {  // 16-byte loads (B rows are 16-byte aligned then)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (8 * i < rank) {
          unpack8(*reinterpret_cast<const uint4*>(b_row + 8 * i), &b_first[c][8 * i]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) b_first[c][8 * i + e] = 0.0f;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) b_first[c][j] = j < rank ? __bfloat162float(b_row[j]) : 0.0f;
    }
  }

  // 2. v rows: the sum over the shrink's chunks, once the shrink grid is done
  // (everything above reads only what was written before the shrink began).
  pdl_wait();
  const int num_splits = (target.in_features + kLoraShrinkChunk - 1) / kLoraShrinkChunk;
  for (int index = threadIdx.x; index < tile.num_rows * rank; index += kThreads) {
    const int r = index / rank;
    const int j = index % rank;
    const float* v = p.v + static_cast<int64_t>(blockIdx.z) * p.max_splits * p.num_rows * p.max_rank +
                     static_cast<int64_t>(tile.first_row + r) * p.max_rank + j;
    float sum = 0.0f;
#pragma unroll 8
    for (int split = 0; split < num_splits; ++split) sum += v[static_cast<int64_t>(split) * p.num_rows * p.max_rank];
    v_tile[r * rank + j] = sum;
  }
  __syncthreads();

  // 3. y += scale * v . B[o].
#pragma unroll
  for (int r = 0; r < kLoraTileRows; ++r) {
    if (token[r] < 0) continue;
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      if (!has_output[c]) continue;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (j < rank) sum += v_tile[r * rank + j] * b_first[c][j];
      const bf16* b_row = module.b + static_cast<int64_t>(output[c]) * rank;
      for (int j = 16; j < rank; ++j) sum += v_tile[r * rank + j] * __bfloat162float(b_row[j]);
      const float value = y_old[c][r] + module.scale * sum;
      const int64_t index =
          static_cast<int64_t>(p.write_by_lora_row ? tile.first_row + r : token[r]) * p.y_stride + target.y_column + output[c];
      if (p.y_is_bf16) {
        static_cast<bf16*>(p.y)[index] = __float2bfloat16_rn(value);
      } else {
        static_cast<float*>(p.y)[index] = value;
      }
    }
  }
}

#ifdef LOOM_CUDA_MEASURE
// Fused shrink + expand for decode-sized tiles, one launch per projection
// group: one CTA per (tile, block of outputs, target), few CTAs in all. Each CTA
// computes the tile's whole v = scale * x A^T itself, keeps it in shared memory
// and expands its block of outputs. The shrink streams A and the tile's x rows
// through shared memory in chunks of 2048 features with cp.async, every load of
// a chunk in flight at once (the split path's CTAs each wait on a chain of
// small dependent loads). Ranks in passes of 16: thread t takes rank
// j0 + t / 16 and features (t % 16) * 8 + 128 i of the chunk; the 16 threads of
// a rank sum by shuffles at the end of the pass.
constexpr int kFusedThreads = 256;
constexpr int kFusedChunk = 2048;
constexpr int kFusedRanksPerPass = kFusedThreads / 16;

__device__ __forceinline__ void cp_async16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global));
}

size_t fused_shared_bytes(int max_rank) {
  return 2 * static_cast<size_t>(kLoraTileRows) * kFusedChunk * sizeof(bf16) +
         static_cast<size_t>(kLoraTileRows) * max_rank * sizeof(float);
}

__global__ void __launch_bounds__(kFusedThreads) lora_fused_kernel(LoraParams p, int outputs_per_cta) {
  pdl_wait();
  pdl_trigger();
  const LoraTile tile = p.tiles[blockIdx.x];
  if (tile.num_rows == 0) return;  // padding of a graph-captured step's list
  const LoraTargetArgs target = p.targets[blockIdx.z];
  const LoraModuleRef module = module_of(p, tile.slot, target.target);
  const int first_output = blockIdx.y * outputs_per_cta;
  if (first_output >= target.out_features) return;
  const int end_output = min(target.out_features, first_output + outputs_per_cta);
  const int rank = module.rank;
  const int num_rows = tile.num_rows;
  if (rank == 0) {
    if (p.write_by_lora_row)  // every LoRA row's columns get written
      for (int o = first_output + threadIdx.x; o < end_output; o += kFusedThreads)
        for (int r = 0; r < num_rows; ++r) {
          const int64_t index = static_cast<int64_t>(tile.first_row + r) * p.y_stride + target.y_column + o;
          if (p.y_is_bf16) {
            static_cast<bf16*>(p.y)[index] = __float2bfloat16_rn(0.0f);
          } else {
            static_cast<float*>(p.y)[index] = 0.0f;
          }
        }
    return;
  }
  extern __shared__ __align__(16) unsigned char fused_shared[];
  bf16* a_tile = reinterpret_cast<bf16*>(fused_shared);         // [16 ranks][kFusedChunk]
  bf16* x_tile = a_tile + kLoraTileRows * kFusedChunk;          // [16 rows][kFusedChunk]
  float* v_tile = reinterpret_cast<float*>(x_tile + kLoraTileRows * kFusedChunk);  // [16 rows][rank]
  __shared__ int32_t tokens[kLoraTileRows];
  if (threadIdx.x < kLoraTileRows)
    tokens[threadIdx.x] = threadIdx.x < num_rows ? p.sorted_tokens[tile.first_row + threadIdx.x] : 0;
  __syncthreads();
  const int in_features = target.in_features;
  const int segment = threadIdx.x % 16;
  constexpr int kVectorsPerRow = kFusedChunk / 8;

  for (int j0 = 0; j0 < rank; j0 += kFusedRanksPerPass) {
    const int pass_ranks = min(kFusedRanksPerPass, rank - j0);
    const int j = j0 + threadIdx.x / 16;
    float sum[kLoraTileRows];
#pragma unroll
    for (int r = 0; r < kLoraTileRows; ++r) sum[r] = 0.0f;
    for (int chunk_begin = 0; chunk_begin < in_features; chunk_begin += kFusedChunk) {
      const int chunk = min(kFusedChunk, in_features - chunk_begin);
      const int vectors = chunk / 8;
      __syncthreads();  // the previous chunk's readers are done
      for (int index = threadIdx.x; index < pass_ranks * vectors; index += kFusedThreads) {
        const int row = index / vectors, column = (index % vectors) * 8;
        cp_async16(a_tile + row * kFusedChunk + column,
                   module.a + static_cast<int64_t>(j0 + row) * in_features + chunk_begin + column);
      }
      for (int index = threadIdx.x; index < num_rows * vectors; index += kFusedThreads) {
        const int row = index / vectors, column = (index % vectors) * 8;
        cp_async16(x_tile + row * kFusedChunk + column,
                   p.x + static_cast<int64_t>(tokens[row]) * p.x_stride + chunk_begin + column);
      }
      asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
      __syncthreads();
      if (j < rank) {
        for (int i = 0; i < kVectorsPerRow / 16; ++i) {
          const int feature = segment * 8 + 128 * i;
          if (feature >= chunk) break;
          float a[8];
          load8(a_tile + (j - j0) * kFusedChunk + feature, a);
#pragma unroll
          for (int r = 0; r < kLoraTileRows; ++r) {
            if (r >= num_rows) break;
            float x[8];
            load8(x_tile + r * kFusedChunk + feature, x);
#pragma unroll
            for (int e = 0; e < 8; ++e) sum[r] += a[e] * x[e];
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kLoraTileRows; ++r) {
      if (r >= num_rows) break;
      float s = sum[r];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      s += __shfl_xor_sync(0xffffffffu, s, 4);
      s += __shfl_xor_sync(0xffffffffu, s, 8);
      if (segment == 0 && j < rank) v_tile[r * rank + j] = module.scale * s;
    }
  }
  __syncthreads();

  // Expand: a thread per output column (strided), y[row] (+)= v[row] . B[o].
#pragma unroll 2
  for (int o = first_output + threadIdx.x; o < end_output; o += kFusedThreads) {
    const bf16* b_row = module.b + static_cast<int64_t>(o) * rank;
    float acc[kLoraTileRows];
#pragma unroll
    for (int r = 0; r < kLoraTileRows; ++r) acc[r] = 0.0f;
    for (int j8 = 0; j8 < rank; j8 += 8) {
      float b[8];
      if (rank % 8 == 0) {
        unpack8(__ldg(reinterpret_cast<const uint4*>(b_row + j8)), b);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) b[e] = j8 + e < rank ? __bfloat162float(b_row[j8 + e]) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kLoraTileRows; ++r) {
        if (r >= num_rows) break;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (j8 + e < rank) acc[r] += v_tile[r * rank + j8 + e] * b[e];
      }
    }
    const int column = target.y_column + o;
#pragma unroll
    for (int r = 0; r < kLoraTileRows; ++r) {
      if (r >= num_rows) break;
      if (p.write_by_lora_row) {
        const int64_t index = static_cast<int64_t>(tile.first_row + r) * p.y_stride + column;
        if (p.y_is_bf16) {
          static_cast<bf16*>(p.y)[index] = __float2bfloat16_rn(acc[r]);
        } else {
          static_cast<float*>(p.y)[index] = acc[r];
        }
        continue;
      }
      const int64_t index = static_cast<int64_t>(tokens[r]) * p.y_stride + column;
      if (p.y_is_bf16) {
        bf16* y = static_cast<bf16*>(p.y) + index;
        *y = __float2bfloat16_rn(__bfloat162float(*y) + acc[r]);
      } else {
        static_cast<float*>(p.y)[index] += acc[r];
      }
    }
  }
}

#endif  // LOOM_CUDA_MEASURE

}  // namespace

int32_t lora_splits(int32_t in_features) { return (in_features + kLoraShrinkChunk - 1) / kLoraShrinkChunk; }

namespace {

void check_lora_params(const LoraParams& params, int* max_in, int* max_out) {
  if (params.max_rank > kLoraMaxRank) throw_unsupported("cuda LoRA: rank above 256", params.max_rank);
  *max_in = 0;
  *max_out = 0;
  for (int t = 0; t < params.num_targets; ++t) {
    *max_in = std::max(*max_in, params.targets[t].in_features);
    if (params.targets[t].in_features % 8 != 0)
      throw_unsupported("cuda LoRA: in_features must be a multiple of 8", params.targets[t].in_features);
    *max_out = std::max(*max_out, params.targets[t].out_features);
  }
  if (lora_splits(*max_in) > params.max_splits)
    throw_unsupported("cuda LoRA: v scratch has too few splits for in_features", *max_in);
}

size_t expand_shared_bytes(const LoraParams& params) {
  return static_cast<size_t>(kLoraTileRows) * params.max_rank * sizeof(float);
}

}  // namespace

void launch_lora(const LoraParams& params, Launch launch) {
  if (params.num_tiles == 0 || params.num_targets == 0) return;
  int max_in = 0, max_out = 0;
  check_lora_params(params, &max_in, &max_out);
  launch_kernel(launch, dim3(params.num_tiles, params.num_targets, lora_splits(max_in)), kShrinkThreads, 0,
                lora_shrink_kernel, params);
  const dim3 expand_grid(params.num_tiles, (max_out + kExpandThreads - 1) / kExpandThreads, params.num_targets);
  launch_kernel(launch, expand_grid, kExpandThreads, expand_shared_bytes(params), lora_expand_kernel<1, kExpandThreads>,
                params);
}

#ifdef LOOM_CUDA_MEASURE
void launch_lora_variant(const LoraParams& params, Launch launch, const LoraVariant& variant) {
  if (params.num_tiles == 0 || params.num_targets == 0) return;
  int max_in = 0, max_out = 0;
  check_lora_params(params, &max_in, &max_out);
  if (variant.fused) {
    // Up to 4096 outputs per CTA (each CTA recomputes its tile's shrink).
    const int outputs_per_cta = std::min(max_out, 4096);
    const dim3 grid(params.num_tiles, (max_out + outputs_per_cta - 1) / outputs_per_cta, params.num_targets);
    const size_t shared = fused_shared_bytes(params.max_rank);
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(lora_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(shared)));
    launch_kernel(launch, grid, kFusedThreads, shared, lora_fused_kernel, params, outputs_per_cta);
    return;
  }
  if ((variant.skip & 1) == 0)
    launch_kernel(launch, dim3(params.num_tiles, params.num_targets, lora_splits(max_in)), kShrinkThreads, 0,
                  lora_shrink_kernel, params);
  if ((variant.skip & 2) != 0) return;
  // 4 or 2 columns per thread of 256; 1: one of 256; 0 (or anything else): one
  // column per thread of 128, the most CTAs.
  const int columns = variant.expand_columns == 4 ? 4 : variant.expand_columns == 2 ? 2 : 1;
  const int threads = variant.expand_columns >= 1 && variant.expand_columns <= 4 ? kExpandThreads : kExpandThreads / 2;
  const int outputs_per_cta = threads * columns;
  const dim3 expand_grid(params.num_tiles, (max_out + outputs_per_cta - 1) / outputs_per_cta, params.num_targets);
  const size_t shared = expand_shared_bytes(params);
  // The expand's launch and prologue overlap the shrink (its pdl_wait is a no-op without it).
  const Launch expand(launch.stream, launch.programmatic || variant.programmatic_expand);
  if (threads != kExpandThreads) {
    launch_kernel(expand, expand_grid, threads, shared, lora_expand_kernel<1, kExpandThreads / 2>, params);
  } else if (columns == 4) {
    launch_kernel(expand, expand_grid, threads, shared, lora_expand_kernel<4, kExpandThreads>, params);
  } else if (columns == 2) {
    launch_kernel(expand, expand_grid, threads, shared, lora_expand_kernel<2, kExpandThreads>, params);
  } else {
    launch_kernel(expand, expand_grid, threads, shared, lora_expand_kernel<1, kExpandThreads>, params);
  }
}
#endif  // LOOM_CUDA_MEASURE

}  // namespace loom::cuda
