#include "kvtransfer/kv_link_crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <memory>

#include "util/error.h"

namespace loom::kvlink {

Digest sha256(std::span<const std::byte> bytes) {
  Digest digest{};
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), reinterpret_cast<unsigned char*>(digest.data()), &length, EVP_sha256(),
                 nullptr) != 1 ||
      length != digest.size())
    throw Error(ErrorKind::kInternal, "SHA-256 failed (OpenSSL)");
  return digest;
}

Digest hmac_sha256(std::span<const std::byte> key, std::initializer_list<std::span<const std::byte>> parts) {
  // OpenSSL 3's EVP_MAC (HMAC_CTX is deprecated): the parts are fed one by one, without a copy.
  std::unique_ptr<EVP_MAC, decltype(&EVP_MAC_free)> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr), &EVP_MAC_free);
  if (!mac) throw Error(ErrorKind::kInternal, "HMAC is unavailable (OpenSSL)");
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> context(EVP_MAC_CTX_new(mac.get()), &EVP_MAC_CTX_free);
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest_name, 0), OSSL_PARAM_construct_end()};
  static const unsigned char kEmpty = 0;  // OpenSSL refuses a null key pointer, even for length 0
  const auto* key_data = key.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(key.data());
  bool ok = context && EVP_MAC_init(context.get(), key_data, key.size(), params) == 1;
  for (std::span<const std::byte> part : parts)
    ok = ok && EVP_MAC_update(context.get(), reinterpret_cast<const unsigned char*>(part.data()), part.size()) == 1;
  Digest tag{};
  size_t length = 0;
  ok = ok && EVP_MAC_final(context.get(), reinterpret_cast<unsigned char*>(tag.data()), &length, tag.size()) == 1;
  if (!ok || length != tag.size()) throw Error(ErrorKind::kInternal, "HMAC-SHA256 failed (OpenSSL)");
  return tag;
}

void random_bytes(std::span<std::byte> bytes) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(bytes.size())) != 1)
    throw Error(ErrorKind::kInternal, "no random bytes (OpenSSL RAND_bytes)");
}

bool constant_time_equal(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (std::byte byte : bytes) {
    text.push_back(kDigits[static_cast<uint8_t>(byte) >> 4]);
    text.push_back(kDigits[static_cast<uint8_t>(byte) & 15]);
  }
  return text;
}

}  // namespace loom::kvlink
