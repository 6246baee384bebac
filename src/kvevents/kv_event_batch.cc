#include "kvevents/kv_event_batch.h"

#include <charconv>

#include "kv/kv_key.h"
#include "kvevents/msgpack_writer.h"

namespace loom {

namespace {

constexpr std::string_view kActivatedPrefix = "alora/";

void write_extra_key(MsgpackWriter& out, const KvEventExtraKey& key) {
  out.array(static_cast<uint32_t>(key.size()));
  for (const auto& item : key) {
    if (const auto* text = std::get_if<std::string>(&item))
      out.string(*text);
    else
      out.integer(std::get<int64_t>(item));
  }
}

}  // namespace

const char* kv_event_medium_name(KvMedium medium) {
  switch (medium) {
    case KvMedium::kDevice: return "GPU";
    case KvMedium::kHost: return "CPU";
    case KvMedium::kDisk: return "DISK";
  }
  return "GPU";
}

KvEventOwner kv_event_owner(KvCacheId cache, std::string_view kv_namespace) {
  KvEventOwner owner;
  KvEventExtraKey key;
  if (const std::optional<std::string> adapter = adapter_of_kv_namespace(kv_namespace)) {
    owner.lora_name = *adapter;
    key.emplace_back(*adapter);
    if (kv_namespace.starts_with(kActivatedPrefix)) {  // "alora/NAME@S": the branch from invocation start S
      const std::string_view start = kv_namespace.substr(kv_namespace.rfind('@') + 1);
      key.emplace_back(std::string("activated"));
      int64_t invocation_start = 0;
      std::from_chars(start.data(), start.data() + start.size(), invocation_start);  // digits (adapter_of_kv_namespace)
      key.emplace_back(invocation_start);
    } else if (cache == KvCacheId::kResidual) {
      key.emplace_back(std::string("forked"));
    }
  } else if (kv_namespace == kForkedBaseKvNamespace) {
    key.emplace_back(std::string("forked"));
  } else if (kv_namespace != kBaseKvNamespace) {
    key.emplace_back(std::string(kv_namespace));  // not a namespace of kv_key.h: named as it is
  }
  if (cache == KvCacheId::kResidual) key.emplace_back(std::string("residual"));
  if (!key.empty()) owner.extra_key = std::move(key);
  return owner;
}

void KvEventBatcher::block_stored(const KvStoredBlock& block) {
  const uint64_t hash = kv_event_block_hash(block.hash);
  const std::optional<uint64_t> parent =
      block.parent_hash.is_zero() ? std::nullopt : std::optional(kv_event_block_hash(block.parent_hash));
  KvEventOwner owner = kv_event_owner(block.cache, block.kv_namespace);
  const auto block_size = static_cast<int32_t>(block.tokens.size());
  if (!events_.empty()) {
    Event& last = events_.back();
    if (last.kind == Event::Kind::kStored && last.cache == block.cache && last.medium == block.medium &&
        last.block_size == block_size && parent == last.block_hashes.back() && last.owner == owner) {
      last.block_hashes.push_back(hash);  // the next block of the same chain
      last.token_ids.insert(last.token_ids.end(), block.tokens.begin(), block.tokens.end());
      return;
    }
  }
  Event event;
  event.kind = Event::Kind::kStored;
  event.cache = block.cache;
  event.medium = block.medium;
  event.block_hashes.push_back(hash);
  event.parent_block_hash = parent;
  event.token_ids.assign(block.tokens.begin(), block.tokens.end());
  event.block_size = block_size;
  event.owner = std::move(owner);
  events_.push_back(std::move(event));
}

void KvEventBatcher::block_removed(KvCacheId cache, KvMedium medium, const KvBlockHash& hash) {
  if (!events_.empty()) {
    Event& last = events_.back();
    if (last.kind == Event::Kind::kRemoved && last.cache == cache && last.medium == medium) {
      last.block_hashes.push_back(kv_event_block_hash(hash));
      return;
    }
  }
  Event event;
  event.kind = Event::Kind::kRemoved;
  event.cache = cache;
  event.medium = medium;
  event.block_hashes.push_back(kv_event_block_hash(hash));
  events_.push_back(std::move(event));
}

void KvEventBatcher::all_blocks_cleared() {
  events_.clear();  // whatever they said is void now
  Event event;
  event.kind = Event::Kind::kCleared;
  events_.push_back(std::move(event));
}

std::string KvEventBatcher::take_batch(double timestamp) {
  MsgpackWriter out;
  out.array(3);
  out.float64(timestamp);
  out.array(static_cast<uint32_t>(events_.size()));
  for (const Event& event : events_) {
    switch (event.kind) {
      case Event::Kind::kStored: {
        const bool with_extra_keys = event.owner.extra_key.has_value();
        out.array(with_extra_keys ? 9 : 8);
        out.string("BlockStored");
        out.array(static_cast<uint32_t>(event.block_hashes.size()));
        for (uint64_t hash : event.block_hashes) out.unsigned_integer(hash);
        if (event.parent_block_hash) out.unsigned_integer(*event.parent_block_hash);
        else out.nil();
        out.array(static_cast<uint32_t>(event.token_ids.size()));
        for (int32_t token : event.token_ids) out.integer(token);
        out.integer(event.block_size);
        out.nil();  // lora_id
        out.string(kv_event_medium_name(event.medium));
        if (event.owner.lora_name) out.string(*event.owner.lora_name);
        else out.nil();
        if (with_extra_keys) {
          out.array(static_cast<uint32_t>(event.block_hashes.size()));
          for (size_t i = 0; i < event.block_hashes.size(); ++i) write_extra_key(out, *event.owner.extra_key);
        }
        break;
      }
      case Event::Kind::kRemoved:
        out.array(3);
        out.string("BlockRemoved");
        out.array(static_cast<uint32_t>(event.block_hashes.size()));
        for (uint64_t hash : event.block_hashes) out.unsigned_integer(hash);
        out.string(kv_event_medium_name(event.medium));
        break;
      case Event::Kind::kCleared:
        out.array(1);
        out.string("AllBlocksCleared");
        break;
    }
  }
  out.integer(0);  // data_parallel_rank: one engine per server
  events_.clear();
  return out.take();
}

}  // namespace loom
