#include "kvtransfer/nccl/nccl_data_plane.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/kv_link_protocol.h"
#include "nccl/nccl_library.h"
#include "util/error.h"

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;

class NcclChannel final : public KvBulkChannel {
  struct Buffer {
    std::byte* device = nullptr;
    std::byte* host = nullptr;      // pinned
    cudaEvent_t copied = nullptr;   // its last host <-> device copy finished
    cudaEvent_t moved = nullptr;    // its last NCCL transfer finished
  };

 public:
  NcclChannel(const NcclLibrary& api, const NcclPlaneOptions& options, int rank)
      : api_(api), options_(options), rank_(rank) {}

  ~NcclChannel() override {
    cudaSetDevice(options_.device);
    // Abort, not destroy: the peer may be gone, and abort never waits for it.
    if (comm_ != nullptr) api_.comm_abort(comm_);
    for (cudaStream_t stream : {stream_, copy_stream_})
      if (stream != nullptr) cudaStreamDestroy(stream);
    for (Buffer& buffer : buffers_) {
      if (buffer.device != nullptr) cudaFree(buffer.device);
      if (buffer.host != nullptr) cudaFreeHost(buffer.host);
      for (cudaEvent_t event : {buffer.copied, buffer.moved})
        if (event != nullptr) cudaEventDestroy(event);
    }
  }

  // Rank 0 writes the id to `fd`, rank 1 reads it; then both join, and the
  // server (rank 1) tells the client whether it got through.
  bool open(int fd, std::string& failure) {
    const int rank = rank_;
    if (!set_device(failure)) return false;
    ncclUniqueId id{};
    if (rank == 0) {
      if (!check(api_.get_unique_id(&id), "ncclGetUniqueId", failure)) return false;
      if (!kvlink::write_all(fd, std::as_bytes(std::span(id.internal)))) return fail("sending the id", failure);
    } else if (!kvlink::read_exact(fd, std::as_writable_bytes(std::span(id.internal)))) {
      return fail("receiving the id", failure);
    }
    if (!allocate(failure)) return false;
    const ncclResult_t started = api_.comm_init_rank(&comm_, 2, id, rank);
    if (started != ncclSuccess && started != ncclInProgress) return check(started, "ncclCommInitRank", failure);
    if (rank == 1) {
      const bool joined = settle(failure);
      const std::byte answer{joined ? uint8_t{1} : uint8_t{0}};
      return kvlink::write_all(fd, std::span(&answer, 1)) && joined;
    }
    std::byte answer{};
    if (!kvlink::read_exact(fd, std::span(&answer, 1)) || answer == std::byte{0}) {
      failure = "the peer could not join the communicator";
      return false;
    }
    return settle(failure);
  }

  bool send(std::span<const KvPayload* const> payloads) override {
    return transfer(payloads.size(), [&](size_t i) { return const_cast<KvPayload*>(payloads[i]); }, true);
  }

  bool receive(std::span<KvPayload* const> payloads) override {
    return transfer(payloads.size(), [&](size_t i) { return payloads[i]; }, false);
  }

 private:
  bool set_device(std::string& failure) {
    const cudaError_t error = cudaSetDevice(options_.device);
    if (error != cudaSuccess) failure = fmt::format("cuda:{}: {}", options_.device, cudaGetErrorString(error));
    return error == cudaSuccess;
  }

