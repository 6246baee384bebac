#include "backend/cuda/vocab_gather.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_communicator.h"
#include "util/error.h"

namespace loom::cuda {

VocabGather::VocabGather(const TensorParallelShard& shard, int32_t vocab_size, int32_t model_vocab_size,
                         DeviceCommunicator* communicator)
    : communicator_(communicator),
      size_(std::max(shard.size, 1)),
      rank_(shard.rank),
      vocab_(communicator != nullptr && shard.size > 1 ? model_vocab_size : vocab_size),
      padded_((model_vocab_size + size_ - 1) / size_) {
  if (active() && (shard.vocab_begin != std::min(vocab_, rank_ * padded_) || vocab_size != width_of(rank_) ||
                   shard.vocab_slice() != vocab_size))
    fail(ErrorKind::kInternal, "vocab gather: rank {} holds vocabulary rows [{}, {}), not slice {} of {} rows", rank_,
         shard.vocab_begin, shard.vocab_end, rank_, padded_);
}

int32_t VocabGather::width_of(int32_t rank) const {
  return std::max(0, std::min(vocab_, (rank + 1) * padded_) - rank * padded_);
}

void VocabGather::grow(int32_t rows) {
  if (!active() || rows <= 0) return;
  const size_t slice_bytes = static_cast<size_t>(rows) * padded_ * sizeof(float);
  staging_.reserve(slice_bytes);
  gathered_.reserve(slice_bytes * size_);
  whole_.reserve(static_cast<size_t>(rows) * vocab_ * sizeof(float));
}

void VocabGather::enqueue(const float* slice_logits, int32_t rows, cudaStream_t stream) {
  if (!active() || rows <= 0) return;
  const size_t padded_bytes = static_cast<size_t>(padded_) * sizeof(float);
  const float* send = slice_logits;
  if (width_of(rank_) != padded_) {  // the last rank: its rows padded to the common width (the pad is never read)
    LOOM_CUDA_CHECK(cudaMemcpy2DAsync(staging_.data(), padded_bytes, slice_logits, width_of(rank_) * sizeof(float),
                                      width_of(rank_) * sizeof(float), rows, cudaMemcpyDeviceToDevice, stream));
    send = staging_.as<float>();
  }
  communicator_->all_gather(send, gathered_.as<float>(), static_cast<int64_t>(rows) * padded_, stream);
  for (int32_t r = 0; r < size_; ++r) {
    if (width_of(r) == 0) continue;
    LOOM_CUDA_CHECK(cudaMemcpy2DAsync(whole_.as<float>() + static_cast<size_t>(r) * padded_, vocab_ * sizeof(float),
                                      gathered_.as<float>() + static_cast<size_t>(r) * rows * padded_, padded_bytes,
                                      width_of(r) * sizeof(float), rows, cudaMemcpyDeviceToDevice, stream));
  }
}

}  // namespace loom::cuda
