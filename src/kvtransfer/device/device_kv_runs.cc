#include "kvtransfer/device/device_kv_runs.h"

#include "util/error.h"

namespace loom {

std::vector<DeviceKvBlockRun> coalesce_block_runs(std::span<const int32_t> sources,
                                                  std::span<const int32_t> destinations) {
  LOOM_CHECK(sources.size() == destinations.size());
  std::vector<DeviceKvBlockRun> runs;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!runs.empty()) {
      DeviceKvBlockRun& last = runs.back();
      if (sources[i] == last.source + last.count && destinations[i] == last.destination + last.count) {
        ++last.count;
        continue;
      }
    }
    runs.push_back({sources[i], destinations[i], 1});
  }
  return runs;
}

}  // namespace loom
