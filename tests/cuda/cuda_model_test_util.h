// End-to-end helpers of the CUDA backend's tests (cuda_backend_test.cc,
// cuda_sharing_test.cc): the tiny synthetic models' weights as the GPU holds
// them, for the CPU reference, the logits check between the two backends, and
// a Driver that builds the steps' batches over shuffled KV blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "lora/adapter.h"
#include "model/config.h"
#include "model/weights.h"
#include "util/prng.h"

namespace loom::cuda::test {

// The tiny model's weights; with `bf16_matrices` every 2-D tensor is rounded
// to bf16 (what the GPU holds), so that the CPU reference sees the same weights.
std::shared_ptr<ModelWeights> tiny_weights(const ModelConfig& config, uint64_t seed, bool bf16_matrices);
// A copy of the adapter with A and B rounded to bf16 (what the GPU holds).
std::shared_ptr<const LoraAdapter> rounded_adapter(const LoraAdapter& adapter);
// The first `count` synthetic adapters of synthetic_adapter_specs (default
// options but num_adapters) for `config`, drawn with `seed`.
std::vector<std::shared_ptr<const LoraAdapter>> synthetic_adapters(const ModelConfig& config, int count, uint64_t seed);

int argmax(const float* row, int count);

// The tiny Qwen2 model grown to head_dim 64 (hidden 512, 8 heads over 2 kv heads,
// 8K positions): the wide and ping-pong prefill kernels and the forked wide path run.
ModelConfig wide_qwen2_config();

// End to end the GPU rounds activations to bf16 at every GEMM input and keeps
// K/V in bf16; on the tiny models, whose q/k gains make attention very sharp,
// that moves logits by up to ~0.3. The check: the same rows, no NaN, NMSE <=
// max_nmse, and the argmax may differ only where the reference's top two are
// within kNearTie. Updates *worst_nmse when given.
inline constexpr float kNearTie = 0.15f;
void expect_logits_close(const ForwardResult& out, const ForwardResult& ref, const std::string& what, double max_nmse,
                         double* worst_nmse = nullptr);

// How a Driver sequence shares KV (backend.h's batch fields).
enum class SharingMode { kPlain, kBase, kForked };

// Sequences over a main pool (and, with_residual_pool, an rCache pool) of
// num_blocks blocks each, handed out in a shuffled order; builds each step's Batch.
class Driver {
 public:
  Driver(int num_blocks, int block_size, uint64_t seed, bool with_residual_pool = false);
  struct Sequence {
    SharingMode mode = SharingMode::kPlain;
    int32_t slot = -1;  // the decoder (base) or forked adapter slot
    std::vector<int32_t> main_blocks, residual_blocks;
    int32_t num_cached = 0;
    int32_t kv_present = 0, residual_present = 0;  // entries shared with another sequence
  };
  int add_sequence(SharingMode mode = SharingMode::kPlain, int32_t slot = -1);
  // Sequence `to` starts with `from`'s first num_blocks blocks of the main (or
  // rCache) pool, their entries present (read, never written).
  void share_blocks(int from, int to, int num_blocks, bool residual);
  Sequence& sequence(int index) { return sequences_[index]; }

  struct Part {
    int sequence;
    std::vector<int32_t> tokens;
    std::vector<int32_t> slots;  // per token, kPlain only (base tokens are -1, forked tokens the slot)
    bool all_logits = false;
  };
  // The parts' new tokens, each sequence's blocks grown to hold them.
  Batch make_batch(const std::vector<Part>& parts);
  std::vector<int32_t> random_tokens(int count, int vocab);

 private:
  void grow(std::vector<int32_t>& blocks, std::vector<int32_t>& free, int entries);

  int block_size_;
  Prng prng_;
  std::vector<int32_t> free_main_, free_residual_;
  std::vector<Sequence> sequences_;
};

}  // namespace loom::cuda::test
