#include "backend/cpu/grouped_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "util/vector_math.h"

namespace loom::cpu {
namespace {

// GCC/Clang vector extensions: one AVX2 register where the build has AVX2
// (LOOM_ARCH_FLAGS), SSE pairs or scalars elsewhere, from one source.
typedef float Vec8 __attribute__((vector_size(32)));
typedef int32_t Int8 __attribute__((vector_size(32)));
typedef float UnalignedVec8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t UnalignedInt8 __attribute__((vector_size(32), aligned(4), may_alias));

constexpr int32_t kLanes = 8;          // rows per row vector
constexpr int32_t kKeysPerTile = 8;    // entries one score tile covers
constexpr int32_t kColumnsPerTile = 8; // head_dim columns one value tile covers
constexpr int32_t kEntriesPerChunk = 32;  // entries whose V rows one P V step reads

Vec8 load(const float* p) { return *reinterpret_cast<const UnalignedVec8*>(p); }
Int8 load(const int32_t* p) { return *reinterpret_cast<const UnalignedInt8*>(p); }
void store(float* p, Vec8 v) { *reinterpret_cast<UnalignedVec8*>(p) = v; }

Vec8 exp8(Vec8 x) {
#if defined(__AVX2__) && defined(__FMA__)
  return std::bit_cast<Vec8>(exp_avx2(std::bit_cast<__m256>(x)));
#else
  for (int lane = 0; lane < kLanes; ++lane) x[lane] = std::exp(x[lane]);
  return x;
#endif
}

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// The offsets of entries [0, count) in a pool (add kv_head * head_dim for a
// head), walking the block table (no division per entry: small blocks cost
// the same as large ones).
void entry_offsets(const int32_t* block_table, const AttentionShape& shape, int32_t count, int64_t* offsets) {
  for (int32_t start = 0, block = 0; start < count; start += shape.block_size, ++block) {
    const int64_t first = static_cast<int64_t>(block_table[block]) * shape.block_size * shape.slot_floats();
    const int32_t end = std::min(count, start + shape.block_size);
    for (int32_t j = start; j < end; ++j) offsets[j] = first + (j - start) * shape.slot_floats();
  }
}

// One pass: rows.size() <= kMaxGroupedRows; offsets[j] for every entry a row sees.
void attend_pass(std::span<const QueryRow> rows, const int64_t* offsets, const AttentionShape& shape, int kv_head,
                 const float* k_pool, const float* v_pool, float* scratch) {
  const int head_dim = shape.head_dim;
  const float* keys = k_pool + static_cast<int64_t>(kv_head) * head_dim;
  const float* values = v_pool + static_cast<int64_t>(kv_head) * head_dim;
  const int32_t num_rows = static_cast<int32_t>(rows.size());
  const int32_t num_vectors = (num_rows + kLanes - 1) / kLanes;
  const int32_t width = num_vectors * kLanes;  // row stride of the transposed arrays

  // Padding rows see nothing; a row vector is computed up to its largest num_visible.
  int32_t num_visible[kMaxGroupedRows];
  int32_t vector_visible[kMaxGroupedRows / kLanes];
  int32_t max_visible = 0;
  for (int32_t r = 0; r < width; ++r) num_visible[r] = r < num_rows ? rows[r].num_visible : 0;
  for (int32_t v = 0; v < num_vectors; ++v) {
    vector_visible[v] = *std::max_element(num_visible + v * kLanes, num_visible + (v + 1) * kLanes);
    max_visible = std::max(max_visible, vector_visible[v]);
  }

  float* queries_t = scratch;                                          // [head_dim][width]
  float* scores_t = scratch + int64_t{head_dim} * kMaxGroupedRows;    // [entries][width]
  for (int d = 0; d < head_dim; ++d)
    for (int32_t r = 0; r < width; ++r) queries_t[d * width + r] = r < num_rows ? rows[r].query[d] : 0.0f;

  // Scores, 8 entries x 8 rows at a time; entries past max_visible repeat the
  // last one (their scores are masked below).
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int32_t first = 0; first < max_visible; first += kKeysPerTile) {
    const float* key[kKeysPerTile];
    for (int32_t k = 0; k < kKeysPerTile; ++k)
      key[k] = keys + offsets[std::min(first + k, max_visible - 1)];
    for (int32_t v = 0; v < num_vectors; ++v) {
      if (vector_visible[v] <= first) continue;
      Vec8 sum[kKeysPerTile] = {};
      const float* query = queries_t + v * kLanes;
      for (int d = 0; d < head_dim; ++d) {
        const Vec8 q = load(query + d * width);
#pragma GCC unroll 8
        for (int32_t k = 0; k < kKeysPerTile; ++k) sum[k] += q * key[k][d];
      }
#pragma GCC unroll 8
      for (int32_t k = 0; k < kKeysPerTile; ++k) store(scores_t + (first + k) * width + v * kLanes, sum[k] * scale);
    }
  }

