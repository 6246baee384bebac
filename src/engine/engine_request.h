// Engine-side state of one request: sampler, detokenizer, stop handling,
// timings, and the channel its outputs go to. Engine thread only (except the
// constructor, which submit() runs to validate sampling params early).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/request_channel.h"
#include "engine/request_kv.h"
#include "engine/sampler.h"
#include "engine/stop_strings.h"
#include "grammar/grammar_matcher.h"
#include "tokenizer/tokenizer.h"

namespace loom {

using SteadyTime = std::chrono::steady_clock::time_point;

struct PendingRequest {
  int64_t id = 0;
  std::string request_id;
  EngineRequest request;
  RequestKvPlan kv_plan;  // KV key, token layout and mode label (engine/request_kv.h)
  std::shared_ptr<RequestChannel> channel;
  Sampler sampler;
  IncrementalDetokenizer detokenizer;
  StopStringFilter stop_filter;
  SteadyTime submitted_at;
  std::optional<SteadyTime> first_scheduled_at, first_token_at, last_token_at;
  // Set the first step the scheduler held it back for a load (host tier); the
  // wait ends when it is admitted.
  std::optional<SteadyTime> load_wait_started_at;
  int32_t num_output_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;
  // Workflow hints, resolved at admission (engine thread): "workflow/agent"
  // ("" without an agent) and the prompt's fixed prefix in tokens (0: none known).
  std::string agent_key;
  int32_t num_fixed_prefix_tokens = 0;
  // The structured-output state when request.constraint is set and applies
  // (from the first token, or once request.constraint_after was written).
  std::optional<grammar::GrammarMatcher> matcher;

  PendingRequest(int64_t id, std::string request_id, EngineRequest request, RequestKvPlan kv_plan,
                 std::shared_ptr<const Tokenizer> tokenizer);

  // Samples the next token from one row of logits (masking EOS and stop token
  // ids while fewer than min_new_tokens were produced) and turns it into the
  // output to stream. `eos_ids` are the tokenizer's.
  RequestOutput on_logits(const float* logits, int32_t vocab_size, const std::vector<TokenId>& eos_ids);
  // True when the backend may draw the next token itself (backend.h
  // DeviceSampling): no top logprobs asked for, no EOS / stop-token masking
  // pending (min_new_tokens reached), no penalties, logit_bias or min_p unless
  // the backend processes logits (`device_logit_processing`: sampler's
  // append_logit_edits gives it this step's), and no structured-output
  // constraint unless it takes token masks (`device_token_masks`:
  // write_device_mask gives it this step's).
  bool can_sample_on_device(bool device_token_masks, bool device_logit_processing) const;
  // on_logits' second half, for a token drawn on the device.
  RequestOutput on_sampled_token(SampledToken sampled, const std::vector<TokenId>& eos_ids);
  // Structured outputs drawn on the device: writes the grammar's mask of allowed
  // next tokens as num_words words of 32 bits (bit t % 32 of word t / 32 = token
  // t; tokens past the grammar's vocabulary or the model's vocab_size clear), from prepare_constraint_mask's
  // result when it has one. A grammar that fails here, or allows no token, leaves
  // that outcome to on_device_token (the mask then allows everything, so the draw
  // stays defined).
  void write_device_mask(uint32_t* words, int32_t num_words, int32_t vocab_size);
  // on_sampled_token for a row drawn on the device: a constrained request whose
  // write_device_mask found no allowed token stops, one whose grammar failed ends
  // with that error (the drawn token is dropped in both cases).
  RequestOutput on_device_token(SampledToken sampled, const std::vector<TokenId>& eos_ids);
  // A finished output carrying `error`.
  RequestOutput failed(const Error& error) const;
  // Structured outputs: computes the grammar's mask of allowed next tokens
  // now, for the next on_logits (which otherwise computes it itself). The
  // engine runs this beside the forward pass, on another thread; nothing else
  // may touch this request meanwhile. A failure leaves the mask to on_logits.
  void prepare_constraint_mask();

 private:
  RequestOutput make_output() const;
  // Sets disallowed tokens' logits to -inf in masked_logits_ (a copy of
  // `logits` unless `copied`); false when the grammar allows no token at all.
  bool apply_constraint(const float* logits, int32_t vocab_size, bool copied);
  RequestOutput finish_without_token(FinishReason reason);
  // request.constraint_after: notes the sampled token; starts the matcher once the marker is complete.
  void watch_constraint_start(TokenId token);
  std::vector<float> masked_logits_;
  std::vector<uint64_t> allowed_tokens_;  // the matcher's bitmask, reused across steps
  bool mask_prepared_ = false;            // allowed_tokens_ is the matcher's current state's
  // write_device_mask's outcome, for on_device_token.
  enum class DeviceMask { kNone, kWritten, kEmpty, kFailed };
  DeviceMask device_mask_ = DeviceMask::kNone;
  std::optional<Error> device_mask_error_;
  std::shared_ptr<const Tokenizer> tokenizer_;  // watch_constraint_start's token bytes
  std::string constraint_start_tail_;           // the output's last bytes while the marker is awaited
};

// The engine thread's requests in flight, by id.
using ActiveRequests = std::unordered_map<int64_t, std::unique_ptr<PendingRequest>>;

}  // namespace loom
