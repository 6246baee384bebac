// Launchers of the CUDA backend's kernels (kernels.cu, attention.cu, lora.cu,
// synthetic_init.cu). Every pointer is device memory unless named host_*; every
// launcher enqueues on `stream`, returns at once and throws loom::Error if the
// launch fails. Matrices are row-major and dense unless a *_stride says otherwise.
//
// Precision: weights and GEMM inputs are bf16; the residual stream, GEMM
// outputs feeding it (q/k/v, o_proj, down_proj) and all reductions are fp32.
// Thread: call from the thread that owns the stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/plan_types.h"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// Where a launcher enqueues: `stream`, and whether as a programmatic dependent
// launch of the stream's previous kernel (launch.cuh; the launchers that take a
// Launch run kernels that wait for their predecessor first). A plain stream
// converts to a plain launch.
struct Launch {
  Launch(cudaStream_t stream_in, bool programmatic_in = false) : stream(stream_in), programmatic(programmatic_in) {}
  cudaStream_t stream;
  bool programmatic;
};

// out[t, :] = float(table[token_ids[t], :]) for t < num_tokens. hidden % 8 == 0.
// out[t] = table[token_ids[t] - vocab_begin] for ids in [vocab_begin, vocab_begin + vocab_rows)
// (a vocab-parallel rank's rows; everything, unsharded), zeros for other ids.
void launch_embedding(const int32_t* token_ids, int32_t num_tokens, const bf16* table, int32_t hidden,
                      float* out, Launch launch, int32_t vocab_begin = 0, int32_t vocab_rows = INT32_MAX);
// delta[t] += lora_delta[lora_rows[t]] for rows whose lora_rows[t] >= 0 (a tensor-parallel
// rank folds its partial LoRA output into the partial product before their one all-reduce).
void launch_add_lora_rows(float* delta, const float* lora_delta, const int32_t* lora_rows, int32_t num_rows,
                          int32_t hidden, cudaStream_t stream);

// For each output row r (token t = row_index ? row_index[r] : r):
//   if delta: residual[t] += delta[t] (+ delta_bias), written back;
//   out[r] = bf16(weight * residual[t] * rsqrt(mean(residual[t]^2) + eps)).
// HF LlamaRMSNorm with the residual add of the previous block fused in.
// lora_delta ([LoRA rows, hidden], LoraParams::write_by_lora_row's output) is
// added with delta for tokens t whose lora_rows[t] >= 0.
void launch_add_rms_norm(float* residual, const float* delta, const float* delta_bias, const float* weight,
                         float eps, int32_t hidden, const int32_t* row_index, int32_t num_rows, bf16* out,
                         Launch launch, const float* lora_delta = nullptr, const int32_t* lora_rows = nullptr);

struct QkvParams {
  const float* qkv = nullptr;      // [num_tokens, q_size + 2 kv_size]: GEMM (+ LoRA) output
  const float* bias = nullptr;     // optional [q_size + 2 kv_size]
  const float* q_norm = nullptr;   // optional [head_dim] (Qwen3 q/k RMSNorm)
  const float* k_norm = nullptr;
  const float* inv_freq = nullptr; // [head_dim / 2] (llama3 scaling already applied)
  const int32_t* positions = nullptr;
  const int32_t* kv_slots = nullptr;  // [num_tokens], -1: leave the cache entry alone
  bf16* q_out = nullptr;           // [num_tokens, q_size]
  bf16* k_cache = nullptr;         // this layer's pools (plan_types.h's kv_element_index layout)
  bf16* v_cache = nullptr;
  // An FP8 cache (kv_fp8.cuh) instead of k_cache / v_cache, with this layer's scales.
  uint8_t* k_cache_fp8 = nullptr;
  uint8_t* v_cache_fp8 = nullptr;
  float k_scale = 1.0f, v_scale = 1.0f;
  int32_t num_tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  float eps = 1e-6f;
  // Optional LoRA output [LoRA rows, q_size + 2 kv_size] added to qkv for
  // tokens t with lora_rows[t] >= 0 (before the bias).
  const float* lora = nullptr;
  const int32_t* lora_rows = nullptr;
  // ForkKV (optional): rows t with residual_slots[t] != -1 are forked tokens,
  // whose K/V (the bCache) get no k/v LoRA; those with residual_slots[t] >= 0
  // also write their rCache slot: rK = x·A_k^T, rV = x·A_v^T, the q/k/v LoRA
  // shrink's k and v results (split path: lora_v holds lora_splits partial
  // sums per LoRA row, LoraParams::v's layout with targets q, k, v), zeros past
  // the module's rank (plan_types.h's rCache layout).
  const int32_t* residual_slots = nullptr;
  bf16* residual_pool = nullptr;  // this layer's rCache
  int32_t residual_rank_stride = 0;
  const float* lora_v = nullptr;
  int32_t lora_num_rows = 0, lora_max_rank = 0, lora_max_splits = 0, lora_splits = 0;
  const LoraModuleRef* lora_modules = nullptr;  // [slots][num_layers][kNumLoraTargets]
  const int32_t* row_adapter_slots = nullptr;   // [num_tokens]
  int32_t num_layers = 0, layer = 0;
};
// Bias, q/k norm, RoPE (rotate-half) on q and k; q -> q_out, k/v -> their slots.
void launch_qkv_postprocess(const QkvParams& params, Launch launch);

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, intermediate + i]. intermediate % 8 == 0.
// With lora ([LoRA rows, 2 intermediate] fp32, or bf16 with lora_is_bf16), tokens with lora_rows[t] >= 0
// first add their row to gate_up's.
// lora_is_bf16: the LoRA delta rows are bf16 rather than fp32.
void launch_swiglu(const bf16* gate_up, int32_t num_tokens, int32_t intermediate, bf16* out, Launch launch,
                   const float* lora = nullptr, const int32_t* lora_rows = nullptr, bool lora_is_bf16 = false);

