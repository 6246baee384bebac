// The device-to-device data plane's parts that any plane uses
// (kvtransfer/device/): the receiver's layer-wise assembly, run coalescing,
// and the in-process test double's copies, peer checks and failures.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "kvtransfer/device/device_kv_assembly.h"
#include "kvtransfer/device/device_kv_runs.h"
#include "kvtransfer/device/in_process_device_kv_plane.h"
#include "util/error.h"

namespace loom {
namespace {

using State = DeviceKvProgress::State;
using Clock = std::chrono::steady_clock;

TEST(DeviceKvAssemblyTest, DoneOnlyWhenEveryLayerOfEveryBlockLandedInAnyOrder) {
  DeviceKvAssembly assembly(3, 4, Clock::now() + std::chrono::hours(1));
  EXPECT_TRUE(assembly.land(2, 0, 4, 100));  // last layer first
  EXPECT_TRUE(assembly.land(0, 2, 2, 50));
  EXPECT_EQ(assembly.progress(Clock::now()).state, State::kPending);
  EXPECT_EQ(assembly.progress(Clock::now()).num_layers_landed, 1);
  EXPECT_TRUE(assembly.land(0, 2, 2, 50));   // again: counts once
  EXPECT_TRUE(assembly.land(1, 0, 4, 100));
  EXPECT_TRUE(assembly.land(0, 0, 1, 25));
  EXPECT_EQ(assembly.progress(Clock::now()).state, State::kPending);  // layer 0 block 1 still missing
  EXPECT_TRUE(assembly.land(0, 1, 1, 25));
  const DeviceKvProgress done = assembly.progress(Clock::now());
  EXPECT_EQ(done.state, State::kDone);
  EXPECT_EQ(done.num_layers_landed, 3);
  EXPECT_EQ(done.num_bytes_landed, 350);
}

TEST(DeviceKvAssemblyTest, RefusesPiecesOutsideTheTransfer) {
  DeviceKvAssembly assembly(2, 4, Clock::now() + std::chrono::hours(1));
  EXPECT_FALSE(assembly.land(2, 0, 1, 1));
  EXPECT_FALSE(assembly.land(-1, 0, 1, 1));
  EXPECT_FALSE(assembly.land(0, 3, 2, 1));
  EXPECT_EQ(assembly.progress(Clock::now()).num_bytes_landed, 0);
}

TEST(DeviceKvAssemblyTest, FailsAtTheDeadlineOrWhenTheSenderGivesUpAndStaysFailed) {
  const Clock::time_point start = Clock::now();
  DeviceKvAssembly late(1, 2, start + std::chrono::seconds(1));
  EXPECT_EQ(late.progress(start).state, State::kPending);
  const DeviceKvProgress expired = late.progress(start + std::chrono::seconds(2));
  EXPECT_EQ(expired.state, State::kFailed);
  EXPECT_EQ(expired.failure, "deadline passed");
  EXPECT_FALSE(late.land(0, 0, 2, 1));  // too late: nothing more lands
  EXPECT_EQ(late.progress(start).state, State::kFailed);

  DeviceKvAssembly abandoned(1, 2, start + std::chrono::hours(1));
  abandoned.fail("");  // an end without failure changes nothing
  EXPECT_EQ(abandoned.progress(start).state, State::kPending);
  abandoned.fail("peer died");
  EXPECT_EQ(abandoned.progress(start).failure, "peer died");

  DeviceKvAssembly empty(2, 0, start);  // nothing to receive: done at once
  EXPECT_EQ(empty.progress(start + std::chrono::hours(1)).state, State::kDone);
}

TEST(DeviceKvRunsTest, CoalescesConsecutiveBlocksIntoRuns) {
  const std::vector<int32_t> sources = {4, 5, 6, 9, 10, 11, 3};
  const std::vector<int32_t> destinations = {0, 1, 2, 3, 7, 8, 9};
  const std::vector<DeviceKvBlockRun> expected = {{4, 0, 3}, {9, 3, 1}, {10, 7, 2}, {3, 9, 1}};
  EXPECT_EQ(coalesce_block_runs(sources, destinations), expected);
  EXPECT_TRUE(coalesce_block_runs({}, {}).empty());
}

// Two "engines" of 2 layers with pools of 8 blocks of 16 bytes per array.
struct FakePools {
  explicit FakePools(int32_t arrays_per_layer, uint8_t fill) {
    memory.arrays_per_layer = arrays_per_layer;
    memory.num_blocks = 8;
    memory.bytes_per_block = 16;
    bytes.assign(static_cast<size_t>(2 * arrays_per_layer), std::vector<std::byte>(8 * 16, std::byte{fill}));
    for (auto& array : bytes) memory.arrays.push_back(array.data());
  }
  // Block `block` of array `array` filled with `value`.
  void fill(size_t array, int32_t block, uint8_t value) {
    std::memset(bytes[array].data() + block * 16, value, 16);
  }
  uint8_t at(size_t array, int32_t block) const { return static_cast<uint8_t>(bytes[array][static_cast<size_t>(block) * 16]); }
  std::vector<std::vector<std::byte>> bytes;
  KvPoolMemory memory;
};

class InProcessPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fabric = std::make_shared<InProcessDeviceKvFabric>();
    pe = std::make_unique<InProcessDeviceKvPlane>(fabric, "pe");
    de = std::make_unique<InProcessDeviceKvPlane>(fabric, "de");
    for (size_t array = 0; array < 4; ++array)
      for (int32_t block = 0; block < 8; ++block) pe_main.fill(array, block, static_cast<uint8_t>(array * 16 + block));
    pe->bind_pools(pe_main.memory, {});
    de->bind_pools(de_main.memory, {});
  }
  DeviceKvExpectation expectation(std::vector<int32_t> blocks, double seconds = 60) {
    DeviceKvExpectation expected;
    expected.destination.id = 7;
    expected.destination.main_blocks = std::move(blocks);
    expected.peer = "pe";
    expected.num_layers = 2;
    expected.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    return expected;
  }
  std::shared_ptr<InProcessDeviceKvFabric> fabric;
  FakePools pe_main{2, 0}, de_main{2, 0xEE};
  std::unique_ptr<InProcessDeviceKvPlane> pe, de;
};

