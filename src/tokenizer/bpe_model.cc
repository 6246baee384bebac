#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <queue>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace loom {

BpeModel::BpeModel(std::vector<std::string> vocab, const std::vector<BpeMerge>& merges, BpeOptions options,
                   const std::string& context)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  token_to_id_.reserve(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) {
    if (!vocab_[id].empty()) token_to_id_.emplace(vocab_[id], static_cast<TokenId>(id));
  }
  merges_.reserve(merges.size());
  merge_pairs_.reserve(merges.size());
  const size_t prefix_length = options_.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge& merge = merges[rank];
    const auto left = token_to_id(merge.left);
    const auto right = token_to_id(merge.right);
    if (!left || !right) {
      fail(ErrorKind::kFormat, "{}: merge #{} '{} {}' names a token outside the vocabulary", context, rank,
           merge.left, merge.right);
    }
    std::string merged = merge.left;
    if (prefix_length > 0 && merge.right.rfind(options_.continuing_subword_prefix, 0) == 0) {
      merged += merge.right.substr(prefix_length);
    } else {
      merged += merge.right;
    }
    const auto merged_id = token_to_id(merged);
    if (!merged_id) {
      fail(ErrorKind::kFormat, "{}: merge #{} '{} {}' yields '{}', which is not in the vocabulary", context,
           rank, merge.left, merge.right, merged);
    }
    // As in HF, a repeated pair keeps its last rank.
    merges_[pair_key(*left, *right)] = MergeResult{static_cast<uint32_t>(rank), *merged_id};
    merge_pairs_.emplace_back(*left, *right);
  }
  if (options_.unk_token) {
    const auto unk_id = token_to_id(*options_.unk_token);
    if (!unk_id) fail(ErrorKind::kFormat, "{}: unk_token '{}' is not in the vocabulary", context, *options_.unk_token);
    unk_id_ = *unk_id;
  }
}

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& model, const std::string& context) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") fail(ErrorKind::kUnsupported, "{}: model type '{}' is not supported (only BPE)", context, type);
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0.0) {
    fail(ErrorKind::kUnsupported, "{}: BPE dropout is not supported", context);
  }
  std::vector<std::string> vocab;
  const nlohmann::json& entries = model.at("vocab");
  if (!entries.is_object()) fail(ErrorKind::kFormat, "{}: model.vocab is not an object", context);
  // Ids are dense in real vocabularies; a few gaps are tolerated, not a
  // 16M-entry table from a one-line file.
  const int64_t max_id = std::min<int64_t>(static_cast<int64_t>(entries.size()) + (1 << 16), 1 << 24);
  for (const auto& [token, id_value] : entries.items()) {
    if (!id_value.is_number_integer())
      fail(ErrorKind::kFormat, "{}: token '{}' has id {}, not an integer", context, token, id_value.dump());
    const int64_t id = id_value.get<int64_t>();
    if (id < 0 || id > max_id) fail(ErrorKind::kFormat, "{}: token '{}' has id {} out of range", context, token, id);
    if (static_cast<size_t>(id) >= vocab.size()) vocab.resize(static_cast<size_t>(id) + 1);
    vocab[static_cast<size_t>(id)] = token;
  }
  std::vector<BpeMerge> merges;
  for (const auto& merge : model.value("merges", nlohmann::json::array())) {
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        fail(ErrorKind::kFormat, "{}: merge '{}' is not of the form 'a b'", context, text);
      }
      merges.push_back({text.substr(0, space), text.substr(space + 1)});
    } else if (merge.is_array() && merge.size() == 2) {
      merges.push_back({merge[0].get<std::string>(), merge[1].get<std::string>()});
    } else {
      fail(ErrorKind::kFormat, "{}: merge {} is neither 'a b' nor [a, b]", context, merge.dump());
    }
  }
  BpeOptions options;
  options.ignore_merges = model.value("ignore_merges", false);
  options.byte_fallback = model.value("byte_fallback", false);
  options.fuse_unk = model.value("fuse_unk", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) options.unk_token = model["unk_token"].get<std::string>();
  if (model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string())
    options.continuing_subword_prefix = model["continuing_subword_prefix"].get<std::string>();
  if (model.contains("end_of_word_suffix") && model["end_of_word_suffix"].is_string())
    options.end_of_word_suffix = model["end_of_word_suffix"].get<std::string>();
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options), context);
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  const auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::id_to_token(TokenId id) const {
  static const std::string kEmpty;
  if (id < 0 || static_cast<size_t>(id) >= vocab_.size()) return kEmpty;
  return vocab_[static_cast<size_t>(id)];
}

