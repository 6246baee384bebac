// Sampling on the device (backend.h DeviceSampling): one CTA per logits row
// turns the row into a token id and that token's raw logprob, so only 8 bytes
// per row come back to the host.
//
// Per row, over the fp32 logits (L2-resident after the lm_head GEMM):
//   pass 0      max, argmax (lowest id on ties), sum exp(l - max): greedy and
//               the logprob need nothing else.
//   top-k/top-p radix select over a 64-bit key (the logit's order-preserving
//               bits, then the inverted id, so ties order by lower id), 11 bits
//               per pass, weighting elements by 1 (top-k) or by
//               exp((l - max) / T) (top-p, among the top-k survivors). Ends as
//               soon as the selected bin holds one element.
//   draw        Gumbel-max over the kept set: argmax (l - max) / T - log(-log u_i),
//               u_i from Philox4x32-10 keyed by the seed, counter (i / 4, step):
//               an exact draw from the renormalised softmax, independent of the
//               row's position in the batch.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/plan_types.h"

namespace loom::cuda {

// Philox4x32-10 (Salmon et al., Random123): four 32-bit words from a 128-bit
// counter and a 64-bit key. Host and device, for tests to recompute draws.
struct Philox4 {
  uint32_t x, y, z, w;
};
LOOM_HOST_DEVICE inline Philox4 philox4x32_10(Philox4 counter, uint32_t key_lo, uint32_t key_hi) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(0xD2511F53u) * counter.x;
    const uint64_t product1 = static_cast<uint64_t>(0xCD9E8D57u) * counter.z;
    counter = {static_cast<uint32_t>(product1 >> 32) ^ counter.y ^ key_lo, static_cast<uint32_t>(product1),
               static_cast<uint32_t>(product0 >> 32) ^ counter.w ^ key_hi, static_cast<uint32_t>(product0)};
    key_lo += 0x9E3779B9u;
    key_hi += 0xBB67AE85u;
  }
  return counter;
}

// Samples rows [0, num_rows) of `logits` ([num_rows, vocab_size] fp32) by
// `rows` (device, one SamplingRow each): token_ids[r] (-1 where the row is not
// on_device) and logprobs[r] (log-softmax of the raw logits at that token).
// vocab_size >= 1. Rows are independent; enqueued as `launch` says (kernels.h).
void launch_sampling(const float* logits, int32_t num_rows, int32_t vocab_size, const SamplingRow* rows,
                     int32_t* token_ids, float* logprobs, Launch launch);

// Structured outputs: for each row r < num_rows whose SamplingRow is on_device
// with mask_row >= 0, sets logits[r][t] = -inf where bit t % 32 of word t / 32
// of mask row mask_row is clear (masks: device, [mask rows][words_per_row],
// words_per_row * 32 >= vocab_size). Run before launch_sampling on the same rows.
void launch_apply_token_masks(float* logits, int32_t num_rows, int32_t vocab_size, const SamplingRow* rows,
                              const uint32_t* masks, int32_t words_per_row, cudaStream_t stream);

// Logit processing (backend.h DeviceSampling): for each row whose SamplingRow
// processes_logits(), writes raw_lse[r] (the log-sum-exp of the row as it is,
// after any mask), applies its edits (keeping each edited logit's previous value
// in originals[edit index]) and then min_p. Run after the masks and before
// launch_sampling; then launch_raw_logprobs puts the drawn tokens' logprobs back
// under the unprocessed row. edits and originals: device, indexed by edits_begin.
void launch_process_logits(float* logits, int32_t num_rows, int32_t vocab_size, const SamplingRow* rows,
                           const DeviceLogitEdit* edits, float* originals, float* raw_lse, cudaStream_t stream);
void launch_raw_logprobs(const float* logits, int32_t num_rows, int32_t vocab_size, const SamplingRow* rows,
                         const DeviceLogitEdit* edits, const float* originals, const float* raw_lse,
                         const int32_t* token_ids, float* logprobs, cudaStream_t stream);

}  // namespace loom::cuda
