// Divergence of the lossy KV sharing modes from their exact reference
// (`loom divergence`; a ForkKV Fig. 5 analogue). Backend-level: it drives a
// Backend directly with hand-built batches, no scheduler, no prefix cache.
//
// A measurement takes one prompt = shared context C + the agent's own suffix S,
// one reader adapter B (bound to a backend slot) and N generated tokens, and
// compares a mode run against a reference run that is exact by definition:
//
//   case            reference                      mode run
//   kBaseModel      isolated B                     the base model alone (B ignored): how much B matters
//   kBase (ICaRus)  isolated B                     every K/V from the base model (C prefilled by the
//                                                  base model, S and generated tokens as base rows);
//                                                  logits and hidden states from B's decoder rows
//   kForked         isolated B                     C's bCache written by the *writer* (the base model,
//                                                  another adapter A run forked, or B itself), marked
//                                                  present; B recomputes only its rCache over C (its own
//                                                  x, the writer's bCache in attention; with writer B
//                                                  itself both are hits), then S and the generated
//                                                  tokens forked with its own bCache + rCache
//   kActivated      B with the aLoRA mask (base    C's K/V from a separate base-model run (the base
//                   on C, B from S on): greedy     namespace), then S and the generated tokens with B
//                   after one prefill over C + S,  (invocation start = |C|); exact: a sanity row
//                   own KV
//
// "isolated B" = B on every token, its own KV: C prefilled, then S + generated.
//
// Measured positions: the |S| + N - 1 positions of S and of the generated
// tokens that are fed back (teacher-forced on the reference's greedy path).
//   layer_cosine[l]  mean over those positions of cos(h_ref, h_mode), h = the
//                    residual stream after the embedding (l = 0) and after layer
//                    l (1..L), before the final norm; in kBase the decoder row's.
//   mean_kl/max_kl   KL(ref || mode) of the next-token distributions (softmax of
//                    the logits, nats), over the same positions.
//   teacher_forced_agreement  over the N positions that predict the generated
//                    tokens (the last of S and the first N - 1 generated ones):
//                    fraction where argmax(mode) == argmax(ref).
//   free_running_agreement    both decode greedily on their own for N tokens:
//                    (number of identical tokens before the first difference) / N.
// EOS is not special: generation always runs N tokens.
//
// KV layout: the function (re)allocates the backend's KV and rCache pools when
// they are too small or have another block size (their contents are lost) and
// runs one sequence per forward. Blocks are reused between the runs of one
// measurement: a continuation writes its entries (index >= |C|) before reading
// them, and present (inherited) entries are never written (backend.h).
//
// Thread: the backend's (engine) thread; not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "lora/adapter.h"
#include "model/config.h"
#include "model/weights.h"

namespace loom {

enum class DivergenceMode { kBaseModel, kBase, kForked, kActivated };
// "base-model", "base", "forked", "activated".
const char* divergence_mode_name(DivergenceMode mode);

// Who wrote the bCache a forked reader inherits over the context.
enum class ForkedWriter { kBaseModel, kAdapter, kSelf };
// "base-model", "adapter", "self".
const char* forked_writer_name(ForkedWriter writer);

struct DivergenceCase {
  DivergenceMode mode = DivergenceMode::kBase;
  ForkedWriter writer = ForkedWriter::kBaseModel;  // kForked only
  int32_t writer_slot = -1;                        // kForked with kAdapter: the writer's bound slot
};

struct DivergencePrompt {
  std::vector<int32_t> context;  // shared context C, >= 1 token
  std::vector<int32_t> suffix;   // the agent's own suffix S, >= 1 token
};

struct DivergenceOptions {
  int32_t num_generated_tokens = 32;  // N >= 1
  int32_t block_size = 16;            // KV and rCache block size
  // rCache max rank: >= the k/v LoRA rank of every adapter run forked (reader
  // and writers). Needed only when a case is kForked.
  int32_t residual_max_rank = 0;
};

struct DivergenceStats {
  std::vector<double> layer_cosine;  // [num_layers + 1], see above
  double mean_kl = 0.0;
  double max_kl = 0.0;
  int32_t num_positions = 0;          // |S| + N - 1
  int32_t num_generated_tokens = 0;   // N
  double teacher_forced_agreement = 0.0;
  double free_running_agreement = 0.0;
  int32_t first_divergence = 0;       // index of the first differing free-running token; N when none
  std::vector<double> kl_by_position;    // [num_positions]; empty after average_divergence
  std::vector<int32_t> reference_tokens; // [N] the reference's greedy path; empty after average_divergence
  std::vector<int32_t> mode_tokens;      // [N] the mode's own greedy path; empty after average_divergence
};

// One stats per case, in order. The reader B is bound to `reader_slot` (and
// every writer_slot) before the call. The isolated reference is computed once
// for all cases that use it. Throws Error(kInvalidArgument) for an empty
// context or suffix, N < 1, unbound slots, a forked case without
// residual_max_rank or a writer_slot < 0 for ForkedWriter::kAdapter; backend
// errors (e.g. forked on a q/k-norm model: kUnsupported) pass through.
std::vector<DivergenceStats> measure_divergence(Backend& backend, const ModelConfig& config,
                                                const DivergencePrompt& prompt, int32_t reader_slot,
                                                const std::vector<DivergenceCase>& cases,
                                                const DivergenceOptions& options);

// Averages stats of the same case over prompts/adapters: layer_cosine, mean_kl
// and the agreements weighted by positions (or generated tokens); max_kl the
// max; first_divergence the (floored) mean. Empty input -> default stats.
DivergenceStats average_divergence(const std::vector<DivergenceStats>& stats);

// KL(P || Q) in nats of P = softmax(p_logits), Q = softmax(q_logits), in double.
double logit_kl_divergence(const float* p_logits, const float* q_logits, int64_t vocab_size);
// cos(a, b) in double; 1 when both are zero, 0 when exactly one is.
double cosine_similarity(const float* a, const float* b, int64_t size);

// Random LoRA adapters of a chosen scale, for measuring (not the synthetic
// models' gains). A is PEFT's default init, kaiming-uniform: U(-1/sqrt(in),
// 1/sqrt(in)) (synthetic/synthetic_model.h's make_synthetic_adapter). B ~ N(0, sigma)
// (not PEFT's zero init), sigma per module either
//   - fixed (b_sigma > 0), or
//   - from relative_norm: sigma = relative_norm * ||W||_F * sqrt(3) / (s * sqrt(out * r)),
//     so that E||s B A||_F = relative_norm * ||W||_F for that module's base weight W
//     (E||B A||_F^2 = out * r * sigma^2 / 3 with the uniform A above).
struct RandomLoraOptions {
  std::string name = "adapter0";
  int rank = 16;
  float alpha = 32.0f;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  float relative_norm = 0.1f;
  float b_sigma = 0.0f;  // > 0: overrides relative_norm
  uint64_t seed = 0;
};

struct RandomLora {
  std::shared_ptr<const LoraAdapter> adapter;
  // Mean over layers of the sigma used for B, per target (0 where not targeted), kNumLoraTargets entries.
  std::vector<double> mean_b_sigma;
};

// `weights` null: a random model whose weights live only on the GPU
// (`--model random:...`); ||W||_F is then its expectation under the synthetic
// draw, sqrt(numel / 3) * scale (synthetic_weights.h). Throws
// Error(kInvalidArgument) for a rank < 1, alpha <= 0, unknown targets or
// neither a positive relative_norm nor b_sigma.
RandomLora make_random_lora(const ModelConfig& config, const ModelWeights* weights, const RandomLoraOptions& options);

}  // namespace loom