// One symbol per character; characters outside the vocabulary become byte
// tokens (byte_fallback) or unk, as HF's BPE::merge_word does.
std::vector<TokenId> BpeModel::initial_symbols(std::string_view word) const {
  std::vector<TokenId> symbols;
  symbols.reserve(word.size());
  std::optional<TokenId> pending_unk;
  size_t pos = 0;
  std::string piece;
  while (pos < word.size()) {
    uint32_t code_point = 0;
    const size_t length = utf8::decode_code_point(word, pos, code_point);
    const bool is_first = pos == 0;
    const bool is_last = pos + length == word.size();
    piece.clear();
    if (!is_first) piece += options_.continuing_subword_prefix;
    piece.append(word.substr(pos, length));
    if (is_last) piece += options_.end_of_word_suffix;
    pos += length;
    if (const auto id = token_to_id(piece)) {
      if (pending_unk) symbols.push_back(*pending_unk);
      pending_unk.reset();
      symbols.push_back(*id);
      continue;
    }
    if (options_.byte_fallback) {
      std::vector<TokenId> byte_ids;
      for (unsigned char byte : piece) {
        const auto id = token_to_id(fmt::format("<0x{:02X}>", byte));
        if (!id) break;
        byte_ids.push_back(*id);
      }
      if (byte_ids.size() == piece.size()) {
        symbols.insert(symbols.end(), byte_ids.begin(), byte_ids.end());
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !options_.fuse_unk) symbols.push_back(*pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk) symbols.push_back(*pending_unk);
  return symbols;
}

std::vector<TokenId> BpeModel::merge_symbols(std::vector<TokenId> symbols) const {
  const int num_symbols = static_cast<int>(symbols.size());
  if (num_symbols < 2) return symbols;
  std::vector<int> prev(num_symbols), next(num_symbols);
  std::vector<bool> alive(num_symbols, true);
  for (int i = 0; i < num_symbols; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < num_symbols ? i + 1 : -1;
  }
  struct Candidate {
    uint32_t rank;
    int position;
    TokenId merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push_pair = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const auto it = merges_.find(pair_key(symbols[left], symbols[next[left]]));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.merged_id});
  };
  for (int i = 0; i + 1 < num_symbols; ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int left = top.position;
    if (!alive[left] || next[left] < 0) continue;
    const int right = next[left];
    // Stale entry: one side has merged since this candidate was queued.
    const auto it = merges_.find(pair_key(symbols[left], symbols[right]));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;
    symbols[left] = top.merged_id;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    push_pair(prev[left]);
    push_pair(left);
  }
  std::vector<TokenId> merged;
  for (int i = 0; i >= 0; i = next[i]) merged.push_back(symbols[i]);
  return merged;
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool can_cache = word.size() <= kMaxCachedWordBytes;
  if (can_cache) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<TokenId> ids = merge_symbols(initial_symbols(word));
  out.insert(out.end(), ids.begin(), ids.end());
  if (can_cache) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCachedWords) {
      cache_evictions_ += static_cast<int64_t>(cache_.size());
      cache_bytes_ = 0;
      cache_.clear();
    }
    const auto bytes = static_cast<int64_t>(word.size() + ids.size() * sizeof(TokenId));
    if (cache_.emplace(std::string(word), std::move(ids)).second) cache_bytes_ += bytes;
  }
}

CacheGauge BpeModel::cache_gauge() const {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  return {"bpe_words", static_cast<int64_t>(cache_.size()), static_cast<int64_t>(kMaxCachedWords), cache_bytes_,
          cache_evictions_};
}

nlohmann::json BpeModel::to_json() const {
  nlohmann::json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = options_.unk_token ? nlohmann::json(*options_.unk_token) : nlohmann::json();
  model["continuing_subword_prefix"] = options_.continuing_subword_prefix.empty()
                                           ? nlohmann::json()
                                           : nlohmann::json(options_.continuing_subword_prefix);
  model["end_of_word_suffix"] = options_.end_of_word_suffix.empty()
                                    ? nlohmann::json()
                                    : nlohmann::json(options_.end_of_word_suffix);
  model["fuse_unk"] = options_.fuse_unk;
  model["byte_fallback"] = options_.byte_fallback;
  model["ignore_merges"] = options_.ignore_merges;
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t id = 0; id < vocab_.size(); ++id) {
    if (!vocab_[id].empty()) vocab[vocab_[id]] = id;
  }
  model["vocab"] = std::move(vocab);
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] : merge_pairs_) merges.push_back({vocab_[left], vocab_[right]});
  model["merges"] = std::move(merges);
  return model;
}

}  // namespace loom