TEST_F(InProcessPlaneTest, MovesEachLayerAsRunsIntoTheReservedBlocks) {
  const DeviceKvExpectation expected = expectation({4, 5, 6});
  de->expect(expected);
  ASSERT_TRUE(pe->begin_send("de", expected.destination, 2));
  const std::vector<int32_t> sources = {1, 2, 3};
  for (int32_t layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(de->progress(7).state, State::kPending);
    ASSERT_TRUE(pe->send_layer(7, {layer, 0, sources, {}, {}}));
  }
  EXPECT_EQ(de->progress(7).state, State::kDone);
  EXPECT_EQ(fabric->num_copies(), 4);  // one run per array (K, V) per layer
  for (size_t array = 0; array < 4; ++array)
    for (int32_t i = 0; i < 3; ++i) EXPECT_EQ(de_main.at(array, 4 + i), pe_main.at(array, 1 + i)) << array << " " << i;
  EXPECT_EQ(de_main.at(0, 3), 0xEE);  // nothing outside the reservation
  EXPECT_EQ(de_main.at(0, 7), 0xEE);
  de->finish(7);
  EXPECT_EQ(de->progress(7).state, State::kUnknown);
  EXPECT_FALSE(pe->send_layer(7, {0, 0, sources, {}, {}}));  // finished: nothing more is written
}

