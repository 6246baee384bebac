#include "engine/kv_pools.h"

#include <algorithm>
#include <limits>

#include <spdlog/spdlog.h>

#include "engine/kv_identity.h"

namespace loom {

class KvPools::StoreDirectory : public KvBlockDirectory {
 public:
  explicit StoreDirectory(DiskKvStore& store) : store_(store) {}
  bool contains(const KvBlockHash& hash) override { return store_.contains(hash); }
  bool is_persistent() const override { return store_.is_persistent(); }

 private:
  DiskKvStore& store_;
};

KvPools::KvPools(Backend& backend, const EngineConfig& config, const KvBlockHash& model_identity,
                 KvEventSink* events)
    : backend_(backend), config_(config), kv_bytes_per_block_(backend.kv_bytes_per_token() * config.block_size),
      model_identity_(model_identity), events_(events) {
  if (config_.disk_kv_path.empty() && !config_.kv_store) return;
  if (config_.host_kv_cache_bytes <= 0 && config_.num_host_kv_blocks <= 0)
    throw Error(ErrorKind::kInvalidArgument, "a disk KV tier needs a host KV tier to stage its blocks",
                "add --host-kv-memory BYTES");
  disk_store_ = config_.kv_store ? config_.kv_store : std::shared_ptr<DiskKvStore>(open_disk_tier(config_));
  disk_directory_ = std::make_unique<StoreDirectory>(*disk_store_);
}

std::unique_ptr<DiskKvStore> open_disk_tier(const EngineConfig& config) {
  if (config.disk_kv_bytes <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("a disk KV tier at {} needs its size cap", config.disk_kv_path),
                "add --disk-kv-bytes BYTES");
  DiskKvStoreConfig store;
  store.directory = config.disk_kv_path;
  store.capacity_bytes = config.disk_kv_bytes;
  store.warm_start = config.disk_kv_warm_start;
  store.read_bandwidth_bytes_per_second = config.disk_kv_read_bandwidth;
  std::unique_ptr<DiskKvStore> opened = DiskKvStore::open(store);
  const DiskKvStoreStats stats = opened->stats();
  spdlog::info("KV disk tier at {}: cap {:.1f} MiB{}", config.disk_kv_path,
               static_cast<double>(config.disk_kv_bytes) / (1 << 20),
               config.disk_kv_warm_start ? fmt::format(", warm start: {} blocks ({:.1f} MiB) found", stats.num_blocks,
                                                        static_cast<double>(stats.num_bytes) / (1 << 20))
                                          : "");
  return opened;
}

KvPools::~KvPools() {
  transfers_.reset();  // its copies read and write the store and the pools
}

KvBlockHash KvPools::namespace_salt(const std::string& kv_namespace) const {
  const KvBlockHash spelling = hash_string(kv_namespace);
  const std::optional<std::string> adapter = adapter_of_kv_namespace(kv_namespace);
  if (!adapter) return spelling;
  std::lock_guard lock(naming_mutex_);
  auto it = adapter_identities_.find(*adapter);
  return hash_combine(spelling, it == adapter_identities_.end() ? KvBlockHash{} : it->second);
}

void KvPools::set_adapter_identity(const std::string& adapter_name, const KvBlockHash& fingerprint) {
  std::lock_guard lock(naming_mutex_);
  adapter_identities_[adapter_name] = fingerprint;
}

void KvPools::forget_adapter_identity(const std::string& adapter_name) {
  std::lock_guard lock(naming_mutex_);
  adapter_identities_.erase(adapter_name);
}

std::vector<KvBlockName> KvPools::block_names(const RequestKvKeys& keys, std::span<const int32_t> tokens) const {
  PerKvCache<KvBlockHash> salts;
  PerKvCache<int64_t> block_bytes;
  {
    std::lock_guard lock(naming_mutex_);
    salts = cache_salts_;
    block_bytes = cache_block_bytes_;
  }
  std::vector<KvBlockName> names;
  const size_t block_size = static_cast<size_t>(config_.block_size);
  for (KvCacheId id : {KvCacheId::kMain, KvCacheId::kResidual}) {
    if (!keys.uses(id) || salts[id].is_zero()) continue;
    const KvKey key = keys.key_in(id);
    KvBlockHash parent = salts[id];
    for (size_t i = 0; i + block_size <= tokens.size(); i += block_size) {
      parent = chain_block_hash(parent, namespace_salt(key.namespace_of_block(static_cast<int32_t>(i / block_size))),
                                tokens.subspan(i, block_size));
      names.push_back({parent, block_bytes[id]});
    }
  }
  return names;
}

KvPoolSizing KvPools::initial_sizing() const {
  int64_t residual_bytes = config_.residual_kv_cache_bytes;
  if (residual_bytes < 0) residual_bytes = config_.default_sharing == KvSharing::kForked ? config_.kv_cache_bytes / 8 : 0;
  return {residual_bytes > 0, residual_bytes, config_.max_lora_rank > 0 ? config_.max_lora_rank : kMinAutoLoraRank};
}

KvPoolLayout KvPools::layout(const KvPoolSizing& sizing) const {
  const int32_t block_size = config_.block_size;
  KvPoolLayout layout;
  if (sizing.with_residual) {
    layout.residual_max_rank = sizing.max_rank;
    layout.residual_bytes_per_block = backend_.residual_bytes_per_token(sizing.max_rank) * block_size;
    if (layout.residual_bytes_per_block <= 0)
      backend_.allocate_residual_cache({0, block_size, sizing.max_rank});  // throws: unsupported
    layout.num_residual_blocks =
        config_.num_residual_kv_blocks > 0
            ? config_.num_residual_kv_blocks
            : static_cast<int32_t>(std::min<int64_t>(sizing.residual_bytes / layout.residual_bytes_per_block, 1 << 30));
    if (layout.num_residual_blocks <= 0)
      throw Error(ErrorKind::kCapacity,
                  fmt::format("a forked residual cache of {} bytes holds no block ({} bytes each at rank {})",
                              sizing.residual_bytes, layout.residual_bytes_per_block, sizing.max_rank),
                  "raise --residual-kv-cache-memory");
  }
  layout.num_blocks = config_.num_kv_blocks;
  if (layout.num_blocks <= 0) {
    const int64_t main_bytes =
        config_.kv_cache_bytes - static_cast<int64_t>(layout.num_residual_blocks) * layout.residual_bytes_per_block;
    const int64_t blocks = kv_bytes_per_block_ > 0 ? main_bytes / kv_bytes_per_block_ : 0;
    layout.num_blocks = static_cast<int32_t>(std::clamp<int64_t>(blocks, 0, 1 << 30));
  }
  if (layout.num_blocks <= 0)
    throw Error(ErrorKind::kCapacity,
                fmt::format("a KV cache of {} bytes holds no block{}", config_.kv_cache_bytes,
                            sizing.with_residual ? " beside the forked residual cache" : ""),
                "raise the KV cache size");
  return layout;
}

void KvPools::allocate(const KvPoolLayout& layout) {
  const int32_t block_size = config_.block_size;
  const bool with_residual = layout.num_residual_blocks > 0;
  // Copies in flight read and write the pools.
  drain_transfers();
  transfers_.reset();
  caches_.reset();
  if (events_ != nullptr) events_->all_blocks_cleared();
  layout_in_use_.reset();
  backend_.allocate_kv_cache({layout.num_blocks, block_size});
  if (with_residual) backend_.allocate_residual_cache({layout.num_residual_blocks, block_size, layout.residual_max_rank});
  caches_ = std::make_unique<KvCacheGroup>(layout.num_blocks, layout.num_residual_blocks, block_size);
  num_kv_blocks_ = layout.num_blocks;
  num_residual_kv_blocks_ = layout.num_residual_blocks;
  residual_max_rank_ = with_residual ? layout.residual_max_rank : 0;
  residual_bytes_per_block_ = with_residual ? layout.residual_bytes_per_block : 0;
  try {
    setup_block_names();
    setup_host_tier(layout);
  } catch (...) {
    caches_.reset();
    throw;
  }
  layout_in_use_ = layout;
}

std::optional<KvPoolSizing> KvPools::sizing_for_forked_adapter(const std::string& name, int32_t kv_rank,
                                                               int32_t max_loaded_kv_rank,
                                                               bool any_request_admitted) const {
  const std::string rank_hint = "restart the server with --max-lora-rank >= " + std::to_string(kv_rank) +
                                ", or load the adapter with another kv_sharing mode";
  if (config_.max_lora_rank > 0 && kv_rank > config_.max_lora_rank)
    throw Error(ErrorKind::kCapacity,
                fmt::format("adapter '{}' has k/v LoRA rank {}, over the forked residual cache's max rank {}", name,
                            kv_rank, config_.max_lora_rank),
                rank_hint);
  const bool has_pool = caches_ && caches_->has(KvCacheId::kResidual);
  if (has_pool && kv_rank <= residual_max_rank_.load()) return std::nullopt;
  if (!has_pool && config_.residual_kv_cache_bytes == 0)
    throw Error(ErrorKind::kCapacity,
                fmt::format("adapter '{}' needs a forked residual cache and the server has none "
                            "(residual KV cache memory 0)",
                            name),
                "start the server with --residual-kv-cache-memory BYTES, or load the adapter with another kv_sharing");
  if (any_request_admitted)
    throw Error(ErrorKind::kCapacity,
                has_pool ? fmt::format("adapter '{}' has k/v LoRA rank {}, over the forked residual cache's max rank "
                                       "{} (fixed once requests arrived)",
                                       name, kv_rank, residual_max_rank_.load())
                         : fmt::format("adapter '{}' needs a forked residual cache, and the server made none at start",
                                       name),
                has_pool ? rank_hint
                         : "load forked adapters at start (--lora NAME=PATH:forked), or start the server with "
                           "--residual-kv-cache-memory BYTES or --default-sharing forked");
  // Still "at start": size the rCache for the largest k/v rank loaded so far.
  const int32_t max_rank =
      config_.max_lora_rank > 0 ? config_.max_lora_rank : std::max({kMinAutoLoraRank, kv_rank, max_loaded_kv_rank});
  const int64_t residual_bytes =
      config_.residual_kv_cache_bytes >= 0 ? config_.residual_kv_cache_bytes : config_.kv_cache_bytes / 8;
  return KvPoolSizing{true, residual_bytes, max_rank};
}

KvBlockCounts KvPools::num_host_blocks(const KvPoolLayout& layout) const {
  KvBlockCounts num_blocks;
  if (config_.host_kv_cache_bytes <= 0 && config_.num_host_kv_blocks <= 0) return num_blocks;
  const bool residual_tier = layout.num_residual_blocks > 0 && backend_.capabilities().residual_host_kv_tier;
  const auto clamp_blocks = [](int64_t blocks) {
    return static_cast<int32_t>(std::clamp<int64_t>(blocks, 0, 1 << 30));
  };
  if (config_.num_host_kv_blocks > 0) {
    num_blocks[KvCacheId::kMain] = config_.num_host_kv_blocks;
    // host_residual_kv_cache_bytes == 0 means no rCache host tier here too (as below, and as documented).
    if (residual_tier && config_.host_residual_kv_cache_bytes != 0)
      num_blocks[KvCacheId::kResidual] =
          config_.num_host_residual_kv_blocks > 0
              ? config_.num_host_residual_kv_blocks
              : clamp_blocks(static_cast<int64_t>(config_.num_host_kv_blocks) * layout.num_residual_blocks /
                             layout.num_blocks);
    return num_blocks;
  }
  const int64_t budget = config_.host_kv_cache_bytes;
  if (config_.host_residual_kv_cache_bytes > budget)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("the rCache's host tier ({} bytes) is over the host KV tier ({} bytes) it is taken from",
                            config_.host_residual_kv_cache_bytes, budget),
                "lower --host-residual-kv-memory or raise --host-kv-memory");
  int64_t residual_bytes = 0;
  if (residual_tier) {
    const auto main_device = static_cast<double>(layout.num_blocks) * static_cast<double>(kv_bytes_per_block_);
    const double residual_device =
        static_cast<double>(layout.num_residual_blocks) * static_cast<double>(layout.residual_bytes_per_block);
    residual_bytes =
        config_.host_residual_kv_cache_bytes >= 0
            ? config_.host_residual_kv_cache_bytes
            : static_cast<int64_t>(static_cast<double>(budget) * residual_device / (main_device + residual_device));
    num_blocks[KvCacheId::kResidual] = clamp_blocks(residual_bytes / layout.residual_bytes_per_block);
    if (config_.host_residual_kv_cache_bytes > 0 && num_blocks[KvCacheId::kResidual] == 0)
      throw Error(ErrorKind::kCapacity,
                  fmt::format("an rCache host tier of {} bytes holds no block ({} bytes each)", residual_bytes,
                              layout.residual_bytes_per_block),
                  "raise --host-residual-kv-memory");
  }
  if (kv_bytes_per_block_ > 0)
    num_blocks[KvCacheId::kMain] = clamp_blocks((budget - residual_bytes) / kv_bytes_per_block_);
  if (num_blocks[KvCacheId::kMain] == 0)
    throw Error(ErrorKind::kCapacity,
                fmt::format("a host KV tier of {} bytes{} holds no block ({} bytes each)", budget - residual_bytes,
                            residual_bytes > 0 ? " (beside the rCache's share)" : "", kv_bytes_per_block_),
                residual_bytes > 0 ? "raise --host-kv-memory or lower --host-residual-kv-memory"
                                   : "raise --host-kv-memory");
  return num_blocks;
}

