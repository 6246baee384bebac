// The KV link's NCCL data plane (kv_data_plane.h): block payloads cross
// between two GPU engines (`loom serve --device cuda:N`, DualPath's PE and DE
// on separate GPUs) through NCCL send/recv, over NVLink where the GPUs have it.
//
// Each link connection gets its own two-rank communicator (the client is rank
// 0 and makes the unique id, which travels over the control socket) and two
// staging buffers (pinned host + device). A put's payloads are one byte
// stream, cut into staging-sized pieces: the sender copies a piece into
// pinned memory, host -> device, and ncclSends it; the receiver ncclRecvs it,
// device -> host, and copies it into the payloads; the two buffers alternate
// so one piece's copies overlap the next one's transfer. Payloads live on the host at both ends because the KV buffer
// (kvstore/buffered_kv_store.h) is the unit engines exchange; a transfer
// straight between the engines' device caches is not done here.
//
// NCCL is loaded at run time (dlopen: LOOM_NCCL_LIBRARY, else libnccl.so.2),
// so `loom` runs where NCCL is absent and the plane is simply unavailable.
// Communicators are non-blocking (NCCL_COMM_BLOCKING=0), and every wait
// polls with a deadline: a peer that dies or stalls aborts the communicator
// (ncclCommAbort) and breaks the channel, never hangs the connection thread.
// NCCL_NVLS_ENABLE defaults to 0 here (no NVLink multicast: two-rank
// send/recv has no use for it, and it can take shared GPUs out of service).
//
// Thread: see kv_data_plane.h; each channel sets its device on the calling
// thread before any CUDA or NCCL call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvtransfer/kv_data_plane.h"

namespace loom {

struct NcclPlaneOptions {
  int device = 0;                         // the engine's CUDA device
  uint64_t staging_bytes = 32ull << 20;   // per staging buffer (a channel has two, each on host and device)
  double timeout_seconds = 30.0;          // per piece and for the communicator's set-up
};

// Throws Error(kUnavailable) saying why when NCCL cannot be loaded or the device is not there.
std::unique_ptr<KvDataPlane> make_nccl_data_plane(const NcclPlaneOptions& options);

}  // namespace loom
