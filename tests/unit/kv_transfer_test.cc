// Prefill/decode disaggregation below the HTTP layer: the engine buffer
// (kvstore/buffered_kv_store.h), the KV link between engines (kvtransfer/),
// and two CPU engines, one prefilling and one decoding from the blocks it was
// sent, giving the tokens one engine gives alone in every sharing mode.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "kvstore/buffered_kv_store.h"
#include "kvtransfer/kv_data_plane.h"
#include "kvtransfer/kv_link_client.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kv_link_test_util.h"
#include "kvtransfer/kv_link_server.h"
#include "kvtransfer/kv_link_session.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
using test::connect_raw;

KvBlockHash block_name(uint64_t n) { return hash_string("block " + std::to_string(n)); }

std::vector<std::byte> payload_of(uint64_t n, size_t size) {
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((n * 31 + i * 7) & 0xff);
  return bytes;
}

std::vector<std::byte> bytes_of(const BufferedKvStore::Payload& payload) {
  if (!payload) return {};
  return {payload->bytes().begin(), payload->bytes().end()};
}

std::unique_ptr<DiskKvStore> open_files(const test::TempDir& directory) {
  DiskKvStoreConfig config;
  config.directory = directory.str() + "/kv";
  config.capacity_bytes = 16 << 20;
  return DiskKvStore::open(config);
}

TEST(BufferedKvStoreTest, HoldsTheMostRecentBlocksWithinItsCapacity) {
  BufferedKvStore store(nullptr, 3 * 100);
  for (uint64_t n = 0; n < 3; ++n) store.put(block_name(n), payload_of(n, 100));
  ASSERT_NE(store.get(block_name(0)), nullptr);  // used: block 1 is now the least recent
  store.put(block_name(3), payload_of(3, 100));
  EXPECT_TRUE(store.in_buffer(block_name(0)));
  EXPECT_FALSE(store.in_buffer(block_name(1)));
  EXPECT_TRUE(store.in_buffer(block_name(3)));
  EXPECT_EQ(bytes_of(store.get(block_name(3))), payload_of(3, 100));
  const KvBufferStats stats = store.buffer_stats();
  EXPECT_EQ(stats.num_blocks, 3);
  EXPECT_EQ(stats.num_bytes, 300);
  EXPECT_EQ(stats.num_evicted_blocks, 1);
  store.put(block_name(9), payload_of(9, 301));  // larger than the whole buffer: dropped
  EXPECT_FALSE(store.in_buffer(block_name(9)));
  EXPECT_THROW(BufferedKvStore(nullptr, 0), Error);
}

