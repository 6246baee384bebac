// The "socket" device KV plane (kvtransfer/device/socket/socket_device_kv_plane.h)
// between two planes of one process over loopback TCP, as between two CPU
// engines: layer pieces land in exactly the reserved blocks (main and rCache)
// with the bytes the sender's blocks held; a peer without the secret, a piece
// changed on the wire, a piece outside the reservation, a sender that dies
// and a deadline that passes each fail the transfer with no byte of it in
// the blocks; sends go only to allowed peers.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "kvtransfer/device/socket/socket_device_kv_plane.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"
#include "util/error.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
using State = DeviceKvProgress::State;

const std::string kSecret = "socket-plane-test-secret-0123456789";
constexpr int32_t kLayers = 3, kBlocks = 8;
constexpr int64_t kMainBytes = 24, kResidualBytes = 8;

// Host pools laid out as the CPU backend's: per layer K and V (main), one rCache array.
struct Pools {
  std::vector<std::vector<std::byte>> storage;
  KvPoolMemory main, residual;

  explicit Pools(uint8_t seed) {
    auto make = [&](KvPoolMemory& pool, int32_t arrays, int64_t bytes) {
      pool.arrays_per_layer = arrays;
      pool.num_blocks = kBlocks;
      pool.bytes_per_block = bytes;
      for (int32_t i = 0; i < kLayers * arrays; ++i) {
        storage.emplace_back(static_cast<size_t>(kBlocks * bytes));
        for (size_t b = 0; b < storage.back().size(); ++b)
          storage.back()[b] = seed == 0 ? std::byte{0} : static_cast<std::byte>((seed * 31 + i * 7 + b) & 0xff);
        pool.arrays.push_back(storage.back().data());
      }
    };
    make(main, 2, kMainBytes);
    make(residual, 1, kResidualBytes);
  }
  std::vector<std::byte> block(const KvPoolMemory& pool, int32_t layer, int32_t array, int32_t id) const {
    const std::byte* at = pool.arrays[static_cast<size_t>(layer * pool.arrays_per_layer + array)] + id * pool.bytes_per_block;
    return {at, at + pool.bytes_per_block};
  }
  bool all_zero() const {
    for (const auto& array : storage)
      for (std::byte b : array)
        if (b != std::byte{0}) return false;
    return true;
  }
};

SocketDeviceKvPlaneOptions options(const std::string& secret = kSecret) {
  SocketDeviceKvPlaneOptions result;
  result.secret = secret;
  return result;
}

DeviceKvProgress wait_settled(const DeviceKvPlane& plane, DeviceKvTransferId id, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  DeviceKvProgress progress = plane.progress(id);
  while (progress.state == State::kPending && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(2ms);
    progress = plane.progress(id);
  }
  return progress;
}

DeviceKvDestination destination(DeviceKvTransferId id, bool forked) {
  DeviceKvDestination result;
  result.id = id;
  result.main_blocks = {5, 6, 7, 2};  // two runs: 5-7 and 2
  if (forked) result.residual_blocks = {1, 2, 3, 4};
  return result;
}

class SocketDeviceKvPlaneTest : public ::testing::Test {
 protected:
  Pools pe_pools_{7}, de_pools_{0};
  std::unique_ptr<SocketDeviceKvPlane> pe_, de_;

  void SetUp() override {
    pe_ = std::make_unique<SocketDeviceKvPlane>(options());
    de_ = std::make_unique<SocketDeviceKvPlane>(options());
    pe_->bind_pools(pe_pools_.main, pe_pools_.residual);
    de_->bind_pools(de_pools_.main, de_pools_.residual);
  }
  void expect(const DeviceKvDestination& where, std::chrono::milliseconds timeout = 10s) {
    de_->expect({where, pe_->endpoint().address, kLayers, std::chrono::steady_clock::now() + timeout});
  }
};

const std::vector<int32_t> kMainSources = {0, 1, 2, 3}, kResidualSources = {4, 5, 6, 7};

