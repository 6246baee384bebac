#include "oracles/generator.h"

#include <algorithm>

#include "engine/stop_strings.h"
#include "oracles/block_allocator.h"
#include "util/error.h"

namespace loom {

namespace {

// Per-request progress. Tokens [0, num_computed) have K/V in the cache.
struct SequenceState {
  const GenerationRequest* request = nullptr;
  std::vector<TokenId> tokens;  // prompt followed by generated tokens
  int32_t num_computed = 0;
  std::vector<int32_t> block_ids;
  Sampler sampler;
  IncrementalDetokenizer detokenizer;
  std::string pending_text;  // decoded but possibly the start of a stop string
  bool finished = false;

  SequenceState(const GenerationRequest& req, std::shared_ptr<const Tokenizer> tokenizer)
      : request(&req), tokens(req.prompt_tokens), sampler(req.sampling),
        detokenizer(std::move(tokenizer)) {}
};

}  // namespace

Generator::Generator(Backend& backend, std::shared_ptr<const Tokenizer> tokenizer, GeneratorConfig config)
    : backend_(backend), tokenizer_(std::move(tokenizer)), config_(config) {
  LOOM_CHECK(config_.block_size > 0 && config_.max_batch_tokens > 0);
}

std::vector<GenerationResult> Generator::generate(const std::vector<GenerationRequest>& requests,
                                                  const TextCallback& on_text) {
  const int32_t block_size = config_.block_size;
  int32_t num_blocks_needed = 0;
  for (const auto& request : requests) {
    if (request.prompt_tokens.empty()) fail(ErrorKind::kInvalidArgument, "empty prompt");
    if (request.max_new_tokens < 0) fail(ErrorKind::kInvalidArgument, "max_new_tokens must be >= 0");
    const int64_t total = static_cast<int64_t>(request.prompt_tokens.size()) + request.max_new_tokens;
    if (config_.max_context_tokens > 0 && total > config_.max_context_tokens)
      throw Error(ErrorKind::kCapacity,
                  fmt::format("prompt ({} tokens) + max_new_tokens ({}) exceeds the context limit of {}",
                              request.prompt_tokens.size(), request.max_new_tokens, config_.max_context_tokens),
                  "shorten the prompt or lower max tokens");
    num_blocks_needed += static_cast<int32_t>((total + block_size - 1) / block_size);
  }
  backend_.allocate_kv_cache({num_blocks_needed, block_size});
  BlockAllocator allocator(num_blocks_needed);

  std::vector<SequenceState> states;
  states.reserve(requests.size());
  for (const auto& request : requests) states.emplace_back(request, tokenizer_);
  const std::vector<TokenId> eos_ids = tokenizer_->eos_token_ids();

  std::vector<GenerationResult> results(requests.size());
  auto push_text = [&](size_t index, const std::string& text, bool final_flush) {
    SequenceState& state = states[index];
    state.pending_text += text;
    std::string& pending = state.pending_text;
    size_t stop_at = find_stop_string(pending, state.request->stop_strings);
    if (stop_at != std::string::npos) {
      pending.resize(stop_at);
      state.finished = true;
      results[index].finish_reason = FinishReason::kStop;
      final_flush = true;
    }
    size_t ready = final_flush ? pending.size()
                               : pending.size() - stop_string_hold_back_length(pending, state.request->stop_strings);
    if (ready == 0) return;
    std::string delta = pending.substr(0, ready);
    pending.erase(0, ready);
    results[index].text += delta;
    if (on_text) on_text(index, delta);
  };

  for (size_t i = 0; i < states.size(); ++i)
    if (requests[i].max_new_tokens == 0) states[i].finished = true;

  while (true) {
    Batch batch;
    std::vector<size_t> batch_members;
    int32_t budget = config_.max_batch_tokens;
    for (size_t i = 0; i < states.size() && budget > 0; ++i) {
      SequenceState& state = states[i];
      if (state.finished) continue;
      const int32_t num_uncomputed = static_cast<int32_t>(state.tokens.size()) - state.num_computed;
      const int32_t num_new = std::min(num_uncomputed, budget);
      const int32_t num_total = state.num_computed + num_new;
      const int32_t blocks_needed = (num_total + block_size - 1) / block_size;
      const int32_t extra_blocks = blocks_needed - static_cast<int32_t>(state.block_ids.size());
      if (extra_blocks > 0) {
        auto ids = allocator.allocate(extra_blocks);
        LOOM_CHECK(ids.has_value());  // sized for every request's worst case above
        state.block_ids.insert(state.block_ids.end(), ids->begin(), ids->end());
      }
      BatchSequence sequence;
      sequence.num_computed_tokens = state.num_computed;
      sequence.num_new_tokens = num_new;
      sequence.token_offset = batch.num_tokens();
      sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
      sequence.num_blocks = static_cast<int32_t>(state.block_ids.size());
      for (int32_t j = 0; j < num_new; ++j) {
        batch.token_ids.push_back(state.tokens[static_cast<size_t>(state.num_computed + j)]);
        batch.positions.push_back(state.num_computed + j);
        batch.adapter_slots.push_back(state.request->adapter_slot);
      }
      batch.block_tables.insert(batch.block_tables.end(), state.block_ids.begin(), state.block_ids.end());
      batch.sequences.push_back(sequence);
      batch_members.push_back(i);
      budget -= num_new;
    }
    if (batch_members.empty()) break;

    ForwardResult output = backend_.forward(batch);
    LOOM_CHECK(output.logit_token_index.size() == batch_members.size());
    for (size_t row = 0; row < batch_members.size(); ++row) {
      const size_t index = batch_members[row];
      SequenceState& state = states[index];
      state.num_computed += batch.sequences[row].num_new_tokens;
      if (state.num_computed < static_cast<int32_t>(state.tokens.size())) continue;  // prompt chunk

      SampledToken sampled = state.sampler.sample(
          output.logits.data() + row * static_cast<size_t>(output.vocab_size), output.vocab_size);
      const TokenId token = sampled.token_id;
      results[index].tokens.push_back(std::move(sampled));
      state.tokens.push_back(token);
      const bool is_eos = std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
      if (is_eos && !state.request->ignore_eos) {
        state.finished = true;
        results[index].finish_reason = FinishReason::kStop;
        push_text(index, state.detokenizer.flush(), true);
        continue;
      }
      push_text(index, state.detokenizer.push(token), false);
      if (!state.finished &&
          static_cast<int32_t>(results[index].tokens.size()) >= state.request->max_new_tokens) {
        state.finished = true;
        results[index].finish_reason = FinishReason::kLength;
        push_text(index, state.detokenizer.flush(), true);
      }
    }
  }
  return results;
}

}  // namespace loom
