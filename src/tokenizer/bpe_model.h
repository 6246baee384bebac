// The BPE model of HF tokenizer.json ("model": {"type": "BPE"}): vocabulary,
// ranked merges, ignore_merges, byte_fallback, unk (fused or not),
// continuing_subword_prefix / end_of_word_suffix.
//
// Merging uses a rank hash map and a priority queue over a linked list of
// symbols (O(n log n) per word); results are cached per word.
//
// Thread safety: encode_word may be called concurrently (the cache is guarded).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/cache_gauge.h"

namespace loom {

using TokenId = int32_t;

// Hash for heterogeneous (string_view) lookup in string-keyed maps.
struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using TokenIdMap = std::unordered_map<std::string, TokenId, StringViewHash, std::equal_to<>>;

struct BpeMerge {
  std::string left, right;
};

struct BpeOptions {
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

class BpeModel {
 public:
  // `vocab[id]` is the token string of id (empty string for holes). Throws
  // Error(kFormat) naming `context` when a merge names a token outside the vocabulary.
  BpeModel(std::vector<std::string> vocab, const std::vector<BpeMerge>& merges, BpeOptions options,
           const std::string& context);
  // Parses the "model" JSON object (both merge forms: "a b" and ["a", "b"]).
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& model, const std::string& context);

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;
  // The word cache ("bpe_words"): at most kMaxCachedWords words of up to
  // kMaxCachedWordBytes; full, it starts over.
  CacheGauge cache_gauge() const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  // Empty for an id outside the vocabulary.
  const std::string& id_to_token(TokenId id) const;
  int num_ids() const { return static_cast<int>(vocab_.size()); }
  const BpeOptions& options() const { return options_; }

  // The model as HF JSON (merges in [a, b] form, rank order).
  nlohmann::json to_json() const;

 private:
  struct MergeResult {
    uint32_t rank;
    TokenId merged_id;
  };
  static uint64_t pair_key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  std::vector<TokenId> initial_symbols(std::string_view word) const;
  std::vector<TokenId> merge_symbols(std::vector<TokenId> symbols) const;

  std::vector<std::string> vocab_;
  TokenIdMap token_to_id_;
  TokenId unk_id_ = -1;
  std::unordered_map<uint64_t, MergeResult> merges_;
  std::vector<std::pair<TokenId, TokenId>> merge_pairs_;  // by rank, for to_json
  BpeOptions options_;

  static constexpr size_t kMaxCachedWords = 20000;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>, StringViewHash, std::equal_to<>> cache_;
  mutable int64_t cache_bytes_ = 0, cache_evictions_ = 0;
};

}  // namespace loom
