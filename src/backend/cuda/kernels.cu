// Element-wise and row-wise kernels of the CUDA backend (see kernels.h).
#include <algorithm>
#include <cmath>

#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/launch.cuh"

namespace loom::cuda {

namespace {

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float value, float* scratch /* [33] */) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  value = warp_sum(value);
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    float total = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
    total = warp_sum(total);
    if (lane == 0) scratch[32] = total;
  }
  __syncthreads();
  return scratch[32];
}

__global__ void embedding_kernel(const int32_t* token_ids, const bf16* table, int32_t hidden, float* out,
                                 int32_t vocab_begin, int32_t vocab_rows) {
  pdl_wait();
  pdl_trigger();
  const int64_t token = blockIdx.x;
  const int64_t id = static_cast<int64_t>(token_ids[token]) - vocab_begin;
  float* out_row = out + token * hidden;
  if (id < 0 || id >= vocab_rows) {  // another rank's row: the all-reduce adds it
    for (int i = threadIdx.x * 4; i < hidden; i += blockDim.x * 4)
      *reinterpret_cast<float4*>(out_row + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return;
  }
  const bf16* row = table + id * hidden;
  for (int i = threadIdx.x * 8; i < hidden; i += blockDim.x * 8) {
    const uint4 packed = *reinterpret_cast<const uint4*>(row + i);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
    float values[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 pair = __bfloat1622float2(pairs[k]);
      values[2 * k] = pair.x;
      values[2 * k + 1] = pair.y;
    }
    *reinterpret_cast<float4*>(out_row + i) = make_float4(values[0], values[1], values[2], values[3]);
    *reinterpret_cast<float4*>(out_row + i + 4) = make_float4(values[4], values[5], values[6], values[7]);
  }
}

__global__ void add_rms_norm_kernel(float* residual, const float* delta, const float* delta_bias,
                                    const float* weight, float eps, int32_t hidden, const int32_t* row_index,
                                    bf16* out, const float* lora_delta, const int32_t* lora_rows) {
  pdl_wait();
  pdl_trigger();
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  const int64_t token = row_index != nullptr ? row_index[row] : row;
  float* x = residual + token * hidden;
  const float* d = delta != nullptr ? delta + token * hidden : nullptr;
  const int64_t lora_row = lora_delta != nullptr && d != nullptr ? lora_rows[token] : -1;
  const float* l = lora_row >= 0 ? lora_delta + lora_row * hidden : nullptr;
  float sum_of_squares = 0.0f;
  for (int i = threadIdx.x * 4; i < hidden; i += blockDim.x * 4) {
    float4 value = *reinterpret_cast<const float4*>(x + i);
    if (d != nullptr) {
      float4 add = *reinterpret_cast<const float4*>(d + i);
      if (l != nullptr) {
        const float4 lora = *reinterpret_cast<const float4*>(l + i);
        add.x += lora.x;
        add.y += lora.y;
        add.z += lora.z;
        add.w += lora.w;
      }
      value.x += add.x;
      value.y += add.y;
      value.z += add.z;
      value.w += add.w;
      if (delta_bias != nullptr) {
        value.x += delta_bias[i];
        value.y += delta_bias[i + 1];
        value.z += delta_bias[i + 2];
        value.w += delta_bias[i + 3];
      }
      *reinterpret_cast<float4*>(x + i) = value;
    }
    sum_of_squares += value.x * value.x + value.y * value.y + value.z * value.z + value.w * value.w;
  }
  const float total = block_sum(sum_of_squares, scratch);
  const float inverse_rms = 1.0f / sqrtf(total / static_cast<float>(hidden) + eps);
  bf16* out_row = out + row * hidden;
  // Each thread re-reads only the elements it wrote itself: no barrier needed.
  for (int i = threadIdx.x * 4; i < hidden; i += blockDim.x * 4) {
    const float4 value = *reinterpret_cast<const float4*>(x + i);
    const __nv_bfloat162 first = __floats2bfloat162_rn(weight[i] * (value.x * inverse_rms),
                                                       weight[i + 1] * (value.y * inverse_rms));
    const __nv_bfloat162 second = __floats2bfloat162_rn(weight[i + 2] * (value.z * inverse_rms),
                                                        weight[i + 3] * (value.w * inverse_rms));
    *reinterpret_cast<__nv_bfloat162*>(out_row + i) = first;
    *reinterpret_cast<__nv_bfloat162*>(out_row + i + 2) = second;
  }
}

// A warp per head and 8 heads per block (blockIdx.y picks the group): every
// head's loads are in flight at once, which matters for decode-sized steps.
constexpr int kQkvThreads = 256;

__global__ void qkv_postprocess_kernel(QkvParams p) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ float rope_table[];  // [half] cos, then [half] sin
  const int head_dim = p.head_dim;
  const int half = head_dim / 2;
  const int64_t token = blockIdx.x;
  const int position = p.positions[token];
  float* cos_table = rope_table;
  float* sin_table = rope_table + half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // fp32 angle, then cos/sin through double: the CPU backend's (and torch's) rounding.
    const float angle = __fmul_rn(p.inv_freq[i], static_cast<float>(position));
    double sine, cosine;
    sincos(static_cast<double>(angle), &sine, &cosine);
    cos_table[i] = static_cast<float>(cosine);
    sin_table[i] = static_cast<float>(sine);
  }
  __syncthreads();

  const int q_size = p.num_heads * head_dim;
  const int kv_size = p.num_kv_heads * head_dim;
  const int row_width = q_size + 2 * kv_size;
  const float* row = p.qkv + token * row_width;
  const int64_t lora_row = p.lora != nullptr ? p.lora_rows[token] : -1;
  const float* lora = lora_row >= 0 ? p.lora + lora_row * row_width : nullptr;
  // Forked tokens: the bCache holds the base model's K/V; their k/v LoRA lives in the rCache.
  const int residual_slot = p.residual_slots != nullptr ? p.residual_slots[token] : -1;
  const float* kv_lora = residual_slot == -1 ? lora : nullptr;
  const int slot = p.kv_slots[token];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int num_heads_total = p.num_heads + 2 * p.num_kv_heads;
  for (int head = blockIdx.y * (kQkvThreads / 32) + warp; head < num_heads_total;
       head += gridDim.y * (kQkvThreads / 32)) {
    const int column = head * head_dim;  // q heads, then k heads, then v heads
    if (head >= p.num_heads + p.num_kv_heads) {
      if (slot < 0) continue;
      const int kv_head = head - p.num_heads - p.num_kv_heads;
      const int64_t entry = kv_element_index(slot, kv_head, p.block_size, p.num_kv_heads, head_dim);
      for (int d = lane; d < head_dim; d += 32) {
        float value = row[column + d];
        if (kv_lora != nullptr) value += kv_lora[column + d];
        if (p.bias != nullptr) value += p.bias[column + d];
        if (p.v_cache_fp8 != nullptr)
          p.v_cache_fp8[entry + d] = kv_fp8_encode(value, p.v_scale);
        else
          p.v_cache[entry + d] = __float2bfloat16_rn(value);
      }
      continue;
    }
    const bool is_query = head < p.num_heads;
    if (!is_query && slot < 0) continue;
    const float* norm = is_query ? p.q_norm : p.k_norm;
    const float* head_lora = is_query ? lora : kv_lora;
    // Each lane holds the pairs (i, i + half) for i = lane, lane + 32, ... (head_dim <= 256).
    float first[4], second[4];
    float sum_of_squares = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = lane + 32 * k;
      first[k] = second[k] = 0.0f;
      if (i < half) {
        first[k] = row[column + i];
        second[k] = row[column + i + half];
        if (head_lora != nullptr) {
          first[k] += head_lora[column + i];
          second[k] += head_lora[column + i + half];
        }
        if (p.bias != nullptr) {
          first[k] += p.bias[column + i];
          second[k] += p.bias[column + i + half];
        }
        sum_of_squares += first[k] * first[k] + second[k] * second[k];
      }
    }
    if (norm != nullptr) {
      const float inverse_rms = 1.0f / sqrtf(warp_sum(sum_of_squares) / static_cast<float>(head_dim) + p.eps);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = lane + 32 * k;
        if (i < half) {
          first[k] = norm[i] * (first[k] * inverse_rms);
          second[k] = norm[i + half] * (second[k] * inverse_rms);
        }
      }
    }
    const bool fp8_key = !is_query && p.k_cache_fp8 != nullptr;
    const int64_t key_entry =
        is_query ? 0 : kv_element_index(slot, head - p.num_heads, p.block_size, p.num_kv_heads, head_dim);
    bf16* destination = is_query ? p.q_out + token * q_size + column : fp8_key ? nullptr : p.k_cache + key_entry;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = lane + 32 * k;
      if (i < half) {
        const float c = cos_table[i];
        const float s = sin_table[i];
        const float rotated_first = first[k] * c - second[k] * s;
        const float rotated_second = second[k] * c + first[k] * s;
        if (fp8_key) {
          p.k_cache_fp8[key_entry + i] = kv_fp8_encode(rotated_first, p.k_scale);
          p.k_cache_fp8[key_entry + i + half] = kv_fp8_encode(rotated_second, p.k_scale);
        } else {
          destination[i] = __float2bfloat16_rn(rotated_first);
          destination[i + half] = __float2bfloat16_rn(rotated_second);
        }
      }
    }
  }
  if (residual_slot < 0 || blockIdx.y != 0 || lora_row < 0) return;
  // rCache write: sum the shrink's partials of k and v (the q/k/v launch's targets 1 and 2).
  const int stride = p.residual_rank_stride;
  const int adapter_slot = p.row_adapter_slots[token];
  bf16* destination = p.residual_pool + static_cast<int64_t>(residual_slot) * 2 * stride;
  const int ranks[2] = {lora_module(p.lora_modules, adapter_slot, p.num_layers, p.layer, kLoraTargetK).rank,
                        lora_module(p.lora_modules, adapter_slot, p.num_layers, p.layer, kLoraTargetV).rank};
  for (int index = threadIdx.x; index < 2 * stride; index += blockDim.x) {
    const int half_index = index / stride;  // 0: rK, 1: rV
    const int j = index % stride;
    const int target = half_index == 0 ? kLoraTargetK : kLoraTargetV;
    const int rank = ranks[half_index];
    float value = 0.0f;
    if (j < rank)
      for (int split = 0; split < p.lora_splits; ++split)
        value += p.lora_v[((static_cast<int64_t>(target) * p.lora_max_splits + split) * p.lora_num_rows + lora_row) *
                              p.lora_max_rank + j];
    destination[index] = __float2bfloat16_rn(value);
  }
}

