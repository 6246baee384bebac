// The CPU backend's KV sharing modes against references computed by
// transformers 5.17 + PEFT 0.21 in fp32 (tools/golden/make_sharing_goldens.py,
// fixtures tests/fixtures/golden/{activated_llama_alora,base_llama,base_qwen2}):
//
//   activated  PEFT's own aLoRA: per-token adapter_slots, -1 before the last
//              invocation occurrence in the prompt, the adapter from it on.
//   base       ICaRus: the base model writes every K/V; decoder rows (the
//              adapter on q, o, gate, up, down, never k/v) give the logits.
//
// Batches are built by hand per backend.h: every (adapter, prompt) pair is one
// sequence of one mixed batch, block ids are scattered, block sizes 16 and 4,
// the prompt is prefilled in one step or in chunks (9, 16, 9, 16, ...), then
// the golden greedy tokens are fed back one step at a time (teacher forcing)
// and Loom's argmax must pick the golden token wherever the golden top-1/top-2
// margin exceeds the tolerance (elsewhere the golden token must be within the
// tolerance of Loom's best). The models are regenerated here by make-model's
// code and must hash to the fnv1a64 values the goldens recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "formats/safetensors.h"
#include "lora/adapter.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

using test::fnv1a64_hex;
using test::safetensors_metadata;

constexpr float kLogitTolerance = 1e-3f;  // as golden_test.cc: fp32 vs fp32, other summation order
constexpr int32_t kChunkPattern[] = {9, 16};

struct SharingFixture {
  const char* name;  // tests/fixtures/golden/<name>.safetensors
  Architecture arch;
  int num_adapters;
  bool alora;  // activated (aLoRA adapters) or base sharing
};

constexpr SharingFixture kFixtures[] = {
    {"activated_llama_alora", Architecture::kLlama, 2, true},
    {"base_llama", Architecture::kLlama, 4, false},
    {"base_qwen2", Architecture::kQwen2, 4, false},
};




std::vector<int32_t> row_ids(const Tensor& tensor, int64_t row) {
  const int64_t width = tensor.shape.back();
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < width; ++i) ids.push_back(static_cast<int32_t>(tensor.data[row * width + i]));
  return ids;
}

float max_abs_diff(const float* a, const float* b, int64_t count) {
  float diff = 0.0f;
  for (int64_t i = 0; i < count; ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
  return diff;
}

int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

// One sequence: a golden prompt and its golden greedy continuation, run with
// one adapter in one sharing mode.
struct Track {
  std::string adapter;          // golden tensor prefix, "adapterN"
  int32_t adapter_index = 0;    // N
  int64_t prompt = 0;           // golden prompt index
  int32_t prompt_length = 0;
  std::vector<int32_t> tokens;  // prompt, then the golden greedy tokens (fed back)
  std::vector<int32_t> slots;   // adapter slot of each token (-1: base rows)
  int32_t decoder_slot = -1;    // base sharing: the adapter whose decoder rows give logits
  std::vector<int32_t> blocks;  // block table, long enough for every token
};

// One sequence's part of a batch.
struct Part {
  const Track* track;
  int32_t num_cached;
  int32_t num_new;
  bool all_logits;
  int32_t num_kv_present = 0;
};

// Hands out block ids in a scattered order (a stride coprime with the pool size).
class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks) : num_blocks_(num_blocks) {
    stride_ = num_blocks / 2 + 1;
    while (std::gcd(stride_, num_blocks_) != 1) ++stride_;
  }
  std::vector<int32_t> take(int32_t count) {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < count; ++i, ++next_) {
      if (next_ >= num_blocks_) throw std::runtime_error("block pool exhausted");
      ids.push_back(static_cast<int32_t>((static_cast<int64_t>(next_) * stride_ + 3) % num_blocks_));
    }
    return ids;
  }

 private:
  int32_t num_blocks_;
  int32_t stride_;
  int32_t next_ = 0;
};

struct StepResult {
  ForwardResult result;
  std::vector<size_t> first_row;  // per part: its first logits row
};

