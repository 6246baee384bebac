#include "synthetic/synthetic_tokenizer.h"

#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "util/error.h"

namespace loom {
namespace {

std::vector<std::string> family_special_tokens(SyntheticPreTokenizer kind) {
  if (kind == SyntheticPreTokenizer::kLlama3)
    return {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  return {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
}

struct TrainedBpe {
  std::vector<std::string> vocab;  // id -> byte-level token
  std::vector<std::pair<int, int>> merges;
};

// Classic BPE training: repeatedly merge the most frequent adjacent pair
// (ties: smallest ids), until `num_tokens` tokens exist or no pair is left.
TrainedBpe train_bpe(SyntheticPreTokenizer kind, int num_tokens) {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  TrainedBpe trained;
  std::unordered_map<std::string, int> token_ids;
  for (int byte = 0; byte < 256; ++byte) {
    trained.vocab.push_back(alphabet.byte_text(static_cast<uint8_t>(byte)));
    token_ids.emplace(trained.vocab.back(), byte);
  }
  const std::string context = "synthetic tokenizer";
  const Normalizer normalizer = Normalizer::from_json(family_normalizer_json(kind), context);
  const PreTokenizer pre_tokenizer = PreTokenizer::from_json(family_pre_tokenizer_json(kind), context);
  std::map<std::string, int64_t> word_counts;
  for (const std::string& word : pre_tokenizer.split(normalizer.apply(synthetic_tokenizer_corpus()), true))
    ++word_counts[word];

  // Each distinct word as a sequence of token ids, starting from its bytes.
  std::vector<std::vector<int>> words;
  std::vector<int64_t> counts;
  for (const auto& [word, count] : word_counts) {
    const auto bytes = alphabet.decode(word);
    LOOM_CHECK(bytes.has_value());
    words.emplace_back(bytes->begin(), bytes->end());
    for (int& symbol : words.back()) symbol = static_cast<uint8_t>(symbol);
    counts.push_back(count);
  }

  // Pair counts are kept up to date incrementally: only words containing the
  // merged pair are recounted. Key: left id << 32 | right id.
  std::unordered_map<uint64_t, int64_t> pair_counts;
  const auto pair_key = [](int left, int right) {
    return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  };
  const auto count_pairs = [&](const std::vector<int>& word, int64_t weight) {
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const uint64_t key = pair_key(word[i], word[i + 1]);
      if ((pair_counts[key] += weight) == 0) pair_counts.erase(key);
    }
  };
  for (size_t w = 0; w < words.size(); ++w) count_pairs(words[w], counts[w]);

  while (static_cast<int>(trained.vocab.size()) < num_tokens && !pair_counts.empty()) {
    // The winner (highest count, then smallest key) does not depend on the
    // map's iteration order.
    uint64_t best_key = 0;
    int64_t best_count = 0;
    for (const auto& [key, count] : pair_counts) {
      if (count > best_count || (count == best_count && key < best_key)) {
        best_key = key;
        best_count = count;
      }
    }
    const int left = static_cast<int>(best_key >> 32);
    const int right = static_cast<int>(best_key & 0xFFFFFFFFu);
    const std::string merged = trained.vocab[left] + trained.vocab[right];
    int merged_id;
    if (const auto it = token_ids.find(merged); it != token_ids.end()) {
      merged_id = it->second;  // reached before by another merge path (as HF's trainer allows)
    } else {
      merged_id = static_cast<int>(trained.vocab.size());
      trained.vocab.push_back(merged);
      token_ids.emplace(merged, merged_id);
    }
    trained.merges.emplace_back(left, right);
    for (size_t w = 0; w < words.size(); ++w) {
      std::vector<int>& word = words[w];
      bool contains_pair = false;
      for (size_t i = 0; i + 1 < word.size() && !contains_pair; ++i)
        contains_pair = word[i] == left && word[i + 1] == right;
      if (!contains_pair) continue;
      count_pairs(word, -counts[w]);
      std::vector<int> out;
      out.reserve(word.size());
      for (size_t i = 0; i < word.size(); ++i) {
        if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
          out.push_back(merged_id);
          ++i;
        } else {
          out.push_back(word[i]);
        }
      }
      word = std::move(out);
      count_pairs(word, counts[w]);
    }
  }
  return trained;
}

nlohmann::json template_processor_json(const std::string& bos, int bos_id) {
  const nlohmann::json bos_piece = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  return {{"type", "TemplateProcessing"},
          {"single", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair",
           {bos_piece,
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
            {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
}

}  // namespace

SyntheticTokenizer make_synthetic_tokenizer(int vocab_size, SyntheticPreTokenizer kind) {
  const std::vector<std::string> specials = family_special_tokens(kind);
  const int num_specials = static_cast<int>(specials.size());
  if (vocab_size < 256 + num_specials) {
    fail(ErrorKind::kInvalidArgument, "synthetic tokenizer: vocab_size {} is below 256 bytes + {} special tokens",
         vocab_size, num_specials);
  }
  const int num_regular = vocab_size - num_specials;
  TrainedBpe trained = train_bpe(kind, num_regular);
  for (int filler = 0; static_cast<int>(trained.vocab.size()) < num_regular; ++filler)
    trained.vocab.push_back("<|reserved_" + std::to_string(filler) + "|>");

  nlohmann::json vocab = nlohmann::json::object();
  for (size_t id = 0; id < trained.vocab.size(); ++id) vocab[trained.vocab[id]] = id;
  nlohmann::json added_tokens = nlohmann::json::array();
  for (int i = 0; i < num_specials; ++i) {
    const int id = num_regular + i;
    vocab[specials[i]] = id;
    AddedToken token;
    token.id = id;
    token.content = specials[i];
    token.special = true;
    token.normalized = false;
    added_tokens.push_back(AddedVocabulary::token_to_json(token));
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] : trained.merges) merges.push_back({trained.vocab[left], trained.vocab[right]});

  SyntheticTokenizer result;
  const auto id_of = [&](const std::string& token) {
    for (int i = 0; i < num_specials; ++i)
      if (specials[i] == token) return num_regular + i;
    return -1;
  };
  const bool is_llama3 = kind == SyntheticPreTokenizer::kLlama3;
  const std::string bos = is_llama3 ? "<|begin_of_text|>" : "<|endoftext|>";
  result.bos_token_id = id_of(bos);
  result.eos_token_ids = is_llama3 ? std::vector<int>{id_of("<|eot_id|>"), id_of("<|end_of_text|>")}
                                   : std::vector<int>{id_of("<|im_end|>"), id_of("<|endoftext|>")};
  const nlohmann::json byte_level_processor = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  const nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", std::move(added_tokens)},
      {"normalizer", family_normalizer_json(kind)},
      {"pre_tokenizer", family_pre_tokenizer_json(kind)},
      {"post_processor", is_llama3 ? nlohmann::json{{"type", "Sequence"},
                                                    {"processors", {byte_level_processor,
                                                                    template_processor_json(bos, result.bos_token_id)}}}
                                   : byte_level_processor},
      {"decoder", byte_level_decoder_json()},
      {"model", byte_level_bpe_model_json(std::move(vocab), std::move(merges), kind)}};
  result.tokenizer_json = tokenizer.dump(1) + "\n";

  ChatTemplate chat_template = ChatTemplate::chatml();
  if (is_llama3) chat_template = ChatTemplate::llama3(bos);
  if (kind == SyntheticPreTokenizer::kQwen2) chat_template = ChatTemplate::chatml("You are a helpful assistant.");
  if (kind == SyntheticPreTokenizer::kSmolLM)
    chat_template = ChatTemplate::chatml("You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const nlohmann::json config = {
      {"add_bos_token", is_llama3},
      {"add_eos_token", false},
      {"bos_token", bos},
      {"eos_token", is_llama3 ? "<|eot_id|>" : "<|im_end|>"},
      {"pad_token", is_llama3 ? "<|end_of_text|>" : "<|endoftext|>"},
      {"chat_template", chat_template.jinja()},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", 131072},
      {"tokenizer_class", "PreTrainedTokenizerFast"}};
  result.tokenizer_config_json = config.dump(1) + "\n";
  return result;
}

std::string make_synthetic_tokenizer_json(int vocab_size, SyntheticPreTokenizer kind) {
  return make_synthetic_tokenizer(vocab_size, kind).tokenizer_json;
}

std::string make_synthetic_tokenizer_config_json(int vocab_size, SyntheticPreTokenizer kind) {
  return make_synthetic_tokenizer(vocab_size, kind).tokenizer_config_json;
}

}  // namespace loom