TEST(BufferedKvStoreTest, WritesThroughToStorageAndReadsFromEither) {
  test::TempDir directory;
  BufferedKvStore store(open_files(directory), 2 * 64);
  for (uint64_t n = 0; n < 4; ++n) EXPECT_TRUE(store.write_block(block_name(n), payload_of(n, 64)));
  // Blocks 0 and 1 left the buffer but are on disk; 2 and 3 are in both.
  EXPECT_FALSE(store.in_buffer(block_name(0)));
  EXPECT_TRUE(store.in_storage(block_name(0)));
  EXPECT_TRUE(store.contains(block_name(0)));
  EXPECT_EQ(store.stats().num_stored_blocks, 4);

  std::vector<std::vector<std::byte>> read(3, std::vector<std::byte>(64));
  const std::vector<KvBlockHash> hashes = {block_name(3), block_name(0), block_name(7)};
  const std::vector<std::span<std::byte>> destinations(read.begin(), read.end());
  const std::vector<bool> ok = store.read_blocks(hashes, destinations);
  EXPECT_EQ(ok, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(read[0], payload_of(3, 64));
  EXPECT_EQ(read[1], payload_of(0, 64));
  EXPECT_TRUE(store.in_buffer(block_name(0)));  // read from storage, then buffered
  EXPECT_EQ(store.buffer_stats().num_hit_blocks, 1);
  EXPECT_EQ(store.queued_read_bytes(), 0);

  // load_from_storage reads only what is on disk and not buffered.
  const std::vector<KvBlockHash> wanted = {block_name(0), block_name(1), block_name(2), block_name(8)};
  const std::vector<int64_t> sizes(wanted.size(), 64);
  const auto [num_read, num_bytes] = store.load_from_storage(wanted, sizes);
  EXPECT_EQ(num_read, 2);  // 1 and 2 (0 was buffered, 8 is nowhere)
  EXPECT_EQ(num_bytes, 128);
  EXPECT_TRUE(store.in_buffer(block_name(1)));
}

TEST(BufferedKvStoreTest, HoldsBlocksOnlyWhileTheyMove) {
  test::TempDir directory;
  BufferedKvStore store(open_files(directory), 1 << 20);
  store.put(block_name(1), payload_of(1, 32));          // received: in transit
  store.write_block(block_name(2), payload_of(2, 32));  // the engine's own: outgoing
  std::vector<std::byte> read(32);
  const std::vector<KvBlockHash> first = {block_name(1)};
  const std::vector<std::span<std::byte>> destination = {read};
  EXPECT_EQ(store.read_blocks(first, destination), std::vector<bool>{true});
  EXPECT_FALSE(store.in_buffer(block_name(1)));  // the engine has it now
  const std::vector<KvBlockHash> second = {block_name(2)};
  EXPECT_EQ(store.read_blocks(second, destination), std::vector<bool>{true});
  EXPECT_TRUE(store.in_buffer(block_name(2)));  // outgoing blocks wait for their send
  store.release_sent(second);
  EXPECT_FALSE(store.in_buffer(block_name(2)));
  EXPECT_TRUE(store.in_storage(block_name(2)));  // written through all the same
  // A received block is not released by a send (this engine still reads it).
  store.put(block_name(3), payload_of(3, 32));
  const std::vector<KvBlockHash> third = {block_name(3)};
  store.release_sent(third);
  EXPECT_TRUE(store.in_buffer(block_name(3)));
}

TEST(BufferedKvStoreTest, OutgoingBlocksMakeRoomBeforeBlocksInTransit) {
  BufferedKvStore store(nullptr, 3 * 100);
  store.put(block_name(0), payload_of(0, 100));          // in transit, the oldest
  store.write_block(block_name(1), payload_of(1, 100));  // outgoing
  store.put(block_name(2), payload_of(2, 100));
  store.put(block_name(3), payload_of(3, 100));  // full: the outgoing block goes first
  EXPECT_FALSE(store.in_buffer(block_name(1)));
  EXPECT_TRUE(store.in_buffer(block_name(0)));
  store.put(block_name(4), payload_of(4, 100));  // then the least recent in transit
  EXPECT_FALSE(store.in_buffer(block_name(0)));
  EXPECT_TRUE(store.in_buffer(block_name(2)));
}

TEST(BufferedKvStoreTest, WaitForReturnsWhatArrivesInTime) {
  BufferedKvStore store(nullptr, 1 << 20);
  store.put(block_name(0), payload_of(0, 8));
  std::thread writer([&] {
    std::this_thread::sleep_for(20ms);
    store.put(block_name(1), payload_of(1, 8));
  });
  const std::vector<KvBlockHash> hashes = {block_name(0), block_name(1)};
  const auto payloads = store.wait_for(hashes, 5000ms);
  writer.join();
  ASSERT_NE(payloads[0], nullptr);
  ASSERT_NE(payloads[1], nullptr);
  EXPECT_EQ(bytes_of(payloads[1]), payload_of(1, 8));
  const std::vector<KvBlockHash> never = {block_name(5)};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(store.wait_for(never, 30ms)[0], nullptr);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
}

TEST(BufferedKvStoreTest, WaitForDoesNotWaitForABlockThatAlreadyLeft) {
  // The engine's own block, sent and released (or evicted): a later send of
  // the same prefix (a prefix hit, never written through again) must not
  // wait the whole timeout for it.
  BufferedKvStore store(nullptr, 1 << 20);
  store.write_block(block_name(3), payload_of(3, 8));
  const std::vector<KvBlockHash> hashes = {block_name(3)};
  store.release_sent(hashes);
  ASSERT_FALSE(store.in_buffer(block_name(3)));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(store.wait_for(hashes, 10000ms)[0], nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5000ms);
}


TEST(KvLinkTest, SendsWhatThePeerLacksAndSkipsTheRest) {
  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0);
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  std::vector<KvBlockHash> hashes;
  for (uint64_t n = 0; n < 5; ++n) {
    hashes.push_back(block_name(n));
    if (n != 4) sender.put(block_name(n), payload_of(n, 1000 + n));  // block 4 is missing here
  }
  receiver.put(block_name(0), payload_of(0, 1000));  // the peer has block 0
  const std::vector<int64_t> sizes = {1000, 1001, 1002, 1003, 1004};
  const KvSendReport report = send_kv_blocks(address, hashes, sizes, sender, {});
  EXPECT_EQ(report.skipped_blocks, 1);
  EXPECT_EQ(report.sent_blocks, 3);
  EXPECT_EQ(report.sent_bytes, 1001 + 1002 + 1003);
  EXPECT_EQ(report.missing_blocks, 1);
  for (uint64_t n = 1; n < 4; ++n) EXPECT_EQ(bytes_of(receiver.get(block_name(n))), payload_of(n, 1000 + n));
  EXPECT_EQ(server.stats().num_received_blocks, 3);
  // Again (the sender's received blocks stay until its engine reads them): everything there is skipped.
  const KvSendReport again = send_kv_blocks(address, hashes, sizes, sender, {});
  EXPECT_EQ(again.sent_blocks, 0);
  EXPECT_EQ(again.skipped_blocks, 4);
  // The sender's own blocks leave its buffer once delivered.
  sender.write_block(block_name(10), payload_of(10, 64));
  const std::vector<KvBlockHash> own = {block_name(10)};
  const std::vector<int64_t> own_size = {64};
  EXPECT_EQ(send_kv_blocks(address, own, own_size, sender, {}).sent_blocks, 1);
  EXPECT_FALSE(sender.in_buffer(block_name(10)));
  EXPECT_TRUE(receiver.in_buffer(block_name(10)));
}

