// The router's decisions for one request (DualPath, arXiv:2602.21548 §4 and §6.1,
// simplified): which prefill engine (PE) and decode engine (DE) serve it, and
// on which side the prompt's blocks found only in storage are read.
//
//   PE: engines over the token limit (tok_e > max_engine_tokens, "beta") are
//       never chosen; among the rest, those whose storage read queue is short
//       (queued_read_bytes <= short_read_queue_bytes, "alpha") come first, the
//       least loaded by tokens (tok_e) among them; else the least loaded of the
//       long-queue ones; ties by fewer requests (seq_e), then by fewer
//       assigned since start (idle engines take turns), then by index.
//   DE: the least tok_e, ties as for PEs.
//   Read path, for r = the storage-only blocks' bytes (r == 0: kNone):
//       t_prefill = (q_pe + r) / bw_pe
//       t_decode  = (q_de + r) / bw_de + r / bw_link
//       kDecode (storage -> DE -> PE) when t_decode < t_prefill, else kPrefill;
//       a bandwidth of 0 (unknown / unpaced) counts as kUnknownBandwidth.
//
// Pure functions of plain data; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace loom::router {

// One engine as the scheduler sees it, a snapshot taken by the caller.
struct EngineLoad {
  bool available = true;           // reachable and not in its retry window after a failure
  int64_t num_requests = 0;        // seq_e: requests the router assigned to it and not finished
  int64_t num_tokens = 0;          // tok_e: those requests' prompt tokens
  int64_t num_assigned = 0;        // requests assigned since start: equally loaded engines take turns
  // q: the engine's reported storage read queue plus what the router routed
  // to its storage side and has not seen finish, in bytes.
  int64_t queued_read_bytes = 0;
  double read_bandwidth = 0.0;     // bytes/s of its storage reads; 0 = unknown
};

enum class PathPolicy { kDual, kPrefill, kDecode };  // --path-policy dual|prefill|decode
enum class ReadPath { kNone, kPrefill, kDecode };

const char* read_path_name(ReadPath path);  // "none", "prefill", "decode"
// "dual" / "prefill" / "decode" -> the policy; nullopt for anything else.
std::optional<PathPolicy> parse_path_policy(std::string_view text);

struct SchedulerConfig {
  int64_t max_engine_tokens = int64_t{1} << 40;      // beta (--max-engine-tokens)
  int64_t short_read_queue_bytes = int64_t{64} << 20;  // alpha (--short-read-queue-bytes)
  PathPolicy path_policy = PathPolicy::kDual;
};

// What a bandwidth of 0 stands for (bytes/s): effectively "not a bottleneck".
inline constexpr double kUnknownBandwidth = 1e12;

// The index of the PE to use among `engines` (the PE candidates), or nullopt
// when every one is unavailable or overloaded.
std::optional<size_t> choose_prefill_engine(std::span<const EngineLoad> engines, const SchedulerConfig& config);

// The index of the DE among `engines`, or nullopt when none is available.
std::optional<size_t> choose_decode_engine(std::span<const EngineLoad> engines);

// The storage read path for a request whose storage-only blocks weigh
// `storage_bytes`; `link_bandwidth` is the PE <-> DE link's bytes/s (0 = unknown).
// A forced policy (kPrefill / kDecode) wins whenever storage_bytes > 0.
ReadPath choose_read_path(int64_t storage_bytes, const EngineLoad& prefill, const EngineLoad& decode,
                          double link_bandwidth, PathPolicy policy);

// ---- How the PE's KV reaches the DE (issue 41) ----
// An engine's device-to-device endpoint as /loom/kv/status reports it
// ("device_kv"; kvtransfer/device/device_kv_plane.h DeviceKvEndpoint).
struct DeviceKvInfo {
  std::string plane = "none";  // "none": no device-to-device path
  std::string host, device, address;
  bool same_host_only = true;
};

// kRecompute: the device path was chosen and reserved, but the PE side failed
// (router/device_kv_flow.h): the DE recomputes the prompt. Set by the flow,
// never by choose_kv_path.
enum class KvPath { kStaged, kDevice, kRecompute };
const char* kv_path_name(KvPath path);  // "staged", "device", "recompute"

struct KvPathChoice {
  KvPath path = KvPath::kStaged;
  // kStaged: why not device, as a metric label ("prefill_no_plane",
  // "decode_no_plane", "plane_mismatch", "no_device", "different_hosts") and
  // as a sentence for the log.
  std::string reason, detail;
};

// kDevice when both ends have the same plane (not "none"), each names its
// device and the DE its address, and, for a plane that reaches only its own
// host, both are on the same host; kStaged with the first rule that failed
// otherwise (the staged path through the KV link always works).
KvPathChoice choose_kv_path(const DeviceKvInfo& prefill, const DeviceKvInfo& decode);

}  // namespace loom::router
