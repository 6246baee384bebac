#include "kvtransfer/kv_link_session.h"

#include <cstring>

#include "kvtransfer/kv_link_protocol.h"

namespace loom::kvlink {

namespace {

constexpr std::string_view kServerProofLabel = "loom kv link 2 server";
constexpr std::string_view kClientProofLabel = "loom kv link 2 client";
constexpr std::string_view kSessionLabel = "loom kv link 2 session";

using Nonce = std::array<std::byte, kNonceBytes>;

Digest keyed(std::string_view secret, std::string_view label, const Nonce& client, const Nonce& server) {
  return hmac_sha256(as_bytes(secret), {as_bytes(label), client, server});
}

std::array<std::byte, 4> le32(uint32_t value) {
  std::array<std::byte, 4> bytes{};
  for (size_t i = 0; i < 4; ++i) bytes[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
  return bytes;
}

}  // namespace

Digest Session::tag(char direction, uint64_t counter, std::span<const std::byte> length,
                    std::span<const std::byte> body) const {
  std::array<std::byte, 9> header{};
  header[0] = static_cast<std::byte>(direction);
  for (size_t i = 0; i < 8; ++i) header[1 + i] = static_cast<std::byte>((counter >> (8 * i)) & 0xff);
  return hmac_sha256(key_, {header, length, body});
}

bool Session::send(int fd, std::span<const std::byte> body) {
  const std::array<std::byte, 4> length = le32(static_cast<uint32_t>(body.size()));
  const Digest sealed = tag(side_ == Side::kClient ? 'C' : 'S', sent_++, length, body);
  std::vector<std::byte> message;
  message.reserve(length.size() + body.size() + sealed.size());
  message.insert(message.end(), length.begin(), length.end());
  message.insert(message.end(), body.begin(), body.end());
  message.insert(message.end(), sealed.begin(), sealed.end());
  return write_all(fd, message);
}

Session::Received Session::receive(int fd, std::vector<std::byte>& body, uint32_t max_bytes) {
  std::array<std::byte, 4> length{};
  if (!read_exact(fd, length)) return Received::kClosed;
  uint32_t size = 0;
  for (size_t i = 0; i < 4; ++i) size |= static_cast<uint32_t>(length[i]) << (8 * i);
  if (size > max_bytes) return Received::kClosed;
  body.resize(size);
  Digest sealed{};
  if (!read_exact(fd, body) || !read_exact(fd, sealed)) return Received::kClosed;
  const Digest expected = tag(side_ == Side::kClient ? 'S' : 'C', received_++, length, body);
  if (!constant_time_equal(expected, sealed)) {
    body.clear();
    return Received::kForged;
  }
  return Received::kOk;
}

const char* handshake_failure_text(HandshakeFailure failure) {
  switch (failure) {
    case HandshakeFailure::kNone: return "none";
    case HandshakeFailure::kClosed:
      return "the peer closed or timed out during the handshake (a peer with another secret, or none, stops here)";
    case HandshakeFailure::kVersion1:
      return "the peer speaks KV link protocol 1 (an older Loom, unauthenticated): upgrade it";
    case HandshakeFailure::kNotALink: return "the peer is not a KV link client (bad magic)";
    case HandshakeFailure::kWrongProof:
      return "the peer did not prove the shared secret (its --kv-transfer-secret differs, or it has none)";
  }
  return "unknown";
}

std::optional<Session> client_handshake(int fd, std::string_view secret, std::string& failure) {
  Nonce client{}, server{};
  random_bytes(client);
  std::array<std::byte, kClientHelloBytes> hello{};
  std::memcpy(hello.data(), kMagic, sizeof(kMagic));
  std::memcpy(hello.data() + sizeof(kMagic), client.data(), client.size());
  std::array<std::byte, sizeof(kMagic)> magic{};
  Digest proof{};
  if (!write_all(fd, hello) || !read_exact(fd, magic)) {
    failure = "the peer closed the handshake: it is an older Loom (KV link protocol 1), not a KV link, or it "
              "refused this connection";
    return std::nullopt;
  }
  if (std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0) {
    failure = "the peer is not a KV link of protocol 2 (bad magic)";
    return std::nullopt;
  }
  if (!read_exact(fd, server) || !read_exact(fd, proof)) {
    failure = "the peer closed during the handshake";
    return std::nullopt;
  }
  if (!constant_time_equal(proof, keyed(secret, kServerProofLabel, client, server))) {
    failure = "the peer did not prove the shared secret: its --kv-transfer-secret differs from this engine's "
              "(or only one of the two has one)";
    return std::nullopt;
  }
  const Digest answer = keyed(secret, kClientProofLabel, client, server);
  std::byte verdict{};
  if (!write_all(fd, answer) || !read_exact(fd, std::span(&verdict, 1)) || verdict != std::byte{1}) {
    failure = "the peer refused this engine's proof of the shared secret";
    return std::nullopt;
  }
  return Session(keyed(secret, kSessionLabel, client, server), Session::Side::kClient);
}

std::optional<Session> server_handshake(int fd, std::string_view secret, HandshakeFailure& failure) {
  std::array<std::byte, sizeof(kMagic)> magic{};
  Nonce client{}, server{};
  failure = HandshakeFailure::kClosed;
  if (!read_exact(fd, magic)) return std::nullopt;
  if (std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0) {
    failure = std::memcmp(magic.data(), kMagicVersion1, sizeof(kMagic)) == 0 ? HandshakeFailure::kVersion1
                                                                              : HandshakeFailure::kNotALink;
    return std::nullopt;
  }
  if (!read_exact(fd, client)) return std::nullopt;
  random_bytes(server);
  const Digest proof = keyed(secret, kServerProofLabel, client, server);
  Digest answer{};
  if (!write_all(fd, std::as_bytes(std::span(kMagic))) || !write_all(fd, server) || !write_all(fd, proof) ||
      !read_exact(fd, answer))
    return std::nullopt;
  const bool accepted = constant_time_equal(answer, keyed(secret, kClientProofLabel, client, server));
  const std::byte verdict{accepted ? uint8_t{1} : uint8_t{0}};
  write_all(fd, std::span(&verdict, 1));
  if (!accepted) {
    failure = HandshakeFailure::kWrongProof;
    return std::nullopt;
  }
  failure = HandshakeFailure::kNone;
  return Session(keyed(secret, kSessionLabel, client, server), Session::Side::kServer);
}

}  // namespace loom::kvlink
