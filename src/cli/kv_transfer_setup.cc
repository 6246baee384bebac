#include "cli/kv_transfer_setup.h"

#include <cctype>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli/device_backend.h"
#include "engine/kv_pools.h"
#include "kvtransfer/device/ipc/ipc_device_kv_plane.h"
#include "kvtransfer/device/socket/socket_device_kv_plane.h"
#include "kvtransfer/kv_peer_allowlist.h"
#include "util/error.h"
#ifdef LOOM_HAVE_CUDA
#include "backend/cuda/cuda_peer_kv_copier.h"
#include "kvtransfer/nccl/nccl_data_plane.h"
#endif

namespace loom::cli {

std::string read_kv_secret(const std::string& secret, const std::string& secret_file) {
  if (!secret.empty() && !secret_file.empty())
    throw Error(ErrorKind::kInvalidArgument, "--kv-transfer-secret and --kv-transfer-secret-file both given",
                "give one: the file keeps the secret out of the process list");
  std::string text = secret;
  if (!secret_file.empty()) {
    std::ifstream file(secret_file, std::ios::binary);
    if (!file) throw Error(ErrorKind::kNotFound, "--kv-transfer-secret-file " + secret_file + ": cannot read it");
    text.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    if (text.empty())
      throw Error(ErrorKind::kInvalidArgument, "--kv-transfer-secret-file " + secret_file + " is empty",
                  "write a random secret into it: openssl rand -hex 32 > " + secret_file);
  } else if (!text.empty()) {
    spdlog::warn("--kv-transfer-secret: the secret is visible to every local user in the process list; prefer "
                 "--kv-transfer-secret-file");
  }
  if (!text.empty() && text.size() < kMinKvSecretBytes)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("the KV transfer secret has {} characters, under {}", text.size(), kMinKvSecretBytes),
                "a short secret can be guessed from a recorded handshake: use openssl rand -hex 32");
  return text;
}

std::string resolve_device_kv_plane(const std::string& requested, const std::string& device,
                                    int tensor_parallel_size) {
  if (requested == "none") return "none";
  if (requested == "auto") return is_cuda(device) ? IpcDeviceKvPlane::kName : SocketDeviceKvPlane::kName;
  if (requested != SocketDeviceKvPlane::kName && requested != IpcDeviceKvPlane::kName)
    throw Error(ErrorKind::kInvalidArgument, "--kv-device-plane " + requested, "use auto, none, socket or cuda-ipc");
  if (requested == SocketDeviceKvPlane::kName && is_cuda(device))
    throw Error(ErrorKind::kInvalidArgument, "--kv-device-plane socket on --device " + device,
                "the socket plane moves CPU engines' KV; GPU engines use cuda-ipc (or auto)");
  if (requested == IpcDeviceKvPlane::kName && !is_cuda(device))
    throw Error(ErrorKind::kInvalidArgument, "--kv-device-plane cuda-ipc on --device " + device,
                "cuda-ipc moves GPU engines' KV; CPU engines use socket (or auto)");
  (void)tensor_parallel_size;  // a tensor-parallel engine's ranks copy rank to rank (same size at both ends)
  return requested;
}

namespace {

// The cuda-ipc plane on `device` (a build with the CUDA backend only).
std::shared_ptr<DeviceKvPlane> make_ipc_plane(const KvTransferOptions& options, const std::string& device,
                                              int tensor_parallel_size) {
#ifdef LOOM_HAVE_CUDA
  std::vector<int> devices;  // the ranks' GPUs, as device_backend.cc places them: cuda:N, N+1, ...
  for (int r = 0; r < tensor_parallel_size; ++r) devices.push_back(cuda_device_index(device) + r);
  IpcDeviceKvPlaneOptions plane;
  plane.host = options.host;
  plane.port = options.device_plane_port;
  plane.secret = options.secret;
  plane.peers = KvPeerAllowlist::parse(options.peers);
  return std::make_shared<IpcDeviceKvPlane>(std::move(plane), std::make_shared<cuda::CudaPeerKvCopier>(devices));
#else
  (void)options;
  (void)tensor_parallel_size;
  throw Error(ErrorKind::kInvalidArgument, "--kv-device-plane cuda-ipc on --device " + device,
              "this build has no CUDA backend");
#endif
}

}  // namespace

