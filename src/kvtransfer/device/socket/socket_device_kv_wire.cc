#include "kvtransfer/device/socket/socket_device_kv_wire.h"

#include <cstring>
#include <numeric>

#include "kvtransfer/device/device_kv_runs.h"
#include "kvtransfer/kv_link_crypto.h"

namespace loom::socket_plane_wire {

// Bytes one block contributes to one layer piece: every array of the layer, main then rCache.
int64_t piece_block_bytes(int64_t main_arrays, int64_t main_bytes, int64_t residual_arrays, int64_t residual_bytes) {
  return main_arrays * main_bytes + residual_arrays * residual_bytes;
}

bool ids_in_pool(std::span<const int32_t> ids, const KvPoolMemory& pool) {
  for (int32_t id : ids)
    if (id < 0 || id >= pool.num_blocks) return false;
  return true;
}

// Appends layer `layer` of blocks `ids` of `pool`, array after array, to `out`.
void append_layer(const KvPoolMemory& pool, int32_t layer, std::span<const int32_t> ids, std::vector<std::byte>& out) {
  const int64_t bytes = pool.bytes_per_block;
  std::vector<int32_t> positions(ids.size());
  std::iota(positions.begin(), positions.end(), 0);
  for (int32_t a = 0; a < pool.arrays_per_layer; ++a) {
    const std::byte* base = pool.arrays[static_cast<size_t>(layer) * pool.arrays_per_layer + a];
    const size_t at = out.size();
    out.resize(at + ids.size() * static_cast<size_t>(bytes));
    for (const DeviceKvBlockRun& run : coalesce_block_runs(ids, positions))
      std::memcpy(out.data() + at + run.destination * bytes, base + run.source * bytes,
                  static_cast<size_t>(run.count * bytes));
  }
}

// Copies `payload` (layer `layer` of `count` blocks, array after array) into blocks `destinations` of `pool`;
// returns the bytes used.
size_t scatter_layer(const KvPoolMemory& pool, int32_t layer, std::span<const int32_t> destinations,
                     const std::byte* payload) {
  const int64_t bytes = pool.bytes_per_block;
  std::vector<int32_t> positions(destinations.size());
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<DeviceKvBlockRun> runs = coalesce_block_runs(positions, destinations);
  size_t used = 0;
  for (int32_t a = 0; a < pool.arrays_per_layer; ++a) {
    std::byte* base = pool.arrays[static_cast<size_t>(layer) * pool.arrays_per_layer + a];
    for (const DeviceKvBlockRun& run : runs)
      std::memcpy(base + run.destination * bytes, payload + used + run.source * bytes,
                  static_cast<size_t>(run.count * bytes));
    used += destinations.size() * static_cast<size_t>(bytes);
  }
  return used;
}

std::string text_of(kvlink::MessageReader& reader) {
  std::string text(reader.remaining(), '\0');
  reader.raw(std::as_writable_bytes(std::span(text)));
  return text;
}

std::vector<std::byte> control(char op, uint8_t flag, const std::string& text) {
  kvlink::MessageWriter writer;
  writer.op(op);
  writer.bytes.push_back(std::byte{flag});
  writer.raw(kvlink::as_bytes(text));
  return std::move(writer.bytes);
}

// The answer to an open: u8 accepted, then the reason.
std::vector<std::byte> verdict(bool accepted, const std::string& reason) {
  kvlink::MessageWriter writer;
  writer.bytes.push_back(std::byte{accepted ? uint8_t{1} : uint8_t{0}});
  writer.raw(kvlink::as_bytes(reason));
  return std::move(writer.bytes);
}

}  // namespace loom::socket_plane_wire
