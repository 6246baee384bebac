// The "cuda-ipc" device KV plane's protocol (kvtransfer/device/ipc/
// ipc_device_kv_plane.h) between two planes of one process over loopback TCP,
// with a host-memory PeerKvCopier standing in for CUDA IPC (the "handle" is
// the allocation's address; copies are memcpy, optionally held back as a
// copy stream that has not run yet). What it shows: pieces, sent before or
// after the DE's pools are mapped, land in exactly the reserved blocks (main
// and rCache) and the transfer is done only once every copy ran; a peer
// without the secret or from another address gets no handle; a DE that gives
// up on a transfer whose copies are still queued keeps its blocks
// (quiesced() false) until the PE drained them; a PE that dies fails the
// transfer; end_send returns only once no copy reads the sender's blocks.
// The CUDA copier itself runs on a GPU (tests/cuda, tests/python/test_device_kv.py).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "backend/peer_kv_copier.h"
#include "kvtransfer/device/ipc/ipc_device_kv_plane.h"
#include "util/error.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
using State = DeviceKvProgress::State;

const std::string kSecret = "ipc-plane-test-secret-0123456789";
constexpr int32_t kLayers = 3, kBlocks = 8;
constexpr int64_t kMainBytes = 24, kResidualBytes = 8;

// Copies in host memory; hold() keeps them queued (a copy stream behind) until run_held().
class HostPeerKvCopier final : public PeerKvCopier {
 public:
  std::string device_name() const override { return "host"; }
  bool accepts(const KvPoolMemory& pool) const override {
    return static_cast<int32_t>(pool.allocations.size()) == pool.num_ranks;
  }
  std::vector<std::byte> export_allocation(const KvPoolMemory& pool, int32_t rank) override {
    std::vector<std::byte> handle(sizeof(std::byte*));
    std::memcpy(handle.data(), &pool.allocations.at(static_cast<size_t>(rank)), sizeof(std::byte*));
    return handle;
  }
  std::byte* import(int32_t rank, std::span<const std::byte> handle) override {
    ranks_imported.insert(rank);
    if (handle.size() != sizeof(std::byte*)) fail(ErrorKind::kInvalidArgument, "not a host handle");
    std::byte* base = nullptr;
    std::memcpy(&base, handle.data(), sizeof(base));
    ++imports;
    return base;
  }
  void after(const KvLayerFence&) override {}
  void copy(int32_t rank, std::byte* destination, const std::byte* source, int64_t bytes) override {
    std::lock_guard lock(mutex_);
    ranks_copied.insert(rank);
    ++enqueued_;
    if (held_) {
      queue_.push_back({destination, source, bytes});
    } else {
      std::memcpy(destination, source, static_cast<size_t>(bytes));
      ++ran_;
    }
  }
  Ticket record() override {
    std::lock_guard lock(mutex_);
    marks_[next_] = enqueued_;
    return next_++;
  }
  void wait(Ticket ticket) override {
    std::unique_lock lock(mutex_);
    auto it = marks_.find(ticket);
    if (it == marks_.end()) return;
    const int64_t mark = it->second;
    ran_changed_.wait(lock, [&] { return ran_ >= mark; });
  }
  void release(Ticket ticket) override {
    std::lock_guard lock(mutex_);
    marks_.erase(ticket);
  }
  void hold() {
    std::lock_guard lock(mutex_);
    held_ = true;
  }
  void run_held() {
    std::lock_guard lock(mutex_);
    held_ = false;
    for (const Copy& copy : queue_) std::memcpy(copy.destination, copy.source, static_cast<size_t>(copy.bytes));
    ran_ += static_cast<int64_t>(queue_.size());
    queue_.clear();
    ran_changed_.notify_all();
  }
  int64_t queued() {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(queue_.size());
  }
  std::atomic<int> imports{0};
  std::set<int32_t> ranks_imported, ranks_copied;  // read once the transfer settled

 private:
  struct Copy {
    std::byte* destination;
    const std::byte* source;
    int64_t bytes;
  };
  std::mutex mutex_;
  std::condition_variable ran_changed_;
  bool held_ = false;
  std::deque<Copy> queue_;
  int64_t enqueued_ = 0, ran_ = 0;
  std::map<Ticket, int64_t> marks_;
  Ticket next_ = 1;
};