__global__ void gather_hidden_kernel(const float* residual, const float* delta, const float* lora_delta,
                                     const int32_t* lora_rows, const int32_t* rows, int32_t hidden, float* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t row = rows[blockIdx.x];
  const int64_t lora_row = lora_delta != nullptr ? lora_rows[row] : -1;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float value = residual[row * hidden + i];
    if (delta != nullptr) value += delta[row * hidden + i];
    if (lora_row >= 0) value += lora_delta[lora_row * hidden + i];
    out[static_cast<int64_t>(blockIdx.x) * hidden + i] = value;
  }
}

__device__ __forceinline__ void unpack_bf16x8(const uint4& packed, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 pair = __bfloat1622float2(pairs[k]);
    out[2 * k] = pair.x;
    out[2 * k + 1] = pair.y;
  }
}

__global__ void swiglu_kernel(const bf16* gate_up, int64_t num_tokens, int32_t intermediate, bf16* out,
                              const float* lora, const int32_t* lora_rows, bool lora_is_bf16) {
  pdl_wait();
  pdl_trigger();
  const int64_t vectors_per_row = intermediate / 8;
  const int64_t total = num_tokens * vectors_per_row;
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t token = index / vectors_per_row;
    const int64_t column = (index % vectors_per_row) * 8;
    const bf16* row = gate_up + token * 2 * intermediate;
    const uint4 gate_packed = *reinterpret_cast<const uint4*>(row + column);
    const uint4 up_packed = *reinterpret_cast<const uint4*>(row + intermediate + column);
    const __nv_bfloat162* gate = reinterpret_cast<const __nv_bfloat162*>(&gate_packed);
    const __nv_bfloat162* up = reinterpret_cast<const __nv_bfloat162*>(&up_packed);
    uint4 result;
    __nv_bfloat162* result_pairs = reinterpret_cast<__nv_bfloat162*>(&result);
    const int64_t lora_row = lora != nullptr ? lora_rows[token] : -1;
    float lora_gate[8], lora_up[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) lora_gate[k] = lora_up[k] = 0.0f;
    if (lora_row >= 0 && lora_is_bf16) {
      const bf16* l = reinterpret_cast<const bf16*>(lora) + lora_row * 2 * intermediate + column;
      unpack_bf16x8(*reinterpret_cast<const uint4*>(l), lora_gate);
      unpack_bf16x8(*reinterpret_cast<const uint4*>(l + intermediate), lora_up);
    } else if (lora_row >= 0) {
      const float* l = lora + lora_row * 2 * intermediate + column;
#pragma unroll
      for (int k = 0; k < 8; k += 4) {
        const float4 g4 = *reinterpret_cast<const float4*>(l + k);
        const float4 u4 = *reinterpret_cast<const float4*>(l + intermediate + k);
        lora_gate[k] = g4.x, lora_gate[k + 1] = g4.y, lora_gate[k + 2] = g4.z, lora_gate[k + 3] = g4.w;
        lora_up[k] = u4.x, lora_up[k + 1] = u4.y, lora_up[k + 2] = u4.z, lora_up[k + 3] = u4.w;
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 g = __bfloat1622float2(gate[k]);
      float2 u = __bfloat1622float2(up[k]);
      g.x += lora_gate[2 * k], g.y += lora_gate[2 * k + 1];
      u.x += lora_up[2 * k], u.y += lora_up[2 * k + 1];
      result_pairs[k] = __floats2bfloat162_rn(g.x / (1.0f + __expf(-g.x)) * u.x, g.y / (1.0f + __expf(-g.y)) * u.y);
    }
    *reinterpret_cast<uint4*>(out + token * intermediate + column) = result;
  }
}

