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
#pragma once

#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "server/kv_routes.h"

namespace loom::cli {

struct KvTransferOptions {
  std::string role = "both";
  std::string host;             // the link's address ("" = the server's --host)
  int port = -1;                // -1: none for role both, a free port otherwise
  int64_t buffer_bytes = int64_t{1} << 30;  // --kv-buffer-bytes (1G)
  std::string backend = "auto";  // the link's data plane: auto, tcp or nccl

  // Whether this engine gets a KV buffer and a link: role prefill / decode, or a --kv-transfer-port.
  bool has_buffer() const { return role != "both" || port >= 0; }
};

// Before the engine is made: the buffer (as engine.kv_store) and a default
// host tier. Returns the server's view with the store filled in (no link yet);
// role "both" without a port returns it empty.
server::KvTransferSetup prepare_kv_transfer(const KvTransferOptions& options, EngineConfig& engine,
                                            int64_t kv_bytes_per_token);
// Once the engine runs: starts the link (when the setup has a store) on
// options.host (or server_host) with its data plane (--kv-transfer-backend;
// nccl needs `device` to be cuda or cuda:N) and its client, and fills in its
// address. The link's "have" answers count the blocks `engine` caches
// (Engine::caches_kv_block; the engine outlives the link). Throws
// Error(kUnavailable) when nccl was asked for and cannot run.
void start_kv_link(const KvTransferOptions& options, const std::string& server_host, const std::string& device,
                   Engine& engine, server::KvTransferSetup& setup);

}  // namespace loom::cli
