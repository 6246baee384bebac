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
  return p.modules[(static_cast<int64_t>(slot) * p.num_layers + p.layer) * 7 + target];
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
  // The expand is launched programmatically dependent (PDL): let its CTAs
  // start their prologue now; they wait for this grid before reading v.
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
  const LoraTile tile = p.tiles[blockIdx.x];
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

// Expand: one CTA per (tile, 256 outputs, target), a thread per output column.
// The old y values and B's row are loaded first, then the chunk sums of v are
// gathered into shared memory, then each row gets scale * v . B[o]. (Two
// columns per thread, half the CTAs, measured slower on the H100: 1.38x
// instead of 1.27x for the multi-LoRA decode step.)
__global__ void __launch_bounds__(kExpandThreads) lora_expand_kernel(LoraParams p) {
  const LoraTile tile = p.tiles[blockIdx.x];
  const LoraTargetArgs target = p.targets[blockIdx.z];
  const LoraModuleRef module = module_of(p, tile.slot, target.target);
  const int first_output = blockIdx.y * kExpandThreads;
  if (first_output >= target.out_features) return;
  const int output = first_output + threadIdx.x;
  const bool has_output = output < target.out_features;
  const int column = target.y_column + output;
  if (module.rank == 0) {
    if (p.write_by_lora_row && has_output)  // every LoRA row's columns get written
      for (int r = 0; r < tile.num_rows; ++r)
        static_cast<float*>(p.y)[static_cast<int64_t>(tile.first_row + r) * p.y_stride + column] = 0.0f;
    return;
  }
  extern __shared__ float v_tile[];  // [kLoraTileRows][rank]
  const int rank = module.rank;

  // 1. This thread's old y values (one per row) and, for ranks up to 16, its row of B.
  int32_t token[kLoraTileRows];
  float y_old[kLoraTileRows];
#pragma unroll
  for (int r = 0; r < kLoraTileRows; ++r) {
    y_old[r] = 0.0f;
    token[r] = -1;
    if (r < tile.num_rows && has_output) {
      token[r] = p.sorted_tokens[tile.first_row + r];
      if (p.write_by_lora_row) continue;
      const int64_t index = static_cast<int64_t>(token[r]) * p.y_stride + column;
      y_old[r] = p.y_is_bf16 ? __bfloat162float(static_cast<const bf16*>(p.y)[index]) : static_cast<const float*>(p.y)[index];
    }
  }
  const bf16* b_row = module.b + static_cast<int64_t>(has_output ? output : 0) * rank;
  float b_first[16];
  if (rank % 8 == 0) {  // 16-byte loads (B rows are 16-byte aligned then)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (8 * i < rank) {
        unpack8(*reinterpret_cast<const uint4*>(b_row + 8 * i), &b_first[8 * i]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) b_first[8 * i + e] = 0.0f;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) b_first[j] = j < rank ? __bfloat162float(b_row[j]) : 0.0f;
  }

  // 2. v rows: the sum over the shrink's chunks, once the shrink grid is done
  // (everything above reads only what was written before the shrink began).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int num_splits = (target.in_features + kLoraShrinkChunk - 1) / kLoraShrinkChunk;
  for (int index = threadIdx.x; index < tile.num_rows * rank; index += kExpandThreads) {
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
  if (!has_output) return;

  // 3. y += scale * v . B[o].
#pragma unroll
  for (int r = 0; r < kLoraTileRows; ++r) {
    if (token[r] < 0) continue;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      if (j < rank) sum += v_tile[r * rank + j] * b_first[j];
    for (int j = 16; j < rank; ++j) sum += v_tile[r * rank + j] * __bfloat162float(b_row[j]);
    const float value = y_old[r] + module.scale * sum;
    const int64_t index =
        static_cast<int64_t>(p.write_by_lora_row ? tile.first_row + r : token[r]) * p.y_stride + column;
    if (p.y_is_bf16 && !p.write_by_lora_row) {
      static_cast<bf16*>(p.y)[index] = __float2bfloat16_rn(value);
    } else {
      static_cast<float*>(p.y)[index] = value;
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
  // Optionally a programmatic dependent launch: the expand's launch and prologue
  // overlap the shrink (griddepcontrol.wait is a no-op without it).
  cudaLaunchConfig_t config = {};
  config.gridDim = expand_grid;
  config.blockDim = dim3(kExpandThreads);
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = params.programmatic_expand ? 1 : 0;
  config.attrs = &attribute;
  config.numAttrs = 1;
  LOOM_CUDA_CHECK(cudaLaunchKernelEx(&config, lora_expand_kernel, params));
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda
