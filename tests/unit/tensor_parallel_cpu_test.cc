// Tensor parallelism on the CPU (backend/cpu/tensor_parallel_cpu_backend.h):
// TP=2 and TP=4 give the TP=1 logits to fp32 rounding for every architecture,
// every sharing mode mixed in one batch, adapters of different ranks loaded and
// unloaded at run time, and KV moved through the host tier; the shard layout's
// rules; the in-process group's sum and its abort.
#include <gtest/gtest.h>

#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/in_process_group.h"
#include "formats/gguf_dequant.h"
#include "lora/adapter_shard.h"
#include "model/tensor_parallel.h"
#include "reference_model.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

// SequenceInput is filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {
namespace {

using test::make_batch;
using test::SequenceInput;

//                                                q  k  v  o  gate up down
constexpr std::array<int, kNumLoraTargets> kRanksA = {8, 4, 2, 6, 3, 5, 7};
constexpr std::array<int, kNumLoraTargets> kRanksB = {4, 8, 8, 0, 2, 0, 16};

struct Model {
  ModelConfig config;
  std::shared_ptr<ModelWeights> weights;
};

// tiny_config: 4 heads, 2 kv heads (split at TP=2, replicated at TP=4), vocab 97 (uneven slices).
Model make_model(Architecture arch, bool o_bias = false) {
  ModelConfig config = test::tiny_config(arch);
  config.o_bias = o_bias;
  return {config, test::random_weights(config, 91)};
}

std::unique_ptr<Backend> new_backend(const Model& model, int tensor_parallel_size) {
  auto backend = make_cpu_backend(model.config, model.weights,
                                  {.num_threads = 2, .max_adapter_slots = 4, .tensor_parallel_size = tensor_parallel_size});
  backend->allocate_kv_cache({48, 4});
  backend->allocate_residual_cache({48, 4, 16});
  return backend;
}

double max_relative_diff(const ForwardResult& got, const ForwardResult& want) {
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.logit_token_index, want.logit_token_index);
  EXPECT_EQ(got.logits.size(), want.logits.size());
  double scale = 1e-6, worst = 0.0;
  for (float value : want.logits) scale = std::max(scale, static_cast<double>(std::abs(value)));
  for (size_t i = 0; i < std::min(got.logits.size(), want.logits.size()); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(got.logits[i] - want.logits[i])));
  return worst / scale;
}

// Runs `steps` on TP=1 and on each size; every step's logits must agree.
void expect_sizes_agree(const Model& model, const std::vector<std::shared_ptr<LoraAdapter>>& adapters,
                        const std::vector<std::vector<SequenceInput>>& steps, const std::string& what) {
  std::vector<ForwardResult> reference;
  auto whole = new_backend(model, 1);
  for (size_t slot = 0; slot < adapters.size(); ++slot) whole->set_adapter(static_cast<int32_t>(slot), adapters[slot]);
  for (const auto& step : steps) reference.push_back(whole->forward(make_batch(step)));
  for (int size : {2, 4}) {
    auto sharded = new_backend(model, size);
    EXPECT_EQ(sharded->capabilities().tensor_parallel_size, size);
    for (size_t slot = 0; slot < adapters.size(); ++slot)
      sharded->set_adapter(static_cast<int32_t>(slot), adapters[slot]);
    for (size_t s = 0; s < steps.size(); ++s)
      EXPECT_LT(max_relative_diff(sharded->forward(make_batch(steps[s])), reference[s]), 1e-5)
          << what << " TP=" << size << " step " << s;
  }
}

std::vector<int32_t> tokens(const Model& model, uint64_t seed, int count) {
  return test::random_tokens(seed, count, model.config.vocab_size);
}

TEST(TensorParallelCpu, EveryArchitectureGivesTheWholeModelsLogits) {
  struct Case {
    Architecture arch;
    bool o_bias;
  };
  for (const Case& c : {Case{Architecture::kLlama, false}, Case{Architecture::kLlama, true},
                        Case{Architecture::kQwen2, false}, Case{Architecture::kQwen3, false},
                        Case{Architecture::kMistral, false}}) {
    const Model model = make_model(c.arch, c.o_bias);
    const std::vector<std::shared_ptr<LoraAdapter>> adapters = {test::random_adapter(model.config, 92, kRanksA, 16.0f),
                                                                test::random_adapter(model.config, 93, kRanksB, 8.0f, true)};
    // Prefill (logits for every token) of three sequences, base and two adapters, then two decode steps.
    std::vector<SequenceInput> step = {
        {.tokens = tokens(model, 1, 11), .block_ids = {0, 1, 2}, .logits_for_all_tokens = true},
        {.tokens = tokens(model, 2, 6), .adapter_slot = 0, .block_ids = {3, 4}},
        {.tokens = tokens(model, 3, 9), .adapter_slot = 1, .block_ids = {5, 6, 7}}};
    std::vector<std::vector<SequenceInput>> steps = {step};
    for (int d = 0; d < 2; ++d) {
      for (size_t i = 0; i < step.size(); ++i) {
        step[i].num_computed_tokens += static_cast<int32_t>(step[i].tokens.size());
        step[i].tokens = {static_cast<int32_t>(5 + 7 * i + d)};
        step[i].logits_for_all_tokens = false;
        step[i].block_ids.push_back(10 + static_cast<int32_t>(3 * i + d));
      }
      steps.push_back(step);
    }
    expect_sizes_agree(model, adapters, steps,
                       std::string(architecture_short_name(c.arch)) + (c.o_bias ? " with o bias" : ""));
  }
}

TEST(TensorParallelCpu, OneBatchMixingEveryModeGivesTheWholeModelsLogits) {
  const Model model = make_model(Architecture::kQwen2);
  const std::vector<std::shared_ptr<LoraAdapter>> adapters = {
      test::random_adapter(model.config, 64, kRanksA, 16.0f),         // 0: isolated
      test::random_adapter(model.config, 65, kRanksB, 8.0f),          // 1: activated
      test::random_adapter(model.config, 66, kRanksA, 16.0f, true),   // 2: base
      test::random_adapter(model.config, 67, kRanksB, 16.0f)};        // 3: forked
  std::vector<int32_t> activated_slots(10, 1);
  std::fill_n(activated_slots.begin(), 4, -1);  // invocation start at token 4
  const std::vector<SequenceInput> prefill = {
      {.tokens = tokens(model, 1, 9), .block_ids = {0, 1, 2}},
      {.tokens = tokens(model, 2, 6), .adapter_slot = 0, .block_ids = {3, 4}},
      {.tokens = tokens(model, 3, 10), .adapter_slots = activated_slots, .block_ids = {5, 6, 7}},
      {.tokens = tokens(model, 4, 7), .block_ids = {8, 9}, .logits_for_all_tokens = true, .decoder_adapter_slot = 2},
      {.tokens = tokens(model, 5, 17), .adapter_slot = 3, .block_ids = {10, 11, 12, 13, 14}, .forked_adapter_slot = 3,
       .residual_block_ids = {4, 0, 3, 1, 2}},
  };
  std::vector<SequenceInput> decode = prefill;
  for (size_t i = 0; i < decode.size(); ++i) {
    SequenceInput& sequence = decode[i];
    sequence.num_computed_tokens = static_cast<int32_t>(sequence.tokens.size());
    sequence.tokens = {static_cast<int32_t>(11 + i)};
    sequence.logits_for_all_tokens = false;
    if (!sequence.adapter_slots.empty()) sequence.adapter_slots = {1};
    if (sequence.num_computed_tokens % 4 == 0) sequence.block_ids.push_back(20 + static_cast<int32_t>(i));
    if (sequence.forked_adapter_slot >= 0 && sequence.num_computed_tokens % 4 == 0)
      sequence.residual_block_ids.push_back(20 + static_cast<int32_t>(i));
  }
  expect_sizes_agree(model, adapters, {prefill, decode}, "mixed modes");
}

// Unload an adapter and load another into its slot between steps; copy KV to
// the host tier, wipe the device pools, load it back and decode on.
TEST(TensorParallelCpu, AdaptersSwapAndKvRoundTripsThroughTheHostTier) {
  const Model model = make_model(Architecture::kLlama);
  auto first = test::random_adapter(model.config, 70, kRanksA, 16.0f);
  auto second = test::random_adapter(model.config, 71, kRanksB, 8.0f);
  const auto prompt = tokens(model, 72, 13);
  const std::vector<int32_t> blocks = {7, 2, 9, 4};

  auto run = [&](Backend& backend) {
    std::vector<ForwardResult> results;
    backend.set_adapter(0, first);
    results.push_back(backend.forward(make_batch({{.tokens = prompt, .adapter_slot = 0, .block_ids = blocks,
                                                   .forked_adapter_slot = 0, .residual_block_ids = {1, 3, 5, 6}}})));
    backend.set_adapter(0, nullptr);
    backend.set_adapter(0, second);
    results.push_back(backend.forward(make_batch({{.tokens = {3}, .adapter_slot = 0, .num_computed_tokens = 13,
                                                   .block_ids = blocks, .forked_adapter_slot = 0,
                                                   .residual_block_ids = {1, 3, 5, 6}, .num_residual_present_tokens = 13}})));
    // The blocks (main and rCache) go to the host and come back after the device pools are wiped.
    backend.allocate_host_kv_cache(KvPoolKind::kMain, 8);
    backend.allocate_host_kv_cache(KvPoolKind::kResidual, 8);
    const std::vector<int32_t> host = {5, 0, 6, 1};
    backend.copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, blocks, host);
    backend.copy_kv_blocks(KvPoolKind::kResidual, KvCopyDirection::kDeviceToHost, std::vector<int32_t>{1, 3, 5, 6}, host);
    const size_t main_bytes = backend.host_kv_block(KvPoolKind::kMain, 0).size();
    EXPECT_EQ(main_bytes, static_cast<size_t>(backend.kv_bytes_per_token() * 4));
    backend.allocate_kv_cache({48, 4});
    backend.allocate_residual_cache({48, 4, 16});
    const std::vector<int32_t> moved = {11, 12, 13, 14}, moved_residual = {20, 21, 22, 23};
    backend.copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kHostToDevice, moved, host);
    backend.copy_kv_blocks(KvPoolKind::kResidual, KvCopyDirection::kHostToDevice, moved_residual, host);
    results.push_back(backend.forward(make_batch({{.tokens = {5}, .adapter_slot = 0, .num_computed_tokens = 14,
                                                   .block_ids = moved, .forked_adapter_slot = 0,
                                                   .residual_block_ids = moved_residual,
                                                   .num_residual_present_tokens = 14}})));
    return results;
  };
  auto whole = new_backend(model, 1);
  const std::vector<ForwardResult> reference = run(*whole);
  for (int size : {2, 4}) {
    auto sharded = new_backend(model, size);
    const std::vector<ForwardResult> got = run(*sharded);
    for (size_t s = 0; s < got.size(); ++s)
      EXPECT_LT(max_relative_diff(got[s], reference[s]), 1e-5) << "TP=" << size << " step " << s;
  }
}

TEST(TensorParallelCpu, SizesTheModelCannotSplitAreRefused) {
  const Model model = make_model(Architecture::kLlama);
  auto refused = [&](int size, const std::string& needle) {
    test::expect_error([&] { make_cpu_backend(model.config, model.weights, {.tensor_parallel_size = size}); },
                       ErrorKind::kInvalidArgument, {needle});
  };
  refused(3, "power of two");
  refused(8, "4 attention heads");
  ModelConfig odd = model.config;
  odd.intermediate_size = 98;
  EXPECT_THROW(check_tensor_parallel_size(odd, 4), Error);
  // A bad batch fails every rank with the batch's own error, not the group's.
  auto backend = new_backend(model, 2);
  test::expect_error([&] { backend->forward(make_batch({{.tokens = {200}, .block_ids = {0}}})); },
                     ErrorKind::kInvalidArgument, {"id 200 outside the vocabulary of 97"});
  // ... and the group works on afterwards.
  EXPECT_NO_THROW(backend->forward(make_batch({{.tokens = {20}, .block_ids = {0}}})));
}