StepResult run_parts(Backend& backend, const std::vector<Part>& parts, int32_t block_size) {
  Batch batch;
  StepResult step;
  size_t num_rows = 0;
  for (const Part& part : parts) {
    const Track& track = *part.track;
    BatchSequence sequence;
    sequence.num_computed_tokens = part.num_cached;
    sequence.num_new_tokens = part.num_new;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = ceil_div(part.num_cached + part.num_new, block_size);
    sequence.logits_for_all_tokens = part.all_logits;
    sequence.num_kv_present_tokens = part.num_kv_present;
    sequence.decoder_adapter_slot = track.decoder_slot;
    for (int32_t j = part.num_cached; j < part.num_cached + part.num_new; ++j) {
      batch.token_ids.push_back(track.tokens.at(static_cast<size_t>(j)));
      batch.positions.push_back(j);
      batch.adapter_slots.push_back(track.slots.at(static_cast<size_t>(j)));
    }
    batch.block_tables.insert(batch.block_tables.end(), track.blocks.begin(),
                              track.blocks.begin() + sequence.num_blocks);
    batch.sequences.push_back(sequence);
    step.first_row.push_back(num_rows);
    num_rows += part.all_logits ? static_cast<size_t>(part.num_new) : 1;
  }
  step.result = backend.forward(batch);
  EXPECT_EQ(step.result.logit_token_index.size(), num_rows);
  return step;
}

class SharingGoldenTest : public ::testing::TestWithParam<std::tuple<int, int32_t, bool>> {
 protected:
  void SetUp() override {
    fixture_ = kFixtures[std::get<0>(GetParam())];
    block_size_ = std::get<1>(GetParam());
    chunked_ = std::get<2>(GetParam());
    SyntheticModelOptions options;
    options.arch = fixture_.arch;
    options.num_adapters = fixture_.num_adapters;
    options.alora_invocation = fixture_.alora;
    write_synthetic_model(directory_.str(), options);

    const std::string golden_path = test::fixture_path(fmt::format("golden/{}.safetensors", fixture_.name));
    metadata_ = safetensors_metadata(golden_path);
    ASSERT_EQ(metadata_.at("mode").get<std::string>(), fixture_.alora ? "activated" : "base");
    int num_checked_files = 0;
    for (const auto& [key, value] : metadata_.items()) {
      if (key.rfind("fnv1a64.", 0) != 0) continue;
      const std::string file = key.substr(8);
      ASSERT_EQ(fnv1a64_hex(test::read_file_bytes((directory_.path() / file).string())), value.get<std::string>())
          << file << " changed: regenerate with tools/golden/make_sharing_fixtures.sh";
      ++num_checked_files;
    }
    ASSERT_EQ(num_checked_files, 2 + 2 * fixture_.num_adapters);

    golden_ = read_safetensors(golden_path);
    model_ = load_model(directory_.str());
    backend_ = make_cpu_backend(model_.config, model_.weights);
    vocab_ = model_.config.vocab_size;
    for (int i = 0; i < fixture_.num_adapters; ++i) {
      const std::string name = fmt::format("adapter{}", i);
      auto adapter = load_lora_adapter(name, fmt::format("{}/adapters/{}", directory_.str(), name), model_.config);
      if (fixture_.alora) {
        const auto expected = metadata_.at("alora." + name).get<std::string>();
        ASSERT_EQ(nlohmann::json(adapter->config.alora_invocation_tokens).dump(), nlohmann::json::parse(expected).dump());
      }
      backend_->set_adapter(i, adapter);
    }
  }

  int64_t num_prompts() const { return golden_.at("prompts").shape[0]; }
  int32_t prompt_length() const { return static_cast<int32_t>(golden_.at("prompts").shape[1]); }
  int32_t num_greedy() const { return static_cast<int32_t>(std::stoi(metadata_.at("num_greedy").get<std::string>())); }

