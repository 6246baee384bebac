// The KV link's transfer rate between two GPU engines' buffers (issue 20):
// a KvLinkClient on the sender's device pushes --blocks blocks of
// --block-bytes to a KvLinkServer on the receiver's device, in one process,
// through each data plane asked for (tcp: inline on loopback TCP; nccl: NCCL
// send/recv through device staging). Each figure is the median of --repeat
// sends of fresh block names after one untimed send that sets the connection
// (and communicator) up; every received block is compared with what was sent.
//
//   loom_kv_link_bench --planes tcp,nccl --blocks 512 --block-bytes 2M --out kv_link.json
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvtransfer/kv_link_client.h"
#include "kvtransfer/kv_link_server.h"
#include "kvtransfer/nccl/nccl_data_plane.h"
#include "util/error.h"
#include "kv/kv_block_hash.h"

using namespace loom;

int main(int argc, char** argv) {
  CLI::App app("The KV link's transfer rate between two GPU engines' buffers");
  std::vector<std::string> planes = {"tcp", "nccl"};
  int num_blocks = 512, repeat = 5, sender_device = 0, receiver_device = 1;
  int64_t block_bytes = 2 << 20, staging_bytes = 32 << 20;
  std::string out_path;
  app.add_option("--planes", planes, "Data planes to measure (tcp, nccl)")->delimiter(',');
  app.add_option("--blocks", num_blocks, "Blocks per send")->capture_default_str();
  app.add_option("--block-bytes", block_bytes, "Bytes per block")->capture_default_str();
  app.add_option("--staging-bytes", staging_bytes, "NCCL staging per channel")->capture_default_str();
  app.add_option("--repeat", repeat, "Timed sends per plane (median)")->capture_default_str();
  app.add_option("--sender-device", sender_device)->capture_default_str();
  app.add_option("--receiver-device", receiver_device)->capture_default_str();
  app.add_option("--out", out_path, "JSON results");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::shared_ptr<KvPayload>> payloads;
  for (int n = 0; n < num_blocks; ++n) {
    payloads.push_back(KvPayload::allocate(static_cast<size_t>(block_bytes)));
    for (int64_t i = 0; i < block_bytes; i += 64) payloads.back()->data()[i] = static_cast<std::byte>((n + i / 64) & 0xff);
  }
  const int64_t total = block_bytes * num_blocks;
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& plane_name : planes) {
    std::unique_ptr<KvDataPlane> sender_plane, receiver_plane;
    if (plane_name == "nccl") {
      sender_plane = make_nccl_data_plane({.device = sender_device, .staging_bytes = static_cast<uint64_t>(staging_bytes)});
      receiver_plane =
          make_nccl_data_plane({.device = receiver_device, .staging_bytes = static_cast<uint64_t>(staging_bytes)});
    } else if (plane_name != "tcp") {
      fmt::print(stderr, "unknown plane {}\n", plane_name);
      return 2;
    }
    BufferedKvStore sender(nullptr, total + block_bytes), receiver(nullptr, 2 * (total + block_bytes));
    KvLinkServer server(receiver, "127.0.0.1", 0, {.receive_timeout_seconds = 60.0, .plane = receiver_plane.get()});
    KvLinkClient client(sender_plane.get());
    const std::string address = "127.0.0.1:" + std::to_string(server.port());
    std::vector<double> seconds;
    int64_t mismatched = 0;
    for (int round = 0; round <= repeat; ++round) {
      const int count = round == 0 ? 1 : num_blocks;  // round 0: set-up, untimed
      std::vector<KvBlockHash> hashes;
      std::vector<int64_t> sizes(count, block_bytes);
      for (int n = 0; n < count; ++n) {
        hashes.push_back(hash_string(fmt::format("{} {} {}", plane_name, round, n)));
        sender.put(hashes.back(), BufferedKvStore::Payload(payloads[n]));
      }
      const auto start = std::chrono::steady_clock::now();
      const KvSendReport report = client.send(address, hashes, sizes, sender, {.socket_timeout_seconds = 60.0});
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (report.sent_blocks != count) fmt::print(stderr, "{}: sent {} of {}\n", plane_name, report.sent_blocks, count);
      for (int n = 0; n < count; ++n) {
        const BufferedKvStore::Payload got = receiver.get(hashes[n]);
        if (!got || std::memcmp(got->data(), payloads[n]->data(), got->size()) != 0) ++mismatched;
      }
      if (round > 0) seconds.push_back(elapsed);
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    const double rate = static_cast<double>(total) / median / 1e9;
    fmt::print("{:>5}: {} blocks x {} bytes in {:.3f} s = {:.2f} GB/s (mismatched blocks: {})\n", plane_name,
               num_blocks, block_bytes, median, rate, mismatched);
    results.push_back({{"plane", plane_name}, {"blocks", num_blocks}, {"block_bytes", block_bytes},
                       {"median_seconds", median}, {"gb_per_second", rate}, {"mismatched_blocks", mismatched},
                       {"sender_device", sender_device}, {"receiver_device", receiver_device}});
  }
  if (!out_path.empty()) std::ofstream(out_path) << nlohmann::json{{"kv_link", results}}.dump(2) << "\n";
  return 0;
}