TEST(TensorParallelCpu, ShardsCoverTheModelOnce) {
  ModelConfig config = test::tiny_config(Architecture::kLlama);
  config.num_kv_heads = 1;  // replicated on every rank
  int32_t vocab = 0, intermediate = 0;
  for (int32_t r = 0; r < 4; ++r) {
    const TensorParallelShard shard = tensor_parallel_shard(config, r, 4);
    EXPECT_EQ(shard.q_head_begin, r);
    EXPECT_EQ(shard.num_kv_heads, 1);
    EXPECT_EQ(shard.kv_head_begin, 0);
    EXPECT_EQ(shard.vocab_begin, vocab);
    EXPECT_EQ(shard.intermediate_begin, intermediate);
    EXPECT_EQ(shard.adds_o_bias, r == 0);
    vocab = shard.vocab_end;
    intermediate += shard.intermediate_size;
  }
  EXPECT_EQ(vocab, config.vocab_size);
  EXPECT_EQ(intermediate, config.intermediate_size);
  // Two kv heads over four ranks: ranks 0-1 read kv head 0, ranks 2-3 kv head 1.
  config.num_kv_heads = 2;
  EXPECT_EQ(tensor_parallel_shard(config, 1, 4).kv_head_begin, 0);
  EXPECT_EQ(tensor_parallel_shard(config, 2, 4).kv_head_begin, 1);
}

// tensor_parallel_slice names the cut shard_model_weights makes: for every
// architecture (with o's bias too), size and rank, each tensor of the rank's
// weights holds the whole tensor's values at the rows or columns it names, and
// the tensors it names kNone are the ones the rank lacks.
TEST(TensorParallelCpu, NamedSlicesAreTheShardsCuts) {
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3, Architecture::kMistral}) {
    const Model model = make_model(arch, /*o_bias=*/arch == Architecture::kQwen2);
    const TensorMap whole = model_weights_to_tensor_map(model.config, *model.weights);
    for (int32_t size : {2, 4}) {
      for (int32_t r = 0; r < size; ++r) {
        const TensorParallelShard shard = tensor_parallel_shard(model.config, r, size);
        const ModelWeights rank_weights = shard_model_weights(model.config, *model.weights, shard);
        const TensorMap part = model_weights_to_tensor_map(rank_config(model.config, shard), rank_weights);
        const std::string where = std::string(architecture_short_name(arch)) + " TP=" + std::to_string(size) +
                                  " rank " + std::to_string(r);
        for (const auto& [name, tensor] : whole) {
          const TensorParallelSlice slice = tensor_parallel_slice(model.config, shard, name);
          const auto found = part.find(name);
          if (slice.kind == TensorParallelSlice::Kind::kNone) {
            EXPECT_TRUE(found == part.end()) << where << ": " << name << " named absent";
            continue;
          }
          ASSERT_TRUE(found != part.end()) << where << ": " << name;
          const Tensor& cut = found->second;
          const int64_t columns = tensor.shape.size() == 2 ? tensor.shape[1] : 1;
          const int64_t cut_columns = cut.shape.size() == 2 ? cut.shape[1] : 1;
          int64_t row0 = 0, column0 = 0, rows = tensor.shape[0], want_columns = columns;
          if (slice.kind == TensorParallelSlice::Kind::kRows) row0 = slice.begin, rows = slice.end - slice.begin;
          if (slice.kind == TensorParallelSlice::Kind::kColumns)
            column0 = slice.begin, want_columns = slice.end - slice.begin;
          ASSERT_EQ(cut.shape[0], rows) << where << ": " << name;
          ASSERT_EQ(cut_columns, want_columns) << where << ": " << name;
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < want_columns; ++j)
              ASSERT_EQ(cut.data[i * cut_columns + j], tensor.data[(row0 + i) * columns + column0 + j])
                  << where << ": " << name << " [" << i << ", " << j << "]";
        }
        EXPECT_EQ(part.size() + (shard.adds_o_bias || !model.config.o_bias ? 0 : model.config.num_layers),
                  whole.size())
            << where;
      }
    }
  }
}