  bool allocate(std::string& failure) {
    cudaError_t error = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (error == cudaSuccess) error = cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking);
    for (Buffer& buffer : buffers_) {
      if (error == cudaSuccess) error = cudaMalloc(&buffer.device, options_.staging_bytes);
      if (error == cudaSuccess) error = cudaHostAlloc(&buffer.host, options_.staging_bytes, cudaHostAllocDefault);
      if (error == cudaSuccess) error = cudaEventCreateWithFlags(&buffer.copied, cudaEventDisableTiming);
      if (error == cudaSuccess) error = cudaEventCreateWithFlags(&buffer.moved, cudaEventDisableTiming);
    }
    if (error != cudaSuccess)
      failure = fmt::format("staging 2 x {} bytes on cuda:{} and pinned host memory: {}", options_.staging_bytes,
                            options_.device, cudaGetErrorString(error));
    return error == cudaSuccess;
  }

  bool check(ncclResult_t result, const char* call, std::string& failure) const {
    if (result == ncclSuccess) return true;
    failure = fmt::format("{}: {}", call, api_.error_string(result));
    return false;
  }

  static bool fail(const char* during, std::string& failure) {
    failure = fmt::format("the control connection failed while {}", during);
    return false;
  }

  // Waits (polling, with the deadline) until the communicator's pending
  // operation finished; on error or timeout aborts it and breaks the channel.
  bool settle(std::string& failure) {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_seconds));
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t polled = api_.comm_get_async_error(comm_, &state);
      if (polled == ncclSuccess && state == ncclSuccess) return true;
      if ((polled != ncclSuccess && polled != ncclInProgress) || (state != ncclSuccess && state != ncclInProgress)) {
        check(polled != ncclSuccess ? polled : state, "NCCL", failure);
        return broken();
      }
      if (Clock::now() > deadline) {
        failure = fmt::format("NCCL: no progress in {} s", options_.timeout_seconds);
        return broken();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Waits for `event` (work queued on the channel's streams); NCCL errors and
  // the deadline abort as in settle().
  bool wait_event(cudaEvent_t event) {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_seconds));
    for (;;) {
      const cudaError_t done = cudaEventQuery(event);
      if (done == cudaSuccess) return true;
      if (done != cudaErrorNotReady) {
        spdlog::warn("KV link (NCCL): {}", cudaGetErrorString(done));
        return broken();
      }
      ncclResult_t state = ncclSuccess;
      api_.comm_get_async_error(comm_, &state);
      if ((state != ncclSuccess && state != ncclInProgress) || Clock::now() > deadline) {
        spdlog::warn("KV link (NCCL): {}", state != ncclSuccess && state != ncclInProgress
                                               ? api_.error_string(state)
                                               : "the peer made no progress in time");
        return broken();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  bool broken() {
    if (comm_ != nullptr) api_.comm_abort(comm_);
    comm_ = nullptr;
    return false;
  }

  // The payloads' bytes as one stream, cut into staging-sized pieces; both
  // ends cut the same pieces because they agreed on every size. Two buffers
  // (pinned host + device) alternate, so piece k's host copy and PCIe copy
  // overlap piece k-1's NCCL transfer:
  //   sender    memcpy -> host[b], host[b] -> device[b] (copy stream, `copied`),
  //             ncclSend(device[b]) after `copied` (NCCL stream, `moved`)
  //   receiver  ncclRecv(device[b]) after the last copy out of it (`copied`),
  //             device[b] -> host[b] after `moved` (copy stream, `copied`),
  //             then memcpy host[b] -> payloads while piece k+1 moves.
  struct Segment {
    std::byte* host;
    size_t offset, bytes;  // offset within the piece
  };
  struct Piece {
    std::vector<Segment> segments;
    size_t bytes = 0;
  };

  template <typename PayloadAt>
  std::vector<Piece> cut(size_t count, PayloadAt payload_at) const {
    std::vector<Piece> pieces(1);
    for (size_t i = 0; i < count; ++i) {
      KvPayload* payload = payload_at(i);
      for (size_t offset = 0; offset < payload->size();) {
        if (pieces.back().bytes == options_.staging_bytes) pieces.emplace_back();
        Piece& piece = pieces.back();
        const size_t bytes = std::min(payload->size() - offset, options_.staging_bytes - piece.bytes);
        piece.segments.push_back({payload->data() + offset, piece.bytes, bytes});
        piece.bytes += bytes;
        offset += bytes;
      }
    }
    if (pieces.back().bytes == 0) pieces.pop_back();
    return pieces;
  }

  bool enqueue_nccl(bool sending, Buffer& buffer, size_t bytes) {
    const ncclResult_t enqueued = sending ? api_.send(buffer.device, bytes, ncclUint8, 1 - rank_, comm_, stream_)
                                          : api_.recv(buffer.device, bytes, ncclUint8, 1 - rank_, comm_, stream_);
    std::string failure;
    if (enqueued == ncclInProgress ? !settle(failure) : enqueued != ncclSuccess) {
      spdlog::warn("KV link (NCCL): {}", failure.empty() ? api_.error_string(enqueued) : failure);
      return broken();
    }
    return cudaEventRecord(buffer.moved, stream_) == cudaSuccess || broken();
  }

  template <typename PayloadAt>
  bool transfer(size_t count, PayloadAt payload_at, bool sending) {
    if (comm_ == nullptr) return false;
    std::string failure;
    if (!set_device(failure)) return false;
    const std::vector<Piece> pieces = cut(count, payload_at);
    auto ok = [&](cudaError_t error) { return error == cudaSuccess || broken(); };
    for (size_t k = 0; k < pieces.size(); ++k) {
      const Piece& piece = pieces[k];
      Buffer& buffer = buffers_[k % 2];
      if (sending) {
        if (!wait_event(buffer.copied)) return false;  // piece k-2's host -> device copy is done
        for (const Segment& segment : piece.segments)
          std::memcpy(buffer.host + segment.offset, segment.host, segment.bytes);
        if (!ok(cudaStreamWaitEvent(copy_stream_, buffer.moved)) ||  // piece k-2 left device[b]
            !ok(cudaMemcpyAsync(buffer.device, buffer.host, piece.bytes, cudaMemcpyHostToDevice, copy_stream_)) ||
            !ok(cudaEventRecord(buffer.copied, copy_stream_)) || !ok(cudaStreamWaitEvent(stream_, buffer.copied)) ||
            !enqueue_nccl(true, buffer, piece.bytes))
          return false;
      } else {
        if (!ok(cudaStreamWaitEvent(stream_, buffer.copied)) || !enqueue_nccl(false, buffer, piece.bytes) ||
            !ok(cudaStreamWaitEvent(copy_stream_, buffer.moved)) ||
            !ok(cudaMemcpyAsync(buffer.host, buffer.device, piece.bytes, cudaMemcpyDeviceToHost, copy_stream_)) ||
            !ok(cudaEventRecord(buffer.copied, copy_stream_)))
          return false;
        if (k > 0 && !unpack(pieces[k - 1], buffers_[(k - 1) % 2])) return false;
      }
    }
    if (pieces.empty()) return true;
    if (sending) return wait_event(buffers_[(pieces.size() - 1) % 2].moved);
    return unpack(pieces.back(), buffers_[(pieces.size() - 1) % 2]);
  }

  bool unpack(const Piece& piece, Buffer& buffer) {
    if (!wait_event(buffer.copied)) return false;
    for (const Segment& segment : piece.segments) std::memcpy(segment.host, buffer.host + segment.offset, segment.bytes);
    return true;
  }

  const NcclLibrary& api_;
  const NcclPlaneOptions options_;
  const int rank_;  // 0: the connecting side
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;       // NCCL's
  cudaStream_t copy_stream_ = nullptr;  // host <-> device copies
  Buffer buffers_[2];
};

class NcclDataPlane final : public KvDataPlane {
 public:
  NcclDataPlane(const NcclLibrary& api, const NcclPlaneOptions& options) : api_(api), options_(options) {}
  std::string name() const override { return "nccl"; }
  std::unique_ptr<KvBulkChannel> connect(int fd, std::string& failure) override { return open(fd, 0, failure); }
  std::unique_ptr<KvBulkChannel> accept(int fd, std::string& failure) override { return open(fd, 1, failure); }

 private:
  std::unique_ptr<KvBulkChannel> open(int fd, int rank, std::string& failure) {
    auto channel = std::make_unique<NcclChannel>(api_, options_, rank);
    if (!channel->open(fd, failure)) return nullptr;
    return channel;
  }

  const NcclLibrary& api_;
  const NcclPlaneOptions options_;
};

}  // namespace

std::unique_ptr<KvDataPlane> make_nccl_data_plane(const NcclPlaneOptions& options) {
  const NcclLibrary& api = nccl_library();
  if (!api.failure.empty()) throw Error(ErrorKind::kUnavailable, "KV link over NCCL: " + api.failure);
  int num_devices = 0;
  if (cudaGetDeviceCount(&num_devices) != cudaSuccess || options.device < 0 || options.device >= num_devices)
    throw Error(ErrorKind::kUnavailable,
                fmt::format("KV link over NCCL: no CUDA device {} ({} present)", options.device, num_devices));
  int version = 0;
  api.get_version(&version);
  spdlog::info("KV link: NCCL {} loaded, data plane on cuda:{}", version, options.device);
  return std::make_unique<NcclDataPlane>(api, options);
}

}  // namespace loom
