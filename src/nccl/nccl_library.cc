#include "nccl/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>

#include <fmt/format.h>

namespace loom {

const NcclLibrary& nccl_library() {
  static const NcclLibrary library = [] {
    NcclLibrary loaded;
    ::setenv("NCCL_COMM_BLOCKING", "0", 1);
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    const char* configured = std::getenv("LOOM_NCCL_LIBRARY");
    const std::string path = configured != nullptr && *configured != '\0' ? configured : "libnccl.so.2";
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      loaded.failure =
          fmt::format("cannot load {} ({}); set LOOM_NCCL_LIBRARY to libnccl.so.2's path", path, ::dlerror());
      return loaded;
    }
    auto resolve = [&](auto& function, const char* name) {
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(::dlsym(handle, name));
      if (function == nullptr && loaded.failure.empty()) loaded.failure = fmt::format("{} lacks {}", path, name);
    };
    resolve(loaded.get_version, "ncclGetVersion");
    resolve(loaded.get_unique_id, "ncclGetUniqueId");
    resolve(loaded.comm_init_rank, "ncclCommInitRank");
    resolve(loaded.comm_get_async_error, "ncclCommGetAsyncError");
    resolve(loaded.comm_abort, "ncclCommAbort");
    resolve(loaded.group_start, "ncclGroupStart");
    resolve(loaded.group_end, "ncclGroupEnd");
    resolve(loaded.all_reduce, "ncclAllReduce");
    resolve(loaded.all_gather, "ncclAllGather");
    resolve(loaded.send, "ncclSend");
    resolve(loaded.recv, "ncclRecv");
    resolve(loaded.error_string, "ncclGetErrorString");
    return loaded;
  }();
  return library;
}

}  // namespace loom
