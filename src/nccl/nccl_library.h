// NCCL, loaded at run time (dlopen), so that `loom` runs where no NCCL is
// installed and only the features that need it (tensor parallelism over
// GPUs, the KV link's NCCL data plane) ask for it. The library is
// $LOOM_NCCL_LIBRARY, else libnccl.so.2 from the loader's path.
//
// Loading sets, before NCCL first reads its environment, NCCL_COMM_BLOCKING=0
// (every communicator is non-blocking: a call may answer ncclInProgress, and
// its users poll ncclCommGetAsyncError, which keeps every wait abortable) and
// NCCL_NVLS_ENABLE=0 unless set (NVLink multicast stays off).
//
// Threads: nccl_library() may be called from any thread; the first call loads.
#pragma once

#include <nccl.h>

#include <string>

namespace loom {

struct NcclLibrary {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  std::string failure;  // why it did not load ("" when every entry point resolved)

  bool loaded() const { return failure.empty(); }
};

// The process's one NcclLibrary (loaded on first use; never unloaded).
const NcclLibrary& nccl_library();

}  // namespace loom
