#include "backend/batch_checks.h"

#include <initializer_list>
#include <string>

#include <fmt/ranges.h>

#include "util/error.h"

namespace loom {

namespace {

// Names in the messages about one kind of block table: the main pool's or the rCache's.
struct BlockTableNames {
  const char* prefix;  // "" or "residual "
  const char* field;   // the Batch member
  const char* pool;    // "KV" or "residual"
};

// A sequence's blocks [offset, offset + num_blocks) of `tables` hold its
// num_entries entries and name blocks of the pool.
void check_block_table(size_t index, const BlockTableNames& names, const std::vector<int32_t>& tables, int32_t offset,
                       int32_t num_blocks, int64_t num_entries, int32_t block_size, int32_t num_pool_blocks) {
  const int64_t blocks_needed = (num_entries + block_size - 1) / block_size;
  if (num_blocks < blocks_needed)
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: {} {}blocks cannot hold {} entries ({}block size {})", index,
         num_blocks, names.prefix, num_entries, names.prefix, block_size);
  if (offset < 0 || static_cast<int64_t>(offset) + num_blocks > static_cast<int64_t>(tables.size()))
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: {}block table [{}, +{}) exceeds {} of size {}", index,
         names.prefix, offset, num_blocks, names.field, tables.size());
  for (int64_t b = 0; b < blocks_needed; ++b) {
    const int32_t block_id = tables[offset + b];
    if (block_id < 0 || block_id >= num_pool_blocks)
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: {}block id {} outside the {} {} blocks", index, names.prefix,
           block_id, num_pool_blocks, names.pool);
  }
}

void check_sequence(const Batch& batch, size_t index, int32_t expected_token_offset,
                    const BatchLimits& limits) {
  const BatchSequence& sequence = batch.sequences[index];
  if (sequence.num_new_tokens <= 0)
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: num_new_tokens is {}, must be > 0", index,
         sequence.num_new_tokens);
  if (sequence.num_computed_tokens < 0)
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: num_computed_tokens is {}", index,
         sequence.num_computed_tokens);
  if (sequence.token_offset != expected_token_offset)
    fail(ErrorKind::kInvalidArgument,
         "batch sequence {}: token_offset is {}, expected {} (sequences lie back to back)", index,
         sequence.token_offset, expected_token_offset);
  if (static_cast<int64_t>(sequence.token_offset) + sequence.num_new_tokens > batch.num_tokens())
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: tokens {}..{} exceed the batch's {} tokens",
         index, sequence.token_offset, sequence.token_offset + sequence.num_new_tokens,
         batch.num_tokens());

  check_block_table(index, {"", "block_tables", "KV"}, batch.block_tables, sequence.block_table_offset,
                    sequence.num_blocks, static_cast<int64_t>(sequence.num_computed_tokens) + sequence.num_new_tokens,
                    limits.block_size, limits.num_kv_blocks);
}

void check_adapter_slot(int32_t slot, const char* field, size_t index,
                        const std::vector<std::shared_ptr<const LoraAdapter>>& adapters) {
  if (slot == -1) return;
  if (slot < -1 || slot >= static_cast<int32_t>(adapters.size()))
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: {} {} outside [-1, {})", index, field, slot,
         adapters.size());
  if (adapters[slot] == nullptr)
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: {} {} has no adapter bound", index, field, slot);
}

void check_forked_sequence(const Batch& batch, size_t index, const BatchLimits& limits,
                           const std::vector<std::shared_ptr<const LoraAdapter>>& adapters) {
  const BatchSequence& sequence = batch.sequences[index];
  if (limits.has_qk_norm)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("batch sequence {}: forked KV sharing on a model with q/k norm (RMSNorm on K does "
                            "not commute with the residual split)",
                            index),
                "serve this adapter with kv_sharing isolated, activated or base");
  if (limits.num_residual_blocks <= 0)
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: forked sharing but no residual cache is allocated",
         index);
  const LoraAdapter& adapter = *adapters[sequence.forked_adapter_slot];
  for (size_t layer = 0; layer < adapter.layers.size(); ++layer)
    for (LoraTarget target : {LoraTarget::kK, LoraTarget::kV}) {
      const auto& module = adapter.layers[layer][static_cast<int>(target)];
      if (module.has_value() && module->rank > limits.residual_max_rank)
        fail(ErrorKind::kInvalidArgument,
             "batch sequence {}: adapter '{}' layer {} {} has rank {}, over the residual cache's max rank {}",
             index, adapter.name, layer, lora_target_module_name(target), module->rank, limits.residual_max_rank);
    }
  for (int32_t i = 0; i < sequence.num_new_tokens; ++i) {
    const int32_t token = sequence.token_offset + i;
    if (batch.adapter_slots[token] != sequence.forked_adapter_slot)
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: forked on slot {} but token {} has adapter slot {}",
           index, sequence.forked_adapter_slot, token, batch.adapter_slots[token]);
    // Deferred RoPE rotates residual entry j at position j.
    if (batch.positions[token] != sequence.num_computed_tokens + i)
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: forked token {} has position {}, expected its KV index {}",
           index, token, batch.positions[token], sequence.num_computed_tokens + i);
  }
  const int64_t num_entries = static_cast<int64_t>(sequence.num_computed_tokens) + sequence.num_new_tokens;
  if (sequence.num_residual_present_tokens < 0 || sequence.num_residual_present_tokens > num_entries)
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: num_residual_present_tokens {} outside [0, {}]", index,
         sequence.num_residual_present_tokens, num_entries);
  check_block_table(index, {"residual ", "residual_block_tables", "residual"}, batch.residual_block_tables,
                    sequence.residual_block_table_offset, sequence.num_residual_blocks, num_entries,
                    limits.residual_block_size, limits.num_residual_blocks);
}

