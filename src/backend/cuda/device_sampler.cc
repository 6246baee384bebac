#include "backend/cuda/device_sampler.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/sampling.h"
#include "util/error.h"

namespace loom::cuda {

static_assert(sizeof(LogitEdit) == sizeof(DeviceLogitEdit) && offsetof(LogitEdit, token) == offsetof(DeviceLogitEdit, token) &&
                  offsetof(LogitEdit, bias) == offsetof(DeviceLogitEdit, bias) &&
                  offsetof(LogitEdit, subtract) == offsetof(DeviceLogitEdit, subtract) &&
                  offsetof(LogitEdit, repeated) == offsetof(DeviceLogitEdit, repeated),
              "the edits are copied to the device as they are");

DeviceSampler::DeviceSampler(int32_t vocab_size) : vocab_size_(vocab_size) {
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
}

DeviceSampler::~DeviceSampler() {
  if (uploaded_ != nullptr) cudaEventDestroy(uploaded_);
}

void DeviceSampler::grow(int32_t logit_launch_rows) {
  device_.reserve(static_cast<size_t>(logit_launch_rows) * 2 * sizeof(int32_t));
}

bool DeviceSampler::guided(std::span<const SamplingRow> rows, int32_t num_token_mask_rows) {
  if (num_token_mask_rows > 0) return true;
  return std::any_of(rows.begin(), rows.end(), [](const SamplingRow& row) { return processes_logits(row); });
}

void DeviceSampler::enqueue_draw(const float* logits, int32_t num_rows, const SamplingRow* rows, Launch launch) {
  launch_sampling(logits, num_rows, vocab_size_, rows, device_.as<int32_t>(),
                  reinterpret_cast<float*>(device_.as<int32_t>() + num_rows), launch);
}

void DeviceSampler::enqueue_guided_draw(float* logits, int32_t num_rows, const SamplingRow* rows,
                                        std::span<const uint32_t> masks, int32_t num_token_mask_rows,
                                        std::span<const LogitEdit> edits, cudaStream_t stream) {
  int32_t* token_ids = device_.as<int32_t>();
  float* logprobs = reinterpret_cast<float*>(token_ids + num_rows);
  // Steps may be enqueued back to back: the previous uploads from the pinned
  // buffers must be done before they are refilled.
  LOOM_CUDA_CHECK(cudaEventSynchronize(uploaded_));
  if (num_token_mask_rows > 0) {
    const int32_t words = (vocab_size_ + 31) / 32;
    const size_t count = static_cast<size_t>(num_token_mask_rows) * words;
    if (masks.size() != count)
      fail(ErrorKind::kInvalidArgument, "cuda backend: {} token mask words for {} rows of {} words", masks.size(),
           num_token_mask_rows, words);
    masks_host_.reserve(count * sizeof(uint32_t));
    masks_.reserve(count * sizeof(uint32_t));
    std::memcpy(masks_host_.data(), masks.data(), count * sizeof(uint32_t));
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(masks_.data(), masks_host_.data(), count * sizeof(uint32_t), cudaMemcpyHostToDevice, stream));
    launch_apply_token_masks(logits, num_rows, vocab_size_, rows, masks_.as<uint32_t>(), words, stream);
  }
  const size_t num_edits = edits.size();
  edits_.reserve(std::max<size_t>(num_edits, 1) * sizeof(LogitEdit));
  edit_originals_.reserve(std::max<size_t>(num_edits, 1) * sizeof(float));
  raw_lse_.reserve(static_cast<size_t>(num_rows) * sizeof(float));
  if (num_edits > 0) {
    edits_host_.reserve(num_edits * sizeof(LogitEdit));
    std::memcpy(edits_host_.data(), edits.data(), num_edits * sizeof(LogitEdit));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(edits_.data(), edits_host_.data(), num_edits * sizeof(LogitEdit),
                                    cudaMemcpyHostToDevice, stream));
  }
  LOOM_CUDA_CHECK(cudaEventRecord(uploaded_, stream));
  launch_process_logits(logits, num_rows, vocab_size_, rows, edits_.as<DeviceLogitEdit>(), edit_originals_.as<float>(),
                        raw_lse_.as<float>(), stream);
  launch_sampling(logits, num_rows, vocab_size_, rows, token_ids, logprobs, stream);
  launch_raw_logprobs(logits, num_rows, vocab_size_, rows, edits_.as<DeviceLogitEdit>(), edit_originals_.as<float>(),
                      raw_lse_.as<float>(), token_ids, logprobs, stream);
}

void DeviceSampler::enqueue_copy_to_host(int32_t launch_rows, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(launch_rows) * 2 * sizeof(int32_t);
  host_.reserve(bytes);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(host_.data(), device_.data(), bytes, cudaMemcpyDeviceToHost, stream));
}

}  // namespace loom::cuda
