#include "router/completion_flow.h"

#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "router/device_kv_flow.h"
#include "server/api_error.h"
#include "server/json_input.h"

namespace loom::router {
namespace {

using Json = nlohmann::json;
using server::ApiError;
using server::HttpResponse;

// A completions prompt that is a list of prompts (strings or token lists), not
// one prompt given as a token list.
bool is_multi_prompt(const Json& body) {
  auto prompt = body.find("prompt");
  if (prompt == body.end() || !prompt->is_array() || prompt->size() < 2) return false;
  const Json& first = prompt->front();
  return first.is_string() || first.is_array();
}

HttpResponse relayed(const HttpReply& reply) {
  HttpResponse response;
  response.status = reply.status;
  response.content_type = reply.content_type.empty() ? "application/json" : reply.content_type;
  response.body = reply.body;
  return response;
}

// What the PE part of the flow came to.
struct PrefillOutcome {
  enum Kind { kDone, kDirect, kReplyNow, kPrefillFailed } kind = kDirect;
  ReadPath path = ReadPath::kNone;  // kDone
  HttpResponse reply;               // kReplyNow: the PE's 4xx, as it sent it

  static PrefillOutcome direct() { return PrefillOutcome(); }
  static PrefillOutcome failed() { return with(kPrefillFailed); }
  static PrefillOutcome done(ReadPath path) {
    PrefillOutcome outcome = with(kDone);
    outcome.path = path;
    return outcome;
  }
  static PrefillOutcome reply_now(const HttpReply& engine_reply) {
    PrefillOutcome outcome = with(kReplyNow);
    outcome.reply = relayed(engine_reply);
    return outcome;
  }

 private:
  static PrefillOutcome with(Kind kind) {
    PrefillOutcome outcome;
    outcome.kind = kind;
    return outcome;
  }
};

class CompletionFlow {
 public:
  CompletionFlow(const FlowContext& context, server::HttpRequest& request, bool chat)
      : context_(context), engines_(*context.engines), metrics_(*context.metrics), request_(request), chat_(chat),
        path_(chat ? "/v1/chat/completions" : "/v1/completions") {}

  HttpResponse run() {
    const Json body = server::parse_json_object_body(request_.body);
    engines_.refresh_statuses();
    std::optional<size_t> decode = choose_decode_engine(engines_.loads(EngineGroup::kDecode, tried_decode_));
    if (!decode) throw no_decode_engine();
    decode_ = *decode;
    decode_assignment_ = engines_.assign(EngineGroup::kDecode, decode_);

    const char* path_name = "direct";
    if (!chat_ && is_multi_prompt(body)) {
      spdlog::debug("multi-prompt completions request: sent whole to a decode engine");
    } else {
      PrefillOutcome outcome = prepare_on_prefill_engines(body);
      if (outcome.kind == PrefillOutcome::kReplyNow) return std::move(outcome.reply);
      if (outcome.kind == PrefillOutcome::kDone) path_name = read_path_name(outcome.path);
    }
    metrics_.count_request(path_name);
    return relay_from_decode_engines();
  }

 private:
  ApiError no_decode_engine() const {
    return ApiError(503, "no decode engine is available", "server_error", "", "no_engine_available");
  }

  // Steps 2-7 with one retry on another PE; kDirect when no PE could do them.
  PrefillOutcome prepare_on_prefill_engines(const Json& body) {
    std::vector<size_t> tried;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::optional<size_t> prefill = choose_prefill_engine(
          engines_.loads(EngineGroup::kPrefill, tried, /*need_kv_address=*/true), context_.config->scheduler);
      if (!prefill) break;
      if (attempt > 0) metrics_.count_retry();
      tried.push_back(*prefill);
      PrefillOutcome outcome = prepare_on(*prefill, body);
      if (outcome.kind != PrefillOutcome::kPrefillFailed) return outcome;
    }
    return PrefillOutcome::direct();
  }

