#include "engine/engine_request.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace loom {

PendingRequest::PendingRequest(int64_t id_in, std::string request_id_in, EngineRequest request_in,
                               RequestKvPlan kv_plan_in, std::shared_ptr<const Tokenizer> tokenizer)
    : id(id_in), request_id(std::move(request_id_in)), request(std::move(request_in)), kv_plan(std::move(kv_plan_in)),
      channel(std::make_shared<RequestChannel>()),
      sampler(request.sampling), detokenizer(tokenizer, request.skip_special_tokens),
      stop_filter(request.stop_strings, request.include_stop_str_in_output),
      submitted_at(std::chrono::steady_clock::now()), tokenizer_(std::move(tokenizer)) {
  sampler.set_prompt(request.prompt_tokens);
  if (request.constraint && request.constraint_after.empty()) matcher.emplace(request.constraint);
}

void PendingRequest::watch_constraint_start(TokenId token) {
  const std::string& marker = request.constraint_after;
  constraint_start_tail_ += tokenizer_->token_bytes(token);
  if (constraint_start_tail_.find(marker) != std::string::npos) {
    matcher.emplace(request.constraint);
    constraint_start_tail_ = std::string();
    return;
  }
  if (constraint_start_tail_.size() >= marker.size())
    constraint_start_tail_.erase(0, constraint_start_tail_.size() - (marker.size() - 1));
}

RequestOutput PendingRequest::make_output() const {
  RequestOutput output;
  output.num_prompt_tokens = static_cast<int32_t>(request.prompt_tokens.size());
  output.num_cached_prompt_tokens = num_cached_prompt_tokens;
  output.num_output_tokens = num_output_tokens;
  return output;
}