// Pools laid out as the CUDA backend's: each pool one allocation per rank, per layer K and V (main), one
// rCache array; a tensor-parallel group's (ranks > 1) as TensorParallelBackend::kv_pool_memory gives them: a
// layer's arrays rank after rank, rank r's in its own allocation.
struct Pools {
  std::vector<std::vector<std::byte>> main_memory, residual_memory;  // [rank]
  KvPoolMemory main, residual;

  explicit Pools(uint8_t seed, int32_t ranks = 1) {
    auto make = [&](KvPoolMemory& pool, std::vector<std::vector<std::byte>>& memory, int32_t arrays, int64_t bytes) {
      pool.kind = KvPoolMemory::Kind::kCuda;  // as a GPU engine's; the host copier only reads `allocations`
      pool.num_ranks = ranks;
      pool.arrays_per_layer = arrays * ranks;
      pool.num_blocks = kBlocks;
      pool.bytes_per_block = bytes;
      memory.resize(static_cast<size_t>(ranks));
      for (int32_t r = 0; r < ranks; ++r) {
        auto& part = memory[static_cast<size_t>(r)];
        part.resize(static_cast<size_t>(kLayers * arrays * kBlocks * bytes));
        for (size_t b = 0; b < part.size(); ++b)
          part[b] = seed == 0 ? std::byte{0} : static_cast<std::byte>((seed * 31 + r * 101 + b * 7 + b / 13) & 0xff);
        pool.allocations.push_back(part.data());
      }
      for (int32_t layer = 0; layer < kLayers; ++layer)
        for (int32_t r = 0; r < ranks; ++r)
          for (int32_t a = 0; a < arrays; ++a)
            pool.arrays.push_back(memory[static_cast<size_t>(r)].data() + (layer * arrays + a) * kBlocks * bytes);
    };
    make(main, main_memory, 2, kMainBytes);
    make(residual, residual_memory, 1, kResidualBytes);
  }
  static std::vector<std::byte> block(const KvPoolMemory& pool, int32_t layer, int32_t array, int32_t id) {
    const std::byte* at = pool.arrays[static_cast<size_t>(layer * pool.arrays_per_layer + array)] + id * pool.bytes_per_block;
    return {at, at + pool.bytes_per_block};
  }
  bool all_zero() const {
    for (const auto* memory : {&main_memory, &residual_memory})
      for (const auto& part : *memory)
        for (std::byte b : part)
          if (b != std::byte{0}) return false;
    return true;
  }
};

IpcDeviceKvPlaneOptions options(const std::string& secret = kSecret) {
  IpcDeviceKvPlaneOptions result;
  result.secret = secret;
  result.io_timeout_seconds = 5.0;
  return result;
}

template <typename Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

DeviceKvProgress wait_settled(const DeviceKvPlane& plane, DeviceKvTransferId id) {
  DeviceKvProgress progress = plane.progress(id);
  eventually([&] { return (progress = plane.progress(id)).state != State::kPending; });
  return progress;
}

DeviceKvDestination destination(DeviceKvTransferId id, bool forked) {
  DeviceKvDestination result;
  result.id = id;
  result.main_blocks = {5, 6, 7, 2};  // two runs: 5-7 and 2
  if (forked) result.residual_blocks = {1, 2, 3, 4};
  return result;
}

const std::vector<int32_t> kMainSources = {0, 1, 2, 3}, kResidualSources = {4, 5, 6, 7};

class IpcDeviceKvPlaneTest : public ::testing::Test {
 protected:
  Pools pe_pools_{7}, de_pools_{0};
  std::shared_ptr<HostPeerKvCopier> pe_copier_ = std::make_shared<HostPeerKvCopier>();
  std::unique_ptr<IpcDeviceKvPlane> pe_, de_;