// The sharing fields of one sequence; runs after check_sequence and the token checks.
void check_sharing(const Batch& batch, size_t index, const BatchLimits& limits,
                   const std::vector<std::shared_ptr<const LoraAdapter>>& adapters) {
  const BatchSequence& sequence = batch.sequences[index];
  const int64_t num_entries = static_cast<int64_t>(sequence.num_computed_tokens) + sequence.num_new_tokens;
  if (sequence.num_kv_present_tokens < 0 || sequence.num_kv_present_tokens > num_entries)
    fail(ErrorKind::kInvalidArgument, "batch sequence {}: num_kv_present_tokens {} outside [0, {}]", index,
         sequence.num_kv_present_tokens, num_entries);
  check_adapter_slot(sequence.decoder_adapter_slot, "decoder_adapter_slot", index, adapters);
  check_adapter_slot(sequence.forked_adapter_slot, "forked_adapter_slot", index, adapters);
  if (sequence.decoder_adapter_slot >= 0 && sequence.forked_adapter_slot >= 0)
    fail(ErrorKind::kInvalidArgument,
         "batch sequence {}: both decoder_adapter_slot {} (base sharing) and forked_adapter_slot {} are set",
         index, sequence.decoder_adapter_slot, sequence.forked_adapter_slot);
  if (sequence.decoder_adapter_slot >= 0) {
    for (int32_t token = sequence.token_offset; token < sequence.token_offset + sequence.num_new_tokens; ++token)
      if (batch.adapter_slots[token] != -1)
        fail(ErrorKind::kInvalidArgument,
             "batch sequence {}: base sharing (decoder slot {}) but token {} has adapter slot {}; its tokens "
             "run as base rows (-1)",
             index, sequence.decoder_adapter_slot, token, batch.adapter_slots[token]);
  }
  if (sequence.forked_adapter_slot >= 0) check_forked_sequence(batch, index, limits, adapters);
}

}  // namespace

void validate_batch(const Batch& batch, const BatchLimits& limits,
                    const std::vector<std::shared_ptr<const LoraAdapter>>& adapters) {
  if (limits.num_kv_blocks <= 0)
    fail(ErrorKind::kInvalidArgument, "forward: the KV cache is not allocated");
  const size_t num_tokens = batch.token_ids.size();
  if (batch.positions.size() != num_tokens || batch.adapter_slots.size() != num_tokens)
    fail(ErrorKind::kInvalidArgument,
         "batch: token_ids ({}), positions ({}) and adapter_slots ({}) differ in size", num_tokens,
         batch.positions.size(), batch.adapter_slots.size());

  int32_t expected_token_offset = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    check_sequence(batch, s, expected_token_offset, limits);
    expected_token_offset += batch.sequences[s].num_new_tokens;
  }
  if (static_cast<size_t>(expected_token_offset) != num_tokens)
    fail(ErrorKind::kInvalidArgument, "batch: sequences cover {} tokens, token_ids has {}",
         expected_token_offset, num_tokens);

  for (size_t t = 0; t < num_tokens; ++t) {
    if (batch.token_ids[t] < 0 || batch.token_ids[t] >= limits.vocab_size)
      fail(ErrorKind::kInvalidArgument, "batch token {}: id {} outside the vocabulary of {}", t,
           batch.token_ids[t], limits.vocab_size);
    if (batch.positions[t] < 0)
      fail(ErrorKind::kInvalidArgument, "batch token {}: negative position {}", t, batch.positions[t]);
    const int32_t slot = batch.adapter_slots[t];
    if (slot == -1) continue;
    if (slot < -1 || slot >= static_cast<int32_t>(adapters.size()))
      fail(ErrorKind::kInvalidArgument, "batch token {}: adapter slot {} outside [-1, {})", t, slot,
           adapters.size());
    if (adapters[slot] == nullptr)
      fail(ErrorKind::kInvalidArgument, "batch token {}: adapter slot {} has no adapter bound", t,
           slot);
  }
  for (size_t s = 0; s < batch.sequences.size(); ++s) check_sharing(batch, s, limits, adapters);
}

constexpr const char* kTargetNames[kNumLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                        "gate_proj", "up_proj", "down_proj"};