__global__ void f32_to_bf16_kernel(const float* in, int64_t count, bf16* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void f16_to_bf16_kernel(const __half* in, int64_t count, bf16* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(__half2float(in[i]));
}

int grid_for(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

void launch_embedding(const int32_t* token_ids, int32_t num_tokens, const bf16* table, int32_t hidden,
                      float* out, Launch launch, int32_t vocab_begin, int32_t vocab_rows) {
  if (num_tokens == 0) return;
  const int threads = hidden / 8 >= 256 ? 256 : ((hidden / 8 + 31) / 32) * 32;
  launch_kernel(launch, num_tokens, threads, 0, embedding_kernel, token_ids, table, hidden, out, vocab_begin,
                vocab_rows);
}

namespace {

__global__ void add_lora_rows_kernel(float* delta, const float* lora_delta, const int32_t* lora_rows,
                                     int32_t hidden) {
  const int64_t row = blockIdx.x;
  const int32_t lora_row = lora_rows[row];
  if (lora_row < 0) return;
  float* out = delta + row * hidden;
  const float* in = lora_delta + static_cast<int64_t>(lora_row) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] += in[i];
}

}  // namespace

void launch_add_lora_rows(float* delta, const float* lora_delta, const int32_t* lora_rows, int32_t num_rows,
                          int32_t hidden, cudaStream_t stream) {
  if (num_rows == 0 || lora_delta == nullptr) return;
  add_lora_rows_kernel<<<num_rows, 256, 0, stream>>>(delta, lora_delta, lora_rows, hidden);
  LOOM_CUDA_CHECK_LAUNCH();
}

void launch_add_rms_norm(float* residual, const float* delta, const float* delta_bias, const float* weight,
                         float eps, int32_t hidden, const int32_t* row_index, int32_t num_rows, bf16* out,
                         Launch launch, const float* lora_delta, const int32_t* lora_rows) {
  if (num_rows == 0) return;
  int threads = ((hidden / 4 + 31) / 32) * 32;
  if (threads > 1024) threads = 1024;
  launch_kernel(launch, num_rows, threads, 0, add_rms_norm_kernel, residual, delta, delta_bias, weight, eps, hidden,
                row_index, out, lora_delta, lora_rows);
}

void launch_qkv_postprocess(const QkvParams& params, Launch launch) {
  if (params.num_tokens == 0) return;
  const size_t shared = static_cast<size_t>(params.head_dim) * sizeof(float);
  const int head_groups = (params.num_heads + 2 * params.num_kv_heads + kQkvThreads / 32 - 1) / (kQkvThreads / 32);
  launch_kernel(launch, dim3(params.num_tokens, head_groups), kQkvThreads, shared, qkv_postprocess_kernel, params);
}

void launch_gather_hidden(const float* residual, const float* delta, const float* lora_delta,
                          const int32_t* lora_rows, const int32_t* rows, int32_t num_rows, int32_t hidden, float* out,
                          Launch launch) {
  if (num_rows == 0) return;
  launch_kernel(launch, num_rows, 256, 0, gather_hidden_kernel, residual, delta, lora_delta, lora_rows, rows, hidden, out);
}

void launch_swiglu(const bf16* gate_up, int32_t num_tokens, int32_t intermediate, bf16* out, Launch launch,
                   const float* lora, const int32_t* lora_rows, bool lora_is_bf16) {
  if (num_tokens == 0) return;
  const int64_t total = static_cast<int64_t>(num_tokens) * (intermediate / 8);
  launch_kernel(launch, grid_for(total, 256), 256, 0, swiglu_kernel, gate_up, num_tokens, intermediate, out, lora,
                lora_rows, lora_is_bf16);
}

void launch_f32_to_bf16(const float* in, int64_t count, bf16* out, cudaStream_t stream) {
  if (count == 0) return;
  f32_to_bf16_kernel<<<grid_for(count, 256), 256, 0, stream>>>(in, count, out);
  LOOM_CUDA_CHECK_LAUNCH();
}

void launch_f16_to_bf16(const uint16_t* in, int64_t count, bf16* out, cudaStream_t stream) {
  if (count == 0) return;
  f16_to_bf16_kernel<<<grid_for(count, 256), 256, 0, stream>>>(reinterpret_cast<const __half*>(in), count, out);
  LOOM_CUDA_CHECK_LAUNCH();
}

namespace {

constexpr int64_t kPrefetchChunk = 16 << 10;  // bytes per bulk prefetch

__global__ void prefetch_l2_kernel(L2PrefetchRanges ranges) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kPrefetchChunk;
  const int64_t start = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPrefetchChunk;
#pragma unroll 1
  for (const L2PrefetchRange& range : ranges.range) {
    const char* begin = static_cast<const char*>(range.begin);
    const int64_t bytes = range.bytes & ~int64_t{15};
    for (int64_t offset = start; offset < bytes; offset += stride) {
      const uint32_t size = static_cast<uint32_t>(min(kPrefetchChunk, bytes - offset));
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(begin + offset), "r"(size) : "memory");
    }
  }
}

}  // namespace

void launch_prefetch_l2(const L2PrefetchRanges& ranges, cudaStream_t stream) {
  int64_t bytes = 0;
  for (const L2PrefetchRange& range : ranges.range) bytes += std::max<int64_t>(range.bytes, 0);
  if (bytes < 16) return;
  const int64_t chunks = bytes / kPrefetchChunk + 3;
  // One thread per chunk up to 528 CTAs of 32: every SM's copy engine issues a share.
  const int blocks = static_cast<int>(std::min<int64_t>((chunks + 31) / 32, 528));
  prefetch_l2_kernel<<<blocks, 32, 0, stream>>>(ranges);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda
