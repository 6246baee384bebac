// The KV link's authentication (kvtransfer/kv_link_session.h): peers without
// the shared secret, or with another, are refused and nothing they send
// enters the receiver's buffer; a message or payload changed on the way, a
// replayed message and a replayed session are rejected; an older (protocol 1)
// peer gets a clear error; sends reach only allowed peers; a link without a
// secret stays on loopback; and the signed /loom/kv/* HTTP calls
// (server/kv_auth.h). Changes on the way are made by a man-in-the-middle TCP
// proxy between a real client and a real server.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "kvstore/buffered_kv_store.h"
#include "kvtransfer/kv_link_client.h"
#include "kvtransfer/kv_link_crypto.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kv_link_test_util.h"
#include "kvtransfer/kv_link_server.h"
#include "kvtransfer/kv_link_session.h"
#include "kvtransfer/kv_peer_allowlist.h"
#include "server/kv_auth.h"
#include "test_util.h"

namespace loom {
namespace {

using test::connect_raw;

const std::string kSecret = "0123456789abcdef-the-engines-secret";

KvBlockHash block_name(uint64_t n) { return hash_string("auth block " + std::to_string(n)); }

std::vector<std::byte> payload_of(uint64_t n, size_t size) {
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((n * 131 + i * 17 + i / 256) & 0xff);
  return bytes;
}

std::vector<std::byte> bytes_of(const BufferedKvStore::Payload& payload) {
  if (!payload) return {};
  return {payload->bytes().begin(), payload->bytes().end()};
}

std::string address_of(int port) { return "127.0.0.1:" + std::to_string(port); }

// Whether `counter()` reaches `value` within 5 s (the server counts a refusal on its own thread).
template <typename Counter>
bool reaches(Counter counter, int64_t value) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (counter() != value && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return counter() == value;
}


int listen_loopback(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_EQ(::listen(fd, 4), 0);
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  port = ntohs(address.sin_port);
  return fd;
}

// A man in the middle for one connection: forwards both ways between a client
// and the server at `target_port`, flipping the client's byte number `flip_at`
// (counted from the connection's first byte; none when negative), and
// recording what the client sent.
class Proxy {
 public:
  Proxy(int target_port, int64_t flip_at) : flip_at_(flip_at) {
    listen_fd_ = listen_loopback(port_);
    thread_ = std::thread([this, target_port] { run(target_port); });
  }
  ~Proxy() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  std::vector<std::byte> client_bytes() {
    std::lock_guard lock(mutex_);
    return client_bytes_;
  }

 private:
  void run(int target_port) {
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    if (client < 0) return;
    const int server = connect_raw(target_port, 5.0);
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    std::byte buffer[4096];
    int64_t forwarded = 0;
    for (bool open = true; open;) {
      if (::poll(fds, 2, 5000) <= 0) break;
      for (int side = 0; side < 2 && open; ++side) {
        if (fds[side].revents == 0) continue;
        const ssize_t count = ::recv(fds[side].fd, buffer, sizeof(buffer), 0);
        if (count <= 0) {
          open = false;
          break;
        }
        if (side == 0) {
          if (flip_at_ >= forwarded && flip_at_ < forwarded + count) buffer[flip_at_ - forwarded] ^= std::byte{0x20};
          std::lock_guard lock(mutex_);
          client_bytes_.insert(client_bytes_.end(), buffer, buffer + count);
          forwarded += count;
        }
        if (!kvlink::write_all(fds[1 - side].fd, std::span(buffer, static_cast<size_t>(count)))) open = false;
      }
    }
    ::close(client);
    ::close(server);
  }

  const int64_t flip_at_;
  int listen_fd_ = -1, port_ = 0;
  std::mutex mutex_;
  std::vector<std::byte> client_bytes_;
  std::thread thread_;
};

struct Blocks {
  std::vector<KvBlockHash> hashes;
  std::vector<int64_t> sizes;
};

// Blocks first..first+count-1 of `size` bytes, put in `sender`.
Blocks put_blocks(BufferedKvStore& sender, uint64_t first, uint64_t count, size_t size) {
  Blocks blocks;
  for (uint64_t n = first; n < first + count; ++n) {
    sender.put(block_name(n), payload_of(n, size));
    blocks.hashes.push_back(block_name(n));
    blocks.sizes.push_back(static_cast<int64_t>(size));
  }
  return blocks;
}

// Bytes the client writes before a put of `num_blocks` (handshake, then the have query of as many blocks).
int64_t bytes_before_put(size_t num_blocks) {
  return static_cast<int64_t>(kvlink::kClientHandshakeBytes + kvlink::kMessageOverheadBytes + 1 + 4 + 16 * num_blocks);
}

TEST(KvLinkAuthTest, PeersSharingTheSecretMoveBlocksBitExact) {
  BufferedKvStore sender(nullptr, 4 << 20), receiver(nullptr, 4 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.secret = kSecret});
  EXPECT_TRUE(server.authenticated());
  KvLinkClient client(nullptr, {.secret = kSecret});
  Blocks blocks = put_blocks(sender, 0, 6, 4096);
  sender.put(block_name(6), payload_of(6, 1));  // sizes differ: one byte, and a larger block
  sender.put(block_name(7), payload_of(7, 300000));
  blocks.hashes.insert(blocks.hashes.end(), {block_name(6), block_name(7)});
  blocks.sizes.insert(blocks.sizes.end(), {1, 300000});
  const KvSendReport report = client.send(address_of(server.port()), blocks.hashes, blocks.sizes, sender, {});
  EXPECT_EQ(report.sent_blocks, 8);
  for (uint64_t n = 0; n < 8; ++n)
    EXPECT_EQ(bytes_of(receiver.get(block_name(n))), payload_of(n, static_cast<size_t>(blocks.sizes[n])));
  // The next send on the pooled connection (its counters moved on) is skipped by the have answer.
  EXPECT_EQ(client.send(address_of(server.port()), blocks.hashes, blocks.sizes, sender, {}).skipped_blocks, 8);
  EXPECT_EQ(client.stats().num_connections, 1);
  const KvLinkServerStats stats = server.stats();
  EXPECT_EQ(stats.num_refused_connections, 0);
  EXPECT_EQ(stats.num_forged_messages, 0);
  EXPECT_EQ(stats.num_rejected_blocks, 0);
}

TEST(KvLinkAuthTest, PeersWithoutTheSecretOrWithAnotherAreRefusedAndNothingEnters) {
  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.secret = kSecret});
  const Blocks blocks = put_blocks(sender, 0, 3, 512);
  for (const std::string& secret : {std::string(), std::string("another secret of enough bytes"), kSecret + "x"}) {
    SCOPED_TRACE(secret.empty() ? "no secret" : secret);
    KvLinkClient client(nullptr, {.secret = secret});
    test::expect_error([&] { client.send(address_of(server.port()), blocks.hashes, blocks.sizes, sender, {}); },
                       ErrorKind::kUnavailable, {"handshake failed", "did not prove the shared secret"});
  }
  // An engine with a secret is refused by a link without one as well.
  BufferedKvStore open_receiver(nullptr, 1 << 20);
  KvLinkServer open_link(open_receiver, "127.0.0.1", 0);
  KvLinkClient with_secret(nullptr, {.secret = kSecret});
  test::expect_error(
      [&] { with_secret.send(address_of(open_link.port()), blocks.hashes, blocks.sizes, sender, {}); },
      ErrorKind::kUnavailable, {"handshake failed"});
  // A peer that ignores the server's proof and pushes a block anyway is refused: the server closes.
  const int fd = connect_raw(server.port(), 5.0);
  std::vector<std::byte> hello(kvlink::kClientHelloBytes, std::byte{7});
  std::memcpy(hello.data(), kvlink::kMagic, sizeof(kvlink::kMagic));
  std::vector<std::byte> reply(8 + kvlink::kNonceBytes + kvlink::kTagBytes);
  ASSERT_TRUE(kvlink::write_all(fd, hello) && kvlink::read_exact(fd, reply));
  const std::vector<std::byte> guess(kvlink::kTagBytes, std::byte{0});
  ASSERT_TRUE(kvlink::write_all(fd, guess));
  std::byte verdict{0x55};
  ASSERT_TRUE(kvlink::read_exact(fd, std::span(&verdict, 1)));
  EXPECT_EQ(verdict, std::byte{0});
  kvlink::Session forged(kvlink::Digest{}, kvlink::Session::Side::kClient);
  const std::vector<std::byte> payload = payload_of(9, 64);
  kvlink::MessageWriter put;
  put.op(kvlink::kOpPut).u32(1).hash(block_name(9)).u64(payload.size()).raw(kvlink::sha256(payload));
  forged.send(fd, put.bytes);  // may fail: the server closed
  kvlink::write_all(fd, payload);
  EXPECT_FALSE(kvlink::read_exact(fd, std::span(&verdict, 1)));
  ::close(fd);

  for (uint64_t n : {0, 1, 2, 9}) EXPECT_FALSE(receiver.in_buffer(block_name(n)));
  EXPECT_EQ(receiver.buffer_stats().num_blocks, 0);
  EXPECT_EQ(open_receiver.buffer_stats().num_blocks, 0);
  EXPECT_EQ(server.stats().num_received_blocks, 0);
  EXPECT_TRUE(reaches([&] { return server.stats().num_refused_connections; }, 4));
  EXPECT_TRUE(reaches([&] { return open_link.stats().num_refused_connections; }, 1));
  // The link still serves a peer with the secret.
  KvLinkClient good(nullptr, {.secret = kSecret});
  EXPECT_EQ(good.send(address_of(server.port()), blocks.hashes, blocks.sizes, sender, {}).sent_blocks, 3);
}

TEST(KvLinkAuthTest, AControlMessageChangedOnTheWayClosesTheConnectionAndNothingEnters) {
  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.secret = kSecret});
  const Blocks blocks = put_blocks(sender, 0, 1, 1000);
  // A byte of the put's header message (in its block size field) changes.
  Proxy proxy(server.port(), bytes_before_put(1) + 4 + 1 + 4 + 16 + 2);
  KvLinkClient client(nullptr, {.secret = kSecret});
  test::expect_error([&] { client.send(address_of(proxy.port()), blocks.hashes, blocks.sizes, sender, {}); },
                     ErrorKind::kUnavailable, {"the block transfer"});
  EXPECT_FALSE(receiver.in_buffer(block_name(0)));
  EXPECT_EQ(server.stats().num_forged_messages, 1);
  EXPECT_EQ(server.stats().num_received_blocks, 0);
  // A changed handshake (the client's proof) is refused as well.
  Proxy at_handshake(server.port(), kvlink::kClientHelloBytes + 3);
  KvLinkClient other(nullptr, {.secret = kSecret});
  test::expect_error([&] { other.send(address_of(at_handshake.port()), blocks.hashes, blocks.sizes, sender, {}); },
                     ErrorKind::kUnavailable, {"refused this engine's proof"});
  EXPECT_TRUE(reaches([&] { return server.stats().num_refused_connections; }, 1));
  EXPECT_FALSE(receiver.in_buffer(block_name(0)));
}

TEST(KvLinkAuthTest, APayloadChangedOnTheWayIsDroppedByItsDigest) {
  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.secret = kSecret});
  const Blocks blocks = put_blocks(sender, 0, 2, 1000);
  const int64_t put_message = kvlink::kMessageOverheadBytes + 1 + 4 + 2 * kvlink::kBlockHeaderBytes;
  Proxy proxy(server.port(), bytes_before_put(2) + put_message + 1000 + 500);  // inside the second payload
  KvLinkClient client(nullptr, {.secret = kSecret});
  const KvSendReport report = client.send(address_of(proxy.port()), blocks.hashes, blocks.sizes, sender, {});
  EXPECT_EQ(report.sent_blocks, 1);
  EXPECT_EQ(bytes_of(receiver.get(block_name(0))), payload_of(0, 1000));
  EXPECT_FALSE(receiver.in_buffer(block_name(1)));
  EXPECT_EQ(server.stats().num_rejected_blocks, 1);
}

TEST(KvLinkAuthTest, AReplayedMessageOrSessionIsRejected) {
  BufferedKvStore receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.secret = kSecret});
  // A peer with the secret sends a put; the same sealed bytes again on that connection fail their counter.
  const int fd = connect_raw(server.port(), 5.0);
  std::string failure;
  std::optional<kvlink::Session> session = kvlink::client_handshake(fd, kSecret, failure);
  ASSERT_TRUE(session) << failure;
  const std::vector<std::byte> payload = payload_of(3, 256);
  kvlink::MessageWriter put;
  put.op(kvlink::kOpPut).u32(1).hash(block_name(3)).u64(payload.size()).raw(kvlink::sha256(payload));
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ASSERT_TRUE(session->send(pair[0], put.bytes));  // sealed once, captured
  std::vector<std::byte> sealed(put.bytes.size() + kvlink::kMessageOverheadBytes);
  ASSERT_TRUE(kvlink::read_exact(pair[1], sealed));
  ::close(pair[0]);
  ::close(pair[1]);
  ASSERT_TRUE(kvlink::write_all(fd, sealed) && kvlink::write_all(fd, payload));
  std::vector<std::byte> answer;
  ASSERT_EQ(session->receive(fd, answer, 4), kvlink::Session::Received::kOk);
  ASSERT_TRUE(kvlink::write_all(fd, sealed) && kvlink::write_all(fd, payload));  // the replay
  std::byte byte{};
  EXPECT_FALSE(kvlink::read_exact(fd, std::span(&byte, 1)));  // closed, no answer
  ::close(fd);
  EXPECT_EQ(server.stats().num_forged_messages, 1);
  EXPECT_EQ(server.stats().num_received_blocks, 1);  // the first put only

  // A whole recorded session replayed on a new connection fails the handshake: the server's nonce is new.
  BufferedKvStore sender(nullptr, 1 << 20), fresh(nullptr, 1 << 20);
  KvLinkServer target(fresh, "127.0.0.1", 0, {.secret = kSecret});
  std::vector<std::byte> recorded;
  {
    BufferedKvStore elsewhere(nullptr, 1 << 20);
    KvLinkServer original(elsewhere, "127.0.0.1", 0, {.secret = kSecret});
    Proxy recorder(original.port(), -1);
    const Blocks blocks = put_blocks(sender, 10, 2, 300);
    KvLinkClient client(nullptr, {.max_connections_per_peer = 1, .idle_seconds = 0.0, .secret = kSecret});
    EXPECT_EQ(client.send(address_of(recorder.port()), blocks.hashes, blocks.sizes, sender, {}).sent_blocks, 2);
    recorded = recorder.client_bytes();
  }
  const int replay = connect_raw(target.port(), 5.0);
  ASSERT_GT(recorded.size(), kvlink::kClientHandshakeBytes);
  ASSERT_TRUE(kvlink::write_all(replay, std::span(recorded).first(kvlink::kClientHandshakeBytes)));
  std::vector<std::byte> server_reply(8 + kvlink::kNonceBytes + kvlink::kTagBytes + 1);
  ASSERT_TRUE(kvlink::read_exact(replay, server_reply));
  EXPECT_EQ(server_reply.back(), std::byte{0});  // the verdict: refused
  kvlink::write_all(replay, std::span(recorded).subspan(kvlink::kClientHandshakeBytes));  // the rest, unheard
  ::close(replay);
  EXPECT_TRUE(reaches([&] { return target.stats().num_refused_connections; }, 1));
  EXPECT_EQ(fresh.buffer_stats().num_blocks, 0);
}

TEST(KvLinkAuthTest, AnOlderPeerGetsAClearErrorEitherWay) {
  BufferedKvStore receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.secret = kSecret});
  {  // a protocol 1 client: its magic, then a have query
    const int fd = connect_raw(server.port(), 5.0);
    kvlink::write_all(fd, std::as_bytes(std::span(kvlink::kMagicVersion1)));
    const std::byte have[] = {std::byte{'H'}, std::byte{1}, std::byte{0}, std::byte{0}, std::byte{0}};
    kvlink::write_all(fd, have);
    std::byte byte{};
    EXPECT_FALSE(kvlink::read_exact(fd, std::span(&byte, 1)));  // closed, not a garbage answer
    ::close(fd);
  }
  EXPECT_TRUE(reaches([&] { return server.stats().num_refused_connections; }, 1));
  // A protocol 1 server (reads a magic that is not its own, and closes).
  int port = 0;
  const int listener = listen_loopback(port);
  std::thread old_server([listener] {
    const int fd = ::accept(listener, nullptr, nullptr);
    std::byte magic[8];
    kvlink::read_exact(fd, magic);
    ::close(fd);
  });
  BufferedKvStore sender(nullptr, 1 << 20);
  const Blocks blocks = put_blocks(sender, 0, 1, 64);
  KvLinkClient client(nullptr, {.secret = kSecret});
  test::expect_error([&] { client.send(address_of(port), blocks.hashes, blocks.sizes, sender, {}); },
                     ErrorKind::kUnavailable, {"older Loom (KV link protocol 1)"});
  old_server.join();
  ::close(listener);
}

TEST(KvLinkAuthTest, ALinkWithoutASecretListensOnLoopbackOnly) {
  BufferedKvStore receiver(nullptr, 1 << 20);
  test::expect_error([&] { KvLinkServer server(receiver, "0.0.0.0", 0); }, ErrorKind::kInvalidArgument,
                     {"without a shared secret", "--kv-transfer-secret-file"});
  KvLinkServer with_secret(receiver, "0.0.0.0", 0, {.secret = kSecret});
  EXPECT_GT(with_secret.port(), 0);
  KvLinkServer loopback(receiver, "127.0.0.1", 0);
  EXPECT_FALSE(loopback.authenticated());
}