struct AttentionParams {
  const bf16* q = nullptr;           // [num_tokens, num_heads * head_dim]
  const bf16* k_cache = nullptr;     // kv_element_index layout (plan_types.h)
  const bf16* v_cache = nullptr;
  // An FP8 cache (kv_fp8.cuh) in the same layout instead, with this layer's
  // scales: every variant reads it as bf16(e4m3 * scale). The forked wide
  // path's rebuild reads it too, then runs the wide kernel on its bf16 scratch.
  const uint8_t* k_cache_fp8 = nullptr;
  const uint8_t* v_cache_fp8 = nullptr;
  float k_scale = 1.0f, v_scale = 1.0f;
  const int32_t* block_tables = nullptr;
  const AttentionSequence* sequences = nullptr;
  bf16* out = nullptr;               // [num_tokens, num_heads * head_dim]
  float* partial_out = nullptr;      // [num_partials, num_kv_heads, kAttentionMaxRows, head_dim]
  float* partial_lse = nullptr;      // [num_partials, num_kv_heads, kAttentionMaxRows] (log2 domain)
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  float scale = 1.0f;                // softmax scale, 1 / sqrt(head_dim)
  // Forked sequences only (ResidualAttention, ForkKV, arXiv:2604.06370 §5.3), per kv head h of
  // the sequence's adapter (B_k, s_k, B_v, s_v of this layer, rank 0: none):
  //   K_j = bK_j + RoPE_j(s_k · rK_j · B_k[h]^T)   rebuilt per key tile in shared memory
  //   out = (P·bV + (P·rV) · s_v B_v[h]^T) / l     V's up-projection once, after the loop
  const bf16* residual_pool = nullptr;  // this layer's rCache (plan_types.h)
  const int32_t* residual_block_tables = nullptr;
  int32_t residual_block_size = 0, residual_rank_stride = 0;
  const LoraModuleRef* lora_modules = nullptr;  // [slots][num_layers][kNumLoraTargets]
  int32_t num_layers = 0, layer = 0;
  const float* inv_freq = nullptr;  // [head_dim / 2]: RoPE of KV entry j at position j (as launch_qkv_postprocess)
};
// True for the head sizes the attention kernels are built for (16, 32, 64, 128).
bool attention_supports_head_dim(int32_t head_dim);
// Decode-variant CTAs that fit on one SM at once (PlanShape::decode_ctas_per_sm;
// residual_rank > 0: the ResidualAttention kernel of that rank's tier).
int32_t attention_decode_ctas_per_sm(int32_t head_dim, int32_t residual_rank = 0);
// True for the head sizes the wide (wgmma) prefill is built for (64, 128).
bool attention_wide_supports_head_dim(int32_t head_dim);
// Runs the work items (see plan_types.h). `variant` picks the tile shape.
// residual_rank > 0: the items are forked sequences' (ResidualAttention) and
// no adapter among them has a k or v rank above it (<= kResidualMaxRank).
// kPrefillWide (and kPrefillWidePingPong): items of unsplit, non-forked
// sequences, a wide-supported head size.
void launch_attention(const AttentionParams& params, AttentionVariant variant, const AttentionWorkItem* items,
                      int32_t num_items, Launch launch, int32_t residual_rank = 0);
