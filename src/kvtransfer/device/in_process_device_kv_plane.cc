#include "kvtransfer/device/in_process_device_kv_plane.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unistd.h>

#include "kvtransfer/device/device_kv_runs.h"
#include "util/error.h"

namespace loom {
namespace {

bool ids_in_pool(std::span<const int32_t> ids, const KvPoolMemory& pool) {
  for (int32_t id : ids)
    if (id < 0 || id >= pool.num_blocks) return false;
  return true;
}

// Copies `layer`'s arrays of blocks sources[i] -> destinations[i] (ids into
// from / to, or, with from == nullptr, positions in `snapshot`), run by run.
// Returns the number of memcpy calls.
int64_t copy_layer(const KvPoolMemory* from, const std::byte* snapshot, const KvPoolMemory& to, int32_t layer,
                   std::span<const int32_t> sources, std::span<const int32_t> destinations) {
  const int64_t bytes = to.bytes_per_block;
  int64_t copies = 0;
  for (int32_t a = 0; a < to.arrays_per_layer; ++a) {
    const size_t array = static_cast<size_t>(layer) * to.arrays_per_layer + a;
    const std::byte* source_base =
        from ? from->arrays[array] : snapshot + static_cast<int64_t>(a) * static_cast<int64_t>(sources.size()) * bytes;
    for (const DeviceKvBlockRun& run : coalesce_block_runs(sources, destinations)) {
      std::memcpy(to.arrays[array] + run.destination * bytes, source_base + run.source * bytes,
                  static_cast<size_t>(run.count * bytes));
      ++copies;
    }
  }
  return copies;
}

// The bytes of `layer`'s arrays of blocks `ids`, array after array.
std::vector<std::byte> snapshot_layer(const KvPoolMemory& pool, int32_t layer, std::span<const int32_t> ids) {
  std::vector<std::byte> bytes(static_cast<size_t>(pool.arrays_per_layer * static_cast<int64_t>(ids.size()) *
                                                   pool.bytes_per_block));
  std::vector<int32_t> positions(ids.size());
  std::iota(positions.begin(), positions.end(), 0);
  KvPoolMemory view;  // the snapshot as a pool of ids.size() blocks per array
  view.arrays_per_layer = pool.arrays_per_layer;
  view.bytes_per_block = pool.bytes_per_block;
  view.num_blocks = static_cast<int32_t>(ids.size());
  view.arrays.assign(static_cast<size_t>(layer + 1) * pool.arrays_per_layer, nullptr);
  for (int32_t a = 0; a < pool.arrays_per_layer; ++a)
    view.arrays[static_cast<size_t>(layer) * pool.arrays_per_layer + a] =
        bytes.data() + static_cast<int64_t>(a) * view.num_blocks * pool.bytes_per_block;
  copy_layer(&pool, nullptr, view, layer, ids, positions);
  return bytes;
}

}  // namespace

void InProcessDeviceKvFabric::kill(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = endpoints_.find(name);
  if (it == endpoints_.end()) return;
  it->second.alive = false;
  for (auto& [other, endpoint] : endpoints_)
    for (auto& [id, incoming] : endpoint.incoming)
      if (incoming.peer == name) incoming.assembly.fail("peer " + name + " died");
}

void InProcessDeviceKvFabric::hold_deliveries(bool hold) {
  std::lock_guard<std::mutex> lock(mutex_);
  hold_ = hold;
}

size_t InProcessDeviceKvFabric::num_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_.size();
}

void InProcessDeviceKvFabric::deliver_held(std::span<const size_t> order) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<bool> delivered(held_.size(), false);
  for (size_t index : order) {
    LOOM_CHECK(index < held_.size() && !delivered[index]);
    land(held_[index], nullptr, {}, {});
    delivered[index] = true;
  }
  std::vector<Held> rest;
  for (size_t i = 0; i < held_.size(); ++i)
    if (!delivered[i]) rest.push_back(std::move(held_[i]));
  held_ = std::move(rest);
}

void InProcessDeviceKvFabric::drop_held() {
  std::lock_guard<std::mutex> lock(mutex_);
  held_.clear();
}

void InProcessDeviceKvFabric::remote_writes(bool on) {
  std::lock_guard<std::mutex> lock(mutex_);
  remote_writes_ = on;
}

int64_t InProcessDeviceKvFabric::num_late_writes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_late_writes_;
}

bool InProcessDeviceKvFabric::may_still_write(const std::string& receiver, DeviceKvTransferId id) const {
  for (const auto& [name, endpoint] : endpoints_) {
    if (!endpoint.alive) continue;  // a dead sender writes nothing more
    auto outgoing = endpoint.outgoing.find(id);
    if (outgoing == endpoint.outgoing.end() || outgoing->second.peer != receiver) continue;
    if (!outgoing->second.ended) return true;
    for (const Held& piece : held_)
      if (piece.sender == name && piece.id == id) return true;
  }
  return false;
}