TEST(KvLinkTest, ReadsFromStorageWhenAsked) {
  test::TempDir directory;
  BufferedKvStore sender(open_files(directory), 1 << 20), receiver(nullptr, 1 << 20);
  ASSERT_TRUE(sender.storage() != nullptr);
  // On disk only (written by another process, say): straight into the storage.
  auto files = open_files(directory);
  files->write_block(block_name(1), payload_of(1, 256));
  KvLinkServer server(receiver, "127.0.0.1", 0);
  const std::vector<KvBlockHash> hashes = {block_name(1)};
  const std::vector<int64_t> sizes = {256};
  KvSendOptions options;
  EXPECT_EQ(send_kv_blocks("127.0.0.1:" + std::to_string(server.port()), hashes, sizes, sender, options).missing_blocks, 1);
  options.read_storage = true;
  const KvSendReport report = send_kv_blocks("127.0.0.1:" + std::to_string(server.port()), hashes, sizes, sender, options);
  EXPECT_EQ(report.read_blocks, 1);
  EXPECT_EQ(report.read_bytes, 256);
  EXPECT_EQ(report.sent_blocks, 1);
  EXPECT_EQ(bytes_of(receiver.get(block_name(1))), payload_of(1, 256));
}

TEST(KvLinkTest, AFailedLinkIsAnUnavailableErrorNamingThePeer) {
  BufferedKvStore sender(nullptr, 1 << 20);
  sender.put(block_name(0), payload_of(0, 8));
  int port = 0;
  {
    BufferedKvStore receiver(nullptr, 1 << 20);
    KvLinkServer server(receiver, "127.0.0.1", 0);
    port = server.port();
  }  // closed: nothing listens there now
  const std::vector<KvBlockHash> hashes = {block_name(0)};
  const std::vector<int64_t> sizes = {8};
  test::expect_error([&] { send_kv_blocks("127.0.0.1:" + std::to_string(port), hashes, sizes, sender, {}); },
                     ErrorKind::kUnavailable, {"KV link to 127.0.0.1:" + std::to_string(port)});
  test::expect_error([&] { send_kv_blocks("nonsense", hashes, sizes, sender, {}); }, ErrorKind::kInvalidArgument,
                     {"nonsense"});
}

