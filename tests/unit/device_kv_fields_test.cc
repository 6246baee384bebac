// The loom_device_kv fields of completion bodies (server/device_kv_fields.h):
// transfer ids, the send and receive forms, and what is refused: unsigned
// with a secret (401), a peer outside the allowlist (403), an engine without
// a plane, several choices, malformed fields (400), each leaving the request
// untouched.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/device_kv_fields.h"
#include "server/kv_auth.h"

namespace loom::server {
namespace {

const std::string kSecret = "device-kv-fields-test-secret-0123";

HttpRequest post(const std::string& body, bool sign = true, const std::string& secret = kSecret) {
  HttpRequest request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = body;
  if (sign) request.headers.emplace_back(kKvAuthHeader, sign_kv_request(secret, "POST", request.path, body, unix_seconds_now()));
  return request;
}

ParsedRequest one_prompt() {
  ParsedRequest parsed;
  parsed.prompts = {{1, 2, 3, 4, 5}};
  return parsed;
}

int status_of(const HttpRequest& request, const DeviceKvFieldsPolicy& policy, ParsedRequest parsed = one_prompt()) {
  try {
    apply_device_kv_fields(request, policy, parsed);
  } catch (const ApiError& error) {
    EXPECT_FALSE(parsed.engine_template.device_kv_send || parsed.engine_template.device_kv_receive);
    return error.status();
  }
  return 200;
}

const DeviceKvFieldsPolicy kPolicy{true, kSecret, nullptr};

TEST(DeviceKvFieldsTest, TransferIdsAreSixteenLowerCaseHexDigits) {
  EXPECT_EQ(transfer_id_text(0x0123456789abcdefULL), "0123456789abcdef");
  EXPECT_EQ(parse_transfer_id("0123456789abcdef"), 0x0123456789abcdefULL);
  EXPECT_EQ(parse_transfer_id("ffffffffffffffff"), ~0ULL);
  EXPECT_FALSE(parse_transfer_id("0123456789ABCDEF"));
  EXPECT_FALSE(parse_transfer_id("123"));
  EXPECT_FALSE(parse_transfer_id("0123456789abcdeg"));
}

TEST(DeviceKvFieldsTest, ReceiveAndSendFillTheEngineRequest) {
  ParsedRequest parsed = one_prompt();
  apply_device_kv_fields(post(R"({"prompt":"x","loom_device_kv":{"receive":"00000000000000ff"}})"), kPolicy, parsed);
  ASSERT_TRUE(parsed.engine_template.device_kv_receive);
  EXPECT_EQ(*parsed.engine_template.device_kv_receive, 0xffu);
  EXPECT_FALSE(parsed.engine_template.device_kv_send);

  parsed = one_prompt();
  apply_device_kv_fields(post(R"({"loom_device_kv":{"send":{"peer":"127.0.0.1:9000","transfer_id":"000000000000002a",
                                  "main_blocks":[4,5,6],"residual_blocks":[7,8,9],"first_block":2}}})"),
                         kPolicy, parsed);
  ASSERT_TRUE(parsed.engine_template.device_kv_send);
  const DeviceKvSend& send = *parsed.engine_template.device_kv_send;
  EXPECT_EQ(send.peer, "127.0.0.1:9000");
  EXPECT_EQ(send.destination.id, 42u);
  EXPECT_EQ(send.destination.main_blocks, (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(send.destination.residual_blocks, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(send.first_block, 2);

  parsed = one_prompt();  // no field: nothing, signed or not
  apply_device_kv_fields(post(R"({"prompt":"loom"})", false), kPolicy, parsed);
  EXPECT_FALSE(parsed.engine_template.device_kv_receive || parsed.engine_template.device_kv_send);
}

TEST(DeviceKvFieldsTest, UnsignedOrBadlySignedFieldsAreRefusedWithASecretAndAcceptedWithout) {
  const std::string body = R"({"loom_device_kv":{"receive":"00000000000000ff"}})";
  EXPECT_EQ(status_of(post(body, false), kPolicy), 401);
  EXPECT_EQ(status_of(post(body, true, "another-secret-0123456789abc"), kPolicy), 401);
  HttpRequest changed = post(body);
  changed.body = R"({"loom_device_kv":{"receive":"00000000000000fe"}})";  // signed for another body
  EXPECT_EQ(status_of(changed, kPolicy), 401);
  EXPECT_EQ(status_of(post(body, false), {true, "", nullptr}), 200);  // no secret: loopback, unsigned
}

TEST(DeviceKvFieldsTest, MalformedFieldsForeignPeersAndEnginesWithoutAPlaneAreRefused) {
  auto status = [](const std::string& field, const DeviceKvFieldsPolicy& policy = kPolicy) {
    return status_of(post(R"({"loom_device_kv":)" + field + "}"), policy);
  };
  EXPECT_EQ(status(R"({"receive":"00000000000000ff"})", {false, kSecret, nullptr}), 400);
  EXPECT_EQ(status(R"({"receive":12})"), 400);
  EXPECT_EQ(status(R"({"receive":"00000000000000ff","send":{}})"), 400);
  EXPECT_EQ(status(R"("receive")"), 400);
  const std::string send = R"({"send":{"peer":"PEER","transfer_id":"000000000000002a","main_blocks":BLOCKS,"first_block":FIRST}})";
  auto with = [&](const std::string& peer, const std::string& blocks, const std::string& first) {
    std::string text = send;
    text.replace(text.find("PEER"), 4, peer);
    text.replace(text.find("BLOCKS"), 6, blocks);
    text.replace(text.find("FIRST"), 5, first);
    return text;
  };
  EXPECT_EQ(status(with("127.0.0.1:9", "[1,2]", "0")), 200);
  EXPECT_EQ(status(with("10.0.0.1:9", "[1,2]", "0")), 403);  // loopback only without --kv-transfer-peers
  const KvPeerAllowlist peers = KvPeerAllowlist::parse("10.0.0.1:*");
  EXPECT_EQ(status(with("10.0.0.1:9", "[1,2]", "0"), {true, kSecret, &peers}), 200);
  EXPECT_EQ(status(with("127.0.0.1:9", "[1,-2]", "0")), 400);
  EXPECT_EQ(status(with("127.0.0.1:9", "3", "0")), 400);
  EXPECT_EQ(status(with("127.0.0.1:9", "[1]", "-1")), 400);
  EXPECT_EQ(status(R"({"send":{"peer":"127.0.0.1:9","transfer_id":"000000000000002a","main_blocks":[1,2],
                      "residual_blocks":[3],"first_block":0}})"),
            400);
  ParsedRequest two = one_prompt();
  two.n = 2;
  EXPECT_EQ(status_of(post(R"({"loom_device_kv":{"receive":"00000000000000ff"}})"), kPolicy, two), 400);
}

}  // namespace
}  // namespace loom::server