int64_t InProcessDeviceKvFabric::num_copies() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_copies_;
}

int64_t InProcessDeviceKvFabric::num_pieces() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_pieces_;
}

bool InProcessDeviceKvFabric::land(const Held& piece, const Endpoint* source, std::span<const int32_t> main_sources,
                                   std::span<const int32_t> residual_sources) {
  auto sender = endpoints_.find(piece.sender);
  if (sender == endpoints_.end() || !sender->second.alive) return false;
  auto outgoing = sender->second.outgoing.find(piece.id);
  if (outgoing == sender->second.outgoing.end()) return false;
  auto receiver = endpoints_.find(outgoing->second.peer);
  if (receiver == endpoints_.end() || !receiver->second.alive) return false;
  Endpoint& to = receiver->second;
  auto incoming = to.incoming.find(piece.id);
  if (incoming == to.incoming.end() && remote_writes_ && source == nullptr) {
    // A copy the receiver cannot stop: its bytes land in the blocks the sender was given, finished or not.
    const DeviceKvDestination& destination = outgoing->second.destination;
    if (piece.first_block < 0 || piece.first_block + piece.count > destination.num_blocks()) return false;
    std::vector<int32_t> positions(static_cast<size_t>(piece.count));
    std::iota(positions.begin(), positions.end(), 0);
    const auto slice = [&](const std::vector<int32_t>& ids) {
      return std::span<const int32_t>(ids).subspan(static_cast<size_t>(piece.first_block),
                                                   static_cast<size_t>(piece.count));
    };
    num_copies_ += copy_layer(nullptr, piece.main.data(), to.main, piece.layer, positions, slice(destination.main_blocks));
    if (!destination.residual_blocks.empty())
      num_copies_ += copy_layer(nullptr, piece.residual.data(), to.residual, piece.layer, positions,
                                slice(destination.residual_blocks));
    ++num_late_writes_;
    return false;
  }
  if (incoming == to.incoming.end() || incoming->second.peer != piece.sender) return false;
  Incoming& transfer = incoming->second;
  if (transfer.assembly.progress(std::chrono::steady_clock::now()).state != DeviceKvProgress::State::kPending)
    return false;
  const DeviceKvDestination& destination = transfer.destination;
  if (piece.first_block < 0 || piece.count < 0 || piece.first_block + piece.count > destination.num_blocks()) {
    transfer.assembly.fail("a piece outside the reservation");
    return false;
  }
  const bool forked = !destination.residual_blocks.empty();
  const size_t residual_count = source ? residual_sources.size() : piece.residual.size() / static_cast<size_t>(
      std::max<int64_t>(1, to.residual.arrays_per_layer * to.residual.bytes_per_block));
  if ((source && main_sources.size() != static_cast<size_t>(piece.count)) ||
      (forked && residual_count != static_cast<size_t>(piece.count))) {
    transfer.assembly.fail("a piece without the blocks it names");
    return false;
  }
  auto slice = [&](const std::vector<int32_t>& ids) {
    return std::span<const int32_t>(ids).subspan(static_cast<size_t>(piece.first_block), static_cast<size_t>(piece.count));
  };
  std::vector<int32_t> positions(static_cast<size_t>(piece.count));
  std::iota(positions.begin(), positions.end(), 0);
  int64_t bytes = 0;
  num_copies_ += copy_layer(source ? &source->main : nullptr, piece.main.data(), to.main, piece.layer,
                            source ? main_sources : positions, slice(destination.main_blocks));
  bytes += to.main.arrays_per_layer * to.main.bytes_per_block * piece.count;
  if (forked) {
    num_copies_ += copy_layer(source ? &source->residual : nullptr, piece.residual.data(), to.residual, piece.layer,
                              source ? residual_sources : positions, slice(destination.residual_blocks));
    bytes += to.residual.arrays_per_layer * to.residual.bytes_per_block * piece.count;
  }
  ++num_pieces_;
  return transfer.assembly.land(piece.layer, piece.first_block, piece.count, bytes);
}

InProcessDeviceKvPlane::InProcessDeviceKvPlane(std::shared_ptr<InProcessDeviceKvFabric> fabric, std::string name)
    : fabric_(std::move(fabric)), name_(std::move(name)) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  LOOM_CHECK(fabric_->endpoints_.emplace(name_, InProcessDeviceKvFabric::Endpoint{}).second);
}

InProcessDeviceKvPlane::~InProcessDeviceKvPlane() {
  fabric_->kill(name_);
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  fabric_->endpoints_.erase(name_);
}

DeviceKvEndpoint InProcessDeviceKvPlane::endpoint() const {
  return {"in-process", "pid:" + std::to_string(::getpid()), name_, name_, true};
}

