// Device sampling kernel (sampling.h): one CTA of 1024 threads per logits row.
#include "backend/cuda/sampling.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = 11;
constexpr int kBins = 1 << kDigitBits;
constexpr uint32_t kStreamTag = 0x53414D50u;  // "SAMP": the counter word that names this use of the seed

struct Shared {
  int count[kBins];
  float weight[kBins];
  float inclusive[kThreads];
  float warp_float[kWarps];
  int warp_int[kWarps];
  int digit;
  int digit_count;
  float digit_above;
};

// Larger float -> larger key (NaN aside).
__device__ __forceinline__ uint32_t ordered_bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Descending order of this key = descending logit, then ascending id.
__device__ __forceinline__ uint64_t sort_key(float logit, int id, int id_bits) {
  return (static_cast<uint64_t>(ordered_bits(logit)) << id_bits) | (((1ull << id_bits) - 1) - static_cast<uint64_t>(id));
}

// Calls f(id, logit) for every element of the row, four consecutive ids per
// thread and iteration (group g holds ids 4g..4g+3: the Philox counter).
template <typename F>
__device__ __forceinline__ void for_each_group(const float* row, int vocab, F&& f) {
  const bool vectorised = vocab % 4 == 0;  // rows start 16-byte aligned then
  for (int g = threadIdx.x; 4 * g < vocab; g += kThreads) {
    float values[4];
    if (vectorised) {
      const float4 packed = reinterpret_cast<const float4*>(row)[g];
      values[0] = packed.x;
      values[1] = packed.y;
      values[2] = packed.z;
      values[3] = packed.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) values[j] = 4 * g + j < vocab ? row[4 * g + j] : -INFINITY;
    }
    f(g, values);
  }
}

__device__ float block_sum(float value, Shared& shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  __syncthreads();
  if (threadIdx.x % 32 == 0) shared.warp_float[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += shared.warp_float[w];
  return total;
}

// Block-wide max with the lowest index among equal values.
__device__ void block_argmax(float& value, int& index, Shared& shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
    if (other_value > value || (other_value == value && other_index < index)) {
      value = other_value;
      index = other_index;
    }
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) {
    shared.warp_float[threadIdx.x / 32] = value;
    shared.warp_int[threadIdx.x / 32] = index;
  }
  __syncthreads();
  value = shared.warp_float[0];
  index = shared.warp_int[0];
  for (int w = 1; w < kWarps; ++w) {
    if (shared.warp_float[w] > value || (shared.warp_float[w] == value && shared.warp_int[w] < index)) {
      value = shared.warp_float[w];
      index = shared.warp_int[w];
    }
  }
}

// Inclusive prefix sum over the threads, written to shared.inclusive.
__device__ void block_inclusive_scan(float value, Shared& shared) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const float other = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += other;
  }
  __syncthreads();
  if (lane == 31) shared.warp_float[threadIdx.x / 32] = value;
  __syncthreads();
  if (threadIdx.x < 32) {
    float total = shared.warp_float[threadIdx.x];
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const float other = __shfl_up_sync(0xffffffffu, total, offset);
      if (lane >= offset) total += other;
    }
    shared.warp_float[threadIdx.x] = total;
  }
  __syncthreads();
  if (threadIdx.x >= 32) value += shared.warp_float[threadIdx.x / 32 - 1];
  shared.inclusive[threadIdx.x] = value;
  __syncthreads();
}

struct RowContext {
  const float* logits;
  int vocab;
  int id_bits;
  float max_logit;
  float inverse_temperature;
};

__device__ __forceinline__ float tempered_weight(const RowContext& row, float logit) {
  return __expf((logit - row.max_logit) * row.inverse_temperature);
}

