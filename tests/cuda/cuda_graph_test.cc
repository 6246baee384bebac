// CUDA graphs of decode steps (cuda_backend_impl.h): the padded step plan's
// launch shape and section layout (StepPlan::pad_for_graph), and graph-replayed
// decode steps of every sharing mode against eager ones.
#include <algorithm>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/step_plan.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom::cuda {
namespace {

using test::argmax;
using test::Driver;
using Mode = test::SharingMode;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 256;

TEST(CudaGraphPlan, CapacitiesGrowByPowersOfTwoAndHalves) {  // no GPU needed
  const std::vector<std::pair<int32_t, int32_t>> expected = {{0, 0},   {1, 1},   {2, 2},   {3, 4},   {4, 4},
                                                             {5, 6},   {6, 6},   {7, 8},   {9, 12},  {13, 16},
                                                             {17, 24}, {25, 32}, {33, 48}, {200, 256}, {257, 384}};
  for (const auto& [n, capacity] : expected) EXPECT_EQ(graph_capacity(n), capacity) << n;
}

// Decode batches of `lengths` contexts (one new token each), sequence i with
// adapter slot i % 3 on even sequences.
Batch decode_batch(const std::vector<int32_t>& lengths) {
  Batch batch;
  int32_t next_block = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    BatchSequence sequence;
    sequence.token_offset = static_cast<int32_t>(batch.token_ids.size());
    sequence.num_computed_tokens = lengths[s] - 1;
    sequence.num_new_tokens = 1;
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    for (int32_t b = 0; b < (lengths[s] + kBlockSize - 1) / kBlockSize; ++b) batch.block_tables.push_back(next_block++);
    batch.sequences.push_back(sequence);
    batch.token_ids.push_back(static_cast<int32_t>(s) + 1);
    batch.positions.push_back(lengths[s] - 1);
    batch.adapter_slots.push_back(s % 2 == 0 ? static_cast<int32_t>(s % 3) : -1);
  }
  return batch;
}

TEST(CudaGraphPlan, PaddedPlansOfOneShapeShareEveryOffset) {  // no GPU needed
  const PlanShape shape{kBlockSize, 8, 2, 132, 3};
  StepPlan five, six;
  five.build(decode_batch({40, 300, 17, 90, 1000}), shape);
  six.build(decode_batch({41, 301, 18, 91, 1001, 64}), shape);
  ASSERT_EQ(five.num_rows(), 5);
  const std::vector<int32_t> logit_rows_before = five.logit_rows();
  ASSERT_TRUE(five.pad_for_graph(256));
  ASSERT_TRUE(six.pad_for_graph(256));
  EXPECT_TRUE(five.is_padded());
  EXPECT_FALSE(five.pad_for_graph(256)) << "padding twice";
  const LaunchCounts a = five.launch_counts(), b = six.launch_counts();
  EXPECT_EQ(a.rows, 6);
  EXPECT_EQ(a.logit_rows, 6);
  EXPECT_EQ(a.lora_rows, 6);
  EXPECT_EQ(a.sequences, 6);
  EXPECT_EQ(graph_capacity(a.decode_items), a.decode_items);
  EXPECT_EQ(five.logit_rows(), logit_rows_before) << "the batch's own logits rows stay";
  // Padding logits rows: distinct, none a row that gives logits (the final norm writes its rows in place).
  const int32_t* launch_rows = five.words().data() + five.sections().logit_rows;
  std::vector<int32_t> sorted(launch_rows, launch_rows + a.logit_rows);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_EQ(std::vector<int32_t>(launch_rows, launch_rows + 5), logit_rows_before);
  ASSERT_EQ(a, b) << "6 rows either way, and as many work items after rounding";
  // The same capacities: the same layout, though the block tables differ in length.
  EXPECT_EQ(five.sections().block_tables, six.sections().block_tables);
  EXPECT_EQ(five.sections().row_adapter_slots, six.sections().row_adapter_slots);
  EXPECT_NE(five.words().size(), six.words().size());
  // Padding entries: no K/V write, no adapter, no-op work items and tiles.
  const int32_t* words = five.words().data();
  EXPECT_EQ(words[five.sections().kv_slots + 5], -1);
  EXPECT_EQ(words[five.sections().lora_row_of_token + 5], -1);
  const auto* items = reinterpret_cast<const AttentionWorkItem*>(words + five.sections().decode_items);
  int32_t padding_items = 0;
  for (int32_t i = 0; i < a.decode_items; ++i) padding_items += items[i].sequence < 0;
  EXPECT_EQ(a.decode_items - padding_items, static_cast<int32_t>(std::count_if(
      five.decode_items().begin(), five.decode_items().end(), [](const AttentionWorkItem& item) {
        return item.sequence >= 0;
      })));
  const auto* tiles = reinterpret_cast<const LoraTile*>(words + five.sections().lora_tiles);
  int32_t lora_rows = 0;
  for (int32_t t = 0; t < a.lora_tiles; ++t) lora_rows += tiles[t].num_rows;
  EXPECT_EQ(lora_rows, 3) << "sequences 0, 2, 4 carry an adapter (slot 0 of sequence 0 included)";
}