RequestOutput PendingRequest::on_logits(const float* logits, int32_t vocab_size, const std::vector<TokenId>& eos_ids) {
  const bool before_min = num_output_tokens < request.min_new_tokens;
  if (before_min) {
    masked_logits_.assign(logits, logits + vocab_size);
    auto mask = [&](TokenId id) {
      if (id >= 0 && id < vocab_size) masked_logits_[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    };
    if (!request.ignore_eos)
      for (TokenId id : eos_ids) mask(id);
    for (TokenId id : request.stop_token_ids) mask(id);
    logits = masked_logits_.data();
  }
  if (matcher) {
    if (!apply_constraint(logits, vocab_size, before_min)) return finish_without_token(FinishReason::kStop);
    logits = masked_logits_.data();
  }
  return on_sampled_token(sampler.sample(logits, vocab_size), eos_ids);
}

void PendingRequest::prepare_constraint_mask() {
  if (!matcher || mask_prepared_) return;
  try {
    matcher->fill_next_token_bitmask(allowed_tokens_);
    mask_prepared_ = true;
  } catch (const std::exception&) {  // on_logits computes it again and reports what fails
  }
}

bool PendingRequest::apply_constraint(const float* logits, int32_t vocab_size, bool copied) {
  if (!copied) masked_logits_.assign(logits, logits + vocab_size);
  if (!mask_prepared_) matcher->fill_next_token_bitmask(allowed_tokens_);
  mask_prepared_ = false;  // the sampled token moves the matcher on
  const int32_t grammar_vocab = matcher->grammar().vocabulary().size();
  bool any = false;
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int32_t id = 0; id < vocab_size; ++id) {
    const bool allowed = id < grammar_vocab && ((allowed_tokens_[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1);
    if (!allowed) masked_logits_[static_cast<size_t>(id)] = kMasked;
    else if (masked_logits_[static_cast<size_t>(id)] != kMasked) any = true;
  }
  return any;
}

RequestOutput PendingRequest::finish_without_token(FinishReason reason) {
  RequestOutput output = make_output();
  output.text_delta = stop_filter.push(detokenizer.flush(), true, true).text;
  output.finished = true;
  output.finish_reason = reason;
  return output;
}

bool PendingRequest::can_sample_on_device(bool device_token_masks, bool device_logit_processing) const {
  return request.sampling.num_top_logprobs == 0 && num_output_tokens >= request.min_new_tokens &&
         (!request.sampling.modifies_logits() || device_logit_processing) && (!matcher || device_token_masks);
}

void PendingRequest::write_device_mask(uint32_t* words, int32_t num_words, int32_t vocab_size) {
  std::fill_n(words, num_words, 0xFFFFFFFFu);
  device_mask_ = DeviceMask::kFailed;
  try {
    if (!mask_prepared_) matcher->fill_next_token_bitmask(allowed_tokens_);
  } catch (const Error& error) {
    device_mask_error_ = error;
    return;
  } catch (const std::exception& error) {
    device_mask_error_ = Error(ErrorKind::kInternal, fmt::format("structured output: {}", error.what()));
    return;
  }
  mask_prepared_ = false;  // the sampled token moves the matcher on
  const int64_t grammar_vocab = std::min<int64_t>(matcher->grammar().vocabulary().size(), vocab_size);
  bool any = false;
  for (int32_t w = 0; w < num_words; ++w) {
    uint32_t word = 0;
    const int64_t first = static_cast<int64_t>(w) * 32;
    if (first < grammar_vocab) {
      word = static_cast<uint32_t>(allowed_tokens_[static_cast<size_t>(first >> 6)] >> (first & 63));
      if (grammar_vocab - first < 32) word &= (1u << (grammar_vocab - first)) - 1u;
    }
    words[w] = word;
    any = any || word != 0;
  }
  device_mask_ = any ? DeviceMask::kWritten : DeviceMask::kEmpty;
  if (!any) std::fill_n(words, num_words, 0xFFFFFFFFu);
}

RequestOutput PendingRequest::on_device_token(SampledToken sampled, const std::vector<TokenId>& eos_ids) {
  const DeviceMask mask = std::exchange(device_mask_, DeviceMask::kNone);
  if (mask == DeviceMask::kFailed) return failed(*std::exchange(device_mask_error_, std::nullopt));
  if (mask == DeviceMask::kEmpty) return finish_without_token(FinishReason::kStop);
  sampler.note_output_token(sampled.token_id);
  return on_sampled_token(std::move(sampled), eos_ids);
}

RequestOutput PendingRequest::on_sampled_token(SampledToken sampled, const std::vector<TokenId>& eos_ids) {
  const bool before_min = num_output_tokens < request.min_new_tokens;
  const TokenId token = sampled.token_id;
  ++num_output_tokens;
  RequestOutput output = make_output();
  output.new_tokens.push_back(std::move(sampled));

  const bool is_eos = !request.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
  const bool is_stop_token =
      std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) != request.stop_token_ids.end();
  const bool match_stops = num_output_tokens >= request.min_new_tokens;
  // The mask only offered tokens the grammar takes; a token it refuses here is a bug. A grammar
  // too ambiguous or nested too deeply to follow fails the request with the matcher's kCapacity error.
  if (matcher && !is_eos && !is_stop_token) {
    try {
      if (!matcher->accept_token(token))
        return failed(Error(ErrorKind::kInternal, fmt::format("structured output: the grammar refused sampled token {}", token)));
    } catch (const Error& error) {
      return failed(error);
    }
  } else if (request.constraint && !matcher && !is_eos && !is_stop_token) {
    watch_constraint_start(token);
  }
  if ((is_eos || is_stop_token) && !before_min) {
    output.text_delta = stop_filter.push(detokenizer.flush(), true, match_stops).text;
    output.finished = true;
    output.finish_reason = FinishReason::kStop;
    return output;
  }
  StopStringFilter::Result text = stop_filter.push(detokenizer.push(token), false, match_stops);
  output.text_delta = std::move(text.text);
  if (text.stopped) {
    output.finished = true;
    output.finish_reason = FinishReason::kStop;
  } else if (matcher && matcher->is_completed()) {
    output.text_delta += stop_filter.push(detokenizer.flush(), true, match_stops).text;
    output.finished = true;
    output.finish_reason = FinishReason::kStop;
  } else if (num_output_tokens >= request.max_new_tokens) {
    StopStringFilter::Result rest = stop_filter.push(detokenizer.flush(), true, match_stops);
    output.text_delta += rest.text;
    output.finished = true;
    output.finish_reason = rest.stopped ? FinishReason::kStop : FinishReason::kLength;
  }
  return output;
}

RequestOutput PendingRequest::failed(const Error& error) const {
  RequestOutput output = make_output();
  output.finished = true;
  output.error = error;
  return output;
}

}  // namespace loom