void KvPools::setup_block_names() {
  {
    std::lock_guard lock(naming_mutex_);
    cache_salts_ = {};
    cache_block_bytes_ = {};
  }
  if (!names_blocks()) return;
  caches_->for_each([&](KvCacheId id, KvCacheManager& member) {
    // The chain's start: the model, the member's layout and its name (kv_cache_layout_spelling).
    const KvBlockHash salt = kv_cache_salt(
        model_identity_,
        kv_cache_layout_spelling({config_.block_size, bytes_per_block(id), backend_.capabilities().tensor_parallel_size,
                                  config_.kv_cache_dtype}),
        kv_cache_name(id));
    member.enable_block_hashes({salt, [this](const std::string& kv_namespace) { return namespace_salt(kv_namespace); }});
    std::lock_guard lock(naming_mutex_);
    cache_salts_[id] = salt;
    cache_block_bytes_[id] = bytes_per_block(id);
  });
  if (events_ != nullptr) caches_->set_event_sink(events_);
}

void KvPools::setup_host_tier(const KvPoolLayout& layout) {
  transfers_.reset();
  const KvBlockCounts num_blocks = num_host_blocks(layout);
  if (num_blocks == KvBlockCounts{}) return;
  caches_->for_each([&](KvCacheId id, KvCacheManager&) {
    if (num_blocks[id] == 0) return;
    backend_.allocate_host_kv_cache(kv_pool_kind(id), num_blocks[id]);
    spdlog::info("KV host tier of the {} cache: {} blocks ({:.1f} MiB)", kv_cache_name(id), num_blocks[id],
                 static_cast<double>(num_blocks[id]) * static_cast<double>(bytes_per_block(id)) / (1 << 20));
  });
  caches_->enable_host_tier(num_blocks);
  if (disk_store_) {
    caches_->for_each([&](KvCacheId, KvCacheManager& member) {
      if (member.host_tier() != nullptr) member.enable_disk_tier({disk_directory_.get()});
    });
  }
  Backend* backend = &backend_;
  DiskKvStore* store = disk_store_.get();
  auto copy = [backend, store](const KvTransferWorker::Transfer& planned) {
    const KvCacheManager::Transfer& transfer = planned.transfer;
    const KvPoolKind pool = kv_pool_kind(planned.cache);
    using Kind = KvCacheManager::Transfer::Kind;
    if (transfer.kind == Kind::kDiskRead) {
      std::vector<std::span<std::byte>> destinations;
      for (int32_t host_block : transfer.host_block_ids) destinations.push_back(backend->host_kv_block(pool, host_block));
      const std::vector<bool> ok = store->read_blocks(transfer.block_hashes, destinations);
      const auto num_ok = std::count(ok.begin(), ok.end(), true);
      if (num_ok != static_cast<ptrdiff_t>(ok.size()))
        fail(ErrorKind::kFormat, "{} of {} blocks did not read back whole from the disk tier", ok.size() - num_ok,
             ok.size());
      return;
    }
    const auto direction =
        transfer.kind == Kind::kOffload ? KvCopyDirection::kDeviceToHost : KvCopyDirection::kHostToDevice;
    backend->copy_kv_blocks(pool, direction, transfer.device_block_ids, transfer.host_block_ids);
    for (size_t i = 0; i < transfer.block_hashes.size(); ++i)  // write-through (offloads with a disk tier)
      if (!transfer.block_hashes[i].is_zero())
        store->write_block(transfer.block_hashes[i], backend->host_kv_block(pool, transfer.host_block_ids[i]));
  };
  transfers_ = std::make_unique<KvTransferWorker>(copy, std::max(config_.max_queued_kv_transfers, 1));
}