// Issue 35: with adapters and varied contexts nearly every decode step had a
// launch shape of its own (a soak captured a new graph per step and evicted
// one). The floors of pad_for_graph make steps of one row capacity agree.
TEST(CudaGraphPlan, DecodeStepsOfOneRowCapacityShareOneLaunchShape) {  // no GPU needed
  const PlanShape shape{kBlockSize, 8, 2, 132, 3};
  const std::vector<std::vector<int32_t>> contexts = {
      {400, 300, 1700, 900, 1000}, {2000, 320, 330, 340, 350}, {700, 700, 700, 700, 700, 700}, {5000, 300, 310, 320, 330}};
  std::vector<LaunchCounts> counts;
  for (size_t i = 0; i < contexts.size(); ++i) {
    Batch batch = decode_batch(contexts[i]);
    for (size_t s = 0; s < batch.adapter_slots.size(); ++s)  // a different adapter pattern each time
      batch.adapter_slots[s] = (s + i) % 3 == 0 ? -1 : static_cast<int32_t>((s * (i + 1)) % 4);
    StepPlan plan;
    plan.build(batch, shape);
    ASSERT_TRUE(plan.pad_for_graph(256));
    counts.push_back(plan.launch_counts());
    EXPECT_EQ(counts.back().rows, 6);
    EXPECT_EQ(counts.back().logit_rows, 6);
  }
  for (size_t i = 1; i < counts.size(); ++i) EXPECT_EQ(counts[i], counts[0]) << "batch " << i;
  const GraphListFloors floors = graph_list_floors(6, shape);
  EXPECT_EQ(floors.decode_items, (132 * 3 + 1) / 2) << "one wave of split-KV items";
  EXPECT_GE(counts[0].decode_items, floors.decode_items);
  EXPECT_EQ(graph_list_floors(256, shape).decode_items, 256) << "rows alone fill the GPU: no split floor";
  // Base-model steps keep their own counts (the batch-1 step launches no no-op items).
  Batch base = decode_batch({2000});
  base.adapter_slots.assign(1, -1);
  StepPlan plan;
  plan.build(base, shape);
  const int32_t own_items = plan.num_decode_items();
  ASSERT_TRUE(plan.pad_for_graph(256));
  EXPECT_EQ(plan.launch_counts().decode_items, graph_capacity(own_items));
  EXPECT_LT(plan.launch_counts().decode_items, floors.decode_items);
}

TEST(CudaGraphPlan, PaddingLogitsRowsAvoidEveryRowThatGivesLogits) {  // no GPU needed
  // Base sharing: 3 token rows, then 3 decoder rows that give the logits; 6
  // rows need no padding, the 3 logits rows are padded to the 6 rows with the token rows.
  Batch batch = decode_batch({20, 30, 40});
  for (BatchSequence& sequence : batch.sequences) sequence.decoder_adapter_slot = 1;
  StepPlan plan;
  plan.build(batch, PlanShape{kBlockSize, 8, 2, 132, 3});
  ASSERT_EQ(plan.num_rows(), 6);
  ASSERT_EQ(plan.logit_rows(), (std::vector<int32_t>{3, 4, 5}));
  ASSERT_TRUE(plan.pad_for_graph(256));
  ASSERT_EQ(plan.num_logit_launch_rows(), 6);
  const int32_t* rows = plan.words().data() + plan.sections().logit_rows;
  EXPECT_EQ(std::vector<int32_t>(rows, rows + 6), (std::vector<int32_t>{3, 4, 5, 0, 1, 2}));
}