// Shared memory one CTA of the variant takes (ResidualAttention with residual_rank > 0).
size_t attention_shared_bytes(int32_t head_dim, AttentionVariant variant, int32_t residual_rank);
// Divergence tooling: out[r] = residual[rows[r]] (+ delta[rows[r]] + lora_delta[lora_rows[rows[r]]]
// where given and >= 0), the residual stream after a layer whose last add is still pending.
void launch_gather_hidden(const float* residual, const float* delta, const float* lora_delta,
                          const int32_t* lora_rows, const int32_t* rows, int32_t num_rows, int32_t hidden, float* out,
                          Launch launch);
// The kPrefillWide kernel (attention_wide.cu), which launch_attention calls.
void launch_attention_wide(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                           cudaStream_t stream);
size_t attention_wide_shared_bytes(int32_t head_dim);
// The kPrefillWidePingPong kernel (attention_pingpong.cu): kPrefillWide's items,
// warp-specialized; launch_attention calls it.
void launch_attention_pingpong(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                               cudaStream_t stream);
size_t attention_pingpong_shared_bytes(int32_t head_dim);
// Forked prefills on the wide kernel (plan_types.h ResidualRebuildItem): rebuilds
// the items' keys and values into scratch_k / scratch_v (kv_element_index's
// layout, params.block_size, the scratch copies' block tables), then runs the
// items over them on `variant` (kPrefillWide or kPrefillWidePingPong). params
// carries the forked fields (rCache, modules, inv_freq); no adapter of the
// items has a k or v rank above residual_rank (<= kResidualMaxRank).
void launch_forked_wide_prefill(const AttentionParams& params, const ResidualRebuildItem* rebuild_items,
                                int32_t num_rebuild_items, const AttentionWorkItem* wide_items,
                                int32_t num_wide_items, bf16* scratch_k, bf16* scratch_v, cudaStream_t stream,
                                int32_t residual_rank, AttentionVariant variant = AttentionVariant::kPrefillWidePingPong);
// launch_forked_wide_prefill for each pass of a plan (StepPlan::forked_wide_passes),
// in order; rebuild_items and wide_items are the plan's whole device lists.
void launch_forked_wide_passes(const AttentionParams& params, const ForkedWidePass* passes, size_t num_passes,
                               const ResidualRebuildItem* rebuild_items, const AttentionWorkItem* wide_items,
                               bf16* scratch_k, bf16* scratch_v, cudaStream_t stream, int32_t residual_rank,
                               AttentionVariant variant = AttentionVariant::kPrefillWidePingPong);
// Merges split-KV partial results into params.out.
void launch_attention_combine(const AttentionParams& params, const AttentionCombineItem* items,
                              int32_t num_items, Launch launch);