  PrefillOutcome prepare_on(size_t prefill, const Json& body) {
    const std::optional<KvStatus> decode_status = engines_.status(EngineGroup::kDecode, decode_);
    const std::optional<KvStatus> prefill_status = engines_.status(EngineGroup::kPrefill, prefill);
    if (!decode_status || !decode_status->kv_transfer_address || !prefill_status) return PrefillOutcome::direct();
    const std::string& decode_address = *decode_status->kv_transfer_address;
    const EngineClient& pe = engines_.client(EngineGroup::kPrefill, prefill);
    const EngineClient& de = engines_.client(EngineGroup::kDecode, decode_);
    EngineRegistry::Assignment assignment = engines_.assign(EngineGroup::kPrefill, prefill);
    auto pe_failed = [&](const std::string& why) {
      engines_.mark_failed(EngineGroup::kPrefill, prefill, why);
      return PrefillOutcome::failed();
    };

    // 3. probe
    EngineResult<KvProbe> probe = pe.probe(chat_ ? "chat" : "completions", body);
    if (probe.status == CallStatus::kRejected) return PrefillOutcome::reply_now(probe.reply);
    if (!probe.ok()) return pe_failed("probe: " + probe.error);
    if (probe.value.blocks.empty()) return PrefillOutcome::direct();  // no full block: nothing a PE could hand over
    assignment.add_tokens(probe.value.prompt_tokens);
    decode_assignment_.add_tokens(probe.value.prompt_tokens);

    // 4. read path
    const int64_t storage_bytes = probe.value.in_storage * probe.value.bytes_per_block;
    const double link_bandwidth =
        context_.config->link_bandwidth > 0 ? context_.config->link_bandwidth : metrics_.link_bandwidth();
    ReadPath path = choose_read_path(storage_bytes, engines_.load(EngineGroup::kPrefill, prefill),
                                     engines_.load(EngineGroup::kDecode, decode_), link_bandwidth,
                                     context_.config->scheduler.path_policy);
    if (path == ReadPath::kDecode && !prefill_status->kv_transfer_address) path = ReadPath::kPrefill;

    // 5. storage -> DE -> PE
    if (path == ReadPath::kDecode) {
      decode_assignment_.set_routed_read_bytes(storage_bytes);
      EngineResult<KvSendResult> sent = de.send_blocks(
          {probe.value.blocks, probe.value.block_bytes, *prefill_status->kv_transfer_address, /*read_storage=*/true,
           /*wait_seconds=*/0.0});
      decode_assignment_.set_routed_read_bytes(0);
      if (sent.ok()) {
        metrics_.add_transfer("de_to_pe", sent.value.sent_bytes, sent.value.seconds);
        metrics_.add_storage_read("decode", sent.value.read_bytes);
      } else if (sent.status == CallStatus::kFailed) {
        // The DE is likely gone: step 8 picks another one, which prefills itself.
        engines_.mark_failed(EngineGroup::kDecode, decode_, "kv send: " + sent.error);
        return PrefillOutcome::direct();
      } else {
        spdlog::warn("decode engine {} refused a KV send (status {}): the PE reads storage itself", de.url(),
                     sent.reply.status);
      }
    }

    // How the KV will reach the DE: device to device where both ends can (choose_kv_path),
    // the DE's blocks reserved first so that the PE streams into them while it prefills.
    KvPathChoice kv_path = choose_kv_path(prefill_status->device_kv, decode_status->device_kv);
    std::optional<KvReservation> reservation;
    if (kv_path.path == KvPath::kDevice) {
      EngineResult<KvReservation> reserved =
          de.reserve({chat_ ? "chat" : "completions", body, prefill_status->device_kv.address,
                      context_.config->device_kv_timeout_seconds});
      if (reserved.ok()) {
        reservation = std::move(reserved.value);
      } else {
        kv_path = {KvPath::kStaged, "reserve_failed",
                   "the decode engine did not reserve blocks: " +
                       (reserved.error.empty() ? "status " + std::to_string(reserved.reply.status) : reserved.error)};
      }
    }

    // 6'. overlap: the DE's request goes now, beside the prefill; the DE parks it until the last layer
    // landed and decodes at once (router/device_kv_flow.h).
    if (reservation) {
      std::shared_ptr<UpstreamResponse> receiving =
          de.post_streaming(path_, receive_body(request_.body, reservation->transfer_id), /*sign=*/true);
      receive_ = Receive{decode_, reservation->transfer_id, std::move(receiving)};
    }

    // 6. prefill (streaming its KV into the reservation on the device path)
    if (path == ReadPath::kPrefill) assignment.set_routed_read_bytes(storage_bytes);
    EngineResult<HttpReply> prefilled =
        reservation ? pe.post(path_, prefill_body(body, &*reservation, decode_status->device_kv.address), /*sign=*/true)
                    : pe.post(path_, prefill_body(body));
    assignment.set_routed_read_bytes(0);
    if (reservation) return after_device_prefill(prefill, de, prefilled, path, storage_bytes);
    if (prefilled.status == CallStatus::kRejected)
      return PrefillOutcome::reply_now(prefilled.reply);
    if (!prefilled.ok()) return pe_failed("prefill: " + prefilled.error);
    if (path == ReadPath::kPrefill) metrics_.add_storage_read("prefill", storage_bytes);

    // A fallback between two engines that both have a plane is worth a warning; no plane is the default.
    if (prefill_status->device_kv.plane != "none" && decode_status->device_kv.plane != "none")
      spdlog::warn("KV for {} goes staged: {}", de.url(), kv_path.detail);
    else
      spdlog::debug("KV for {} goes staged: {}", de.url(), kv_path.detail);
    metrics_.count_kv_path(kv_path_name(kv_path.path), de.url(), kv_path.reason);

    // 7. PE -> DE, staged
    EngineResult<KvSendResult> pushed = pe.send_blocks(
        {probe.value.blocks, probe.value.block_bytes, decode_address, /*read_storage=*/false,
         context_.config->prefill_send_wait_seconds});
    if (pushed.ok()) {
      metrics_.add_transfer("pe_to_de", pushed.value.sent_bytes, pushed.value.seconds);
      metrics_.add_storage_read("prefill", pushed.value.read_bytes);
    } else if (pushed.status == CallStatus::kFailed && pushed.reply.status != 502) {
      return pe_failed("kv send: " + pushed.error);
    } else {
      spdlog::warn("prefill engine {} could not push KV to {} (status {}): the decode engine recomputes it",
                   pe.url(), decode_address, pushed.reply.status);
    }
    return PrefillOutcome::done(path);
  }

