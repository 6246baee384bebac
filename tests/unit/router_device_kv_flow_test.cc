// The router's device-to-device branch, its pure pieces
// (router/device_kv_flow.h): the PE's and the DE's bodies, whether a PE's 4xx
// refuses the send, and what follows the PE's prefill once the DE's request
// is in flight (overlap): receive, cancel and recompute, or cancel and answer
// the PE's 4xx.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "router/device_kv_flow.h"
#include "server/api_error.h"

namespace loom::router {
namespace {

using Json = nlohmann::json;

TEST(RouterDeviceKvFlowTest, ThePrefillBodyAsksOneTokenAndCarriesTheSend) {
  KvReservation reservation;
  reservation.transfer_id = "0123456789abcdef";
  reservation.main_blocks = {4, 5, 6};
  reservation.first_block = 2;
  const Json client = {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 50}, {"stream", true},
                       {"stream_options", {{"include_usage", true}}}, {"min_tokens", 3}, {"n", 2}};
  const Json body = Json::parse(prefill_body(client, &reservation, "127.0.0.1:7000"));
  EXPECT_EQ(body["max_tokens"], 1);
  EXPECT_EQ(body["stream"], false);
  EXPECT_EQ(body["n"], 1);
  EXPECT_FALSE(body.contains("stream_options"));
  EXPECT_FALSE(body.contains("min_tokens"));
  const Json& send = body["loom_device_kv"]["send"];
  EXPECT_EQ(send["peer"], "127.0.0.1:7000");
  EXPECT_EQ(send["transfer_id"], "0123456789abcdef");
  EXPECT_EQ(send["main_blocks"], Json({4, 5, 6}));
  EXPECT_EQ(send["residual_blocks"], Json::array());
  EXPECT_EQ(send["first_block"], 2);
  EXPECT_FALSE(Json::parse(prefill_body(client)).contains("loom_device_kv"));  // the staged path's
}

TEST(RouterDeviceKvFlowTest, TheReceiveBodyIsTheClientsWithTheTransfer) {
  const Json body = Json::parse(receive_body(R"({"model":"tiny","prompt":"hi","stream":true,"max_tokens":9})",
                                             "0123456789abcdef"));
  EXPECT_EQ(body["loom_device_kv"], Json({{"receive", "0123456789abcdef"}}));
  EXPECT_EQ(body["stream"], true);  // untouched otherwise
  EXPECT_EQ(body["max_tokens"], 9);
  EXPECT_THROW(receive_body("[1, 2]", "0123456789abcdef"), server::ApiError);
}

TEST(RouterDeviceKvFlowTest, OnlyAnErrorAboutTheDeviceFieldsRefusesTheSend) {
  auto reply = [](const std::string& body) { return HttpReply{403, "application/json", body}; };
  EXPECT_TRUE(refuses_device_fields(
      reply(R"({"error":{"message":"no","param":"loom_device_kv.send.peer","code":"kv_peer_not_allowed"}})")));
  EXPECT_TRUE(refuses_device_fields(reply(R"({"error":{"message":"unsigned","param":"loom_device_kv"}})")));
  EXPECT_FALSE(refuses_device_fields(reply(R"({"error":{"message":"bad","param":"max_tokens"}})")));
  EXPECT_FALSE(refuses_device_fields(reply(R"({"error":{"message":"bad","param":null}})")));
  EXPECT_FALSE(refuses_device_fields(reply("not json")));
  EXPECT_FALSE(refuses_device_fields(reply(R"({"error":"a string"})")));
}

TEST(RouterDeviceKvFlowTest, AfterThePrefillTheDeviceRequestReceivesOrTheReservationIsCancelled) {
  const DevicePrefillVerdict ok = device_prefill_verdict(CallStatus::kOk, false);
  EXPECT_EQ(ok.action, DevicePrefillAction::kReceive);
  EXPECT_EQ(ok.fallback_reason, "");
  EXPECT_FALSE(ok.prefill_engine_failed);

  const DevicePrefillVerdict refused = device_prefill_verdict(CallStatus::kRejected, true);
  EXPECT_EQ(refused.action, DevicePrefillAction::kCancelRecompute);
  EXPECT_EQ(refused.fallback_reason, "prefill_refused_send");
  EXPECT_FALSE(refused.prefill_engine_failed);  // the PE is fine: only its send was refused

  const DevicePrefillVerdict failed = device_prefill_verdict(CallStatus::kFailed, false);
  EXPECT_EQ(failed.action, DevicePrefillAction::kCancelRecompute);
  EXPECT_EQ(failed.fallback_reason, "prefill_failed");
  EXPECT_TRUE(failed.prefill_engine_failed);

  const DevicePrefillVerdict rejected = device_prefill_verdict(CallStatus::kRejected, false);
  EXPECT_EQ(rejected.action, DevicePrefillAction::kCancelReplyNow);  // the client's fault: its 4xx, as staged
  EXPECT_EQ(rejected.fallback_reason, "");
  EXPECT_FALSE(rejected.prefill_engine_failed);
}

TEST(RouterDeviceKvFlowTest, TheRecomputePathHasItsName) {
  EXPECT_STREQ(kv_path_name(KvPath::kRecompute), "recompute");
}

}  // namespace
}  // namespace loom::router