TEST(CudaGraphPlan, PrefillStepsAndLargeBatchesStayEager) {  // no GPU needed
  const PlanShape shape{kBlockSize, 8, 2, 132, 3};
  Batch prefill = decode_batch({40});
  prefill.sequences[0].num_computed_tokens = 0;
  prefill.sequences[0].num_new_tokens = 40;
  prefill.token_ids.assign(40, 3);
  prefill.positions.resize(40);
  for (int32_t i = 0; i < 40; ++i) prefill.positions[i] = i;
  prefill.adapter_slots.assign(40, -1);
  StepPlan plan;
  plan.build(prefill, shape);
  EXPECT_FALSE(plan.pad_for_graph(256));
  EXPECT_FALSE(plan.is_padded());
  plan.build(decode_batch(std::vector<int32_t>(9, 20)), shape);
  EXPECT_FALSE(plan.pad_for_graph(8)) << "more rows than max_graph_rows";
  EXPECT_TRUE(plan.pad_for_graph(9));
}

// Every mode (plain, activated, base, forked, the base model) decoding in one
// batch, a sequence leaving half way (a new shape): with graphs the same greedy
// tokens as eager steps (the eager run's tokens fed to both), logits within
// GEMM-shape rounding; graphs captured once per shape and replayed after.
TEST(CudaGraph, ReplayedDecodeStepsEqualEagerOnesInEveryMode) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  const std::vector<std::shared_ptr<const LoraAdapter>> adapters = test::synthetic_adapters(config, 3, 5);
  auto new_backend = [&](bool graphs) {
    CudaBackendConfig backend_config;
    backend_config.tuning.cuda_graphs = graphs;
    auto backend = make_synthetic_cuda_backend_impl(config, 5, false, backend_config);
    backend->allocate_kv_cache({kNumBlocks, kBlockSize});
    backend->allocate_residual_cache({kNumBlocks, kBlockSize, 8});
    for (int a = 0; a < 3; ++a) backend->set_adapter(a, adapters[a]);
    return backend;
  };
  struct Setup { Mode mode; int32_t slot; int32_t token_slot; int32_t prompt; };
  const Setup setups[] = {{Mode::kPlain, -1, -1, 12}, {Mode::kPlain, -1, 0, 30}, {Mode::kPlain, -1, 1, 25},
                          {Mode::kBase, 2, -1, 40}, {Mode::kForked, 0, -1, 33}};
  constexpr int kSequences = 5, kSteps = 12, kLeaveAt = 6;
  const int vocab = config.vocab_size;

  auto backend_eager = new_backend(false);
  auto backend_graph = new_backend(true);
  Driver driver_eager(kNumBlocks, kBlockSize, 21, true), driver_graph(kNumBlocks, kBlockSize, 21, true);
  std::vector<int> ids;
  for (const Setup& setup : setups) {
    ids.push_back(driver_eager.add_sequence(setup.mode, setup.slot));
    ASSERT_EQ(driver_graph.add_sequence(setup.mode, setup.slot), ids.back());
  }
  Driver prompt_source(kNumBlocks, kBlockSize, 4);
  auto part = [&](int i, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> slots(tokens.size(), setups[i].token_slot);
    if (i == 2 && tokens.size() > 1) std::fill_n(slots.begin(), 6, -1);  // activated from token 6 on
    return Driver::Part{ids[i], tokens, slots, false};
  };
  std::vector<Driver::Part> prefill;
  for (int i = 0; i < kSequences; ++i) prefill.push_back(part(i, prompt_source.random_tokens(setups[i].prompt, vocab)));
  ForwardResult eager = backend_eager->forward(driver_eager.make_batch(prefill));
  ForwardResult graph = backend_graph->forward(driver_graph.make_batch(prefill));
  int near_ties = 0;
  for (int step = 0; step < kSteps; ++step) {
    const int alive = step < kLeaveAt ? kSequences : kSequences - 1;  // the forked sequence leaves
    ASSERT_EQ(graph.logits.size(), eager.logits.size());
    std::vector<Driver::Part> decode;
    for (int i = 0; i < alive; ++i) {
      const float* eager_row = eager.logits.data() + static_cast<size_t>(i) * vocab;
      const float* graph_row = graph.logits.data() + static_cast<size_t>(i) * vocab;
      const test::Closeness c = test::compare(std::vector<float>(graph_row, graph_row + vocab),
                                              std::vector<float>(eager_row, eager_row + vocab));
      EXPECT_LE(c.nmse, 1e-5) << "sequence " << i << " step " << step << ": " << c.describe();
      const int expected = argmax(eager_row, vocab);
      const int got = argmax(graph_row, vocab);
      if (got != expected) {
        ++near_ties;
        EXPECT_LT(eager_row[expected] - eager_row[got], 1e-2f) << "sequence " << i << " step " << step;
      }
      decode.push_back(part(i, {expected}));
    }
    if (step + 1 == kLeaveAt) decode.pop_back();
    eager = backend_eager->forward(driver_eager.make_batch(decode));
    graph = backend_graph->forward(driver_graph.make_batch(decode));
  }
  EXPECT_LE(near_ties, 1);
  const GraphCache::Stats stats = backend_graph->graph_stats();
  EXPECT_EQ(stats.eager_steps, 1) << "the prefill";
  EXPECT_GE(stats.captures, 2) << "one per batch shape";
  EXPECT_LE(stats.captures, 4);
  EXPECT_EQ(stats.captures + stats.replays, kSteps);
  EXPECT_EQ(backend_eager->graph_stats().captures, 0);
  EXPECT_EQ(backend_eager->graph_stats().eager_steps, kSteps + 1);
}