server::KvTransferSetup prepare_kv_transfer(const KvTransferOptions& options, EngineConfig& engine,
                                            int64_t kv_bytes_per_token, const std::string& device,
                                            int tensor_parallel_size) {
  if (options.role != "prefill" && options.role != "decode" && options.role != "both")
    throw Error(ErrorKind::kInvalidArgument, "--role " + options.role, "use prefill, decode or both");
  server::KvTransferSetup setup;
  setup.role = options.role;
  setup.secret = options.secret;
  setup.block_size = engine.block_size;
  setup.bytes_per_block = kv_bytes_per_token * engine.block_size;
  setup.read_bandwidth = engine.disk_kv_read_bandwidth;
  if (!options.has_buffer()) return setup;
  const int64_t buffer_bytes = options.buffer_bytes;
  if (buffer_bytes < setup.bytes_per_block)
    throw Error(ErrorKind::kInvalidArgument, fmt::format("--kv-buffer-bytes {} holds no KV block", buffer_bytes),
                fmt::format("give at least {} bytes (one block)", setup.bytes_per_block));
  if (engine.host_kv_cache_bytes <= 0 && engine.num_host_kv_blocks <= 0) {
    engine.host_kv_cache_bytes = buffer_bytes;
    spdlog::info("KV transfer: a host KV tier of {:.1f} MiB stages the buffer's blocks (--host-kv-memory)",
                 static_cast<double>(buffer_bytes) / (1 << 20));
  }
  std::unique_ptr<DiskKvStore> storage = engine.disk_kv_path.empty() ? nullptr : open_disk_tier(engine);
  setup.store = std::make_shared<BufferedKvStore>(std::move(storage), buffer_bytes);
  engine.kv_store = setup.store;
  const std::string plane_name = resolve_device_kv_plane(options.device_plane, device, tensor_parallel_size);
  std::shared_ptr<DeviceKvPlane> plane;
  if (plane_name == SocketDeviceKvPlane::kName) {
    SocketDeviceKvPlaneOptions socket;
    socket.host = options.host;
    socket.port = options.device_plane_port;
    socket.secret = options.secret;
    socket.peers = KvPeerAllowlist::parse(options.peers);
    plane = std::make_shared<SocketDeviceKvPlane>(std::move(socket));
  } else if (plane_name == IpcDeviceKvPlane::kName) {
    plane = make_ipc_plane(options, device, tensor_parallel_size);
  }
  if (plane) {
    spdlog::info("KV transfer: device KV plane {} on {} (KV layer by layer into the decode engine's blocks; {})",
                 plane_name, plane->endpoint().address, options.secret.empty() ? "unauthenticated" : "authenticated");
    setup.device_plane = plane;
    engine.device_kv_plane = plane;
  }
  return setup;
}

namespace {

// The data plane --kv-transfer-backend asks for; null means payloads inline on TCP.
std::shared_ptr<KvDataPlane> make_data_plane(const KvTransferOptions& options, const std::string& device) {
  if (options.backend == "tcp") return nullptr;
  if (!is_cuda(device)) {
    if (options.backend == "nccl")
      throw Error(ErrorKind::kInvalidArgument, "--kv-transfer-backend nccl on --device " + device,
                  "NCCL moves KV between GPU engines: use --device cuda:N, or --kv-transfer-backend tcp");
    return nullptr;
  }
#ifdef LOOM_HAVE_CUDA
  try {
    return make_nccl_data_plane({.device = cuda_device_index(device)});
  } catch (const Error& error) {
    if (options.backend == "nccl") throw;
    spdlog::info("KV transfer: payloads go inline on TCP ({})", error.what());
    return nullptr;
  }
#else
  if (options.backend == "nccl")
    throw Error(ErrorKind::kInvalidArgument, "--kv-transfer-backend nccl", "this build has no CUDA backend");
  return nullptr;
#endif
}

}  // namespace

void start_kv_link(const KvTransferOptions& options, const std::string& device, Engine& engine,
                   server::KvTransferSetup& setup) {
  if (!setup.store) return;
  const std::string& host = options.host;
  setup.plane = make_data_plane(options, device);
  setup.link = std::make_shared<KvLinkServer>(
      *setup.store, host, std::max(options.port, 0),
      KvLinkServerOptions{.plane = setup.plane.get(),
                          .cached = [&engine](const KvBlockHash& hash) { return engine.caches_kv_block(hash); },
                          .secret = setup.secret});
  KvLinkClientOptions client_options;
  client_options.secret = setup.secret;
  client_options.peers = KvPeerAllowlist::parse(options.peers);
  setup.client = std::make_shared<KvLinkClient>(setup.plane.get(), client_options);
  if (setup.secret.empty())
    spdlog::warn("KV transfer: no --kv-transfer-secret-file: the KV link on {} is unauthenticated (loopback only: "
                 "any local process can write KV blocks this engine then serves)",
                 host);
  // Peers connect to this address: a wildcard listener is announced as loopback (one machine).
  const std::string announced = host == "0.0.0.0" || host == "::" || host.empty() ? "127.0.0.1" : host;
  setup.link_address = fmt::format("{}:{}", announced, setup.link->port());
  spdlog::info("KV transfer: role {}, link on {} ({}, {}), sends to {}, buffer {:.1f} MiB{}", setup.role,
               setup.link_address, setup.plane ? setup.plane->name() : "tcp",
               setup.secret.empty() ? "unauthenticated" : "authenticated", client_options.peers.describe(),
               static_cast<double>(setup.store->buffer_stats().capacity_bytes) / (1 << 20),
               setup.store->has_storage() ? ", over the disk tier" : "");
}

}  // namespace loom::cli
