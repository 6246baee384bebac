#include "router/dual_path_scheduler.h"

#include <tuple>

namespace loom::router {
namespace {

double effective_bandwidth(double bandwidth) { return bandwidth > 0.0 ? bandwidth : kUnknownBandwidth; }

// Index order of "less loaded": tokens, then requests, then the index (stable choices).
bool less_loaded(const EngineLoad& a, size_t a_index, const EngineLoad& b, size_t b_index) {
  return std::tuple(a.num_tokens, a.num_requests, a.num_assigned, a_index) <
         std::tuple(b.num_tokens, b.num_requests, b.num_assigned, b_index);
}

}  // namespace

const char* read_path_name(ReadPath path) {
  switch (path) {
    case ReadPath::kPrefill:
      return "prefill";
    case ReadPath::kDecode:
      return "decode";
    case ReadPath::kNone:
      break;
  }
  return "none";
}

std::optional<PathPolicy> parse_path_policy(std::string_view text) {
  if (text == "dual") return PathPolicy::kDual;
  if (text == "prefill") return PathPolicy::kPrefill;
  if (text == "decode") return PathPolicy::kDecode;
  return std::nullopt;
}

std::optional<size_t> choose_prefill_engine(std::span<const EngineLoad> engines, const SchedulerConfig& config) {
  std::optional<size_t> best_short_queue, best_long_queue;
  for (size_t i = 0; i < engines.size(); ++i) {
    const EngineLoad& engine = engines[i];
    if (!engine.available || engine.num_tokens > config.max_engine_tokens) continue;  // overloaded: never
    std::optional<size_t>& best =
        engine.queued_read_bytes <= config.short_read_queue_bytes ? best_short_queue : best_long_queue;
    if (!best || less_loaded(engine, i, engines[*best], *best)) best = i;
  }
  return best_short_queue ? best_short_queue : best_long_queue;
}

std::optional<size_t> choose_decode_engine(std::span<const EngineLoad> engines) {
  std::optional<size_t> best;
  for (size_t i = 0; i < engines.size(); ++i) {
    if (!engines[i].available) continue;
    if (!best || less_loaded(engines[i], i, engines[*best], *best)) best = i;
  }
  return best;
}

ReadPath choose_read_path(int64_t storage_bytes, const EngineLoad& prefill, const EngineLoad& decode,
                          double link_bandwidth, PathPolicy policy) {
  if (storage_bytes <= 0) return ReadPath::kNone;
  if (policy == PathPolicy::kPrefill) return ReadPath::kPrefill;
  if (policy == PathPolicy::kDecode) return ReadPath::kDecode;
  const double bytes = static_cast<double>(storage_bytes);
  const double prefill_seconds =
      (static_cast<double>(prefill.queued_read_bytes) + bytes) / effective_bandwidth(prefill.read_bandwidth);
  const double decode_seconds =
      (static_cast<double>(decode.queued_read_bytes) + bytes) / effective_bandwidth(decode.read_bandwidth) +
      bytes / effective_bandwidth(link_bandwidth);
  return decode_seconds < prefill_seconds ? ReadPath::kDecode : ReadPath::kPrefill;
}

const char* kv_path_name(KvPath path) {
  switch (path) {
    case KvPath::kDevice: return "device";
    case KvPath::kRecompute: return "recompute";
    case KvPath::kStaged: break;
  }
  return "staged";
}

KvPathChoice choose_kv_path(const DeviceKvInfo& prefill, const DeviceKvInfo& decode) {
  auto staged = [](const char* reason, std::string detail) {
    return KvPathChoice{KvPath::kStaged, reason, std::move(detail)};
  };
  if (prefill.plane == "none" || prefill.plane.empty())
    return staged("prefill_no_plane", "the prefill engine has no device KV plane");
  if (decode.plane == "none" || decode.plane.empty())
    return staged("decode_no_plane", "the decode engine has no device KV plane");
  if (prefill.plane != decode.plane)
    return staged("plane_mismatch", "device KV planes differ (" + prefill.plane + " vs " + decode.plane + ")");
  if (prefill.device.empty() || decode.device.empty() || decode.address.empty())
    return staged("no_device", "an engine does not name its device or its plane address");
  if ((prefill.same_host_only || decode.same_host_only) && (prefill.host.empty() || prefill.host != decode.host))
    return staged("different_hosts", "the engines are on different hosts (" + prefill.host + " vs " + decode.host +
                                         ") and the " + prefill.plane + " plane reaches its own host only");
  return {KvPath::kDevice, "", ""};
}

}  // namespace loom::router
