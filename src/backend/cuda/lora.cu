// Batched multi-LoRA (SGMV-style): rows are the tokens that carry an adapter,
// grouped by adapter slot and cut into tiles of <= 16 rows (plan_types.h).
//   shrink: v[row, j] = x[token] . A[j]      one CTA per (tile, target); a warp per rank j
//   expand: y[token, o] += scale * v[row] . B[o]   one CTA per (tile, 256 outputs, target)
// Each tile reads its adapter's A and B once; ranks may differ between adapters
// and modules (the module table gives each one's rank; 0 = not targeted).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

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

__device__ __forceinline__ const LoraModuleRef& module_of(const LoraParams& p, int slot, int target) {
  return p.modules[(static_cast<int64_t>(slot) * p.num_layers + p.layer) * 7 + target];
}

// One CTA per (tile, target, 512-feature chunk of the input): the chunk of the
// tile's x rows is staged in shared memory, each warp takes ranks j = warp,
// warp + 4, ... and writes its partial dot products to v[target][chunk]; the
// expand kernel sums the chunks. No atomics, deterministic, and a decode step's
// few rows still spread over enough CTAs to stream A at full bandwidth.
__global__ void __launch_bounds__(kShrinkThreads) lora_shrink_kernel(LoraParams p) {
  const LoraTile tile = p.tiles[blockIdx.x];
  const LoraTargetArgs target = p.targets[blockIdx.y];
  const LoraModuleRef module = module_of(p, tile.slot, target.target);
  const int chunk_begin = blockIdx.z * kLoraShrinkChunk;
  if (module.rank == 0 || chunk_begin >= target.in_features) return;
  const int chunk = min(kLoraShrinkChunk, target.in_features - chunk_begin);
  __shared__ __align__(16) bf16 x_tile[kLoraTileRows][kLoraShrinkChunk];
  for (int index = threadIdx.x; index < tile.num_rows * (chunk / 8); index += kShrinkThreads) {
    const int r = index / (chunk / 8);
    const int c = (index % (chunk / 8)) * 8;
    const int64_t token = p.sorted_tokens[tile.first_row + r];
    *reinterpret_cast<uint4*>(&x_tile[r][c]) =
        *reinterpret_cast<const uint4*>(p.x + token * p.x_stride + chunk_begin + c);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  float* v = p.v + (static_cast<int64_t>(blockIdx.y) * p.max_splits + blockIdx.z) * p.num_rows * p.max_rank;
  for (int j = warp; j < module.rank; j += kShrinkThreads / 32) {
    const bf16* a_row = module.a + static_cast<int64_t>(j) * target.in_features + chunk_begin;
    float accumulators[kLoraTileRows];
#pragma unroll
    for (int r = 0; r < kLoraTileRows; ++r) accumulators[r] = 0.0f;
    for (int k = lane * 8; k < chunk; k += 32 * 8) {
      float a[8];
      load8(a_row + k, a);
#pragma unroll
      for (int r = 0; r < kLoraTileRows; ++r) {
        if (r < tile.num_rows) {
          float x[8];
          load8(&x_tile[r][k], x);
#pragma unroll
          for (int e = 0; e < 8; ++e) accumulators[r] += a[e] * x[e];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kLoraTileRows; ++r) {
      if (r < tile.num_rows) {
        float value = accumulators[r];
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
        if (lane == 0) v[static_cast<int64_t>(tile.first_row + r) * p.max_rank + j] = value;
      }
    }
  }
}

__global__ void __launch_bounds__(kExpandThreads) lora_expand_kernel(LoraParams p) {
  const LoraTile tile = p.tiles[blockIdx.x];
  const LoraTargetArgs target = p.targets[blockIdx.z];
  const LoraModuleRef module = module_of(p, tile.slot, target.target);
  const int first_output = blockIdx.y * kExpandThreads;
  if (module.rank == 0 || first_output >= target.out_features) return;
  extern __shared__ float v_tile[];  // [kLoraTileRows][rank]
  __shared__ int32_t tokens[kLoraTileRows];
  const int rank = module.rank;
  const int num_splits = (target.in_features + kLoraShrinkChunk - 1) / kLoraShrinkChunk;
  for (int index = threadIdx.x; index < tile.num_rows * rank; index += kExpandThreads) {
    const int r = index / rank;
    const int j = index % rank;
    const float* v = p.v + static_cast<int64_t>(blockIdx.z) * p.max_splits * p.num_rows * p.max_rank +
                     static_cast<int64_t>(tile.first_row + r) * p.max_rank + j;
    float sum = 0.0f;
    for (int split = 0; split < num_splits; ++split) sum += v[static_cast<int64_t>(split) * p.num_rows * p.max_rank];
    v_tile[r * rank + j] = sum;
  }
  if (threadIdx.x < kLoraTileRows)
    tokens[threadIdx.x] = threadIdx.x < tile.num_rows ? p.sorted_tokens[tile.first_row + threadIdx.x] : 0;
  __syncthreads();
  const int output = first_output + threadIdx.x;
  if (output >= target.out_features) return;

  float accumulators[kLoraTileRows];
#pragma unroll
  for (int r = 0; r < kLoraTileRows; ++r) accumulators[r] = 0.0f;
  const bf16* b_row = module.b + static_cast<int64_t>(output) * rank;
  int j = 0;
  if (rank % 8 == 0) {
    for (; j < rank; j += 8) {
      float b[8];
      load8(b_row + j, b);
#pragma unroll
      for (int r = 0; r < kLoraTileRows; ++r) {
        if (r < tile.num_rows) {
          float sum = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) sum += v_tile[r * rank + j + e] * b[e];
          accumulators[r] += sum;
        }
      }
    }
  }
  for (; j < rank; ++j) {
    const float b = __bfloat162float(b_row[j]);
#pragma unroll
    for (int r = 0; r < kLoraTileRows; ++r)
      if (r < tile.num_rows) accumulators[r] += v_tile[r * rank + j] * b;
  }
  const int column = target.y_column + output;
#pragma unroll
  for (int r = 0; r < kLoraTileRows; ++r) {
    if (r >= tile.num_rows) continue;
    const int64_t index = static_cast<int64_t>(tokens[r]) * p.y_stride + column;
    const float delta = module.scale * accumulators[r];
    if (p.y_is_bf16) {
      bf16* y = static_cast<bf16*>(p.y) + index;
      *y = __float2bfloat16_rn(__bfloat162float(*y) + delta);
    } else {
      static_cast<float*>(p.y)[index] += delta;
    }
  }
}

}  // namespace

int32_t lora_splits(int32_t in_features) { return (in_features + kLoraShrinkChunk - 1) / kLoraShrinkChunk; }

void launch_lora(const LoraParams& params, cudaStream_t stream) {
  if (params.num_tiles == 0 || params.num_targets == 0) return;
  if (params.max_rank > kLoraMaxRank) throw_unsupported("cuda LoRA: rank above 256", params.max_rank);
  int max_out = 0, max_in = 0;
  for (int t = 0; t < params.num_targets; ++t) {
    max_in = max_in > params.targets[t].in_features ? max_in : params.targets[t].in_features;
    if (params.targets[t].in_features % 8 != 0)
      throw_unsupported("cuda LoRA: in_features must be a multiple of 8", params.targets[t].in_features);
    max_out = max_out > params.targets[t].out_features ? max_out : params.targets[t].out_features;
  }
  if (lora_splits(max_in) > params.max_splits)
    throw_unsupported("cuda LoRA: v scratch has too few splits for in_features", max_in);
  lora_shrink_kernel<<<dim3(params.num_tiles, params.num_targets, lora_splits(max_in)), kShrinkThreads, 0, stream>>>(
      params);
  LOOM_CUDA_CHECK_LAUNCH();
  const dim3 expand_grid(params.num_tiles, (max_out + kExpandThreads - 1) / kExpandThreads, params.num_targets);
  const size_t shared = static_cast<size_t>(kLoraTileRows) * params.max_rank * sizeof(float);
  lora_expand_kernel<<<expand_grid, kExpandThreads, shared, stream>>>(params);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda
