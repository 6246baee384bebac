// A tensor-parallel rank's logits made whole on its device: each rank's lm_head
// gives its slice of the vocabulary ([rows, slice] fp32; slices of
// ceil(vocab / N) rows, the last one shorter, model/tensor_parallel.h); the
// group gathers them (DeviceCommunicator::all_gather) into [rows, vocab] on
// every rank, so the device sampler draws as on one GPU and rank 0 alone copies
// the rows the host samples. Inactive (nothing to gather) for a backend alone.
//
// Ownership: its three device buffers; the communicator is the rank's (not owned).
// Thread: the rank's engine thread. enqueue is capturable where the communicator is.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/cuda/device_buffer.h"
#include "model/tensor_parallel.h"

namespace loom::cuda {

class DeviceCommunicator;

class VocabGather {
 public:
  // vocab_size: the rank's lm_head rows (its config's; the whole model's for a backend alone).
  VocabGather(const TensorParallelShard& shard, int32_t vocab_size, int32_t model_vocab_size,
              DeviceCommunicator* communicator);

  bool active() const { return communicator_ != nullptr && size_ > 1; }
  // The vocabulary rows of a whole logits row: the model's when active, else the rank's (its own).
  int32_t vocab_size() const { return vocab_; }
  // Buffers for `rows` logit rows (grown, never shrunk; before a capture).
  void grow(int32_t rows);
  // Enqueues on `stream`: this rank's [rows, slice] logits (row stride = its
  // slice) gathered from every rank into whole() ([rows, vocab]). Every rank
  // of the group calls it with the same rows, in the same order.
  void enqueue(const float* slice_logits, int32_t rows, cudaStream_t stream);
  const float* whole() const { return whole_.as<float>(); }
  float* whole() { return whole_.as<float>(); }
  // The buffers a captured graph holds (GraphCache::check_addresses).
  std::vector<const void*> addresses() const { return {staging_.data(), gathered_.data(), whole_.data()}; }

 private:
  int32_t width_of(int32_t rank) const;

  DeviceCommunicator* const communicator_;
  const int32_t size_, rank_, vocab_, padded_;  // padded_: ceil(vocab / size), every rank's send width
  DeviceBuffer staging_;   // [rows, padded_]: this rank's slice, padded (the last rank's is shorter)
  DeviceBuffer gathered_;  // [size][rows, padded_]
  DeviceBuffer whole_;     // [rows, vocab_]
};

}  // namespace loom::cuda
