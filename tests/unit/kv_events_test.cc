// KV events (kv/kv_event_sink.h) through the KV cache manager with a
// recording sink: the exact stored / removed sequence of commits, device
// eviction (to the host, or gone), host eviction, loads, failed loads, disk
// reads, adoption, namespace drops and the residual member; then vLLM's wire
// encoding of a batch (kvevents/kv_event_batch.h), byte for byte.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kv/kv_cache_group.h"
#include "kv/kv_cache_manager.h"
#include "kv_test_tokens.h"
#include "kvevents/kv_event_batch.h"
#include "kvevents/msgpack_writer.h"

namespace loom {
namespace {

constexpr int32_t kBlock = test::kKvTestBlock;
using Tokens = test::KvTestTokens;
using test::block_tokens;
using test::concat;
using Events = std::vector<std::string>;
using Reason = KvCacheManager::LoadReason;

// Events as "+GPU base@8<4": stored (+) or removed (-), the medium, the
// residual member's "r:", the namespace, @ the block's first token, and after
// "<" its parent's first token (empty: a chain's first block). Blocks are
// labelled by what was stored under their hash, so a removal of a block never
// announced fails the test.
class RecordingSink : public KvEventSink {
 public:
  void block_stored(const KvStoredBlock& block) override {
    EXPECT_EQ(block.tokens.size(), static_cast<size_t>(kBlock));
    const std::string label = fmt::format("{}{}@{}", block.cache == KvCacheId::kResidual ? "r:" : "",
                                          block.kv_namespace, block.tokens[0]);
    const auto known = labels.find(block.hash);
    EXPECT_TRUE(known == labels.end() || known->second == label) << label;
    labels[block.hash] = label;
    std::string parent;
    if (!block.parent_hash.is_zero()) {
      EXPECT_EQ(labels.count(block.parent_hash), 1u) << "parent of " << label << " never stored";
      const std::string& parent_label = labels[block.parent_hash];
      parent = parent_label.substr(parent_label.rfind('@') + 1);
    }
    events.push_back(fmt::format("+{} {}<{}", medium(block.medium), label, parent));
    held.insert({block.medium, block.hash});
  }
  void block_removed(KvCacheId, KvMedium medium_removed, const KvBlockHash& hash) override {
    EXPECT_EQ(labels.count(hash), 1u) << "removed a block never stored";
    EXPECT_EQ(held.erase({medium_removed, hash}), 1u) << labels[hash] << " removed from where it is not";
    events.push_back(fmt::format("-{} {}", medium(medium_removed), labels[hash]));
  }
  void all_blocks_cleared() override { events.push_back("cleared"); }

  // The events since the last call.
  Events take() { return std::exchange(events, {}); }

  std::map<KvBlockHash, std::string> labels;
  std::set<std::pair<KvMedium, KvBlockHash>> held;  // what the sink believes each medium holds
  Events events;

 private:
  static const char* medium(KvMedium medium) {
    return medium == KvMedium::kDevice ? "GPU" : medium == KvMedium::kHost ? "CPU" : "DISK";
  }
};

KvBlockNaming naming(const std::string& salt = "cache") {
  return {hash_string(salt), [](const std::string& ns) { return hash_string(ns); }};
}

class EventCache {
 public:
  EventCache(int32_t num_blocks, int32_t num_host_blocks) : kv(num_blocks, kBlock) {
    if (num_host_blocks > 0) kv.enable_host_tier(num_host_blocks);
    kv.enable_block_hashes(naming());
    kv.set_event_sink(&sink, KvCacheId::kMain);
  }
  KvLease compute(const KvKey& key, const Tokens& tokens) {
    KvLease lease = kv.lock_prefix(key, tokens);
    EXPECT_TRUE(kv.allocate(lease, static_cast<int32_t>(tokens.size()) / kBlock - lease.num_blocks()));
    kv.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
    EXPECT_EQ(kv.integrity_error(), "");
    return lease;
  }
  void run(const Tokens& tokens, const KvKey& key = KvKey::single("base")) { compute(key, tokens).release(); }
  void finish_all(bool succeeded = true) {
    for (const auto& transfer : kv.take_transfers()) kv.finish_transfer(transfer.id, succeeded);
    EXPECT_EQ(kv.num_transfers_in_flight(), 0);
    EXPECT_EQ(kv.integrity_error(), "");
  }
  // What the sink believes the device tier holds of `tokens`' chain: the
  // leading blocks whose nodes it heard of on the device.
  int32_t num_device_blocks_announced(const Tokens& tokens, const KvKey& key = KvKey::single("base")) const {
    int32_t count = 0;
    for (const RadixNode* node : kv.tree().match_any_tier(key, tokens)) {
      if (sink.held.count({KvMedium::kDevice, node->content_hash}) == 0) break;
      ++count;
    }
    return count;
  }

