// The cuda-ipc device KV plane's transfer rate between two GPUs (issue 41):
// a decode-engine plane in this process (pools on --de-device) and a
// prefill-engine plane in a child process (pools on --pe-device, started as
// this binary with --child), as between two engines. Each timed transfer
// moves every layer of --blocks blocks (K and V arrays of --block-bytes each:
// the default is Llama-3-8B's 16-token block, 32 layers, 512 blocks = 1 GiB)
// as the engine does: one send_layer per layer, one run per array, the DE
// counting a layer landed when the PE's 'L' for it came. The figure is the
// median over --repeat transfers after one untimed one (which maps the
// pools), from the DE's "go" to the DE's kDone; the PE's own time from
// begin_send to end_send comes beside it. Afterwards every byte the DE holds
// is compared with the pattern the PE wrote.
//
//   loom_ipc_plane_bench --pe-device 0 --de-device 1 --out ipc_plane.json
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_peer_kv_copier.h"
#include "kvtransfer/device/ipc/ipc_device_kv_plane.h"

using namespace loom;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "ipc-plane-bench-secret-0123456789abcdef";

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fmt::print(stderr, "{}: {}\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// The byte pattern of array `array`'s block `block`: distinct per array, block and word.
void fill_pattern(std::vector<uint32_t>& words, int64_t array, int64_t block) {
  const uint32_t seed = static_cast<uint32_t>(array * 2654435761u + block * 40503u + 17);
  for (size_t i = 0; i < words.size(); ++i) words[i] = seed ^ static_cast<uint32_t>(i * 2246822519u);
}

struct Pool {
  void* memory = nullptr;
  KvPoolMemory kv;
};

Pool make_pool(int device, int layers, int blocks, int64_t block_bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  Pool pool;
  const size_t array_bytes = static_cast<size_t>(blocks) * block_bytes;
  check(cudaMalloc(&pool.memory, array_bytes * 2 * layers), "cudaMalloc");
  check(cudaMemset(pool.memory, 0, array_bytes * 2 * layers), "cudaMemset");
  pool.kv.kind = KvPoolMemory::Kind::kCuda;
  pool.kv.device = device;
  pool.kv.arrays_per_layer = 2;
  pool.kv.num_blocks = blocks;
  pool.kv.bytes_per_block = block_bytes;
  pool.kv.devices = {device};
  pool.kv.allocations = {static_cast<std::byte*>(pool.memory)};
  for (int a = 0; a < 2 * layers; ++a) pool.kv.arrays.push_back(pool.kv.allocations[0] + a * array_bytes);
  return pool;
}

IpcDeviceKvPlaneOptions plane_options() {
  IpcDeviceKvPlaneOptions options;
  options.secret = kSecret;
  return options;
}

// The PE: fills its pool with the pattern, announces its plane's address, then sends one transfer per
// "go ID PEER" line on stdin; writes each transfer's seconds (begin_send to end_send) to `out`.
int run_child(int device, int layers, int blocks, int64_t block_bytes, const std::string& out) {
  Pool pool = make_pool(device, layers, blocks, block_bytes);
  std::vector<uint32_t> words(static_cast<size_t>(block_bytes / 4));
  for (int a = 0; a < 2 * layers; ++a)
    for (int b = 0; b < blocks; ++b) {
      fill_pattern(words, a, b);
      check(cudaMemcpy(pool.kv.arrays[a] + b * block_bytes, words.data(), static_cast<size_t>(block_bytes),
                       cudaMemcpyHostToDevice),
            "upload");
    }
  IpcDeviceKvPlane plane(plane_options(), std::make_shared<cuda::CudaPeerKvCopier>(std::vector<int>{device}));
  plane.bind_pools(pool.kv, {});
  { std::ofstream(out + ".address") << plane.endpoint().address; }
  std::vector<int32_t> sources(static_cast<size_t>(blocks)), destinations(sources.size());
  for (int b = 0; b < blocks; ++b) {
    sources[b] = b;
    destinations[b] = (b + blocks / 2) % blocks;  // the DE's reservation (main() below)
  }
  nlohmann::json seconds = nlohmann::json::array();
  char line[512];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
    unsigned long long id = 0;
    char peer[256] = {};
    if (std::sscanf(line, "go %llu %255s", &id, peer) != 2) break;
    DeviceKvDestination destination;
    destination.id = id;
    destination.main_blocks = destinations;
    const auto start = Clock::now();
    if (!plane.begin_send(peer, destination, layers)) return 3;
    for (int layer = 0; layer < layers; ++layer)
      if (!plane.send_layer(id, {layer, 0, sources, {}, {}})) return 4;
    plane.end_send(id, "");
    seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::ofstream(out) << seconds.dump();
  return 0;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("The cuda-ipc device KV plane's transfer rate between two GPUs");
  int pe_device = 0, de_device = 1, layers = 32, blocks = 512, repeat = 5;
  int64_t block_bytes = 32768;
  std::string out_path, child_out;
  app.add_option("--pe-device", pe_device)->capture_default_str();
  app.add_option("--de-device", de_device)->capture_default_str();
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--blocks", blocks)->capture_default_str();
  app.add_option("--block-bytes", block_bytes, "Bytes of one block of one array (K or V)")->capture_default_str();
  app.add_option("--repeat", repeat)->capture_default_str();
  app.add_option("--out", out_path, "JSON results");
  app.add_option("--child", child_out, "(internal) run as the prefill engine, writing timings here");
  CLI11_PARSE(app, argc, argv);
  if (!child_out.empty()) return run_child(pe_device, layers, blocks, block_bytes, child_out);

  Pool pool = make_pool(de_device, layers, blocks, block_bytes);
  IpcDeviceKvPlane plane(plane_options(), std::make_shared<cuda::CudaPeerKvCopier>(std::vector<int>{de_device}));
  plane.bind_pools(pool.kv, {});
  char scratch[] = "/tmp/loom_ipc_bench_XXXXXX";
  const int scratch_fd = ::mkstemp(scratch);
  ::close(scratch_fd);
  const std::string child_file = scratch;
  std::remove((child_file + ".address").c_str());
  const std::string command =
      fmt::format("/proc/{}/exe --child {} --pe-device {} --layers {} --blocks {} --block-bytes {}", ::getpid(),
                  child_file, pe_device, layers, blocks, block_bytes);
  FILE* child = ::popen(command.c_str(), "w");
  if (child == nullptr) return 2;
  std::string pe_address;
  for (int tries = 0; tries < 6000 && pe_address.empty(); ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream(child_file + ".address") >> pe_address;
  }
  if (pe_address.empty()) {
    fmt::print(stderr, "the prefill-engine process did not start\n");
    return 2;
  }
  // Source block b lands in block (b + blocks / 2) % blocks: two runs per array, so placement is
  // checked, not only the bytes.
  std::vector<int32_t> rotated(static_cast<size_t>(blocks));
  for (int b = 0; b < blocks; ++b) rotated[b] = (b + blocks / 2) % blocks;
  std::vector<double> seconds;
  bool ok = true;
  for (int rep = 0; rep <= repeat && ok; ++rep) {
    DeviceKvDestination destination;
    destination.id = static_cast<DeviceKvTransferId>(rep + 1);
    destination.main_blocks = rotated;
    plane.expect({destination, pe_address, layers, Clock::now() + std::chrono::seconds(60)});
    const auto start = Clock::now();
    std::fprintf(child, "go %d %s\n", rep + 1, plane.endpoint().address.c_str());
    std::fflush(child);
    DeviceKvProgress progress;
    while ((progress = plane.progress(destination.id)).state == DeviceKvProgress::State::kPending)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (progress.state != DeviceKvProgress::State::kDone) {
      fmt::print(stderr, "transfer {} failed: {}\n", rep + 1, progress.failure);
      ok = false;
    }
    plane.finish(destination.id);
    if (rep > 0) seconds.push_back(elapsed);
  }
  std::fclose(child);  // ::pclose would also wait; the child ends at EOF
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  nlohmann::json pe_seconds = nlohmann::json::array();
  std::ifstream(child_file) >> pe_seconds;
  // Every byte as the PE wrote it.
  int64_t wrong_blocks = 0;
  std::vector<uint32_t> expected(static_cast<size_t>(block_bytes / 4)), got(expected.size());
  check(cudaSetDevice(de_device), "cudaSetDevice");
  for (int a = 0; a < 2 * layers; ++a)
    for (int b = 0; b < blocks; ++b) {
      fill_pattern(expected, a, b);
      check(cudaMemcpy(got.data(), pool.kv.arrays[a] + rotated[b] * block_bytes, static_cast<size_t>(block_bytes),
                       cudaMemcpyDeviceToHost),
            "download");
      wrong_blocks += std::memcmp(got.data(), expected.data(), static_cast<size_t>(block_bytes)) != 0;
    }
  const double bytes = static_cast<double>(block_bytes) * 2 * layers * blocks;
  std::vector<double> pe;
  for (const auto& value : pe_seconds) pe.push_back(value.get<double>());
  if (!pe.empty()) pe.erase(pe.begin());  // the untimed first
  cudaDeviceProp pe_props{}, de_props{};
  cudaGetDeviceProperties(&pe_props, pe_device);
  cudaGetDeviceProperties(&de_props, de_device);
  nlohmann::json result = {
      {"plane", "cuda-ipc"},
      {"pe_device", fmt::format("{} ({})", pe_device, pe_props.name)},
      {"de_device", fmt::format("{} ({})", de_device, de_props.name)},
      {"layers", layers},
      {"blocks", blocks},
      {"block_bytes_per_array", block_bytes},
      {"bytes", bytes},
      {"seconds_median", median(seconds)},
      {"gb_per_s", bytes / median(seconds) / 1e9},
      {"pe_seconds_median", median(pe)},
      {"pe_gb_per_s", pe.empty() ? 0.0 : bytes / median(pe) / 1e9},
      {"seconds", seconds},
      {"wrong_blocks", wrong_blocks},
      {"ok", ok && wrong_blocks == 0},
  };
  fmt::print("{}\n", result.dump(2));
  if (!out_path.empty()) std::ofstream(out_path) << result.dump(2) << "\n";
  std::remove(child_file.c_str());
  std::remove((child_file + ".address").c_str());
  return ok && wrong_blocks == 0 ? 0 : 1;
}