TEST(InProcessGroup, SumsInRankOrderAndAbortEndsEveryWaiter) {
  cpu::InProcessGroup group(3);
  std::vector<std::vector<float>> buffers = {{1, 2, 3, 4, 5}, {10, 20, 30, 40, 50}, {100, 200, 300, 400, 500}};
  {
    std::vector<std::jthread> threads;
    for (int32_t r = 0; r < 3; ++r)
      threads.emplace_back([&, r] { group.all_reduce_sum(r, buffers[r].data(), 5); });
  }
  for (const auto& buffer : buffers) EXPECT_EQ(buffer, (std::vector<float>{111, 222, 333, 444, 555}));

  // Rank 2 never arrives: it failed. The two waiting ranks end with an error.
  std::vector<std::string> errors(2);
  {
    std::vector<std::jthread> threads;
    for (int32_t r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          group.all_reduce_sum(r, buffers[r].data(), 5);
        } catch (const Error& e) {
          errors[r] = e.what();
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    group.abort(2);
  }
  for (const std::string& error : errors) EXPECT_NE(error.find("rank 2 failed"), std::string::npos) << error;
  group.reset();
  {
    std::vector<std::jthread> threads;
    for (int32_t r = 0; r < 3; ++r)
      threads.emplace_back([&, r] { group.all_reduce_sum(r, buffers[r].data(), 2); });
  }
  EXPECT_EQ(buffers[1][0], 111 * 3);
}

TEST(TensorParallelCpu, BlockFormatWeightsAreRefusedWithAHint) {
  const Model model = make_model(Architecture::kLlama);
  ModelWeights quantized = *model.weights;
  static const uint8_t bytes[34] = {};
  quantized.layers[0].q_proj.quantized = {static_cast<uint32_t>(GgmlType::kQ8_0), bytes, 34};
  quantized.layers[0].q_proj.data = nullptr;
  test::expect_error([&] { shard_model_weights(model.config, quantized, tensor_parallel_shard(model.config, 0, 2)); },
                     ErrorKind::kUnsupported, {"model.layers.0.self_attn.q_proj.weight", "Q8_0", "--cpu-precision fp32"});
}

// 16-bit rows (a checkpoint kept in its file, for the GPU) are cut in place: row
// slices move the start, column slices keep the whole row stride; their values
// are the fp32 tensor's slices.
TEST(TensorParallelCpu, SixteenBitRowsAreSlicedInPlace) {
  const std::vector<int64_t> shape = {6, 10};
  std::vector<float> values(60);
  for (int i = 0; i < 60; ++i) values[i] = 0.25f * static_cast<float>(i - 30);  // exact in bf16
  std::vector<uint16_t> bits(60);
  for (int i = 0; i < 60; ++i) bits[i] = float_to_bf16(values[i]);
  Tensor rows;
  rows.shape = shape;
  rows.quantized = {static_cast<uint32_t>(GgmlType::kBF16), reinterpret_cast<const uint8_t*>(bits.data()), 20};
  const Tensor fp32 = Tensor::from_vector(shape, values);
  auto expect_same = [](const Tensor& got, const Tensor& want, const char* what) {
    ASSERT_EQ(got.shape, want.shape) << what;
    const Tensor expanded = to_fp32(got);
    for (int64_t i = 0; i < want.numel(); ++i) EXPECT_EQ(expanded.data[i], want.data[i]) << what << " " << i;
  };
  expect_same(slice_rows(rows, 2, 5), slice_rows(fp32, 2, 5), "rows");
  const Tensor columns = slice_columns(rows, 3, 7);
  EXPECT_EQ(columns.quantized.row_bytes, 20);  // the whole row's stride
  EXPECT_EQ(columns.quantized.bytes, rows.quantized.bytes + 3 * 2);  // a view into the rows, no copy
  expect_same(columns, slice_columns(fp32, 3, 7), "columns");
  expect_same(slice_rows(columns, 1, 4), slice_rows(slice_columns(fp32, 3, 7), 1, 4), "rows of columns");
}

}  // namespace
}  // namespace loom