// One LoRA-targeted projection in a launch: module `target` (LoraTarget index)
// reads `in_features` columns and adds into `out_features` columns of y starting
// at `y_column`.
struct LoraTargetArgs {
  int32_t target = 0;
  int32_t in_features = 0;
  int32_t out_features = 0;
  int32_t y_column = 0;
};
struct LoraParams {
  const LoraModuleRef* modules = nullptr;  // [slots][num_layers][kNumLoraTargets]
  int32_t num_layers = 0;
  int32_t layer = 0;
  const int32_t* sorted_tokens = nullptr;  // batch token of each LoRA row, grouped by adapter
  const LoraTile* tiles = nullptr;
  int32_t num_tiles = 0;
  int32_t num_rows = 0;                    // LoRA rows (tokens with an adapter)
  int32_t max_rank = 0;                    // v's row stride
  const bf16* x = nullptr;                 // shrink input, row t at x + t * x_stride
  int32_t x_stride = 0;
  float* v = nullptr;                      // [num_targets][max_splits][num_rows][max_rank] scratch
  int32_t max_splits = 0;                  // >= lora_splits(largest in_features)
  void* y = nullptr;                       // expand output (+=), fp32 or bf16
  bool y_is_bf16 = false;
  int32_t y_stride = 0;
  int32_t num_targets = 0;                 // 1..3, all reading x and writing y
  LoraTargetArgs targets[3];
  // false: y[token] += (y rows are batch tokens). true: y (fp32, or bf16 with
  // y_is_bf16) has a row per LoRA row (sorted_tokens' order) and is written,
  // not added: scale v B^T, zeros where the row's adapter does not target the module.
  bool write_by_lora_row = false;
};
// The shrink splits in_features into chunks computed in parallel; v holds one
// partial per chunk.
int32_t lora_splits(int32_t in_features);
// v = x A^T (shrink), then y += scale * v B^T (expand), per adapter group of rows.
// Rows whose adapter does not target the module are skipped. Requires
// in_features % 8 == 0 and max_rank <= kLoraMaxRank.
void launch_lora(const LoraParams& params, Launch launch);
#ifdef LOOM_CUDA_MEASURE
// The benchmark's build only (measure_switches.h): launch_lora with the
// measurement variants: one fused shrink + expand launch (each CTA recomputes
// its tile's v; no v scratch), the split expand with 2 or 4 output columns per
// thread (0: 1 column, 128 threads), the expand as a programmatic dependent
// launch of the shrink, and launches left out (skip bit 1: shrink, bit 2:
// expand; results wrong).
struct LoraVariant {
  bool fused = false;
  int32_t expand_columns = 1;
  bool programmatic_expand = false;
  int32_t skip = 0;
};
void launch_lora_variant(const LoraParams& params, Launch launch, const LoraVariant& variant);
#endif

// Decode-sized GEMMs (skinny_gemm.cu), m in 1..4: y[r * y_stride + c] = x[r] . w[c]
// for c < n (k % 8 == 0, x rows 16-byte aligned). The gate/up variant computes
// both halves of a fused [2 intermediate, k] weight and writes SwiGLU's output.
inline constexpr int32_t kSkinnyGemmMaxRows = 4;
void launch_skinny_gemm(const bf16* x, int32_t m, int32_t x_stride, const bf16* w, int32_t n, int32_t k, void* y,
                        bool y_is_bf16, int32_t y_stride, Launch launch);
void launch_skinny_gate_up_swiglu(const bf16* x, int32_t m, int32_t x_stride, const bf16* w, int32_t intermediate,
                                  int32_t k, bf16* out, Launch launch);
// The same GEMM over FP8 weights (--quantization fp8): w is e4m3 [n, k] with one
// fp32 scale per row (w_scale[n], device), x stays bf16, the products are summed
// in fp32 and each row's sum scaled once (k % 16 == 0).
void launch_skinny_gemm_fp8(const bf16* x, int32_t m, int32_t x_stride, const uint8_t* w, const float* w_scale,
                            int32_t n, int32_t k, void* y, bool y_is_bf16, int32_t y_stride, Launch launch);
// launch_skinny_gate_up_swiglu over an FP8 [2 intermediate, k] weight (w_scale[2 intermediate]): the
// unfused path's bits (launch_skinny_gemm_fp8 to bf16, then launch_swiglu) in one kernel.
void launch_skinny_gate_up_swiglu_fp8(const bf16* x, int32_t m, int32_t x_stride, const uint8_t* w, const float* w_scale,
                                      int32_t intermediate, int32_t k, bf16* out, Launch launch);

// FP8 (e4m3) quantization by rows (fp8.cu), for weights at load (one scale per
// output channel) and activations before an FP8 GEMM (one per token):
// out[r * cols + c] = e4m3(x[r * x_stride + c] / s_r) for r < rows, c < cols,
// with s_r = max_c |x[r, c]| / 448 (448 = the largest e4m3; s_r = 1 for a zero
// row) written to scales[r]. One kernel, one block a row; capturable.
inline constexpr float kFp8E4m3Max = 448.0f;
void launch_fp8_quantize_rows(const bf16* x, int64_t rows, int64_t cols, int64_t x_stride, uint8_t* out,
                              float* scales, cudaStream_t stream);
// The same with one scale for the whole tensor (s = max |x| / 448), written to
// scales[0 .. copies) (copies = rows gives a per-row vector of equal scales;
// copies <= rows * cols). sync: kFp8QuantizeSyncWords uint32 of device memory,
// zero before the first launch and left zero by each (one launch at a time per
// sync). One kernel; capturable.
inline constexpr int kFp8QuantizeSyncWords = 3;
void launch_fp8_quantize_tensor(const bf16* x, int64_t rows, int64_t cols, int64_t x_stride, uint8_t* out,
                                float* scales, int64_t copies, uint32_t* sync, cudaStream_t stream);