bool KvPools::has_transfers_in_flight() const {
  return caches_ != nullptr && caches_->num_transfers_in_flight() > 0;
}

void KvPools::pump_transfers() {
  if (!transfers_) return;
  if (disk_store_ && events_ != nullptr) {  // what the store trimmed: announced as gone from disk
    const std::vector<KvBlockHash> removed = disk_store_->take_removed_blocks();
    if (!removed.empty()) caches_->disk_blocks_removed(removed);
  }
  for (const KvTransferWorker::Finished& finished : transfers_->take_finished())
    caches_->finish_transfer(finished.cache, finished.transfer_id, finished.succeeded);
  for (KvCacheGroup::MemberTransfer& planned : caches_->take_transfers()) {
    const KvCacheId cache = planned.cache;
    const int64_t id = planned.transfer.id;
    if (!transfers_->submit(std::move(planned))) caches_->finish_transfer(cache, id, false);
  }
}

void KvPools::drain_transfers() {
  if (!transfers_) return;
  while (has_transfers_in_flight()) {
    pump_transfers();
    transfers_->wait_idle();
    pump_transfers();
  }
}

void KvPools::wait_for_transfer() {
  if (!transfers_) return;
  transfers_->wait_for_finished();
  pump_transfers();
}

PrefetchRequest KvPools::prefetch_request(const std::map<std::string, int32_t>& steps_by_agent_key) const {
  PrefetchRequest prefetch;
  if (!transfers_ || config_.prefetch_agents <= 0 || steps_by_agent_key.empty()) return prefetch;
  // Agents about to run, nearest first (steps 0 run now: their requests load on demand).
  std::vector<std::pair<int32_t, const std::string*>> next;
  for (const auto& [agent_key, steps] : steps_by_agent_key)
    if (steps >= 1 && steps != kStepsFar) next.emplace_back(steps, &agent_key);
  std::sort(next.begin(), next.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first < b.first : *a.second < *b.second; });
  const auto num_agents = std::min<size_t>(static_cast<size_t>(config_.prefetch_agents), next.size());
  for (size_t i = 0; i < num_agents; ++i) prefetch.agent_keys.push_back(*next[i].second);
  prefetch.max_bytes = config_.prefetch_max_bytes > 0 ? config_.prefetch_max_bytes : std::numeric_limits<int64_t>::max();
  for (KvCacheId id : kAllKvCaches) prefetch.bytes_per_block[id] = bytes_per_block(id);
  return prefetch;
}

int32_t KvPools::drop_adapter_kv(const std::string& adapter_name) {
  drain_transfers();  // the managers drop nothing a copy still pins
  return caches_->drop_namespaces(
      [&](const std::string& kv_namespace) { return kv_namespace_belongs_to_adapter(kv_namespace, adapter_name); });
}

}  // namespace loom
