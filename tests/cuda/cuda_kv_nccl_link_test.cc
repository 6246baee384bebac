// The KV link's NCCL data plane (kvtransfer/nccl): blocks pushed from a
// buffer on GPU 0's side to a link server on GPU 1's side arrive bit-exact,
// with pieces smaller than a block and puts split into several requests; the
// channel is made once per pooled connection; a peer that goes away is an
// Unavailable error for the sender and nothing else. Needs two GPUs and a
// loadable libnccl.so.2 (LOOM_NCCL_LIBRARY); skipped otherwise.

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "kvtransfer/kv_link_client.h"
#include "kvtransfer/kv_link_server.h"
#include "kvtransfer/nccl/nccl_data_plane.h"
#include "test_util.h"
#include "util/error.h"

namespace loom {
namespace {

std::unique_ptr<KvDataPlane> nccl_plane(int device, uint64_t staging_bytes) {
  try {
    return make_nccl_data_plane({.device = device, .staging_bytes = staging_bytes, .timeout_seconds = 20.0});
  } catch (const Error&) {
    return nullptr;
  }
}

std::shared_ptr<KvPayload> pattern(uint64_t seed, size_t size) {
  std::shared_ptr<KvPayload> payload = KvPayload::allocate(size);
  for (size_t i = 0; i < size; ++i) payload->data()[i] = static_cast<std::byte>((seed * 131 + i * 17 + (i >> 9)) & 0xff);
  return payload;
}

class CudaKvNcclLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::test::visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
    sender_plane_ = nccl_plane(0, 1 << 20);  // 1 MiB pieces: a 2.5 MiB block spans three
    receiver_plane_ = nccl_plane(1, 1 << 20);
    if (!sender_plane_ || !receiver_plane_) GTEST_SKIP() << "NCCL does not load (LOOM_NCCL_LIBRARY)";
  }
  std::unique_ptr<KvDataPlane> sender_plane_, receiver_plane_;
};

TEST_F(CudaKvNcclLinkTest, BlocksCrossBetweenTwoGpusBitExact) {
  BufferedKvStore sender(nullptr, 256 << 20), receiver(nullptr, 256 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.receive_timeout_seconds = 30.0, .plane = receiver_plane_.get()});
  KvLinkClient client(sender_plane_.get(), {.bulk_request_bytes = 8 << 20});
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  std::vector<KvBlockHash> hashes;
  std::vector<int64_t> sizes;
  std::vector<std::shared_ptr<KvPayload>> sent;
  for (uint64_t n = 0; n < 15; ++n) {
    const size_t size = n < 12 ? (5u << 19) : 4096 + 3 * n;  // 2.5 MiB blocks, then odd small ones
    sent.push_back(pattern(n, size));
    hashes.push_back(hash_string("nccl block " + std::to_string(n)));
    sizes.push_back(static_cast<int64_t>(size));
    sender.put(hashes.back(), BufferedKvStore::Payload(sent.back()));
  }
  const KvSendReport report = client.send(address, hashes, sizes, sender, {});
  EXPECT_EQ(report.sent_blocks, 15);
  int64_t total = 0;
  for (size_t n = 0; n < hashes.size(); ++n) {
    const BufferedKvStore::Payload received = receiver.get(hashes[n]);
    ASSERT_NE(received, nullptr) << n;
    ASSERT_EQ(received->size(), sent[n]->size());
    EXPECT_EQ(std::memcmp(received->data(), sent[n]->data(), received->size()), 0) << "block " << n;
    total += static_cast<int64_t>(received->size());
  }
  EXPECT_EQ(client.stats().num_channels, 1);
  EXPECT_EQ(client.stats().num_channel_bytes, total);
  EXPECT_EQ(server.stats().num_channel_bytes, total);
  EXPECT_EQ(server.stats().num_rejected_blocks, 0);
  // Again with new names: the same connection and communicator.
  std::vector<KvBlockHash> again;
  for (size_t n = 0; n < 3; ++n) {
    again.push_back(hash_string("again " + std::to_string(n)));
    sender.put(again.back(), BufferedKvStore::Payload(sent[n]));
  }
  EXPECT_EQ(client.send(address, again, std::span(sizes).first(3), sender, {}).sent_blocks, 3);
  EXPECT_EQ(std::memcmp(receiver.get(again[2])->data(), sent[2]->data(), sent[2]->size()), 0);
  EXPECT_EQ(client.stats().num_connections, 1);
}

TEST_F(CudaKvNcclLinkTest, APeerThatGoesAwayIsAnErrorForTheSenderOnly) {
  BufferedKvStore sender(nullptr, 64 << 20);
  KvLinkClient client(sender_plane_.get());
  const std::vector<KvBlockHash> hashes = {hash_string("one")};
  const std::vector<int64_t> sizes = {1 << 20};
  sender.put(hashes[0], BufferedKvStore::Payload(pattern(1, 1 << 20)));
  std::string address;
  {
    BufferedKvStore receiver(nullptr, 64 << 20);
    KvLinkServer server(receiver, "127.0.0.1", 0, {.receive_timeout_seconds = 30.0, .plane = receiver_plane_.get()});
    address = "127.0.0.1:" + std::to_string(server.port());
    EXPECT_EQ(client.send(address, hashes, sizes, sender, {}).sent_blocks, 1);
  }  // gone, with its end of the communicator
  test::expect_error([&] { client.send(address, hashes, sizes, sender, {}); }, ErrorKind::kUnavailable, {address});
  // A new peer gets a new connection and channel.
  BufferedKvStore receiver(nullptr, 64 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.receive_timeout_seconds = 30.0, .plane = receiver_plane_.get()});
  EXPECT_EQ(client.send("127.0.0.1:" + std::to_string(server.port()), hashes, sizes, sender, {}).sent_blocks, 1);
  EXPECT_EQ(client.stats().num_channels, 2);
}

TEST(CudaKvNcclPlaneTest, AMissingDeviceIsUnavailable) {
  test::expect_error([] { make_nccl_data_plane({.device = 999}); }, ErrorKind::kUnavailable, {"KV link over NCCL"});
}

}  // namespace
}  // namespace loom