TEST_F(SocketDeviceKvPlaneTest, LayerPiecesLandInTheReservedBlocksWithTheSendersBytes) {
  const DeviceKvEndpoint endpoint = de_->endpoint();
  EXPECT_EQ(endpoint.plane, "socket");
  EXPECT_EQ(endpoint.device, "cpu");
  EXPECT_FALSE(endpoint.same_host_only);
  EXPECT_EQ(endpoint.address, "127.0.0.1:" + std::to_string(de_->port()));

  const DeviceKvDestination where = destination(41, /*forked=*/true);
  expect(where);
  ASSERT_TRUE(pe_->begin_send(endpoint.address, where, kLayers));
  // Layers in any order; the second layer in two pieces.
  for (int32_t layer : {2, 0}) {
    ASSERT_TRUE(pe_->send_layer(41, {layer, 0, kMainSources, kResidualSources, {}}));
  }
  std::span<const int32_t> main(kMainSources), residual(kResidualSources);
  ASSERT_TRUE(pe_->send_layer(41, {1, 2, main.subspan(2), residual.subspan(2), {}}));
  ASSERT_TRUE(pe_->send_layer(41, {1, 0, main.first(2), residual.first(2), {}}));
  pe_->end_send(41, "");
  const DeviceKvProgress progress = wait_settled(*de_, 41);
  ASSERT_EQ(progress.state, State::kDone) << progress.failure;
  EXPECT_EQ(progress.num_layers_landed, kLayers);
  EXPECT_EQ(progress.num_bytes_landed, kLayers * 4 * (2 * kMainBytes + kResidualBytes));
  for (int32_t layer = 0; layer < kLayers; ++layer)
    for (size_t i = 0; i < 4; ++i) {
      for (int32_t array = 0; array < 2; ++array)
        EXPECT_EQ(de_pools_.block(de_pools_.main, layer, array, where.main_blocks[i]),
                  pe_pools_.block(pe_pools_.main, layer, array, kMainSources[i]));
      EXPECT_EQ(de_pools_.block(de_pools_.residual, layer, 0, where.residual_blocks[i]),
                pe_pools_.block(pe_pools_.residual, layer, 0, kResidualSources[i]));
    }
  // Blocks outside the reservation stay untouched.
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(de_pools_.block(de_pools_.main, layer, 0, 0), std::vector<std::byte>(kMainBytes));
    EXPECT_EQ(de_pools_.block(de_pools_.residual, layer, 0, 0), std::vector<std::byte>(kResidualBytes));
  }
  EXPECT_EQ(de_->stats().pieces_received, 4);
  de_->finish(41);
  EXPECT_EQ(de_->progress(41).state, State::kUnknown);
}

TEST_F(SocketDeviceKvPlaneTest, ASenderWithAnotherSecretIsRefusedAndTheDeadlineFailsTheTransfer) {
  SocketDeviceKvPlane stranger(options("another-secret-of-enough-length-42"));
  stranger.bind_pools(pe_pools_.main, pe_pools_.residual);
  const DeviceKvDestination where = destination(42, false);
  de_->expect({where, stranger.endpoint().address, kLayers, std::chrono::steady_clock::now() + 400ms});
  ASSERT_TRUE(stranger.begin_send(de_->endpoint().address, where, kLayers));
  stranger.send_layer(42, {0, 0, kMainSources, {}, {}});
  // The stranger's handshake fails: its sends are refused from then on.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (stranger.send_layer(42, {1, 0, kMainSources, {}, {}}) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);
  EXPECT_FALSE(stranger.send_layer(42, {1, 0, kMainSources, {}, {}}));
  // The receiver counts the refusal once its side of the handshake returns, which
  // can be after the stranger has seen the connection end.
  while (de_->stats().refused_connections < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);
  EXPECT_GE(de_->stats().refused_connections, 1);
  const DeviceKvProgress progress = wait_settled(*de_, 42);
  ASSERT_EQ(progress.state, State::kFailed);
  EXPECT_EQ(progress.failure, "deadline passed");
  EXPECT_TRUE(de_pools_.all_zero());
}

// A client speaking the plane's protocol by hand, to send what a real sender never would.
struct RawSender {
  int fd = -1;
  std::optional<kvlink::Session> session;

  explicit RawSender(int port) {
    std::string failure;
    fd = kvlink::open_socket("127.0.0.1", port, false,
                             [](int candidate, const sockaddr* address, socklen_t length) {
                               return ::connect(candidate, address, length) == 0;
                             },
                             failure);
    EXPECT_GE(fd, 0) << failure;
    kvlink::set_timeouts(fd, 5.0);
    session = kvlink::client_handshake(fd, kSecret, failure);
    EXPECT_TRUE(session) << failure;
  }
  ~RawSender() { ::close(fd); }
  bool open(DeviceKvTransferId id, const std::string& from, int32_t blocks) {
    kvlink::MessageWriter open;
    open.op('O').u64(id).u32(kLayers).u32(static_cast<uint32_t>(blocks)).u32(2).u64(kMainBytes).u32(0).u64(0)
        .raw(kvlink::as_bytes(from));
    std::vector<std::byte> answer;
    return session->send(fd, open.bytes) &&
           session->receive(fd, answer, 4096) == kvlink::Session::Received::kOk && !answer.empty() &&
           answer[0] == std::byte{1};
  }
  static std::vector<std::byte> layer(uint32_t layer, uint32_t first, uint32_t count, uint8_t fill) {
    kvlink::MessageWriter piece;
    piece.op('L').u32(layer).u32(first).u32(count);
    piece.bytes.resize(piece.bytes.size() + count * 2 * kMainBytes, std::byte{fill});
    return std::move(piece.bytes);
  }
};