  // The device path once the PE's prefill answered; the DE's request (receive_) is in flight already.
  PrefillOutcome after_device_prefill(size_t prefill, const EngineClient& de,
                                      const EngineResult<HttpReply>& prefilled, ReadPath path, int64_t storage_bytes) {
    const DevicePrefillVerdict verdict = device_prefill_verdict(
        prefilled.status, prefilled.status == CallStatus::kRejected && refuses_device_fields(prefilled.reply));
    if (verdict.action == DevicePrefillAction::kReceive) {
      if (path == ReadPath::kPrefill) metrics_.add_storage_read("prefill", storage_bytes);
      metrics_.count_kv_path(kv_path_name(KvPath::kDevice), de.url(), "");
      return PrefillOutcome::done(path);
    }
    const std::string why = prefilled.status == CallStatus::kFailed
                                ? "the prefill failed: " + prefilled.error
                                : "the prefill engine refused (status " + std::to_string(prefilled.reply.status) +
                                      "): " + prefilled.reply.body.substr(0, 300);
    // Fail the reservation now: the DE's waiting request recomputes at once instead of at the deadline.
    EngineResult<std::string> cancelled = de.cancel_reservation(receive_->transfer_id, why);
    if (cancelled.ok() || cancelled.status == CallStatus::kRejected)  // 404: released already; it recomputes anyway
      spdlog::debug("device KV transfer {} on {}: cancel: {}", receive_->transfer_id, de.url(),
                    cancelled.ok() ? cancelled.value : cancelled.reply.body);
    else  // the DE is likely gone: its request fails too, and step 8 tries another DE
      spdlog::warn("device KV transfer {}: could not cancel it on {}: {}", receive_->transfer_id, de.url(),
                   cancelled.error);
    if (verdict.action == DevicePrefillAction::kCancelReplyNow) {
      receive_->upstream->cancel();  // the DE's copy of a request the PE refused: the client gets the PE's answer
      receive_.reset();
      return PrefillOutcome::reply_now(prefilled.reply);
    }
    spdlog::warn("device KV for {} cancelled, the decode engine recomputes: {}", de.url(), why);
    if (verdict.prefill_engine_failed) engines_.mark_failed(EngineGroup::kPrefill, prefill, "prefill: " + prefilled.error);
    metrics_.count_kv_path(kv_path_name(KvPath::kRecompute), de.url(), verdict.fallback_reason);
    return PrefillOutcome::direct();  // no other PE: the DE's request is committed to this transfer
  }