// Among the candidates (key >= lower), in descending key order, the key of the
// first element at which the cumulative weight (1 per element, or its tempered
// softmax weight) reaches `target`; the kept set is {key >= result}. Returns
// `lower` (keep every candidate) when their whole weight stays below target.
__device__ uint64_t select_threshold(const RowContext& row, uint64_t lower, bool by_count, float target,
                                     Shared& shared) {
  const int total_bits = 32 + row.id_bits;
  uint64_t prefix = 0;
  int known_bits = 0;
  float above = 0.0f;
  for (;;) {
    const int width = min(kDigitBits, total_bits - known_bits);
    const int shift = total_bits - known_bits - width;
    const int high_shift = shift + width;  // bits at and above it are fixed by `prefix`
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      shared.count[b] = 0;
      shared.weight[b] = 0.0f;
    }
    __syncthreads();
    for_each_group(row.logits, row.vocab, [&](int g, const float (&values)[4]) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int id = 4 * g + j;
        if (id >= row.vocab) break;
        const uint64_t key = sort_key(values[j], id, row.id_bits);
        if (key < lower) continue;
        if (known_bits > 0 && (key >> high_shift) != (prefix >> high_shift)) continue;
        const int digit = static_cast<int>((key >> shift) & ((1ull << width) - 1));
        atomicAdd(&shared.count[digit], 1);
        if (!by_count) atomicAdd(&shared.weight[digit], tempered_weight(row, values[j]));
      }
    });
    __syncthreads();
    // Thread t owns bins high = kBins - 1 - 2t and high - 1 (descending order).
    const int high = kBins - 1 - 2 * static_cast<int>(threadIdx.x);
    const float w0 = by_count ? static_cast<float>(shared.count[high]) : shared.weight[high];
    const float w1 = by_count ? static_cast<float>(shared.count[high - 1]) : shared.weight[high - 1];
    if (threadIdx.x == 0) shared.digit = -1;
    block_inclusive_scan(w0 + w1, shared);
    const float before = above + (threadIdx.x == 0 ? 0.0f : shared.inclusive[threadIdx.x - 1]);
    const float through = above + shared.inclusive[threadIdx.x];
    if (before < target && target <= through) {
      const bool first = target <= before + w0 || w1 == 0.0f;
      shared.digit = first ? high : high - 1;
      shared.digit_above = first ? before : before + w0;
    }
    __syncthreads();
    if (shared.digit < 0) {
      if (known_bits == 0) return lower;
      // Rounding left the prefix's weight just under target: take all of it
      // (the lowest occupied bin, then its last element).
      if (threadIdx.x == 0) shared.digit = kBins;
      __syncthreads();
      for (int b = threadIdx.x; b < kBins; b += kThreads)
        if (shared.count[b] > 0) atomicMin(&shared.digit, b);
      __syncthreads();
      if (threadIdx.x == 0) shared.digit_above = above;
    }
    if (threadIdx.x == 0) shared.digit_count = shared.count[shared.digit];
    __syncthreads();
    const int digit = shared.digit;
    const int digit_count = shared.digit_count;
    above = shared.digit_above;
    __syncthreads();  // the shared fields are rewritten by the next pass
    prefix |= static_cast<uint64_t>(digit) << shift;
    known_bits += width;
    if (digit_count == 1 || shift == 0) return prefix > lower ? prefix : lower;
  }
}