TEST(KvLinkTest, ASenderThatDiesMidBlockOrLiesLeavesNothingBehind) {
  BufferedKvStore receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.receive_timeout_seconds = 2.0});
  // A put of one block whose header claims `digest`, on an authenticated connection (no secret: loopback).
  auto put_header = [&](int fd, uint64_t n, size_t size, const kvlink::Digest& digest) {
    std::string failure;
    std::optional<kvlink::Session> session = kvlink::client_handshake(fd, "", failure);
    EXPECT_TRUE(session) << failure;
    kvlink::MessageWriter request;
    request.op(kvlink::kOpPut).u32(1).hash(block_name(n)).u64(size).raw(digest);
    EXPECT_TRUE(session->send(fd, request.bytes));
    return session;
  };
  {  // half a block, then gone
    const int fd = connect_raw(server.port());
    std::vector<std::byte> payload = payload_of(7, 4096);
    put_header(fd, 7, payload.size(), kvlink::sha256(payload));
    ASSERT_TRUE(kvlink::write_all(fd, std::span(payload).first(1000)));
    ::close(fd);
  }
  {  // a whole block that does not match its digest
    const int fd = connect_raw(server.port());
    std::vector<std::byte> payload = payload_of(8, 64);
    std::optional<kvlink::Session> session = put_header(fd, 8, payload.size(), kvlink::sha256(payload_of(9, 64)));
    ASSERT_TRUE(kvlink::write_all(fd, payload));
    std::vector<std::byte> answer;
    ASSERT_EQ(session->receive(fd, answer, 4), kvlink::Session::Received::kOk);
    uint32_t stored = 99;
    ASSERT_TRUE(kvlink::MessageReader(answer).u32(stored));
    EXPECT_EQ(stored, 0u);
    ::close(fd);
  }
  {  // garbage instead of the magic
    const int fd = connect_raw(server.port());
    const std::string garbage = "GET / HTTP/1.1\r\n\r\n";
    kvlink::write_all(fd, std::as_bytes(std::span(garbage)));
    std::byte byte{};
    EXPECT_FALSE(kvlink::read_exact(fd, std::span(&byte, 1)));  // closed on us
    ::close(fd);
  }
  EXPECT_FALSE(receiver.in_buffer(block_name(7)));
  EXPECT_FALSE(receiver.in_buffer(block_name(8)));
  EXPECT_EQ(server.stats().num_rejected_blocks, 1);
  // The server still serves a well-behaved sender.
  BufferedKvStore sender(nullptr, 1 << 20);
  sender.put(block_name(9), payload_of(9, 64));
  const std::vector<KvBlockHash> hashes = {block_name(9)};
  const std::vector<int64_t> sizes = {64};
  EXPECT_EQ(send_kv_blocks("127.0.0.1:" + std::to_string(server.port()), hashes, sizes, sender, {}).sent_blocks, 1);
}

// A data plane in one process: what a channel sends lands in a queue its
// peer channel receives from (both ends share the plane). Its handshake is
// one byte each way over the control socket, as a real plane's would be.
class QueuePlane final : public KvDataPlane {
 public:
  explicit QueuePlane(std::string name = "queue") : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::unique_ptr<KvBulkChannel> connect(int fd, std::string& failure) override {
    ++num_connects;
    if (fail_connect) {
      failure = "refused on purpose";
      return nullptr;
    }
    std::byte hello{0x51}, answer{};
    if (!kvlink::write_all(fd, std::span(&hello, 1)) || !kvlink::read_exact(fd, std::span(&answer, 1)) ||
        answer != hello) {
      failure = "no answer";
      return nullptr;
    }
    return std::make_unique<Channel>(*this);
  }
  std::unique_ptr<KvBulkChannel> accept(int fd, std::string& failure) override {
    std::byte hello{};
    if (!kvlink::read_exact(fd, std::span(&hello, 1)) || !kvlink::write_all(fd, std::span(&hello, 1))) {
      failure = "no hello";
      return nullptr;
    }
    return std::make_unique<Channel>(*this);
  }
  bool corrupt = false;       // flips the first byte of every send
  bool fail_connect = false;  // the client's end of the handshake fails (as NCCL on one GPU)
  std::atomic<int> num_connects{0};

