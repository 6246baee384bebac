// `loom serve --role prefill|decode|both` (prefill/decode disaggregation,
// DualPath): the engine's KV buffer (kvstore/buffered_kv_store.h, its disk
// tier, over --disk-kv-path when given) and its KV link (kvtransfer/), which
// the /loom/kv/ routes and `loom router` use.
//
//   role prefill / decode   a KV buffer and a link (on --kv-transfer-port, default 0: a free port)
//   role both               neither, unless --kv-transfer-port is given
//
// A buffer stages through the host tier as the disk tier does: without
// --host-kv-memory, such an engine gets a host tier as large as its buffer.
//
// Trust (docs/disaggregation.md): the link listens on --kv-transfer-host
// (default 127.0.0.1, not --host); with a secret (--kv-transfer-secret-file,
// or --kv-transfer-secret) every link connection and /loom/kv/* call must
// prove it; without one the link refuses a non-loopback address. Sends reach
// only --kv-transfer-peers (loopback without it).
#pragma once

#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "server/kv_routes.h"

namespace loom::cli {

struct KvTransferOptions {
  std::string role = "both";
  std::string host = "127.0.0.1";  // the link's address (--kv-transfer-host)
  int port = -1;                // -1: none for role both, a free port otherwise
  int64_t buffer_bytes = int64_t{1} << 30;  // --kv-buffer-bytes (1G)
  std::string backend = "auto";  // the link's data plane: auto, tcp or nccl
  std::string secret;            // --kv-transfer-secret (visible in the process list: warned); once
                                 // resolved (serve_config), the secret from either flag
  std::string secret_file;       // --kv-transfer-secret-file (cleared once read)
  std::string peers;             // --kv-transfer-peers: HOST:PORT,... ("" = loopback only)
  // --kv-device-plane: the device-to-device KV plane (docs/disaggregation.md "Device to
  // device"): none (the default: the staged path only), auto (the plane the backend
  // supports: cuda-ipc on a GPU engine, socket on a CPU one), cuda-ipc
  // (kvtransfer/device/ipc/ipc_device_kv_plane.h) or socket
  // (kvtransfer/device/socket/socket_device_kv_plane.h). Role prefill / decode engines only.
  std::string device_plane = "none";
  int device_plane_port = 0;     // --kv-device-plane-port: the plane's listener (0: a free port)

  // Whether this engine gets a KV buffer and a link: role prefill / decode, or a --kv-transfer-port.
  bool has_buffer() const { return role != "both" || port >= 0; }
};

// The KV transfer secret of --kv-transfer-secret / --kv-transfer-secret-file
// (the file's content without its trailing newline / whitespace; "" when
// neither is given). Warns when the secret came on the command line. Throws
// Error(kInvalidArgument) for both flags at once, an unreadable file, or a
// secret under kMinKvSecretBytes.
inline constexpr size_t kMinKvSecretBytes = 16;
std::string read_kv_secret(const std::string& secret, const std::string& secret_file);

// Before the engine is made: the buffer (as engine.kv_store), a default
// host tier and the device KV plane (as engine.device_kv_plane, listening on
// options.host with the secret; `device` and `tensor_parallel_size` decide
// what auto means). Returns the server's view with the store and the device
// plane filled in (no link yet) and options.secret (already resolved by
// read_kv_secret); role "both" without a port returns it without a store or a plane.
server::KvTransferSetup prepare_kv_transfer(const KvTransferOptions& options, EngineConfig& engine,
                                            int64_t kv_bytes_per_token, const std::string& device = "cpu",
                                            int tensor_parallel_size = 1);
// What --kv-device-plane resolves to on `device`: "none" or a plane's name.
// Throws Error(kInvalidArgument) for an unknown plane, or socket on a CUDA device.
std::string resolve_device_kv_plane(const std::string& requested, const std::string& device,
                                    int tensor_parallel_size);
// Once the engine runs: starts the link (when the setup has a store) on
// options.host with setup.secret, its data plane (--kv-transfer-backend;
// nccl needs `device` to be cuda or cuda:N) and its client, and fills in its
// address. The link's "have" answers count the blocks `engine` caches
// (Engine::caches_kv_block; the engine outlives the link). Throws
// Error(kUnavailable) when nccl was asked for and cannot run, and
// Error(kInvalidArgument) when the address is not loopback and there is no secret.
void start_kv_link(const KvTransferOptions& options, const std::string& device, Engine& engine,
                   server::KvTransferSetup& setup);

}  // namespace loom::cli
