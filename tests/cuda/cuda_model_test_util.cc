#include "cuda_model_test_util.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_weights.h"
#include "util/error.h"

namespace loom::cuda::test {

ModelConfig wide_qwen2_config() {
  ModelConfig config = synthetic_model_config(Architecture::kQwen2, SyntheticPreset::kTiny);
  config.hidden_size = 512;
  config.intermediate_size = 1024;
  config.num_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  config.max_position_embeddings = 8192;
  return config;
}

std::shared_ptr<ModelWeights> tiny_weights(const ModelConfig& config, uint64_t seed, bool bf16_matrices) {
  TensorMap tensors;
  for (const SyntheticTensorSpec& spec : synthetic_base_tensor_specs(config)) {
    Tensor tensor = make_synthetic_tensor(spec, seed);
    if (bf16_matrices && spec.shape.size() == 2) {
      std::vector<float> values(tensor.data, tensor.data + tensor.numel());
      tensor = Tensor::from_vector(spec.shape, round_to_bf16(std::move(values)));
    }
    tensors[spec.name] = tensor;
  }
  return std::make_shared<ModelWeights>(build_model_weights(config, tensors, "synthetic tiny"));
}

std::vector<std::shared_ptr<const LoraAdapter>> synthetic_adapters(const ModelConfig& config, int count, uint64_t seed) {
  SyntheticModelOptions options;
  options.num_adapters = count;
  const std::vector<SyntheticAdapterSpec> specs = synthetic_adapter_specs(options, config);
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  for (int a = 0; a < count; ++a)
    adapters.push_back(std::make_shared<LoraAdapter>(make_synthetic_adapter(specs[a], config, seed)));
  return adapters;
}

std::shared_ptr<const LoraAdapter> rounded_adapter(const LoraAdapter& adapter) {
  auto copy = std::make_shared<LoraAdapter>(adapter);
  for (auto& layer : copy->layers)
    for (auto& module : layer) {
      if (!module.has_value()) continue;
      for (Tensor* tensor : {&module->a, &module->b}) {
        std::vector<float> values(tensor->data, tensor->data + tensor->numel());
        *tensor = Tensor::from_vector(tensor->shape, round_to_bf16(std::move(values)));
      }
    }
  return copy;
}

int argmax(const float* row, int count) { return static_cast<int>(std::max_element(row, row + count) - row); }

void expect_logits_close(const ForwardResult& out, const ForwardResult& ref, const std::string& what, double max_nmse,
                         double* worst_nmse) {
  ASSERT_EQ(out.logit_token_index, ref.logit_token_index) << what;
  ASSERT_EQ(out.logits.size(), ref.logits.size()) << what;
  const Closeness c = compare(out.logits, ref.logits);
  if (worst_nmse != nullptr) *worst_nmse = std::max(*worst_nmse, c.nmse);
  EXPECT_FALSE(c.has_nan) << what;
  EXPECT_LE(c.nmse, max_nmse) << what << ": " << c.describe();
  const int vocab = ref.vocab_size;
  for (size_t r = 0; r < ref.logit_token_index.size(); ++r) {
    const float* ref_row = ref.logits.data() + r * vocab;
    const int expected = argmax(ref_row, vocab);
    const int got = argmax(out.logits.data() + r * vocab, vocab);
    if (got == expected) continue;
    EXPECT_LT(ref_row[expected] - ref_row[got], kNearTie) << what << " row " << r << ": argmax " << got << " vs " << expected;
  }
}

Driver::Driver(int num_blocks, int block_size, uint64_t seed, bool with_residual_pool)
    : block_size_(block_size), prng_(seed) {
  for (std::vector<int32_t>* pool : {&free_main_, &free_residual_}) {
    if (pool == &free_residual_ && !with_residual_pool) break;
    pool->resize(num_blocks);
    std::iota(pool->begin(), pool->end(), 0);
    for (int i = num_blocks - 1; i > 0; --i) std::swap((*pool)[i], (*pool)[prng_.next_below(i + 1)]);
  }
}

int Driver::add_sequence(SharingMode mode, int32_t slot) {
  sequences_.push_back({mode, slot, {}, {}, 0, 0, 0});
  return static_cast<int>(sequences_.size()) - 1;
}

void Driver::share_blocks(int from, int to, int num_blocks, bool residual) {
  Sequence& target = sequences_[to];
  const Sequence& source = sequences_[from];
  auto& blocks = residual ? target.residual_blocks : target.main_blocks;
  const auto& source_blocks = residual ? source.residual_blocks : source.main_blocks;
  blocks.assign(source_blocks.begin(), source_blocks.begin() + num_blocks);
  (residual ? target.residual_present : target.kv_present) = num_blocks * block_size_;
}

Batch Driver::make_batch(const std::vector<Part>& parts) {
  Batch batch;
  for (const Part& part : parts) {
    Sequence& s = sequences_[part.sequence];
    BatchSequence entry;
    entry.num_computed_tokens = s.num_cached;
    entry.num_new_tokens = static_cast<int32_t>(part.tokens.size());
    entry.token_offset = batch.num_tokens();
    entry.logits_for_all_tokens = part.all_logits;
    entry.num_kv_present_tokens = s.kv_present;
    const int total = s.num_cached + entry.num_new_tokens;
    grow(s.main_blocks, free_main_, total);
    entry.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    entry.num_blocks = static_cast<int32_t>(s.main_blocks.size());
    batch.block_tables.insert(batch.block_tables.end(), s.main_blocks.begin(), s.main_blocks.end());
    if (s.mode == SharingMode::kBase) entry.decoder_adapter_slot = s.slot;
    if (s.mode == SharingMode::kForked) {
      entry.forked_adapter_slot = s.slot;
      entry.num_residual_present_tokens = s.residual_present;
      grow(s.residual_blocks, free_residual_, total);
      entry.residual_block_table_offset = static_cast<int32_t>(batch.residual_block_tables.size());
      entry.num_residual_blocks = static_cast<int32_t>(s.residual_blocks.size());
      batch.residual_block_tables.insert(batch.residual_block_tables.end(), s.residual_blocks.begin(),
                                         s.residual_blocks.end());
    }
    for (size_t i = 0; i < part.tokens.size(); ++i) {
      batch.token_ids.push_back(part.tokens[i]);
      batch.positions.push_back(s.num_cached + static_cast<int32_t>(i));
      batch.adapter_slots.push_back(s.mode == SharingMode::kBase     ? -1
                                    : s.mode == SharingMode::kForked ? s.slot
                                                                     : part.slots[i]);
    }
    batch.sequences.push_back(entry);
    s.num_cached = total;
  }
  return batch;
}

std::vector<int32_t> Driver::random_tokens(int count, int vocab) {
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = static_cast<int32_t>(prng_.next_below(vocab));
  return tokens;
}

void Driver::grow(std::vector<int32_t>& blocks, std::vector<int32_t>& free, int entries) {
  while (static_cast<int>(blocks.size()) * block_size_ < entries) {
    if (free.empty()) fail(ErrorKind::kCapacity, "test driver: out of KV blocks");
    blocks.push_back(free.back());
    free.pop_back();
  }
}

}  // namespace loom::cuda::test