 private:
  struct Channel final : KvBulkChannel {
    explicit Channel(QueuePlane& plane) : plane(plane) {}
    bool send(std::span<const KvPayload* const> payloads) override {
      std::vector<std::byte> bytes;
      for (const KvPayload* payload : payloads) bytes.insert(bytes.end(), payload->bytes().begin(), payload->bytes().end());
      if (plane.corrupt && !bytes.empty()) bytes[0] ^= std::byte{1};
      std::lock_guard lock(plane.mutex_);
      plane.queue_.push_back(std::move(bytes));
      plane.ready_.notify_all();
      return true;
    }
    bool receive(std::span<KvPayload* const> payloads) override {
      std::unique_lock lock(plane.mutex_);
      if (!plane.ready_.wait_for(lock, 5s, [&] { return !plane.queue_.empty(); })) return false;
      std::vector<std::byte> bytes = std::move(plane.queue_.front());
      plane.queue_.pop_front();
      size_t offset = 0;
      for (KvPayload* payload : payloads) {
        if (offset + payload->size() > bytes.size()) return false;
        std::memcpy(payload->data(), bytes.data() + offset, payload->size());
        offset += payload->size();
      }
      return offset == bytes.size();
    }
    QueuePlane& plane;
  };
  const std::string name_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::vector<std::byte>> queue_;
};

// Puts block n (`size` bytes) in `sender` and sends it alone; the blocks sent.
int64_t send_one(KvLinkClient& client, const std::string& address, BufferedKvStore& sender, uint64_t n, size_t size) {
  sender.put(block_name(n), payload_of(n, size));
  const std::vector<KvBlockHash> hashes = {block_name(n)};
  const std::vector<int64_t> sizes = {static_cast<int64_t>(size)};
  return client.send(address, hashes, sizes, sender, {}).sent_blocks;
}

TEST(KvLinkChannelTest, PayloadsCrossThroughTheDataPlaneOnOnePooledConnection) {
  QueuePlane plane;
  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.plane = &plane});
  // Requests of at most 3000 payload bytes: the 5 blocks below go as 3 bulk puts.
  KvLinkClient client(&plane, {.bulk_request_bytes = 3000});
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  std::vector<KvBlockHash> hashes;
  std::vector<int64_t> sizes;
  for (uint64_t n = 0; n < 5; ++n) {
    hashes.push_back(block_name(n));
    sizes.push_back(1000 + static_cast<int64_t>(n));
    sender.put(block_name(n), payload_of(n, 1000 + n));
  }
  const KvSendReport report = client.send(address, hashes, sizes, sender, {});
  EXPECT_EQ(report.sent_blocks, 5);
  for (uint64_t n = 0; n < 5; ++n) EXPECT_EQ(bytes_of(receiver.get(block_name(n))), payload_of(n, 1000 + n));
  const int64_t total = 1000 + 1001 + 1002 + 1003 + 1004;
  EXPECT_EQ(client.stats().num_channel_bytes, total);
  EXPECT_EQ(server.stats().num_channel_bytes, total);
  EXPECT_EQ(server.stats().num_received_bytes, total);
  // A second send reuses the connection and its channel.
  sender.put(block_name(5), payload_of(5, 77));
  const std::vector<KvBlockHash> more = {block_name(5)};
  const std::vector<int64_t> more_sizes = {77};
  EXPECT_EQ(client.send(address, more, more_sizes, sender, {}).sent_blocks, 1);
  EXPECT_EQ(bytes_of(receiver.get(block_name(5))), payload_of(5, 77));
  EXPECT_EQ(client.stats().num_connections, 1);
  EXPECT_EQ(client.stats().num_channels, 1);
  EXPECT_EQ(server.stats().num_channels, 1);
}

TEST(KvLinkChannelTest, APeerWithoutThePlaneGetsPayloadsInline) {
  QueuePlane mine("queue"), theirs("another");
  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  KvLinkServer plain(receiver, "127.0.0.1", 0);
  KvLinkServer other(receiver, "127.0.0.1", 0, {.plane = &theirs});
  KvLinkClient client(&mine);
  for (const KvLinkServer* server : {&plain, &other}) {
    const uint64_t n = server == &plain ? 1 : 2;
    EXPECT_EQ(send_one(client, "127.0.0.1:" + std::to_string(server->port()), sender, n, 500), 1);
    EXPECT_EQ(bytes_of(receiver.get(block_name(n))), payload_of(n, 500));
  }
  EXPECT_EQ(client.stats().num_channels, 0);
  EXPECT_EQ(client.stats().num_channel_bytes, 0);
}