// Device sampling inside replayed graphs: greedy on the device picks what an
// eager backend's host logits pick; the rows left to the host come back as
// logits, packed, and padding rows never reach the result.
TEST(CudaGraph, DeviceSamplingInReplayedSteps) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  const int vocab = config.vocab_size;
  auto make = [&](bool graphs) {
    CudaBackendConfig backend_config;
    backend_config.tuning.cuda_graphs = graphs;
    auto backend = make_synthetic_cuda_backend(config, 6, false, backend_config);
    backend->allocate_kv_cache({kNumBlocks, kBlockSize});
    return backend;
  };
  auto graph_backend = make(true), eager_backend = make(false);
  Driver graph_driver(kNumBlocks, kBlockSize, 8), eager_driver(kNumBlocks, kBlockSize, 8);
  Driver prompt_source(kNumBlocks, kBlockSize, 9);
  constexpr int kSequences = 3;
  std::vector<Driver::Part> parts;
  for (int i = 0; i < kSequences; ++i) {
    const int id = graph_driver.add_sequence();
    ASSERT_EQ(eager_driver.add_sequence(), id);
    std::vector<int32_t> prompt = prompt_source.random_tokens(10 + 7 * i, vocab);
    parts.push_back({id, prompt, std::vector<int32_t>(prompt.size(), -1), false});
  }
  graph_backend->forward(graph_driver.make_batch(parts));
  ForwardResult eager = eager_backend->forward(eager_driver.make_batch(parts));
  int near_ties = 0;
  for (int step = 0; step < 6; ++step) {
    std::vector<Driver::Part> decode;
    for (int i = 0; i < kSequences; ++i)
      decode.push_back({i, {argmax(eager.logits.data() + static_cast<size_t>(i) * vocab, vocab)}, {-1}, false});
    Batch graph_batch = graph_driver.make_batch(decode);
    graph_batch.sampling.assign(kSequences, DeviceSampling{});
    graph_batch.sampling[0].on_device = graph_batch.sampling[2].on_device = true;  // greedy; row 1 to the host
    const ForwardResult graph = graph_backend->forward(graph_batch);
    eager = eager_backend->forward(eager_driver.make_batch(decode));
    ASSERT_EQ(graph.sampled_token_ids.size(), static_cast<size_t>(kSequences));
    ASSERT_EQ(graph.logits.size(), static_cast<size_t>(vocab)) << "only row 1's logits travel";
    EXPECT_EQ(graph.sampled_token_ids[1], -1);
    EXPECT_EQ(argmax(graph.logits.data(), vocab), argmax(eager.logits.data() + vocab, vocab));
    for (int i : {0, 2}) {
      const float* row = eager.logits.data() + static_cast<size_t>(i) * vocab;
      const int expected = argmax(row, vocab), got = graph.sampled_token_ids[i];
      ASSERT_GE(got, 0);
      if (got != expected) {
        ++near_ties;
        EXPECT_LT(row[expected] - row[got], 1e-2f) << "sequence " << i << " step " << step;
      }
    }
  }
  EXPECT_LE(near_ties, 1);
  EXPECT_GE(static_cast<CudaBackend*>(graph_backend.get())->graph_stats().replays, 4);
}

}  // namespace
}  // namespace loom::cuda