  // The invocation start of prompt p (-1: none), as the goldens recorded it.
  int32_t alora_start(int64_t p) const { return static_cast<int32_t>(golden_.at("alora_starts").data[p]); }

  // The track of (adapter slot, prompt): activated slots from the start on, or
  // base rows everywhere with decoder rows of the adapter.
  Track make_track(int32_t slot, int64_t p, bool base_sharing) const {
    Track track;
    track.adapter = fmt::format("adapter{}", slot);
    track.adapter_index = slot;
    track.prompt = p;
    track.tokens = row_ids(golden_.at("prompts"), p);
    track.prompt_length = static_cast<int32_t>(track.tokens.size());
    if (slot >= 0) {
      const std::vector<int32_t> greedy = row_ids(golden_.at(track.adapter + ".greedy"), p);
      track.tokens.insert(track.tokens.end(), greedy.begin(), greedy.end() - 1);  // the last one is never fed
    }
    const int32_t start = fixture_.alora ? alora_start(p) : 0;
    for (size_t j = 0; j < track.tokens.size(); ++j) {
      const bool adapted = slot >= 0 && !base_sharing && start >= 0 && static_cast<int32_t>(j) >= start;
      track.slots.push_back(adapted ? slot : -1);
    }
    if (base_sharing) track.decoder_slot = slot;
    return track;
  }

  // Every (adapter, prompt) pair, in the fixture's sharing mode.
  std::vector<Track> all_tracks() const {
    std::vector<Track> tracks;
    for (int32_t slot = 0; slot < fixture_.num_adapters; ++slot)
      for (int64_t p = 0; p < num_prompts(); ++p) tracks.push_back(make_track(slot, p, !fixture_.alora));
    return tracks;
  }

  BlockPool make_pool(const std::vector<Track>& tracks, int32_t extra_sequences = 0) {
    int32_t num_blocks = 0;
    for (const Track& track : tracks) num_blocks += ceil_div(static_cast<int32_t>(track.tokens.size()), block_size_);
    num_blocks += extra_sequences * ceil_div(static_cast<int32_t>(tracks.front().tokens.size()), block_size_);
    backend_->allocate_kv_cache({num_blocks, block_size_});
    return BlockPool(num_blocks);
  }

  const float* golden_logits(const Track& track, int32_t position) const {
    const Tensor& logits = golden_.at(track.adapter + ".logits");
    return logits.data + (track.prompt * prompt_length() + position) * vocab_;
  }