// data[r * cols + c] = e4m3(e4m3(data[r * cols + c]) * scales[r] / common) in place:
// rows with their own scales brought to one common scale (>= each of them).
void launch_fp8_requantize_rows(uint8_t* data, const float* scales, int64_t rows, int64_t cols, float common,
                                cudaStream_t stream);
// out[r * cols + c] = bf16(e4m3(w[r * cols + c]) * scales[r]): an FP8 matrix as a
// bf16 one, for GEMMs the FP8 GEMM cannot take (cols % 8 == 0).
void launch_fp8_dequantize(const uint8_t* w, const float* scales, int64_t rows, int64_t cols, bf16* out,
                           cudaStream_t stream);
#ifdef LOOM_CUDA_MEASURE
// The benchmark's build only: the 1-row skinny GEMM (fp32 y) with `unroll`
// 16-byte loads in flight per lane and `warps` a CTA, for the combinations
// skinny_gemm.cu instantiates; and a streaming read of `bytes` (a grid of
// blocks x threads) for the read bandwidth it can reach.
void launch_skinny_gemm_variant(const bf16* x, int32_t k, const bf16* w, int32_t n, float* y, int32_t unroll,
                                int32_t warps, cudaStream_t stream);
// The FP8 skinny GEMM (1 row, fp32 y) with `unroll` chunks in flight per lane and
// row, `rows_per_warp` rows a warp and `warps` a CTA, for the combinations
// skinny_gemm.cu instantiates.
void launch_skinny_gemm_fp8_variant(const bf16* x, int32_t k, const uint8_t* w, const float* w_scale, int32_t n,
                                    float* y, int32_t unroll, int32_t rows_per_warp, int32_t warps, cudaStream_t stream);
void launch_read_probe(const void* data, int64_t bytes, uint32_t* sink, int32_t blocks, int32_t threads,
                       cudaStream_t stream);
#endif

// Fire-and-forget reads of up to three byte ranges into L2 (cp.async.bulk.prefetch:
// the CTAs leave at once, the memory system fills L2 behind the next kernels).
// Results never change; a later kernel reading the ranges may find them in L2.
// Ranges start 16-byte aligned; their lengths are rounded down to 16 bytes.
struct L2PrefetchRange {
  const void* begin = nullptr;
  int64_t bytes = 0;
};
struct L2PrefetchRanges {
  L2PrefetchRange range[3];
};
void launch_prefetch_l2(const L2PrefetchRanges& ranges, cudaStream_t stream);

// Synthetic weights (synthetic/synthetic_weights.h), value i of a tensor from
// SplitMix64 at state tensor_seed + (i + 1) * golden: value-for-value what
// SyntheticValueStream draws. bf16 output rounds to nearest even as make-model's
// bf16 files do; fp32 output optionally rounds through bf16 first.
// With a window, out holds a block of the tensor seen as rows of full_columns
// values: out[r * columns + c] = value (row_begin + r) * full_columns + column_begin + c,
// count = rows * columns (a tensor-parallel rank's rows or columns; columns 0: no window).
struct SyntheticWindow {
  int64_t columns = 0, full_columns = 0, row_begin = 0, column_begin = 0;
};
void launch_synthetic_fill_bf16(bf16* out, int64_t count, uint64_t tensor_seed, bool is_norm, float scale,
                                cudaStream_t stream, const SyntheticWindow& window = {});
void launch_synthetic_fill_f32(float* out, int64_t count, uint64_t tensor_seed, bool is_norm, float scale,
                               bool round_to_bf16, cudaStream_t stream, const SyntheticWindow& window = {});

// out[i] = bf16(in[i]) (weights uploaded in fp32 chunks are converted on the device).
void launch_f32_to_bf16(const float* in, int64_t count, bf16* out, cudaStream_t stream);
// out[i] = bf16(float(in[i])) for IEEE half bits in[i] (f16 checkpoints): the host's fp16 -> fp32 -> bf16.
void launch_f16_to_bf16(const uint16_t* in, int64_t count, bf16* out, cudaStream_t stream);

}  // namespace loom::cuda