TEST(KvLinkChannelTest, AChannelThatFailsFallsBackToInlinePayloadsForThatPeer) {
  QueuePlane plane;
  plane.fail_connect = true;
  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.receive_timeout_seconds = 2.0, .plane = &plane});
  KvLinkClient client(&plane, {.max_connections_per_peer = 1, .idle_seconds = 0.0});  // a new connection each send
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  for (uint64_t n = 0; n < 3; ++n) {
    EXPECT_EQ(send_one(client, address, sender, n, 300), 1);
    EXPECT_EQ(bytes_of(receiver.get(block_name(n))), payload_of(n, 300));
  }
  EXPECT_EQ(plane.num_connects.load(), 1);  // asked once; later connections to this peer go inline at once
  EXPECT_EQ(client.stats().num_channels, 0);
  EXPECT_EQ(client.stats().num_channel_bytes, 0);
}

TEST(KvLinkChannelTest, ChangedChannelBytesAreDroppedByTheirDigest) {
  QueuePlane plane;
  plane.corrupt = true;
  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  const std::string secret = "a secret of at least sixteen bytes";
  KvLinkServer server(receiver, "127.0.0.1", 0, {.plane = &plane, .secret = secret});
  KvLinkClient client(&plane, {.secret = secret});
  EXPECT_EQ(send_one(client, "127.0.0.1:" + std::to_string(server.port()), sender, 3, 256), 0);
  EXPECT_FALSE(receiver.in_buffer(block_name(3)));
  EXPECT_EQ(server.stats().num_rejected_blocks, 1);
}

TEST(KvLinkChannelTest, ConcurrentSendsShareTheConnectionCap) {
  BufferedKvStore sender(nullptr, 4 << 20), receiver(nullptr, 4 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0);
  KvLinkClient client(nullptr, {.max_connections_per_peer = 2});
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  std::vector<std::thread> threads;
  std::atomic<int64_t> sent{0};
  for (uint64_t t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::vector<KvBlockHash> hashes;
      std::vector<int64_t> sizes;
      for (uint64_t n = t * 10; n < t * 10 + 10; ++n) {
        sender.put(block_name(n), payload_of(n, 4096));
        hashes.push_back(block_name(n));
        sizes.push_back(4096);
      }
      sent += client.send(address, hashes, sizes, sender, {}).sent_blocks;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(sent.load(), 60);
  EXPECT_LE(client.stats().num_connections, 2);
  EXPECT_EQ(server.stats().num_received_blocks, 60);
}

// Two engines (a prefill engine and a decode engine), each over its own
// buffer, linked as `loom serve --role prefill|decode` links them.
class DisaggregatedEnginesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 1, /*alora_invocation=*/true));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }
  struct Side {
    std::shared_ptr<BufferedKvStore> store = std::make_shared<BufferedKvStore>(nullptr, 64 << 20);
    std::unique_ptr<EngineImpl> engine;
  };
  Side start(KvSharing mode, bool with_adapter) const {
    Side side;
    EngineConfig config = test::small_sharing_engine_config();
    config.num_host_kv_blocks = 64;
    config.kv_store = side.store;
    side.engine = std::make_unique<EngineImpl>(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}), config);
    if (with_adapter) side.engine->load_adapter("agent", directory_->str() + "/adapters/adapter0", mode);
    return side;
  }
  static EngineRequest request(bool adapter, bool invoke, int32_t max_new_tokens) {
    EngineRequest request;
    for (int32_t i = 0; i < 41; ++i) request.prompt_tokens.push_back(10 + (i * 53 + i * i * 5) % 200);
    if (invoke) {
      const std::vector<int> invocation = synthetic_alora_invocation_tokens(model_->config);
      request.prompt_tokens.insert(request.prompt_tokens.end() - 5, invocation.begin(), invocation.end());
    }
    request.max_new_tokens = max_new_tokens;
    request.ignore_eos = true;
    if (adapter) request.adapter = "agent";
    return request;
  }
  static std::pair<std::vector<int32_t>, int32_t> run(EngineImpl& engine, const EngineRequest& request) {
    std::vector<int32_t> tokens;
    int32_t cached = -1;
    auto stream = engine.submit(request);
    test::read_stream(*stream, [&](const RequestOutput& output) {
      EXPECT_FALSE(output.error.has_value()) << output.error->what();
      for (const SampledToken& token : output.new_tokens) tokens.push_back(token.token_id);
      cached = output.num_cached_prompt_tokens;
    });
    return {tokens, cached};
  }

  static test::TempDir* directory_;
  static LoadedModel* model_;
};
test::TempDir* DisaggregatedEnginesTest::directory_ = nullptr;
LoadedModel* DisaggregatedEnginesTest::model_ = nullptr;