  // Prefills every track's prompt (one step, or chunks of kChunkPattern sizes),
  // checks the logits at every position, then feeds the golden greedy tokens
  // back one by one and checks Loom's argmax against them.
  void check_prefill_and_decode(std::vector<Track>& tracks) {
    BlockPool pool = make_pool(tracks);
    for (Track& track : tracks) track.blocks = pool.take(ceil_div(static_cast<int32_t>(track.tokens.size()), block_size_));
    const int32_t length = prompt_length();
    std::vector<float> max_diff(static_cast<size_t>(fixture_.num_adapters), 0.0f);
    std::vector<std::vector<float>> last_rows(tracks.size());  // logits that pick the next greedy token
    for (int32_t done = 0, chunk = 0; done < length; ++chunk) {
      const int32_t size = chunked_ ? std::min(kChunkPattern[chunk % 2], length - done) : length;
      std::vector<Part> parts;
      for (const Track& track : tracks) parts.push_back({&track, done, size, true});
      const StepResult step = run_parts(*backend_, parts, block_size_);
      for (size_t s = 0; s < tracks.size(); ++s) {
        for (int32_t i = 0; i < size; ++i) {
          const float* row = step.result.logits.data() + (step.first_row[s] + static_cast<size_t>(i)) * vocab_;
          const float diff = max_abs_diff(row, golden_logits(tracks[s], done + i), vocab_);
          float& adapter_max = max_diff[static_cast<size_t>(tracks[s].adapter_index)];
          adapter_max = std::max(adapter_max, diff);
          EXPECT_LT(diff, kLogitTolerance) << tracks[s].adapter << " prompt " << tracks[s].prompt << " position "
                                           << done + i;
          if (done + i == length - 1) last_rows[s].assign(row, row + vocab_);
        }
      }
      done += size;
    }
    for (int i = 0; i < fixture_.num_adapters; ++i)
      std::printf("%s block %d %s adapter%d: max |logit - golden| = %.3g\n", fixture_.name, block_size_,
                  chunked_ ? "chunked" : "one-step", i, max_diff[static_cast<size_t>(i)]);

    // Greedy step 0 is the argmax at the last prompt position; step g the argmax
    // after feeding golden token g-1.
    int num_compared = 0;
    for (int32_t g = 0; g < num_greedy(); ++g) {
      if (g > 0) {
        std::vector<Part> parts;
        for (const Track& track : tracks) parts.push_back({&track, length + g - 1, 1, false});
        const StepResult step = run_parts(*backend_, parts, block_size_);
        for (size_t s = 0; s < tracks.size(); ++s)
          last_rows[s].assign(step.result.logits.begin() + static_cast<int64_t>(step.first_row[s] * vocab_),
                              step.result.logits.begin() + static_cast<int64_t>((step.first_row[s] + 1) * vocab_));
      }
      for (size_t s = 0; s < tracks.size(); ++s) {
        const Track& track = tracks[s];
        const int32_t expected = row_ids(golden_.at(track.adapter + ".greedy"), track.prompt)[static_cast<size_t>(g)];
        const Tensor& margins = golden_.at(track.adapter + ".greedy_margin");
        const float margin = margins.data[track.prompt * margins.shape[1] + g];
        const std::vector<float>& row = last_rows[s];
        const auto best = std::max_element(row.begin(), row.end());
        if (margin > 2 * kLogitTolerance) {
          EXPECT_EQ(best - row.begin(), expected) << track.adapter << " prompt " << track.prompt << " step " << g;
          ++num_compared;
        } else {
          EXPECT_GE(row[static_cast<size_t>(expected)], *best - 2 * kLogitTolerance)
              << track.adapter << " prompt " << track.prompt << " near-tie step " << g;
        }
      }
    }
    EXPECT_GE(num_compared, static_cast<int>(tracks.size()) * num_greedy() * 3 / 4);
  }

  SharingFixture fixture_{};
  int32_t block_size_ = 16;
  bool chunked_ = false;
  test::TempDir directory_;
  LoadedModel model_;
  nlohmann::json metadata_;
  TensorMap golden_;
  std::unique_ptr<Backend> backend_;
  int64_t vocab_ = 0;
};

// All (adapter, prompt) pairs in one batch per step: logits at every prompt
// position, then 16 greedy steps.
TEST_P(SharingGoldenTest, PrefillAndGreedyMatchReference) {
  std::vector<Track> tracks = all_tracks();
  check_prefill_and_decode(tracks);
}

// activated: KV written by base-model rows is read by aLoRA sequences (every
// full block before the invocation start), and KV written by aLoRA sequences
// before their start is read by base-model sequences (the positions before the
// start are base positions, so the adapter's golden logits there are the base
// model's). base: KV written by one adapter's base rows serves every adapter's
// decoder rows, with the overlapping new tokens masked as present.
class SharingKvReuseTest : public SharingGoldenTest {};