void validate_adapter(const LoraAdapter& adapter, const ModelConfig& config) {
  if (adapter.layers.size() != static_cast<size_t>(config.num_layers))
    fail(ErrorKind::kInvalidArgument, "adapter '{}': {} layers, the model has {}", adapter.name,
         adapter.layers.size(), config.num_layers);
  const int64_t hidden = config.hidden_size;
  // [in_features, out_features] of q, k, v, o, gate, up, down.
  const int64_t dims[kNumLoraTargets][2] = {
      {hidden, config.q_size()}, {hidden, config.kv_size()},       {hidden, config.kv_size()},
      {config.q_size(), hidden}, {hidden, config.intermediate_size}, {hidden, config.intermediate_size},
      {config.intermediate_size, hidden}};
  for (size_t layer = 0; layer < adapter.layers.size(); ++layer) {
    for (int target = 0; target < kNumLoraTargets; ++target) {
      const auto& module = adapter.layers[layer][target];
      if (!module.has_value()) continue;
      const int64_t rank = module->rank;
      const int64_t in_features = dims[target][0];
      const int64_t out_features = dims[target][1];
      const bool a_fits = module->a.data != nullptr && module->a.shape.size() == 2 &&
                          module->a.shape[0] == rank && module->a.shape[1] == in_features;
      const bool b_fits = module->b.data != nullptr && module->b.shape.size() == 2 &&
                          module->b.shape[0] == out_features && module->b.shape[1] == rank;
      if (rank <= 0 || !a_fits || !b_fits)
        fail(ErrorKind::kInvalidArgument,
             "adapter '{}' layer {} {}: rank {}, A and B must be [{}, {}] and [{}, {}]",
             adapter.name, layer, kTargetNames[target], rank, rank, in_features, out_features, rank);
    }
  }
}

namespace {

void check_tensor(const Tensor& tensor, std::initializer_list<int64_t> expected_shape,
                  const std::string& name) {
  if (tensor.empty())
    fail(ErrorKind::kFormat, "cpu backend: tensor {} is missing", name);
  const std::vector<int64_t> expected(expected_shape);
  // A 1-D tensor may come as [n] or [1, n]; only the element count matters for it.
  const bool fits = expected.size() == 1 ? tensor.numel() == expected[0] : tensor.shape == expected;
  if (!fits)
    fail(ErrorKind::kFormat, "cpu backend: tensor {} has shape [{}], expected [{}]", name,
         fmt::join(tensor.shape, ", "), fmt::join(expected, ", "));
}

}  // namespace

void validate_weights(const ModelWeights& weights, const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = config.q_size();
  const int64_t kv_size = config.kv_size();
  const int64_t intermediate = config.intermediate_size;
  if (config.num_heads <= 0 || config.num_kv_heads <= 0 || config.num_heads % config.num_kv_heads != 0 ||
      config.head_dim <= 0 || config.head_dim % 2 != 0)
    fail(ErrorKind::kFormat, "cpu backend: {} heads, {} kv heads, head_dim {} are inconsistent",
         config.num_heads, config.num_kv_heads, config.head_dim);
  check_tensor(weights.embed_tokens, {config.vocab_size, hidden}, "model.embed_tokens.weight");
  check_tensor(weights.final_norm, {hidden}, "model.norm.weight");
  check_tensor(weights.lm_head, {config.vocab_size, hidden}, "lm_head.weight");
  if (weights.layers.size() != static_cast<size_t>(config.num_layers))
    fail(ErrorKind::kFormat, "cpu backend: {} layers of weights, config has {}", weights.layers.size(),
         config.num_layers);
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& layer = weights.layers[l];
    const std::string prefix = fmt::format("model.layers.{}.", l);
    check_tensor(layer.input_norm, {hidden}, prefix + "input_layernorm.weight");
    check_tensor(layer.q_proj, {q_size, hidden}, prefix + "self_attn.q_proj.weight");
    check_tensor(layer.k_proj, {kv_size, hidden}, prefix + "self_attn.k_proj.weight");
    check_tensor(layer.v_proj, {kv_size, hidden}, prefix + "self_attn.v_proj.weight");
    check_tensor(layer.o_proj, {hidden, q_size}, prefix + "self_attn.o_proj.weight");
    if (config.qkv_bias) {
      check_tensor(layer.q_bias, {q_size}, prefix + "self_attn.q_proj.bias");
      check_tensor(layer.k_bias, {kv_size}, prefix + "self_attn.k_proj.bias");
      check_tensor(layer.v_bias, {kv_size}, prefix + "self_attn.v_proj.bias");
    }
    if (config.o_bias) check_tensor(layer.o_bias, {hidden}, prefix + "self_attn.o_proj.bias");
    if (config.qk_norm) {
      check_tensor(layer.q_norm, {config.head_dim}, prefix + "self_attn.q_norm.weight");
      check_tensor(layer.k_norm, {config.head_dim}, prefix + "self_attn.k_norm.weight");
    }
    check_tensor(layer.post_attention_norm, {hidden}, prefix + "post_attention_layernorm.weight");
    check_tensor(layer.gate_proj, {intermediate, hidden}, prefix + "mlp.gate_proj.weight");
    check_tensor(layer.up_proj, {intermediate, hidden}, prefix + "mlp.up_proj.weight");
    check_tensor(layer.down_proj, {hidden, intermediate}, prefix + "mlp.down_proj.weight");
  }
}

}  // namespace loom