TEST_F(InProcessPlaneTest, RefusesWritesFromAnotherPeerAndOutsideTheReservation) {
  InProcessDeviceKvPlane intruder(fabric, "intruder");
  intruder.bind_pools(pe_main.memory, {});
  DeviceKvExpectation expected = expectation({4, 5});
  de->expect(expected);
  ASSERT_TRUE(intruder.begin_send("de", expected.destination, 2));
  const std::vector<int32_t> sources = {1, 2};
  EXPECT_FALSE(intruder.send_layer(7, {0, 0, sources, {}, {}}));
  EXPECT_EQ(de_main.at(0, 4), 0xEE);
  ASSERT_TRUE(pe->begin_send("de", expected.destination, 2));
  EXPECT_FALSE(pe->send_layer(7, {0, 1, sources, {}, {}}));  // blocks 1..2 of a 2-block transfer
  EXPECT_EQ(de->progress(7).state, State::kFailed);
  EXPECT_THROW(de->expect(expectation({4, 99})), Error);  // outside the pool
}

TEST_F(InProcessPlaneTest, PeerDeathFailsTheTransferAtOnce) {
  de->expect(expectation({0, 1}));
  ASSERT_TRUE(pe->begin_send("de", expectation({0, 1}).destination, 2));
  const std::vector<int32_t> sources = {1, 2};
  ASSERT_TRUE(pe->send_layer(7, {0, 0, sources, {}, {}}));
  fabric->kill("pe");
  const DeviceKvProgress progress = de->progress(7);
  EXPECT_EQ(progress.state, State::kFailed);
  EXPECT_EQ(progress.failure, "peer pe died");
  EXPECT_EQ(progress.num_layers_landed, 1);
  EXPECT_FALSE(pe->send_layer(7, {1, 0, sources, {}, {}}));
}

TEST_F(InProcessPlaneTest, ASenderThatStallsEndsAtTheDeadline) {
  de->expect(expectation({0, 1}, 0.05));
  ASSERT_TRUE(pe->begin_send("de", expectation({0, 1}).destination, 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_EQ(de->progress(7).state, State::kFailed);
  EXPECT_EQ(de->progress(7).failure, "deadline passed");
}

TEST_F(InProcessPlaneTest, HeldPiecesLandInAnyOrderWithTheBytesOfSendTime) {
  const DeviceKvExpectation expected = expectation({2, 3});
  de->expect(expected);
  ASSERT_TRUE(pe->begin_send("de", expected.destination, 2));
  fabric->hold_deliveries(true);
  const std::vector<int32_t> sources = {5, 6};
  ASSERT_TRUE(pe->send_layer(7, {0, 0, sources, {}, {}}));
  ASSERT_TRUE(pe->send_layer(7, {1, 0, sources, {}, {}}));
  pe->end_send(7, "");
  pe_main.fill(0, 5, 0x77);  // the sender reuses its block after sending: the bytes in flight are the old ones
  EXPECT_EQ(fabric->num_held(), 2u);
  fabric->deliver_held(std::vector<size_t>{1});
  EXPECT_EQ(de->progress(7).state, State::kPending);
  EXPECT_EQ(de_main.at(0, 2), 0xEE);  // layer 0 not there yet
  EXPECT_EQ(de_main.at(2, 2), 2 * 16 + 5);
  fabric->deliver_held(std::vector<size_t>{0});
  EXPECT_EQ(de->progress(7).state, State::kDone);
  EXPECT_EQ(de_main.at(0, 2), 5);
}

TEST_F(InProcessPlaneTest, ASenderThatGivesUpFailsTheTransfer) {
  de->expect(expectation({0}));
  ASSERT_TRUE(pe->begin_send("de", expectation({0}).destination, 2));
  pe->end_send(7, "the prefill request ended first");
  EXPECT_EQ(de->progress(7).failure, "the sender gave up: the prefill request ended first");
  EXPECT_FALSE(pe->begin_send("nobody", expectation({0}).destination, 2));
}

}  // namespace
}  // namespace loom
