// paged_attention (backend/cpu/paged_attention.h) against a plain double-precision
// softmax(q K^T / sqrt(d)) V over each row's entries, read through the block
// table: decode tokens, short tails over a long cached prefix (the warm-prefix
// path), prefill chunks, several query heads per kv head, more rows than one
// grouped pass takes, head_dim not a multiple of 8, decoder rows (base sharing),
// scattered block tables, one and two threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/grouped_attention.h"
#include "backend/cpu/paged_attention.h"

// SequenceSpec is filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom::cpu {
namespace {

struct SequenceSpec {
  int32_t num_computed = 0;
  int32_t num_new = 0;
  bool with_decoder_rows = false;  // base sharing: a decoder row for the last token
};

struct Case {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  std::vector<SequenceSpec> sequences;
};

std::vector<float> random_floats(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  return values;
}

// Runs paged_attention on random pools and queries, and checks every row.
void check_against_reference(const Case& test_case, int num_threads, uint32_t seed) {
  std::mt19937 rng(seed);
  const AttentionShape shape{test_case.num_heads, test_case.num_kv_heads, test_case.head_dim, test_case.block_size};
  Batch batch;
  int32_t num_blocks_total = 0;
  for (const SequenceSpec& spec : test_case.sequences)
    num_blocks_total += (spec.num_computed + spec.num_new + test_case.block_size - 1) / test_case.block_size;
  // Scattered block ids (a permutation of the pool, plus unused blocks).
  const int32_t num_pool_blocks = num_blocks_total + 3;
  std::vector<int32_t> block_ids(num_pool_blocks);
  for (int32_t i = 0; i < num_pool_blocks; ++i) block_ids[i] = i;
  std::shuffle(block_ids.begin(), block_ids.end(), rng);
  for (const SequenceSpec& spec : test_case.sequences) {
    BatchSequence sequence;
    sequence.num_computed_tokens = spec.num_computed;
    sequence.num_new_tokens = spec.num_new;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = (spec.num_computed + spec.num_new + test_case.block_size - 1) / test_case.block_size;
    sequence.decoder_adapter_slot = spec.with_decoder_rows ? 0 : -1;
    for (int32_t b = 0; b < sequence.num_blocks; ++b)
      batch.block_tables.push_back(block_ids[batch.block_tables.size()]);
    for (int32_t i = 0; i < spec.num_new; ++i) {
      batch.token_ids.push_back(1);
      batch.positions.push_back(spec.num_computed + i);
      batch.adapter_slots.push_back(-1);
    }
    batch.sequences.push_back(sequence);
  }
  TokenPlacement placement;
  place_tokens(batch, test_case.block_size, placement);
  const int64_t num_rows = batch.num_tokens() + placement.num_decoder_rows();
  const int64_t q_size = int64_t{shape.num_heads} * shape.head_dim;
  const int64_t pool_floats = int64_t{num_pool_blocks} * shape.block_size * shape.slot_floats();
  const std::vector<float> k_pool = random_floats(pool_floats, rng), v_pool = random_floats(pool_floats, rng);
  const std::vector<float> q = random_floats(num_rows * q_size, rng);
  std::vector<float> out(num_rows * q_size, std::nanf("")), scratch;
  paged_attention(q.data(), batch, placement, shape, k_pool.data(), v_pool.data(), num_threads, scratch, out.data());

  const int heads_per_kv_head = shape.num_heads / shape.num_kv_heads;
  double worst = 0.0;
  for (int64_t row = 0; row < num_rows; ++row) {
    const int64_t token = row < batch.num_tokens() ? row : placement.token_of_decoder_row[row - batch.num_tokens()];
    const BatchSequence& sequence = batch.sequences[placement.sequence_of_token[token]];
    const int32_t num_visible = sequence.num_computed_tokens + static_cast<int32_t>(token - sequence.token_offset) + 1;
    const int32_t* block_table = batch.block_tables.data() + sequence.block_table_offset;
    for (int head = 0; head < shape.num_heads; ++head) {
      const int64_t kv_offset = int64_t{head / heads_per_kv_head} * shape.head_dim;
      const float* query = q.data() + row * q_size + int64_t{head} * shape.head_dim;
      std::vector<double> scores(num_visible);
      double max_score = -INFINITY;
      for (int32_t j = 0; j < num_visible; ++j) {
        const int64_t slot = int64_t{block_table[j / shape.block_size]} * shape.block_size + j % shape.block_size;
        const float* key = k_pool.data() + slot * shape.slot_floats() + kv_offset;
        double dot = 0.0;
        for (int d = 0; d < shape.head_dim; ++d) dot += double{query[d]} * key[d];
        scores[j] = dot / std::sqrt(static_cast<double>(shape.head_dim));
        max_score = std::max(max_score, scores[j]);
      }
      double sum = 0.0;
      for (double& score : scores) sum += (score = std::exp(score - max_score));
      for (int d = 0; d < shape.head_dim; ++d) {
        double expected = 0.0;
        for (int32_t j = 0; j < num_visible; ++j) {
          const int64_t slot = int64_t{block_table[j / shape.block_size]} * shape.block_size + j % shape.block_size;
          expected += scores[j] / sum * v_pool[slot * shape.slot_floats() + kv_offset + d];
        }
        const float actual = out[row * q_size + int64_t{head} * shape.head_dim + d];
        ASSERT_FALSE(std::isnan(actual)) << "row " << row << " head " << head << " dim " << d << " not written";
        worst = std::max(worst, std::abs(actual - expected));
      }
    }
  }
  EXPECT_LT(worst, 2e-5);
}

TEST(CpuPagedAttention, ShortTailOverALongCachedPrefixMatchesReference) {
  // SmolLM2's shape: 9 query heads over 3 kv heads, head_dim 64.
  for (int num_threads : {1, 2})
    for (int32_t num_new : {2, 7, 14, 16})
      check_against_reference({9, 3, 64, 16, {{.num_computed = 2048, .num_new = num_new}}}, num_threads, 11 + num_new);
}

TEST(CpuPagedAttention, PrefillChunksAndDecodeTokensInOneBatchMatchReference) {
  // Sequences of 1 (decode), 3 and 150 new tokens (several chunks of queries),
  // with and without cached entries, small blocks.
  const Case test_case{4, 2, 16, 4,
                       {{.num_computed = 0, .num_new = 150},
                        {.num_computed = 37, .num_new = 3},
                        {.num_computed = 9, .num_new = 1},
                        {.num_computed = 5, .num_new = 20}}};
  for (int num_threads : {1, 2}) check_against_reference(test_case, num_threads, 21);
}

TEST(CpuPagedAttention, ManyQueryHeadsPerKvHeadTakeSeveralGroupedPasses) {
  // 8 query heads on one kv head x 40 queries = 320 rows > kMaxGroupedRows.
  static_assert(kMaxGroupedRows < 320);
  check_against_reference({8, 1, 32, 16, {{.num_computed = 100, .num_new = 40}}}, 2, 31);
}

TEST(CpuPagedAttention, HeadDimNotAMultipleOfEightMatchesReference) {
  check_against_reference({6, 2, 12, 8, {{.num_computed = 33, .num_new = 11}, {.num_computed = 0, .num_new = 5}}}, 2,
                          41);
}

TEST(CpuPagedAttention, DecoderRowsAttendLikeTheirTokens) {
  // Base sharing: the last token of each sequence has a decoder row of its own.
  const Case test_case{
      9, 3, 64, 16,
      {{.num_computed = 300, .num_new = 14, .with_decoder_rows = true}, {.num_computed = 40, .num_new = 1, .with_decoder_rows = true}}};
  for (int num_threads : {1, 2}) check_against_reference(test_case, num_threads, 51);
}

}  // namespace
}  // namespace loom::cpu
