// The draws of a CUDA step (backend.h DeviceSampling; sampling.h's kernels):
// the plain draw right after the logits, or the guided one that first needs
// the host's token masks and logit edits, and the copy of the drawn tokens and
// logprobs to the host. Owns the device and pinned buffers of both.
//
// Thread: the engine thread.
#pragma once

#include <cstdint>
#include <span>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/plan_types.h"

namespace loom::cuda {

class DeviceSampler {
 public:
  explicit DeviceSampler(int32_t vocab_size);
  ~DeviceSampler();
  DeviceSampler(const DeviceSampler&) = delete;
  DeviceSampler& operator=(const DeviceSampler&) = delete;

  void grow(int32_t logit_launch_rows);
  // True when the step's draw needs the host: token masks or logit processing (edits, min_p).
  static bool guided(std::span<const SamplingRow> rows, int32_t num_token_mask_rows);

  // Draws rows [0, num_rows) of logits ([num_rows, vocab] fp32) as the device rows say.
  void enqueue_draw(const float* logits, int32_t num_rows, const SamplingRow* rows, Launch launch);
  // The same after masking (masks: num_token_mask_rows rows of ceil(vocab / 32)
  // words, copied before this returns) and processing (edits: Batch::logit_edits)
  // the logits in place; puts the raw logprobs back where processing changed them.
  void enqueue_guided_draw(float* logits, int32_t num_rows, const SamplingRow* rows, std::span<const uint32_t> masks,
                           int32_t num_token_mask_rows, std::span<const LogitEdit> edits, cudaStream_t stream);

  // Copies the first launch_rows draws to the pinned host copy (read after the stream synchronises).
  void enqueue_copy_to_host(int32_t launch_rows, cudaStream_t stream);
  // [launch rows] token ids (-1: not sampled on the device), then [launch rows] fp32 logprobs.
  const int32_t* host_results() const { return host_.as<int32_t>(); }
  const int32_t* device_results() const { return device_.as<int32_t>(); }
  const void* device_address() const { return device_.data(); }

 private:
  const int32_t vocab_size_;
  DeviceBuffer device_;  // [rows] int32 token ids, then [rows] fp32 logprobs
  PinnedBuffer host_;
  PinnedBuffer masks_host_;
  DeviceBuffer masks_;
  PinnedBuffer edits_host_;
  DeviceBuffer edits_;
  DeviceBuffer edit_originals_;  // [edits] fp32: each edited logit before its edit
  DeviceBuffer raw_lse_;         // [rows] fp32: log-sum-exp of each processed row before processing
  cudaEvent_t uploaded_ = nullptr;  // the last uploads from the pinned buffers are done
};

}  // namespace loom::cuda