  void SetUp() override {
    pe_ = std::make_unique<IpcDeviceKvPlane>(options(), pe_copier_);
    de_ = std::make_unique<IpcDeviceKvPlane>(options(), std::make_shared<HostPeerKvCopier>());
    pe_->bind_pools(pe_pools_.main, pe_pools_.residual);
    de_->bind_pools(de_pools_.main, de_pools_.residual);
  }
  void expect(const DeviceKvDestination& where, const std::string& peer, std::chrono::milliseconds timeout = 10s) {
    de_->expect({where, peer, kLayers, std::chrono::steady_clock::now() + timeout});
  }
  void expect_landed(const DeviceKvDestination& where, int32_t layer) {
    for (size_t i = 0; i < where.main_blocks.size(); ++i) {
      for (int32_t array = 0; array < 2; ++array)
        EXPECT_EQ(Pools::block(de_pools_.main, layer, array, where.main_blocks[i]),
                  Pools::block(pe_pools_.main, layer, array, kMainSources[i]))
            << "layer " << layer << " block " << i;
      if (!where.residual_blocks.empty())
        EXPECT_EQ(Pools::block(de_pools_.residual, layer, 0, where.residual_blocks[i]),
                  Pools::block(pe_pools_.residual, layer, 0, kResidualSources[i]));
    }
  }
};

TEST_F(IpcDeviceKvPlaneTest, PiecesBeforeAndAfterTheMappingLandInTheReservedBlocks) {
  const DeviceKvEndpoint endpoint = de_->endpoint();
  EXPECT_EQ(endpoint.plane, "cuda-ipc");
  EXPECT_EQ(endpoint.device, "host");
  EXPECT_TRUE(endpoint.same_host_only);
  for (bool forked : {true, false}) {
    SCOPED_TRACE(forked ? "forked" : "main pool only");
    const DeviceKvTransferId id = forked ? 41 : 42;
    const DeviceKvDestination where = destination(id, forked);
    expect(where, pe_->endpoint().address);
    ASSERT_TRUE(pe_->begin_send(endpoint.address, where, kLayers));
    // At once, before the transfer's thread can have mapped the DE's pools: kept, copied once mapped.
    const std::vector<int32_t> no_residual;
    const std::vector<int32_t>& residual = forked ? kResidualSources : no_residual;
    ASSERT_TRUE(pe_->send_layer(id, {2, 0, kMainSources, residual, {}}));
    ASSERT_TRUE(eventually([&] { return pe_copier_->imports > 0; }));
    std::span<const int32_t> main(kMainSources), rest(residual);
    ASSERT_TRUE(pe_->send_layer(id, {0, 0, kMainSources, residual, {}}));
    ASSERT_TRUE(pe_->send_layer(id, {1, 2, main.subspan(2), forked ? rest.subspan(2) : rest, {}}));
    ASSERT_TRUE(pe_->send_layer(id, {1, 0, main.first(2), forked ? rest.first(2) : rest, {}}));
    pe_->end_send(id, "");
    const DeviceKvProgress progress = wait_settled(*de_, id);
    ASSERT_EQ(progress.state, State::kDone) << progress.failure;
    EXPECT_EQ(progress.num_bytes_landed, kLayers * 4 * (2 * kMainBytes + (forked ? kResidualBytes : 0)));
    for (int32_t layer = 0; layer < kLayers; ++layer) expect_landed(where, layer);
    EXPECT_TRUE(de_->finish(id));
    EXPECT_TRUE(de_->quiesced(id));
  }
  // Block 0 was never reserved: untouched.
  EXPECT_EQ(Pools::block(de_pools_.main, 0, 0, 0), std::vector<std::byte>(kMainBytes));
  EXPECT_EQ(de_->stats().pieces_received, 8);
}