TEST_F(SocketDeviceKvPlaneTest, APieceChangedOnTheWireFailsItsTagAndNothingOfItLands) {
  const DeviceKvDestination where = destination(43, false);
  expect(where);
  RawSender sender(de_->port());
  ASSERT_TRUE(sender.open(43, pe_->endpoint().address, 4));
  // Seal the piece onto a socket pair, flip one payload byte, and put that on the connection.
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  const std::vector<std::byte> body = RawSender::layer(0, 0, 4, 0x5a);
  ASSERT_TRUE(sender.session->send(pair[0], body));
  std::vector<std::byte> wire(body.size() + kvlink::kMessageOverheadBytes);
  ASSERT_TRUE(kvlink::read_exact(pair[1], wire));
  ::close(pair[0]);
  ::close(pair[1]);
  wire[4 + 20] ^= std::byte{1};
  ASSERT_TRUE(kvlink::write_all(sender.fd, wire));
  const DeviceKvProgress progress = wait_settled(*de_, 43);
  ASSERT_EQ(progress.state, State::kFailed);
  EXPECT_EQ(progress.failure, "a piece failed its authentication tag");
  EXPECT_EQ(de_->stats().forged_messages, 1);
  EXPECT_EQ(de_->stats().pieces_received, 0);
  EXPECT_TRUE(de_pools_.all_zero());
}

TEST_F(SocketDeviceKvPlaneTest, APieceOutsideTheReservationOrFromAnotherAddressIsRefused) {
  const DeviceKvDestination where = destination(44, false);
  expect(where);
  {
    // Holds the secret but claims another sender: refused; the reservation still waits for its sender.
    RawSender impostor(de_->port());
    EXPECT_FALSE(impostor.open(44, "127.0.0.1:1", 4));
  }
  EXPECT_EQ(de_->progress(44).state, State::kPending);
  EXPECT_EQ(de_->stats().rejected_pieces, 1);
  DeviceKvProgress progress;
  de_->finish(44);

  expect(destination(45, false));
  RawSender sender(de_->port());
  ASSERT_TRUE(sender.open(45, pe_->endpoint().address, 4));
  ASSERT_TRUE(sender.session->send(sender.fd, RawSender::layer(0, 3, 2, 0x11)));  // blocks 3-4 of 4
  progress = wait_settled(*de_, 45);
  ASSERT_EQ(progress.state, State::kFailed);
  EXPECT_EQ(progress.failure, "a piece outside the reservation or of the wrong size");
  EXPECT_TRUE(de_pools_.all_zero());
}

TEST_F(SocketDeviceKvPlaneTest, ASenderThatDiesMidTransferFailsItAtOnce) {
  const DeviceKvDestination where = destination(46, false);
  expect(where, 60s);
  ASSERT_TRUE(pe_->begin_send(de_->endpoint().address, where, kLayers));
  ASSERT_TRUE(pe_->send_layer(46, {0, 0, kMainSources, {}, {}}));
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (de_->progress(46).num_layers_landed < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);
  ASSERT_EQ(de_->progress(46).num_layers_landed, 1);
  const auto died = std::chrono::steady_clock::now();
  pe_.reset();  // the engine dies: its connection closes without an end
  const DeviceKvProgress progress = wait_settled(*de_, 46);
  ASSERT_EQ(progress.state, State::kFailed);
  EXPECT_NE(progress.failure.find("died"), std::string::npos) << progress.failure;
  EXPECT_LT(std::chrono::steady_clock::now() - died, 5s);  // not the 60 s deadline
}

TEST_F(SocketDeviceKvPlaneTest, ASenderThatGivesUpFailsTheTransferAndAGoneReceiverFailsTheSends) {
  const DeviceKvDestination where = destination(47, false);
  expect(where);
  ASSERT_TRUE(pe_->begin_send(de_->endpoint().address, where, kLayers));
  pe_->end_send(47, "the prefill request ended first");
  DeviceKvProgress progress = wait_settled(*de_, 47);
  ASSERT_EQ(progress.state, State::kFailed);
  EXPECT_EQ(progress.failure, "the sender gave up: the prefill request ended first");

  // A transfer the receiver does not expect: refused at open, later sends fail.
  ASSERT_TRUE(pe_->begin_send(de_->endpoint().address, destination(48, false), kLayers));
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (pe_->send_layer(48, {0, 0, kMainSources, {}, {}}) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(2ms);
  EXPECT_FALSE(pe_->send_layer(48, {0, 0, kMainSources, {}, {}}));
}

TEST_F(SocketDeviceKvPlaneTest, SendsGoOnlyToAllowedPeersAndCudaPoolsAreRefused) {
  EXPECT_FALSE(pe_->begin_send("10.1.2.3:4000", destination(49, false), kLayers));
  KvPoolMemory cuda = pe_pools_.main;
  cuda.kind = KvPoolMemory::Kind::kCuda;
  EXPECT_THROW(pe_->bind_pools(cuda, {}), Error);
}

TEST(SocketDeviceKvPlaneListenTest, NoSecretOffLoopbackDoesNotListen) {
  SocketDeviceKvPlaneOptions open = options("");
  open.host = "0.0.0.0";
  EXPECT_THROW(SocketDeviceKvPlane plane(open), Error);
}

}  // namespace
}  // namespace loom