  // Step 8 on the chosen DE, then on others while one fails before answering.
  HttpResponse relay_from_decode_engines() {
    while (true) {
      if (!engines_.available(EngineGroup::kDecode, decode_)) {
        if (!choose_next_decode_engine()) throw no_decode_engine();
      }
      const EngineClient& de = engines_.client(EngineGroup::kDecode, decode_);
      // The DE that reserved blocks has the request already (sent beside the prefill); any other DE recomputes.
      std::shared_ptr<UpstreamResponse> upstream;
      if (receive_ && receive_->decode == decode_ && receive_->upstream) upstream = std::move(receive_->upstream);
      else upstream = de.post_streaming(path_, request_.body);
      HttpReply head;
      std::string why;
      if (!upstream->wait_head(head)) {
        why = upstream->error();
      } else if (head.status >= 500 || head.status < 200 || (head.status >= 300 && head.status < 400)) {
        why = "status " + std::to_string(head.status);
      } else if (head.status == 200 && head.content_type.rfind("text/event-stream", 0) == 0) {
        return streamed(std::move(upstream), head);
      } else {
        std::string piece;
        while (upstream->next_piece(piece)) head.body += piece;
        if (!upstream->failed()) return relayed(head);
        why = upstream->error();
      }
      engines_.mark_failed(EngineGroup::kDecode, decode_, why);
      if (!choose_next_decode_engine()) throw no_decode_engine();
    }
  }

  bool choose_next_decode_engine() {
    tried_decode_.push_back(decode_);
    std::optional<size_t> next = choose_decode_engine(engines_.loads(EngineGroup::kDecode, tried_decode_));
    if (!next) return false;
    metrics_.count_retry();
    decode_ = *next;
    decode_assignment_ = engines_.assign(EngineGroup::kDecode, decode_);  // releases the failed DE's share
    return true;
  }

  HttpResponse streamed(std::shared_ptr<UpstreamResponse> upstream, const HttpReply& head) {
    HttpResponse response;
    response.status = head.status;
    response.content_type = head.content_type;
    auto assignment = std::make_shared<EngineRegistry::Assignment>(std::move(decode_assignment_));
    EngineRegistry* engines = &engines_;
    const size_t decode = decode_;
    response.stream = [upstream, assignment, engines, decode](server::ResponseSink& sink) {
      std::string piece;
      while (upstream->next_piece(piece)) {
        if (!sink.write(piece)) {
          upstream->cancel();  // the client left: stop reading
          return;
        }
      }
      if (upstream->failed()) {
        engines->mark_failed(EngineGroup::kDecode, decode, "stream: " + upstream->error());
        const ApiError error(502, "the decode engine failed mid-stream", "server_error", "", "engine_failed");
        sink.write("data: " + error.body() + "\n\ndata: [DONE]\n\n");
      }
      assignment->release();
    };
    return response;
  }

  const FlowContext& context_;
  EngineRegistry& engines_;
  RouterMetrics& metrics_;
  server::HttpRequest& request_;
  const bool chat_;
  const std::string path_;
  size_t decode_ = 0;
  std::vector<size_t> tried_decode_;
  // The device path: the DE (index) that reserved blocks and the transfer its request waits for.
  struct Receive {
    size_t decode = 0;
    std::string transfer_id;
    std::shared_ptr<UpstreamResponse> upstream;  // its request, sent at step 6' (null once relayed)
  };
  std::optional<Receive> receive_;
  EngineRegistry::Assignment decode_assignment_;
};

}  // namespace

HttpResponse handle_completion(const FlowContext& context, server::HttpRequest& request, bool chat) {
  return CompletionFlow(context, request, chat).run();
}

}  // namespace loom::router