void InProcessDeviceKvPlane::bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) {
  if (main.kind != KvPoolMemory::Kind::kHost || (!residual.empty() && residual.kind != KvPoolMemory::Kind::kHost))
    fail(ErrorKind::kUnsupported, "the in-process KV plane (a test double) copies host memory only");
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  auto& endpoint = fabric_->endpoints_.at(name_);
  endpoint.main = main;
  endpoint.residual = residual;
}

void InProcessDeviceKvPlane::expect(const DeviceKvExpectation& expectation) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  auto& endpoint = fabric_->endpoints_.at(name_);
  const DeviceKvDestination& destination = expectation.destination;
  if (endpoint.incoming.count(destination.id))
    fail(ErrorKind::kInvalidArgument, "device KV transfer {} is already expected", destination.id);
  const bool forked = !destination.residual_blocks.empty();
  if (!ids_in_pool(destination.main_blocks, endpoint.main) ||
      (forked && (destination.residual_blocks.size() != destination.main_blocks.size() ||
                  !ids_in_pool(destination.residual_blocks, endpoint.residual))))
    fail(ErrorKind::kInvalidArgument, "device KV transfer {}: block ids outside the bound pools", destination.id);
  endpoint.incoming.emplace(destination.id,
                            InProcessDeviceKvFabric::Incoming{expectation.peer, destination,
                                                              DeviceKvAssembly(expectation.num_layers,
                                                                               destination.num_blocks(),
                                                                               expectation.deadline)});
}

DeviceKvProgress InProcessDeviceKvPlane::progress(DeviceKvTransferId id) const {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  auto& endpoint = fabric_->endpoints_.at(name_);
  auto it = endpoint.incoming.find(id);
  if (it == endpoint.incoming.end()) return {};
  return it->second.assembly.progress(std::chrono::steady_clock::now());
}

bool InProcessDeviceKvPlane::finish(DeviceKvTransferId id) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  fabric_->endpoints_.at(name_).incoming.erase(id);
  return !fabric_->remote_writes_ || !fabric_->may_still_write(name_, id);
}

bool InProcessDeviceKvPlane::quiesced(DeviceKvTransferId id) const {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  return !fabric_->remote_writes_ || !fabric_->may_still_write(name_, id);
}

bool InProcessDeviceKvPlane::begin_send(const std::string& peer, const DeviceKvDestination& destination,
                                        int32_t num_layers) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  auto& self = fabric_->endpoints_.at(name_);
  auto receiver = fabric_->endpoints_.find(peer);
  if (!self.alive || receiver == fabric_->endpoints_.end() || !receiver->second.alive) return false;
  const auto& to = receiver->second;
  // Both ends must lay a block out alike (same model, dtype, block size, rank).
  if (to.main.bytes_per_block != self.main.bytes_per_block || to.main.num_layers() != num_layers ||
      self.main.num_layers() != num_layers ||
      (!destination.residual_blocks.empty() && to.residual.bytes_per_block != self.residual.bytes_per_block))
    return false;
  self.outgoing[destination.id] = {peer, destination};
  return true;
}

bool InProcessDeviceKvPlane::send_layer(DeviceKvTransferId id, const DeviceKvLayerPiece& piece) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  auto& self = fabric_->endpoints_.at(name_);
  if (!self.alive || !self.outgoing.count(id)) return false;
  if (!ids_in_pool(piece.main_sources, self.main) || !ids_in_pool(piece.residual_sources, self.residual)) return false;
  InProcessDeviceKvFabric::Held held{name_, id, piece.layer, piece.first_block,
                                     static_cast<int32_t>(piece.main_sources.size()), {}, {}};
  if (!fabric_->hold_) return fabric_->land(held, &self, piece.main_sources, piece.residual_sources);
  held.main = snapshot_layer(self.main, piece.layer, piece.main_sources);
  if (!piece.residual_sources.empty()) held.residual = snapshot_layer(self.residual, piece.layer, piece.residual_sources);
  fabric_->held_.push_back(std::move(held));
  return true;
}

void InProcessDeviceKvPlane::end_send(DeviceKvTransferId id, const std::string& failure) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  auto& self = fabric_->endpoints_.at(name_);
  auto outgoing = self.outgoing.find(id);
  if (outgoing == self.outgoing.end()) return;
  if (!failure.empty()) {
    auto receiver = fabric_->endpoints_.find(outgoing->second.peer);
    if (receiver != fabric_->endpoints_.end()) {
      auto incoming = receiver->second.incoming.find(id);
      if (incoming != receiver->second.incoming.end()) incoming->second.assembly.fail("the sender gave up: " + failure);
    }
  }
  // Held pieces still land after a successful end: they were sent. Under remote_writes they land after a
  // failed one too: copies already issued into the receiver's memory are not called back.
  if (fabric_->hold_ && (failure.empty() || fabric_->remote_writes_)) outgoing->second.ended = true;
  else self.outgoing.erase(outgoing);
}

}  // namespace loom