__global__ void __launch_bounds__(kThreads) sampling_kernel(const float* logits, int32_t vocab_size,
                                                            const SamplingRow* rows, int32_t* token_ids,
                                                            float* logprobs) {
  pdl_wait();
  pdl_trigger();
  const SamplingRow params = rows[blockIdx.x];
  if (!params.on_device) {
    if (threadIdx.x == 0) {
      token_ids[blockIdx.x] = -1;
      logprobs[blockIdx.x] = 0.0f;
    }
    return;
  }
  __shared__ Shared shared;
  RowContext row;
  row.logits = logits + static_cast<int64_t>(blockIdx.x) * vocab_size;
  row.vocab = vocab_size;
  row.id_bits = vocab_size <= 1 ? 1 : 32 - __clz(vocab_size - 1);

  // Pass 0: max, argmax, and sum exp(l - max) kept per thread relative to its own max.
  float local_max = -INFINITY, local_sum = 0.0f;
  int local_argmax = INT_MAX;
  for_each_group(row.logits, vocab_size, [&](int g, const float (&values)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int id = 4 * g + j;
      if (id >= vocab_size) break;
      const float value = values[j];
      if (value > local_max) {
        local_sum = local_sum * expf(local_max - value) + 1.0f;  // exp(-inf) = 0 on the first
        local_max = value;
        local_argmax = id;
      } else if (value > -INFINITY) {
        local_sum += expf(value - local_max);
      }
    }
  });
  float max_logit = local_max;
  int argmax = local_argmax;
  block_argmax(max_logit, argmax, shared);
  const float sum = block_sum(local_max > -INFINITY ? local_sum * expf(local_max - max_logit) : 0.0f, shared);
  if (argmax == INT_MAX) argmax = 0;  // every logit -inf (or NaN): nothing to choose from
  row.max_logit = max_logit;

  int token = argmax;
  const bool greedy = params.temperature <= 0.0f || params.top_k == 1;
  if (!greedy) {
    row.inverse_temperature = 1.0f / params.temperature;
    uint64_t threshold = 0;  // kept set: sort key >= threshold
    if (params.top_k > 0 && params.top_k < vocab_size)
      threshold = select_threshold(row, 0, true, static_cast<float>(params.top_k), shared);
    if (params.top_p < 1.0f) {
      float local_mass = 0.0f;
      for_each_group(row.logits, vocab_size, [&](int g, const float (&values)[4]) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int id = 4 * g + j;
          if (id >= vocab_size) break;
          if (sort_key(values[j], id, row.id_bits) >= threshold) local_mass += tempered_weight(row, values[j]);
        }
      });
      const float mass = block_sum(local_mass, shared);
      threshold = select_threshold(row, threshold, false, params.top_p * mass, shared);
    }
    // Gumbel-max over the kept set.
    float best = -INFINITY;
    int best_id = INT_MAX;
    for_each_group(row.logits, vocab_size, [&](int g, const float (&values)[4]) {
      const Philox4 random = philox4x32_10({static_cast<uint32_t>(g), kStreamTag, params.step_lo, params.step_hi},
                                           params.seed_lo, params.seed_hi);
      const uint32_t words[4] = {random.x, random.y, random.z, random.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int id = 4 * g + j;
        if (id >= vocab_size) break;
        if (sort_key(values[j], id, row.id_bits) < threshold) continue;
        const float u = (static_cast<float>(words[j] >> 8) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
        const float score = (values[j] - max_logit) * row.inverse_temperature - __logf(-logf(u));
        if (score > best || (score == best && id < best_id)) {
          best = score;
          best_id = id;
        }
      }
    });
    block_argmax(best, best_id, shared);
    if (best_id != INT_MAX) token = best_id;
  }
  if (threadIdx.x == 0) {
    token_ids[blockIdx.x] = token;
    logprobs[blockIdx.x] = row.logits[token] - max_logit - logf(sum);
  }
}

__global__ void apply_token_masks_kernel(float* logits, int32_t vocab_size, const SamplingRow* rows,
                                         const uint32_t* masks, int32_t words_per_row) {
  const SamplingRow& row = rows[blockIdx.x];
  if (!row.on_device || row.mask_row < 0) return;
  const uint32_t* mask = masks + static_cast<int64_t>(row.mask_row) * words_per_row;
  float* row_logits = logits + static_cast<int64_t>(blockIdx.x) * vocab_size;
  for (int id = blockIdx.y * blockDim.x + threadIdx.x; id < vocab_size; id += gridDim.y * blockDim.x)
    if (!((__ldg(mask + id / 32) >> (id % 32)) & 1u)) row_logits[id] = -INFINITY;
}

__device__ float block_max(float value, Shared& shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  __syncthreads();
  if (threadIdx.x % 32 == 0) shared.warp_float[threadIdx.x / 32] = value;
  __syncthreads();
  float result = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) result = fmaxf(result, shared.warp_float[w]);
  return result;
}

// One CTA per row: the raw row's log-sum-exp, then the edits (each edit's
// original logit kept in `originals`), then min_p.
__global__ void __launch_bounds__(kThreads) process_logits_kernel(float* logits, int32_t vocab_size,
                                                                  const SamplingRow* rows, const DeviceLogitEdit* edits,
                                                                  float* originals, float* raw_lse) {
  __shared__ Shared shared;
  const SamplingRow row = rows[blockIdx.x];
  if (!processes_logits(row)) return;
  float* values = logits + static_cast<int64_t>(blockIdx.x) * vocab_size;
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < vocab_size; i += kThreads) local_max = fmaxf(local_max, values[i]);
  const float max_raw = block_max(local_max, shared);
  float local_sum = 0.0f;
  for (int i = threadIdx.x; i < vocab_size; i += kThreads) local_sum += __expf(values[i] - max_raw);
  const float sum = block_sum(local_sum, shared);
  if (threadIdx.x == 0) raw_lse[blockIdx.x] = max_raw + logf(sum);
  __syncthreads();  // every read of the raw row is done
  for (int e = threadIdx.x; e < row.num_edits; e += kThreads) {
    const DeviceLogitEdit edit = edits[row.edits_begin + e];
    if (edit.token < 0 || edit.token >= vocab_size) continue;
    const float original = values[edit.token];
    originals[row.edits_begin + e] = original;
    float value = original + edit.bias;
    if (edit.repeated) value = value > 0.0f ? value / row.repetition_penalty : value * row.repetition_penalty;
    values[edit.token] = value - edit.subtract;
  }
  if (!(row.min_p > 0.0f && row.temperature > 0.0f)) return;
  __syncthreads();
  local_max = -INFINITY;
  for (int i = threadIdx.x; i < vocab_size; i += kThreads) local_max = fmaxf(local_max, values[i]);
  const float threshold = block_max(local_max, shared) + row.temperature * logf(row.min_p);
  for (int i = threadIdx.x; i < vocab_size; i += kThreads)
    if (values[i] < threshold) values[i] = -INFINITY;
}

