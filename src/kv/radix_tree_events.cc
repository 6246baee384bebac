// RadixTree: KV events (kv/kv_event_sink.h). Each node remembers what the sink
// was told it holds; announce() compares that with the node's tier and state
// now, so every state change only has to call it once, whatever it changed.
#include <fmt/format.h>

#include "kv/radix_tree.h"
#include "util/error.h"

namespace loom {

namespace {

// Where a request could use the node's K/V from now (see kv_event_sink.h).
bool usable_on_device(const RadixNode* node) { return node->tier == KvTier::kDevice; }
bool usable_on_host(const RadixNode* node) {
  return node->host_block_id >= 0 && node->state != KvNodeState::kOffloading;  // an offload's copy is not written yet
}

}  // namespace

void RadixTree::set_event_sink(KvEventSink* sink, KvCacheId cache) {
  LOOM_CHECK(num_nodes_ == 0 && (sink == nullptr || hasher_));
  sink_ = sink;
  sink_cache_ = cache;
}

void RadixTree::announce(RadixNode* node) {
  if (sink_ == nullptr) return;
  const auto tell = [&](KvMedium medium, bool now, bool& announced) {
    if (now == announced) return;
    announced = now;
    if (!now) {
      sink_->block_removed(sink_cache_, medium, node->content_hash);
      return;
    }
    const KvBlockHash parent = node->parent->is_root() ? KvBlockHash{} : node->parent->content_hash;
    sink_->block_stored(KvStoredBlock{sink_cache_, medium, node->content_hash, parent, node->kv_namespace, node->tokens});
  };
  // Device first: a block adopted over its host copy is announced where requests find it first.
  tell(KvMedium::kDevice, usable_on_device(node), node->announced_on_device);
  tell(KvMedium::kHost, usable_on_host(node), node->announced_on_host);
}

void RadixTree::announce_removal(RadixNode* node) {
  if (sink_ == nullptr) return;
  if (node->announced_on_device) sink_->block_removed(sink_cache_, KvMedium::kDevice, node->content_hash);
  if (node->announced_on_host) sink_->block_removed(sink_cache_, KvMedium::kHost, node->content_hash);
  node->announced_on_device = node->announced_on_host = false;
}

void RadixTree::announce_on_disk(const RadixNode* node) {
  if (sink_ == nullptr) return;
  const KvBlockHash parent = node->parent->is_root() ? KvBlockHash{} : node->parent->content_hash;
  sink_->block_stored(KvStoredBlock{sink_cache_, KvMedium::kDisk, node->content_hash, parent, node->kv_namespace,
                                    node->tokens});
}

void RadixTree::announce_disk_removal(const KvBlockHash& hash) {
  if (sink_ != nullptr) sink_->block_removed(sink_cache_, KvMedium::kDisk, hash);
}

std::string RadixTree::event_error(const RadixNode* node) const {
  if (sink_ == nullptr) return {};
  if (node->announced_on_device == usable_on_device(node) && node->announced_on_host == usable_on_host(node)) return {};
  return fmt::format("node {} (block {}, host block {}) was announced as on device {} / host {}", node->node_id,
                     node->block_id, node->host_block_id, node->announced_on_device, node->announced_on_host);
}

}  // namespace loom