TEST_F(IpcDeviceKvPlaneTest, ATransferIsDoneOnlyOnceItsCopiesRan) {
  const DeviceKvDestination where = destination(7, /*forked=*/false);
  expect(where, pe_->endpoint().address);
  ASSERT_TRUE(pe_->begin_send(de_->endpoint().address, where, kLayers));
  ASSERT_TRUE(eventually([&] { return pe_copier_->imports > 0; }));
  pe_copier_->hold();
  for (int32_t layer = 0; layer < kLayers; ++layer) ASSERT_TRUE(pe_->send_layer(7, {layer, 0, kMainSources, {}, {}}));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(de_->progress(7).state, State::kPending);  // queued copies: nothing counts as landed
  EXPECT_EQ(de_->progress(7).num_layers_landed, 0);
  EXPECT_TRUE(de_pools_.all_zero());
  // end_send returns only once no copy reads the sender's blocks.
  std::atomic<bool> ended{false};
  std::thread ender([&] {
    pe_->end_send(7, "");
    ended = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(ended);
  pe_copier_->run_held();
  ender.join();
  ASSERT_EQ(wait_settled(*de_, 7).state, State::kDone);
  for (int32_t layer = 0; layer < kLayers; ++layer) expect_landed(where, layer);
}

TEST_F(IpcDeviceKvPlaneTest, AGivenUpTransferKeepsItsBlocksUntilThePeerDrainedItsCopies) {
  const DeviceKvDestination where = destination(9, /*forked=*/true);
  expect(where, pe_->endpoint().address);
  ASSERT_TRUE(pe_->begin_send(de_->endpoint().address, where, kLayers));
  ASSERT_TRUE(eventually([&] { return pe_copier_->imports > 0; }));
  pe_copier_->hold();
  ASSERT_TRUE(pe_->send_layer(9, {0, 0, kMainSources, kResidualSources, {}}));
  ASSERT_TRUE(eventually([&] { return pe_copier_->queued() > 0; }));
  // The router cancelled: the DE finishes the transfer while the PE's copies are still queued.
  EXPECT_FALSE(de_->finish(9));
  EXPECT_EQ(de_->progress(9).state, State::kUnknown);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(de_->quiesced(9));  // a copy may still land: the blocks must stay out of the pool
  pe_copier_->run_held();          // ...and it does land (a late write)
  ASSERT_TRUE(eventually([&] { return de_->quiesced(9); }));
  expect_landed(where, 0);
  EXPECT_EQ(de_->stats().stopped_transfers, 1);
  EXPECT_FALSE(pe_->send_layer(9, {1, 0, kMainSources, kResidualSources, {}}));  // the PE copies nothing more
  pe_->end_send(9, "");
}

TEST_F(IpcDeviceKvPlaneTest, NoHandleForAPeerWithoutTheSecretOrFromAnotherAddress) {
  IpcDeviceKvPlane stranger(options("another-secret-0123456789abcdef"), std::make_shared<HostPeerKvCopier>());
  stranger.bind_pools(pe_pools_.main, pe_pools_.residual);
  const DeviceKvDestination where = destination(11, /*forked=*/false);
  expect(where, stranger.endpoint().address);
  ASSERT_TRUE(stranger.begin_send(de_->endpoint().address, where, kLayers));
  ASSERT_TRUE(eventually([&] { return de_->stats().refused_connections == 1; }));
  ASSERT_TRUE(eventually([&] { return !stranger.send_layer(11, {0, 0, kMainSources, {}, {}}); }));
  stranger.end_send(11, "");

  // The secret, but not the peer the reservation named.
  const DeviceKvDestination elsewhere = destination(12, /*forked=*/false);
  expect(elsewhere, "127.0.0.1:1");
  ASSERT_TRUE(pe_->begin_send(de_->endpoint().address, elsewhere, kLayers));
  ASSERT_TRUE(eventually([&] { return de_->stats().rejected_opens == 1; }));
  ASSERT_TRUE(eventually([&] { return !pe_->send_layer(12, {0, 0, kMainSources, {}, {}}); }));  // refused
  EXPECT_EQ(de_->progress(12).state, State::kPending);  // still open to the peer it names, until its deadline
  EXPECT_EQ(pe_copier_->imports, 0);
  EXPECT_TRUE(de_->finish(12));  // no handle went out: the blocks are free at once
  pe_->end_send(12, "");
  EXPECT_TRUE(de_pools_.all_zero());
}

TEST_F(IpcDeviceKvPlaneTest, APrefillEngineThatDiesFailsTheTransferAndFreesTheBlocks) {
  const DeviceKvDestination where = destination(13, /*forked=*/false);
  expect(where, pe_->endpoint().address);
  ASSERT_TRUE(pe_->begin_send(de_->endpoint().address, where, kLayers));
  ASSERT_TRUE(pe_->send_layer(13, {0, 0, kMainSources, {}, {}}));
  ASSERT_TRUE(eventually([&] { return de_->progress(13).num_layers_landed == 1; }));
  pe_.reset();  // the PE goes mid-transfer
  const DeviceKvProgress progress = wait_settled(*de_, 13);
  EXPECT_EQ(progress.state, State::kFailed);
  EXPECT_NE(progress.failure.find("died"), std::string::npos) << progress.failure;
  EXPECT_TRUE(de_->finish(13));
}

TEST_F(IpcDeviceKvPlaneTest, ADeadlineWithoutASenderFailsAndFreesAtOnce) {
  const DeviceKvDestination where = destination(14, /*forked=*/false);
  expect(where, pe_->endpoint().address, 30ms);
  EXPECT_EQ(wait_settled(*de_, 14).state, State::kFailed);
  EXPECT_TRUE(de_->finish(14));
  EXPECT_TRUE(de_->quiesced(14));
  EXPECT_THROW(de_->bind_pools(KvPoolMemory{.kind = KvPoolMemory::Kind::kCuda, .device = 0, .arrays_per_layer = 2,
                                            .num_blocks = 1, .bytes_per_block = 8, .arrays = {nullptr, nullptr}},
                               {}),
               Error);  // a pool the copier cannot export (no allocations)
}


// Two tensor-parallel ranks at each end: every rank's arrays go into the peer's same rank, through that rank's
// copies and mapping; a TP=2 PE and a TP=1 DE are refused (no resharding).
TEST(IpcDeviceKvPlaneTensorParallel, EachRanksArraysLandInThePeersSameRank) {
  Pools pe_pools(7, 2), de_pools(0, 2), single(0, 1);
  auto pe_copier = std::make_shared<HostPeerKvCopier>();
  IpcDeviceKvPlane pe(options(), pe_copier), de(options(), std::make_shared<HostPeerKvCopier>()),
      de_single(options(), std::make_shared<HostPeerKvCopier>());
  pe.bind_pools(pe_pools.main, pe_pools.residual);
  de.bind_pools(de_pools.main, de_pools.residual);
  de_single.bind_pools(single.main, single.residual);
  const DeviceKvDestination where = destination(21, /*forked=*/true);
  de.expect({where, pe.endpoint().address, kLayers, std::chrono::steady_clock::now() + 10s});
  ASSERT_TRUE(pe.begin_send(de.endpoint().address, where, kLayers));
  for (int32_t layer = 0; layer < kLayers; ++layer)
    ASSERT_TRUE(pe.send_layer(21, {layer, 0, kMainSources, kResidualSources, {}}));
  pe.end_send(21, "");
  const DeviceKvProgress progress = wait_settled(de, 21);
  ASSERT_EQ(progress.state, State::kDone) << progress.failure;
  EXPECT_EQ(progress.num_bytes_landed, 2 * kLayers * 4 * (2 * kMainBytes + kResidualBytes));
  for (int32_t layer = 0; layer < kLayers; ++layer)
    for (size_t i = 0; i < 4; ++i)
      for (int32_t rank = 0; rank < 2; ++rank) {
        for (int32_t kv = 0; kv < 2; ++kv)
          EXPECT_EQ(Pools::block(de_pools.main, layer, rank * 2 + kv, where.main_blocks[i]),
                    Pools::block(pe_pools.main, layer, rank * 2 + kv, kMainSources[i]))
              << "layer " << layer << " rank " << rank;
        EXPECT_EQ(Pools::block(de_pools.residual, layer, rank, where.residual_blocks[i]),
                  Pools::block(pe_pools.residual, layer, rank, kResidualSources[i]));
      }
  EXPECT_EQ(pe_copier->ranks_imported, (std::set<int32_t>{0, 1}));
  EXPECT_EQ(pe_copier->ranks_copied, (std::set<int32_t>{0, 1}));
  EXPECT_TRUE(de.finish(21));

  // TP=2 into TP=1: the open is refused on the layout, nothing is mapped or copied.
  const DeviceKvDestination elsewhere = destination(22, /*forked=*/false);
  de_single.expect({elsewhere, pe.endpoint().address, kLayers, std::chrono::steady_clock::now() + 10s});
  ASSERT_TRUE(pe.begin_send(de_single.endpoint().address, elsewhere, kLayers));
  const DeviceKvProgress refused = wait_settled(de_single, 22);
  EXPECT_EQ(refused.state, State::kFailed);
  EXPECT_NE(refused.failure.find("tensor-parallel size"), std::string::npos) << refused.failure;
  pe.end_send(22, "");
  EXPECT_TRUE(single.all_zero());
}

}  // namespace
}  // namespace loom