// One warp per row: the drawn token's logprob under the raw logits.
__global__ void raw_logprobs_kernel(const float* logits, int32_t vocab_size, const SamplingRow* rows,
                                    const DeviceLogitEdit* edits, const float* originals, const float* raw_lse,
                                    const int32_t* token_ids, float* logprobs) {
  const SamplingRow row = rows[blockIdx.x];
  if (!processes_logits(row)) return;
  const int32_t token = token_ids[blockIdx.x];
  if (token < 0 || token >= vocab_size) return;
  float original = 0.0f;
  bool found = false;  // at most one edit a token
  for (int e = threadIdx.x; e < row.num_edits; e += 32) {
    if (edits[row.edits_begin + e].token == token) {
      original = originals[row.edits_begin + e];
      found = true;
    }
  }
  const unsigned holders = __ballot_sync(0xffffffffu, found);
  original = __shfl_sync(0xffffffffu, original, holders ? __ffs(holders) - 1 : 0);
  const float raw = holders ? original : logits[static_cast<int64_t>(blockIdx.x) * vocab_size + token];
  if (threadIdx.x == 0) logprobs[blockIdx.x] = raw - raw_lse[blockIdx.x];
}

}  // namespace

void launch_process_logits(float* logits, int32_t num_rows, int32_t vocab_size, const SamplingRow* rows,
                           const DeviceLogitEdit* edits, float* originals, float* raw_lse, cudaStream_t stream) {
  if (num_rows <= 0) return;
  process_logits_kernel<<<num_rows, kThreads, 0, stream>>>(logits, vocab_size, rows, edits, originals, raw_lse);
  LOOM_CUDA_CHECK_LAUNCH();
}

void launch_raw_logprobs(const float* logits, int32_t num_rows, int32_t vocab_size, const SamplingRow* rows,
                         const DeviceLogitEdit* edits, const float* originals, const float* raw_lse,
                         const int32_t* token_ids, float* logprobs, cudaStream_t stream) {
  if (num_rows <= 0) return;
  raw_logprobs_kernel<<<num_rows, 32, 0, stream>>>(logits, vocab_size, rows, edits, originals, raw_lse, token_ids,
                                                   logprobs);
  LOOM_CUDA_CHECK_LAUNCH();
}

void launch_apply_token_masks(float* logits, int32_t num_rows, int32_t vocab_size, const SamplingRow* rows,
                              const uint32_t* masks, int32_t words_per_row, cudaStream_t stream) {
  if (num_rows <= 0) return;
  if (words_per_row * 32 < vocab_size) throw_unsupported("cuda token masks: words per row too few for the vocabulary", words_per_row);
  constexpr int kMaskThreads = 256;
  const int slices = std::min(16, (vocab_size + kMaskThreads - 1) / kMaskThreads);
  apply_token_masks_kernel<<<dim3(num_rows, slices), kMaskThreads, 0, stream>>>(logits, vocab_size, rows, masks,
                                                                                 words_per_row);
  LOOM_CUDA_CHECK_LAUNCH();
}

void launch_sampling(const float* logits, int32_t num_rows, int32_t vocab_size, const SamplingRow* rows,
                     int32_t* token_ids, float* logprobs, Launch launch) {
  if (num_rows <= 0) return;
  if (vocab_size <= 0) throw_unsupported("cuda sampling: vocab size must be positive", vocab_size);
  launch_kernel(launch, num_rows, kThreads, 0, sampling_kernel, logits, vocab_size, rows, token_ids, logprobs);
}

}  // namespace loom::cuda