  RecordingSink sink;
  KvCacheManager kv;
};

TEST(KvEvents, CommitsStoreNewBlocksOnTheDeviceOnceEach) {
  EventCache cache(16, 0);
  const Tokens shared = block_tokens(0, 2);
  cache.run(concat(shared, block_tokens(100, 1)));
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@0<", "+GPU base@4<0", "+GPU base@100<4"}));
  // A second prompt reuses the first two blocks: only its own block is new.
  cache.run(concat(shared, block_tokens(200, 1)));
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@200<4"}));
  // The hashes are the nodes' content hashes, chained from the parent's.
  const Tokens tokens = concat(shared, block_tokens(200, 1));
  const auto path = cache.kv.tree().match_any_tier(KvKey::single("base"), tokens);
  ASSERT_EQ(path.size(), 3u);
  for (const RadixNode* node : path) EXPECT_EQ(cache.sink.held.count({KvMedium::kDevice, node->content_hash}), 1u);
  EXPECT_EQ(path[1]->content_hash,
            chain_block_hash(path[0]->content_hash, hash_string("base"), std::span<const KvTokenId>(tokens).subspan(4, 4)));
  // Two requests computing the same blocks at once: the second's copies are
  // swapped for the tree's, and nothing new is stored.
  const Tokens twice = block_tokens(300, 2);
  KvLease first = cache.kv.lock_prefix(KvKey::single("base"), twice);
  KvLease second = cache.kv.lock_prefix(KvKey::single("base"), twice);
  ASSERT_TRUE(cache.kv.allocate(first, 2));
  ASSERT_TRUE(cache.kv.allocate(second, 2));
  cache.kv.commit(first, twice, 8);
  cache.kv.commit(second, twice, 8);
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@300<", "+GPU base@304<300"}));
}

TEST(KvEvents, DeviceEvictionWithoutAHostTierRemovesBlocksLeavesFirst) {
  EventCache cache(4, 0);
  cache.run(block_tokens(0, 2));
  cache.run(block_tokens(100, 2));
  cache.sink.take();
  cache.run(block_tokens(200, 2));  // needs two blocks: the LRU chain goes, leaf first
  EXPECT_EQ(cache.sink.take(), (Events{"-GPU base@4", "-GPU base@0", "+GPU base@200<", "+GPU base@204<200"}));
  EXPECT_EQ(cache.kv.evict_all_cached(), 4);
  EXPECT_EQ(cache.sink.take(), (Events{"-GPU base@104", "-GPU base@100", "-GPU base@204", "-GPU base@200"}));
  EXPECT_TRUE(cache.sink.held.empty());
}

TEST(KvEvents, BackupsStoreOnTheHostWhenTheCopyEndsAndEvictionMovesBlocksThere) {
  EventCache cache(8, 8);
  const Tokens tokens = block_tokens(0, 3);
  cache.run(tokens);
  // Offloading: stored on the device only, until the copy has finished.
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@0<", "+GPU base@4<0", "+GPU base@8<4"}));
  cache.finish_all();
  EXPECT_EQ(cache.sink.take(), (Events{"+CPU base@0<", "+CPU base@4<0", "+CPU base@8<4"}));
  // Device eviction keeps the backed-up blocks on the host.
  EXPECT_EQ(cache.kv.evict_all_cached(), 3);
  EXPECT_EQ(cache.sink.take(), (Events{"-GPU base@8", "-GPU base@4", "-GPU base@0"}));
  EXPECT_EQ(cache.num_device_blocks_announced(tokens), 0);
  // A load: stored on the device again when it has finished.
  EXPECT_EQ(cache.kv.host_tier()->start_load(KvKey::single("base"), tokens, 8), 3);
  EXPECT_EQ(cache.sink.take(), Events{});
  cache.finish_all();
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@0<", "+GPU base@4<0", "+GPU base@8<4"}));
  EXPECT_EQ(cache.num_device_blocks_announced(tokens), 3);
  // A failed offload stores nothing on the host.
  cache.run(block_tokens(100, 1));
  cache.finish_all(false);
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@100<"}));
}

TEST(KvEvents, HostEvictionRemovesHostLeavesAndAFailedLoadItsBlocks) {
  EventCache cache(4, 2);
  cache.run(block_tokens(0, 2));
  cache.finish_all();
  cache.kv.evict_all_cached();
  cache.sink.take();
  // Another chain's backups need the host blocks: the host leaves go (leaf first).
  cache.run(block_tokens(100, 2));
  EXPECT_EQ(cache.sink.take(),
            (Events{"+GPU base@100<", "+GPU base@104<100", "-CPU base@4", "-CPU base@0"}));
  cache.finish_all();
  EXPECT_EQ(cache.sink.take(), (Events{"+CPU base@100<", "+CPU base@104<100"}));
  // A load that fails drops the host copies it read (and what hangs below them).
  cache.kv.evict_all_cached();
  cache.sink.take();
  ASSERT_EQ(cache.kv.host_tier()->start_load(KvKey::single("base"), block_tokens(100, 2), 8), 2);
  cache.finish_all(false);
  EXPECT_EQ(cache.sink.take(), (Events{"-CPU base@104", "-CPU base@100"}));
  EXPECT_TRUE(cache.sink.held.empty());
}

TEST(KvEvents, ARecomputedHostBlockIsStoredOnTheDeviceAgain) {
  EventCache cache(8, 8);
  const Tokens tokens = block_tokens(0, 2);
  cache.run(tokens);
  cache.finish_all();
  cache.kv.evict_all_cached();
  cache.sink.take();
  // A request that does not load the host copies recomputes the blocks: the
  // tree adopts its device blocks (the backups stay valid).
  KvLease lease = cache.kv.lock_prefix(KvKey::single("base"), Tokens{});
  ASSERT_TRUE(cache.kv.allocate(lease, 2));
  cache.kv.commit(lease, tokens, 8);
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@0<", "+GPU base@4<0"}));
  EXPECT_EQ(cache.sink.held.size(), 4u);  // both blocks on both tiers
}

class SetDirectory : public KvBlockDirectory {
 public:
  bool contains(const KvBlockHash& hash) override { return blocks.count(hash) != 0; }
  bool is_persistent() const override { return persistent; }
  std::set<KvBlockHash> blocks;
  bool persistent = true;
};

TEST(KvEvents, WriteThroughStoresBlocksOnDiskUntilTheStoreTrimsThem) {
  SetDirectory directory;
  EventCache cache(8, 8);
  cache.kv.enable_disk_tier({&directory});
  const Tokens tokens = block_tokens(0, 3);
  cache.run(tokens);
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@0<", "+GPU base@4<0", "+GPU base@8<4"}));
  const auto path = cache.kv.tree().match_any_tier(KvKey::single("base"), tokens);
  ASSERT_EQ(path.size(), 3u);
  // The store holds the first two blocks once the write-through ends (the third write failed).
  directory.blocks = {path[0]->content_hash, path[1]->content_hash};
  cache.finish_all();
  EXPECT_EQ(cache.sink.take(),
            (Events{"+CPU base@0<", "+CPU base@4<0", "+CPU base@8<4", "+DISK base@0<", "+DISK base@4<0"}));
  // Gone from the device and the host, the blocks stay on disk.
  const KvBlockHash first = path[0]->content_hash;
  EXPECT_EQ(cache.kv.evict_all_cached(), 3);
  cache.sink.take();
  EXPECT_EQ(cache.sink.held.count({KvMedium::kDisk, first}), 1u);
  // The store trimmed block 0 and a block this cache never announced: only block 0 is removed.
  const std::vector<KvBlockHash> trimmed = {first, hash_string("another server's block")};
  cache.kv.disk_tier()->blocks_removed(trimmed);
  EXPECT_EQ(cache.sink.take(), (Events{"-DISK base@0"}));
  cache.kv.disk_tier()->blocks_removed(trimmed);  // told twice: removed once
  EXPECT_EQ(cache.sink.take(), Events{});
}

TEST(KvEvents, ATransferBufferWithoutStorageIsNotADisk) {
  SetDirectory directory;
  directory.persistent = false;  // a disaggregated engine's buffer
  EventCache cache(8, 8);
  cache.kv.enable_disk_tier({&directory});
  const Tokens tokens = block_tokens(0, 1);
  cache.run(tokens);
  for (const RadixNode* node : cache.kv.tree().match_any_tier(KvKey::single("base"), tokens))
    directory.blocks.insert(node->content_hash);
  cache.finish_all();
  EXPECT_EQ(cache.sink.take(), (Events{"+GPU base@0<", "+CPU base@0<"}));
}

TEST(KvEvents, DiskReadsStoreBlocksOnTheHost) {
  SetDirectory directory;
  const Tokens tokens = block_tokens(0, 3);
  {  // Another process wrote the blocks (their names are the same: same salts).
    KvCacheManager writer(8, kBlock);
    writer.enable_block_hashes(naming());
    KvLease lease = writer.lock_prefix(KvKey::single("base"), tokens);
    ASSERT_TRUE(writer.allocate(lease, 3));
    writer.commit(lease, tokens, 12);
    for (const RadixNode* node : writer.tree().match_any_tier(KvKey::single("base"), tokens))
      directory.blocks.insert(node->content_hash);
  }
  RecordingSink sink;
  KvCacheManager reader(8, kBlock);
  reader.enable_host_tier(8);
  reader.enable_block_hashes(naming());
  reader.set_event_sink(&sink, KvCacheId::kMain);
  reader.enable_disk_tier({&directory});
  ASSERT_EQ(reader.disk_tier()->start_read(KvKey::single("base"), tokens, 8), 3);
  EXPECT_EQ(sink.take(), Events{});  // a read in flight stores nothing yet
  for (const auto& transfer : reader.take_transfers()) reader.finish_transfer(transfer.id, true);
  EXPECT_EQ(sink.take(), (Events{"+CPU base@0<", "+CPU base@4<0", "+CPU base@8<4"}));
  ASSERT_EQ(reader.host_tier()->start_load(KvKey::single("base"), tokens, 8), 3);
  for (const auto& transfer : reader.take_transfers()) reader.finish_transfer(transfer.id, true);
  EXPECT_EQ(sink.take(), (Events{"+GPU base@0<", "+GPU base@4<0", "+GPU base@8<4"}));
  EXPECT_EQ(reader.integrity_error(), "");
}

TEST(KvEvents, DroppingAnAdaptersNamespacesRemovesItsBlocksFromEveryTier) {
  EventCache cache(16, 16);
  const Tokens tokens = block_tokens(0, 3);
  cache.run(tokens);                                         // base
  cache.run(tokens, KvKey::single("lora/x"));                // isolated
  cache.run(tokens, activated_kv_key("x", 4, kBlock));       // base block 0, then the branch "alora/x@4"
  cache.finish_all();
  EXPECT_EQ(cache.sink.take(),
            (Events{"+GPU base@0<", "+GPU base@4<0", "+GPU base@8<4", "+GPU lora/x@0<", "+GPU lora/x@4<0",
                    "+GPU lora/x@8<4", "+GPU alora/x@4@4<0", "+GPU alora/x@4@8<4", "+CPU base@0<", "+CPU base@4<0",
                    "+CPU base@8<4", "+CPU lora/x@0<", "+CPU lora/x@4<0", "+CPU lora/x@8<4", "+CPU alora/x@4@4<0",
                    "+CPU alora/x@4@8<4"}));
  cache.kv.drop_namespaces([](const std::string& ns) { return kv_namespace_belongs_to_adapter(ns, "x"); });
  Events dropped = cache.sink.take();
  std::sort(dropped.begin(), dropped.end());
  EXPECT_EQ(dropped, (Events{"-CPU alora/x@4@4", "-CPU alora/x@4@8", "-CPU lora/x@0", "-CPU lora/x@4", "-CPU lora/x@8",
                             "-GPU alora/x@4@4", "-GPU alora/x@4@8", "-GPU lora/x@0", "-GPU lora/x@4",
                             "-GPU lora/x@8"}));
  EXPECT_EQ(cache.sink.held.size(), 6u);  // the base chain, on both tiers
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

TEST(KvEvents, TheGroupNamesEachMemberInItsEvents) {
  RecordingSink sink;
  KvCacheGroup group(8, 8, kBlock);
  group.for_each([&](KvCacheId id, KvCacheManager& member) { member.enable_block_hashes(naming(kv_cache_name(id))); });
  group.set_event_sink(&sink);
  const Tokens tokens = block_tokens(0, 2);
  RequestKvKeys keys{KvKey::single("fork"), "resid/x"};
  RequestLeases leases = group.lock_prefix(keys, tokens);
  ASSERT_TRUE(group.allocate(leases, group.num_blocks_needed(keys, leases, 8)));
  group.commit(leases, tokens, 8);
  EXPECT_EQ(sink.take(), (Events{"+GPU fork@0<", "+GPU fork@4<0", "+GPU r:resid/x@0<", "+GPU r:resid/x@4<0"}));
  leases.release();
  group.evict_all_cached();
  EXPECT_EQ(sink.take(), (Events{"-GPU fork@4", "-GPU fork@0", "-GPU r:resid/x@4", "-GPU r:resid/x@0"}));
}

TEST(KvEvents, WithoutASinkNothingIsAnnouncedAndHashesAreOptional) {
  KvCacheManager kv(4, kBlock);
  KvLease lease = kv.lock_prefix(KvKey::single("base"), block_tokens(0, 1));
  ASSERT_TRUE(kv.allocate(lease, 1));
  kv.commit(lease, block_tokens(0, 1), 4);
  EXPECT_TRUE(kv.tree().match_any_tier(KvKey::single("base"), block_tokens(0, 1))[0]->content_hash.is_zero());
  EXPECT_EQ(kv.integrity_error(), "");
}

// ---- vLLM's wire encoding (kvevents/kv_event_batch.h) ----

std::string hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

TEST(KvEventWire, MsgpackUsesTheSmallestEncodings) {
  MsgpackWriter out;
  out.array(2);
  out.unsigned_integer(127);
  out.unsigned_integer(128);
  out.unsigned_integer(65536);
  out.unsigned_integer(0xffffffffffffffffull);
  out.integer(-1);
  out.integer(-33);
  out.nil();
  out.string("GPU");
  out.float64(1.5);
  EXPECT_EQ(hex(out.bytes()), "92" "7f" "cc80" "ce00010000" "cfffffffffffffffff" "ff" "d0df" "c0" "a3475055"
                              "cb3ff8000000000000");
  MsgpackWriter long_values;
  long_values.array(16);
  long_values.string(std::string(32, 'a'));
  EXPECT_EQ(hex(long_values.bytes()).substr(0, 10), "dc0010" "d920");
}

TEST(KvEventWire, NamespacesBecomeLoraNamesAndExtraKeys) {
  using Owner = KvEventOwner;
  using Key = KvEventExtraKey;
  EXPECT_EQ(kv_event_owner(KvCacheId::kMain, "base"), (Owner{}));
  EXPECT_EQ(kv_event_owner(KvCacheId::kMain, "lora/x"), (Owner{"x", Key{std::string("x")}}));
  EXPECT_EQ(kv_event_owner(KvCacheId::kMain, "alora/x@37"),
            (Owner{"x", Key{std::string("x"), std::string("activated"), int64_t{37}}}));
  EXPECT_EQ(kv_event_owner(KvCacheId::kMain, "fork"), (Owner{std::nullopt, Key{std::string("forked")}}));
  EXPECT_EQ(kv_event_owner(KvCacheId::kResidual, "resid/x"),
            (Owner{"x", Key{std::string("x"), std::string("forked"), std::string("residual")}}));
}

TEST(KvEventWire, ABatchIsVllmsArrayEncodedKvEventBatch) {
  KvEventBatcher batcher;
  const Tokens tokens = block_tokens(1, 2);
  const KvBlockHash a{0, 5}, b{7, 300}, c{0, 9};
  batcher.block_stored({KvCacheId::kMain, KvMedium::kDevice, a, {}, "base", std::span(tokens).first(4)});
  batcher.block_stored({KvCacheId::kMain, KvMedium::kDevice, b, a, "base", std::span(tokens).subspan(4)});  // merged
  batcher.block_stored({KvCacheId::kMain, KvMedium::kHost, c, a, "lora/x", std::span(tokens).first(4)});
  batcher.block_removed(KvCacheId::kMain, KvMedium::kDevice, b);
  batcher.block_removed(KvCacheId::kMain, KvMedium::kDevice, a);  // merged
  EXPECT_EQ(batcher.num_events(), 3u);
  EXPECT_EQ(hex(batcher.take_batch(1.5)),
            "93" "cb3ff8000000000000" "93"
            // ["BlockStored", [5, 300], nil, [1..8], 4, nil, "GPU", nil]
            "98" "ab426c6f636b53746f726564" "92" "05" "cd012c" "c0" "98" "0102030405060708" "04" "c0" "a3475055" "c0"
            // ["BlockStored", [9], 5, [1..4], 4, nil, "CPU", "x", [["x"]]]
            "99" "ab426c6f636b53746f726564" "91" "09" "05" "94" "01020304" "04" "c0" "a3435055" "a178" "91" "91" "a178"
            // ["BlockRemoved", [300, 5], "GPU"]
            "93" "ac426c6f636b52656d6f766564" "92" "cd012c" "05" "a3475055"
            "00");  // data_parallel_rank
  EXPECT_TRUE(batcher.empty());
  batcher.block_stored({KvCacheId::kMain, KvMedium::kDevice, a, {}, "base", std::span(tokens).first(4)});
  batcher.all_blocks_cleared();  // voids what came before it in the batch
  EXPECT_EQ(hex(batcher.take_batch(0.0)), "93" "cb0000000000000000" "91" "91" "b0416c6c426c6f636b73436c6561726564" "00");
}

}  // namespace
}  // namespace loom
