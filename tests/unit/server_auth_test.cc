// The API key check (server/auth.h): exact "Bearer <key>" only.
#include <gtest/gtest.h>

#include <string>

#include "server/auth.h"

namespace loom::server {
namespace {

TEST(ServerAuthTest, AcceptsExactlyBearerAndTheKey) {
  const std::string key = "sk-test-0123456789";
  EXPECT_TRUE(api_key_matches("Bearer " + key, key));
  EXPECT_FALSE(api_key_matches("", key));
  EXPECT_FALSE(api_key_matches(key, key));                         // no scheme
  EXPECT_FALSE(api_key_matches("bearer " + key, key));             // the scheme as the server documents it
  EXPECT_FALSE(api_key_matches("Bearer  " + key, key));            // one space
  EXPECT_FALSE(api_key_matches("Basic " + key, key));
  EXPECT_FALSE(api_key_matches("Bearer " + key.substr(1), key));   // shorter
  EXPECT_FALSE(api_key_matches("Bearer " + key + "0", key));       // longer
  EXPECT_FALSE(api_key_matches("Bearer " + key + key, key));       // the key twice (the guess is read cyclically)
  EXPECT_FALSE(api_key_matches("Bearer ", key));
  std::string last_differs = "Bearer " + key;
  last_differs.back() ^= 1;
  EXPECT_FALSE(api_key_matches(last_differs, key));
  std::string first_differs = "Bearer " + key;
  first_differs[7] ^= 1;
  EXPECT_FALSE(api_key_matches(first_differs, key));
  // Bytes of any value, NUL included.
  const std::string binary_key("k\0\xff\x80y", 5);
  EXPECT_TRUE(api_key_matches("Bearer " + binary_key, binary_key));
  EXPECT_FALSE(api_key_matches("Bearer k", binary_key));
}

}  // namespace
}  // namespace loom::server
