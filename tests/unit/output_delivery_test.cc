// OutputDelivery: the engine's outputs reach their channels in order, off the
// sending thread, and all of them before finish_async() or the destructor returns.
#include "engine/output_delivery.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "engine/engine_request.h"  // EngineInbox holds PendingRequests
#include "engine/request_channel.h"

namespace loom {
namespace {

RequestOutput token_output(int32_t count, bool finished = false) {
  RequestOutput output;
  output.num_output_tokens = count;
  output.finished = finished;
  return output;
}

// Every output queued in the channel (without waiting), in order.
std::vector<int32_t> drained(RequestChannel& channel) {
  std::lock_guard<std::mutex> lock(channel.mutex);
  std::vector<int32_t> counts;
  for (const RequestOutput& output : channel.outputs) counts.push_back(output.num_output_tokens);
  return counts;
}

TEST(OutputDeliveryTest, EachChannelGetsItsOutputsInOrderAcrossManySends) {
  constexpr int kChannels = 8, kSends = 200;
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (int c = 0; c < kChannels; ++c) channels.push_back(std::make_shared<RequestChannel>());
  {
    OutputDelivery delivery;
    for (int s = 1; s <= kSends; ++s) {
      for (int c = 0; c < kChannels; ++c) delivery.add(channels[c], token_output(s, s == kSends));
      delivery.send();  // faster than the thread pushes: batches queue up and merge
    }
    delivery.finish_async();
    for (int c = 0; c < kChannels; ++c) {
      const std::vector<int32_t> counts = drained(*channels[c]);
      ASSERT_EQ(counts.size(), static_cast<size_t>(kSends)) << "channel " << c;
      for (int s = 0; s < kSends; ++s) EXPECT_EQ(counts[s], s + 1) << "channel " << c;
      EXPECT_TRUE(channels[c]->finished_pushed);
    }
  }
}

TEST(OutputDeliveryTest, AReaderBlockedOnItsStreamIsWokenByTheDeliveryThread) {
  auto channel = std::make_shared<RequestChannel>();
  auto inbox = std::make_shared<EngineInbox>();
  ChannelRequestStream stream("r1", channel, inbox);
  OutputDelivery delivery;
  std::vector<int32_t> seen;
  std::thread reader([&] {
    while (auto output = stream.next(std::chrono::milliseconds(10000))) seen.push_back(output->num_output_tokens);
  });
  for (int s = 1; s <= 3; ++s) {
    delivery.add(channel, token_output(s, s == 3));
    delivery.send();
  }
  reader.join();  // ends after the finished output: every one arrived
  EXPECT_EQ(seen, (std::vector<int32_t>{1, 2, 3}));
}

TEST(OutputDeliveryTest, AfterFinishAsyncSendPushesBeforeItReturns) {
  auto channel = std::make_shared<RequestChannel>();
  OutputDelivery delivery;
  delivery.add(channel, token_output(1));
  delivery.send();
  delivery.finish_async();
  EXPECT_EQ(drained(*channel), (std::vector<int32_t>{1}));
  delivery.add(channel, token_output(2, true));
  delivery.send();  // on this thread now: in the channel when send() returns
  EXPECT_EQ(drained(*channel), (std::vector<int32_t>{1, 2}));
}

TEST(OutputDeliveryTest, TheDestructorPushesWhatWasSentOrGathered) {
  auto channel = std::make_shared<RequestChannel>();
  {
    OutputDelivery delivery;
    for (int s = 1; s <= 50; ++s) {
      delivery.add(channel, token_output(s));
      delivery.send();
    }
    delivery.add(channel, token_output(51, true));  // gathered, never sent
  }
  const std::vector<int32_t> counts = drained(*channel);
  ASSERT_EQ(counts.size(), 51u);
  for (int s = 0; s < 51; ++s) EXPECT_EQ(counts[s], s + 1);
}

TEST(OutputDeliveryTest, NothingAfterAFinishedOutputReachesTheChannel) {
  auto channel = std::make_shared<RequestChannel>();
  OutputDelivery delivery;
  delivery.add(channel, token_output(1, true));
  delivery.add(channel, token_output(2));
  delivery.send();
  delivery.finish_async();
  EXPECT_EQ(drained(*channel), (std::vector<int32_t>{1}));
}

}  // namespace
}  // namespace loom