TEST_F(DisaggregatedEnginesTest, TheDecodeEngineContinuesFromTheBlocksItWasSentInEveryMode) {
  struct Mode {
    const char* name;
    bool adapter;
    KvSharing sharing;
    bool invoke;
  };
  for (const Mode& mode : {Mode{"base model", false, KvSharing::kIsolated, false},
                           Mode{"isolated", true, KvSharing::kIsolated, false},
                           Mode{"activated", true, KvSharing::kActivated, true},
                           Mode{"base", true, KvSharing::kBase, false},
                           Mode{"forked", true, KvSharing::kForked, false}}) {
    SCOPED_TRACE(mode.name);
    Side alone = start(mode.sharing, mode.adapter);
    const EngineRequest full = request(mode.adapter, mode.invoke, 6);
    const auto [expected, alone_cached] = run(*alone.engine, full);
    EXPECT_EQ(alone_cached, 0);

    Side prefill = start(mode.sharing, mode.adapter), decode = start(mode.sharing, mode.adapter);
    EngineRequest first_token = full;
    first_token.max_new_tokens = 1;
    run(*prefill.engine, first_token);
    const std::vector<KvBlockName> names = prefill.engine->kv_block_hashes(full);
    const int32_t num_full_blocks = static_cast<int32_t>(full.prompt_tokens.size()) / 4;
    EXPECT_EQ(static_cast<int32_t>(names.size()), num_full_blocks * (mode.sharing == KvSharing::kForked ? 2 : 1));
    // The decode engine names the same blocks the same way.
    const std::vector<KvBlockName> decode_names = decode.engine->kv_block_hashes(full);
    ASSERT_EQ(decode_names.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(decode_names[i].hash, names[i].hash);

    KvLinkServer link(*decode.store, "127.0.0.1", 0);
    std::vector<KvBlockHash> hashes;
    std::vector<int64_t> sizes;
    for (const KvBlockName& name : names) {
      hashes.push_back(name.hash);
      sizes.push_back(name.bytes);
    }
    KvSendOptions options;
    options.wait = 5000ms;  // the prefill engine's write-through may still be running
    const KvSendReport report =
        send_kv_blocks("127.0.0.1:" + std::to_string(link.port()), hashes, sizes, *prefill.store, options);
    EXPECT_EQ(report.sent_blocks, static_cast<int64_t>(names.size()));
    EXPECT_EQ(report.missing_blocks, 0);

    const auto [tokens, cached] = run(*decode.engine, full);
    EXPECT_EQ(tokens, expected);
    // Every full block came over, but the last prompt token is always computed.
    const int32_t expected_cached = (static_cast<int32_t>(full.prompt_tokens.size()) - 1) / 4 * 4;
    EXPECT_EQ(cached, expected_cached);
    decode.engine->run_on_engine_thread([&] { EXPECT_EQ(decode.engine->kv_caches().integrity_error(), ""); });

    // The decode engine now caches every block: a link that asks its caches
    // (as `loom serve` sets it up) has them all, so the next turn's send skips them.
    EXPECT_FALSE(decode.engine->caches_kv_block(hash_string("never stored")));
    for (const KvBlockHash& hash : hashes) EXPECT_TRUE(decode.engine->caches_kv_block(hash));
    BufferedKvStore empty(nullptr, 1 << 20);  // only the engine's caches can answer "have"
    KvLinkServer asking(empty, "127.0.0.1", 0,
                        {.cached = [&](const KvBlockHash& hash) { return decode.engine->caches_kv_block(hash); }});
    const KvSendReport again =
        send_kv_blocks("127.0.0.1:" + std::to_string(asking.port()), hashes, sizes, *prefill.store, {});
    EXPECT_EQ(again.skipped_blocks, static_cast<int64_t>(names.size()));
    EXPECT_EQ(again.sent_blocks, 0);
  }
}

}  // namespace
}  // namespace loom