TEST_P(SharingKvReuseTest, KvWrittenUnderOneModelServesAnother) {
  const int32_t length = prompt_length();
  std::vector<Track> writers, readers;
  std::vector<int32_t> reader_cached;  // tokens each reader takes from its writer
  std::vector<int32_t> reader_end;     // readers compute [cached, end)
  if (fixture_.alora) {
    for (int32_t slot = 0; slot < fixture_.num_adapters; ++slot) {
      for (int64_t p = 0; p < num_prompts(); ++p) {
        const int32_t start = alora_start(p);
        // base writes, aLoRA reads every full block before the start (at least one new token).
        Track base_writer = make_track(slot, p, false);
        std::fill(base_writer.slots.begin(), base_writer.slots.end(), -1);
        writers.push_back(base_writer);
        readers.push_back(make_track(slot, p, false));
        reader_cached.push_back((std::min(start < 0 ? length : start, length - 1) / block_size_) * block_size_);
        reader_end.push_back(length);
        // aLoRA writes, base reads up to its start (where the start leaves base positions).
        if (start == 0) continue;
        writers.push_back(make_track(slot, p, false));
        Track base_reader = make_track(slot, p, false);
        std::fill(base_reader.slots.begin(), base_reader.slots.end(), -1);
        readers.push_back(base_reader);
        const int32_t end = start < 0 ? length : start;
        reader_cached.push_back(((end - 1) / block_size_) * block_size_);
        reader_end.push_back(end);
      }
    }
  } else {
    for (int64_t p = 0; p < num_prompts(); ++p) {
      for (int32_t slot = 0; slot < fixture_.num_adapters; ++slot) {
        writers.push_back(make_track(0, p, true));
        readers.push_back(make_track(slot, p, true));
        reader_cached.push_back(slot == 0 ? length - 1 : 5 + 3 * slot);  // inside blocks too
        reader_end.push_back(length);
      }
    }
  }
  BlockPool pool = make_pool(writers, static_cast<int32_t>(readers.size()));
  std::vector<Part> parts;
  for (Track& writer : writers) {
    writer.blocks = pool.take(ceil_div(static_cast<int32_t>(writer.tokens.size()), block_size_));
    parts.push_back({&writer, 0, length, false});
  }
  run_parts(*backend_, parts, block_size_);

  parts.clear();
  for (size_t r = 0; r < readers.size(); ++r) {
    Track& reader = readers[r];
    const int32_t cached = reader_cached[r];
    const int32_t shared_blocks = fixture_.alora ? cached / block_size_ : ceil_div(length, block_size_);
    reader.blocks.assign(writers[r].blocks.begin(), writers[r].blocks.begin() + shared_blocks);
    const std::vector<int32_t> own = pool.take(ceil_div(static_cast<int32_t>(reader.tokens.size()), block_size_) - shared_blocks);
    reader.blocks.insert(reader.blocks.end(), own.begin(), own.end());
    // base sharing: the reader's new tokens are already present (written by the writer's base rows).
    parts.push_back({&reader, cached, reader_end[r] - cached, true, fixture_.alora ? 0 : length});
  }
  const StepResult step = run_parts(*backend_, parts, block_size_);
  float max_diff = 0.0f;
  for (size_t r = 0; r < readers.size(); ++r) {
    for (int32_t position = reader_cached[r]; position < reader_end[r]; ++position) {
      const float* row =
          step.result.logits.data() + (step.first_row[r] + static_cast<size_t>(position - reader_cached[r])) * vocab_;
      const float diff = max_abs_diff(row, golden_logits(readers[r], position), vocab_);
      max_diff = std::max(max_diff, diff);
      EXPECT_LT(diff, kLogitTolerance) << readers[r].adapter << " prompt " << readers[r].prompt << " position "
                                       << position << " reading " << reader_cached[r] << " cached tokens";
    }
  }
  std::printf("%s block %d: %zu readers, max |logit - golden| = %.3g\n", fixture_.name, block_size_, readers.size(),
              max_diff);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<int, int32_t, bool>>& info) {
  return fmt::format("{}_block{}{}", kFixtures[std::get<0>(info.param)].name, std::get<1>(info.param),
                     std::get<2>(info.param) ? "_chunked" : "");
}

INSTANTIATE_TEST_SUITE_P(Modes, SharingGoldenTest,
                         ::testing::Combine(::testing::Range(0, 3), ::testing::Values(16, 4), ::testing::Bool()),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Modes, SharingKvReuseTest,
                         ::testing::Combine(::testing::Range(0, 3), ::testing::Values(16, 4), ::testing::Values(false)),
                         case_name);

}  // namespace
}  // namespace loom