TEST(KvLinkAuthTest, SendsReachOnlyAllowedPeers) {
  const KvPeerAllowlist loopback;
  EXPECT_TRUE(loopback.allows("127.0.0.1:5000"));
  EXPECT_TRUE(loopback.allows("127.8.0.1:5000"));
  EXPECT_TRUE(loopback.allows("localhost:1"));
  EXPECT_TRUE(loopback.allows("::1:7000"));
  EXPECT_FALSE(loopback.allows("10.0.0.2:5000"));
  EXPECT_FALSE(loopback.allows("example.com:5000"));
  EXPECT_FALSE(loopback.allows("nonsense"));
  const KvPeerAllowlist listed = KvPeerAllowlist::parse("10.0.0.2:5000, pe-1.internal:*");
  EXPECT_TRUE(listed.allows("10.0.0.2:5000"));
  EXPECT_FALSE(listed.allows("10.0.0.2:5001"));
  EXPECT_TRUE(listed.allows("PE-1.internal:6000"));
  EXPECT_FALSE(listed.allows("127.0.0.1:5000"));  // a list replaces the loopback default
  EXPECT_EQ(listed.describe(), "--kv-transfer-peers 10.0.0.2:5000,pe-1.internal:*");
  test::expect_error([] { KvPeerAllowlist::parse("10.0.0.2"); }, ErrorKind::kInvalidArgument, {"'10.0.0.2'"});

  BufferedKvStore sender(nullptr, 1 << 20), receiver(nullptr, 1 << 20);
  KvLinkServer server(receiver, "127.0.0.1", 0, {.secret = kSecret});
  const Blocks blocks = put_blocks(sender, 0, 1, 64);
  KvLinkClient elsewhere(nullptr, {.secret = kSecret, .peers = KvPeerAllowlist::parse("10.0.0.2:5000")});
  test::expect_error([&] { elsewhere.send(address_of(server.port()), blocks.hashes, blocks.sizes, sender, {}); },
                     ErrorKind::kInvalidArgument, {"is not an allowed peer", "--kv-transfer-peers"});
  EXPECT_EQ(server.stats().num_connections, 0);  // refused before connecting
  KvLinkClient listed_client(nullptr,
                             {.secret = kSecret, .peers = KvPeerAllowlist::parse(address_of(server.port()))});
  EXPECT_EQ(listed_client.send(address_of(server.port()), blocks.hashes, blocks.sizes, sender, {}).sent_blocks, 1);
}

TEST(KvHttpAuthTest, ASignatureCoversTheSecretMethodPathBodyAndTime) {
  const int64_t now = 1'700'000'000;
  const std::string body = R"({"blocks":[],"to":"127.0.0.1:1"})";
  const std::string header = server::sign_kv_request(kSecret, "POST", "/loom/kv/send", body, now);
  EXPECT_TRUE(server::kv_request_signed(kSecret, "POST", "/loom/kv/send", body, header, now));
  EXPECT_TRUE(server::kv_request_signed(kSecret, "POST", "/loom/kv/send", body, header, now + 299));
  EXPECT_FALSE(server::kv_request_signed(kSecret, "POST", "/loom/kv/send", body, header, now + 301));  // stale
  EXPECT_FALSE(server::kv_request_signed(kSecret, "POST", "/loom/kv/send", body, header, now - 301));
  EXPECT_FALSE(server::kv_request_signed("another secret of enough bytes", "POST", "/loom/kv/send", body, header, now));
  EXPECT_FALSE(server::kv_request_signed(kSecret, "POST", "/loom/kv/probe", body, header, now));
  EXPECT_FALSE(server::kv_request_signed(kSecret, "POST", "/loom/kv/send", body + " ", header, now));
  EXPECT_FALSE(server::kv_request_signed(kSecret, "POST", "/loom/kv/send", body, "", now));
  EXPECT_FALSE(server::kv_request_signed(kSecret, "POST", "/loom/kv/send", body, "1 abc def", now));
  std::string changed = header;
  changed.back() = changed.back() == '0' ? '1' : '0';
  EXPECT_FALSE(server::kv_request_signed(kSecret, "POST", "/loom/kv/send", body, changed, now));
  // The format, as another implementation (the Python tests) computes it.
  const std::string text = "loom kv http 1\nPOST\n/loom/kv/send\n1700000000\n" +
                           kvlink::to_hex(kvlink::sha256(kvlink::as_bytes(body)));
  EXPECT_EQ(header, "1 1700000000 " + kvlink::to_hex(kvlink::hmac_sha256(kvlink::as_bytes(kSecret),
                                                                          {kvlink::as_bytes(text)})));
}

TEST(KvHttpAuthTest, HmacMatchesRfc4231) {
  // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
  EXPECT_EQ(kvlink::to_hex(kvlink::hmac_sha256(kvlink::as_bytes("Jefe"),
                                               {kvlink::as_bytes("what do ya "), kvlink::as_bytes("want for nothing?")})),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(kvlink::to_hex(kvlink::sha256(kvlink::as_bytes("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace loom