  // Softmax per row, vectorised across rows: S <- exp(S - max), 0 where j >= num_visible.
  alignas(32) float inverse_sum[kMaxGroupedRows];
  for (int32_t v = 0; v < num_vectors; ++v) {
    const Int8 visible = load(num_visible + v * kLanes);
    float* column = scores_t + v * kLanes;
    Vec8 max_score = Vec8{} - std::numeric_limits<float>::infinity();
    for (int32_t j = 0; j < vector_visible[v]; ++j) {
      const Vec8 score = load(column + j * width);
      max_score = (Int8{} + j < visible) & (score > max_score) ? score : max_score;
    }
    max_score = max_score == -std::numeric_limits<float>::infinity() ? Vec8{} : max_score;  // padding rows
    Vec8 sum = {};
    for (int32_t j = 0; j < vector_visible[v]; ++j) {
      const Vec8 weight = Int8{} + j < visible ? exp8(load(column + j * width) - max_score) : Vec8{};
      store(column + j * width, weight);
      sum += weight;
    }
    store(inverse_sum + v * kLanes, 1.0f / sum);
  }

  // out = P V / sum, 8 rows x 8 columns at a time, kEntriesPerChunk entries at
  // a time (their V rows stay in L1 across row vectors and columns); the sums
  // wait in outs_t [head_dim][width], where the queries were.
  float* outs_t = queries_t;
  std::fill(outs_t, outs_t + int64_t{head_dim} * width, 0.0f);
  const int head_dim_tiled = head_dim / kColumnsPerTile * kColumnsPerTile;
  const float* value[kEntriesPerChunk];
  for (int32_t first = 0; first < max_visible; first += kEntriesPerChunk) {
    const int32_t count = std::min(kEntriesPerChunk, max_visible - first);
    for (int32_t j = 0; j < count; ++j) value[j] = values + offsets[first + j];
    for (int32_t v = 0; v < num_vectors; ++v) {
      const int32_t num_entries = std::min(count, vector_visible[v] - first);
      const float* weights = scores_t + int64_t{first} * width + v * kLanes;
      for (int column = 0; column < head_dim_tiled; column += kColumnsPerTile) {
        float* out = outs_t + int64_t{column} * width + v * kLanes;
        Vec8 sum[kColumnsPerTile];
#pragma GCC unroll 8
        for (int32_t c = 0; c < kColumnsPerTile; ++c) sum[c] = load(out + c * width);
        for (int32_t j = 0; j < num_entries; ++j) {
          const Vec8 weight = load(weights + j * width);
#pragma GCC unroll 8
          for (int32_t c = 0; c < kColumnsPerTile; ++c) sum[c] += weight * value[j][column + c];
        }
#pragma GCC unroll 8
        for (int32_t c = 0; c < kColumnsPerTile; ++c) store(out + c * width, sum[c]);
      }
      // Columns past the last whole tile (head_dim not a multiple of 8), one at a time.
      for (int column = head_dim_tiled; column < head_dim; ++column)
        for (int32_t j = 0; j < num_entries; ++j)
          for (int32_t lane = 0; lane < kLanes; ++lane)
            outs_t[column * width + v * kLanes + lane] += weights[j * width + lane] * value[j][column];
    }
  }
  for (int32_t r = 0; r < num_rows; ++r)
    for (int d = 0; d < head_dim; ++d) rows[r].out[d] = outs_t[d * width + r] * inverse_sum[r];
}

}  // namespace

int64_t grouped_attention_scratch_floats(const AttentionShape& shape, int32_t max_context_length) {
  return (int64_t{shape.head_dim} + round_up(std::max(max_context_length, 1), kKeysPerTile)) * kMaxGroupedRows;
}

void attend_grouped_rows(std::span<const QueryRow> rows, const int32_t* block_table, const AttentionShape& shape,
                         int kv_head, const float* k_pool, const float* v_pool, float* scratch) {
  int32_t max_visible = 0;
  for (const QueryRow& row : rows) max_visible = std::max(max_visible, row.num_visible);
  // Per thread, grown on demand (paged_attention's threads persist).
  thread_local std::vector<int64_t> offsets;
  if (offsets.size() < static_cast<size_t>(max_visible)) offsets.resize(static_cast<size_t>(max_visible));
  entry_offsets(block_table, shape, max_visible, offsets.data());
  for (size_t first = 0; first < rows.size(); first += kMaxGroupedRows)
    attend_pass(rows.subspan(first, std::min<size_t>(kMaxGroupedRows, rows.size() - first)), offsets.data(), shape,
                kv_head, k_pool, v_pool, scratch);
}

}  // namespace loom::cpu
