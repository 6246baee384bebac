// The PE's half of device-to-device KV transfers (kvtransfer/device/
// device_kv_plane.h): a request submitted with EngineRequest::device_kv_send
// streams its prompt's full blocks into the DE's reservation while it is
// prefilled, layer by layer as the backend writes them.
//
// Per step: prepare_step() finds, for each scheduled request with a transfer,
// the transfer blocks this step completes (their last token is computed now)
// and those complete already (found in the cache, or computed by an earlier
// step and not sent yet: sent at once, every layer). The step's batch then
// carries this sender as its KvLayerListener; each layer_written() hands the
// plane one piece per request: that layer of the blocks the step completes,
// as one run (the plane coalesces it). finish_step() ends the transfers whose
// last block went. A step with no such request gets no listener (the rule:
// nothing to pay).
//
// Failures: a plane that refuses begin_send (peer unreachable, layouts
// differ) or a send (the receiver gave up, the peer died) ends the transfer:
// the PE's request runs on unaffected, the DE recomputes. A request that ends
// before its last block went ends its transfer with a reason.
//
// Thread: engine thread only (layer_written runs inside the forward, on it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "kvtransfer/device/device_kv_plane.h"
#include "scheduler/scheduler.h"

namespace loom {

class DeviceKvSender final : public KvLayerListener {
 public:
  DeviceKvSender(DeviceKvPlane& plane, int32_t num_layers, int32_t block_size)
      : plane_(plane), num_layers_(num_layers), block_size_(block_size) {}

  // A request admitted with a DeviceKvSend of a prompt of num_prompt_tokens.
  void start(int64_t request_id, const DeviceKvSend& send, int32_t num_prompt_tokens);
  // Before the step's forward; the listener for its batch, or nullptr.
  KvLayerListener* prepare_step(const ScheduledBatch& scheduled);
  void layer_written(int32_t layer, const KvLayerFence& fence) override;
  // After the step's forward succeeded.
  void finish_step();
  // The request ended (any way); a transfer not finished is abandoned.
  void end_request(int64_t request_id);

  int64_t num_sent() const { return num_sent_; }
  int64_t num_failures() const { return num_failures_; }

 private:
  struct Transfer {
    DeviceKvSend send;
    int32_t num_prompt_blocks = 0;  // full blocks of the prompt: the transfer covers [first_block, this)
    int32_t next_block = 0;         // prompt blocks before this were sent (or are being sent this step)
  };
  // One request's blocks the running step completes: prompt blocks [begin, end).
  struct StepPiece {
    int64_t request_id = 0;
    int32_t begin = 0, end = 0;
    std::vector<int32_t> main_sources, residual_sources;
  };
  // Sends layer `layer` of `piece`; on refusal abandons its transfer.
  void send(const StepPiece& piece, int32_t layer, const KvLayerFence& fence);
  void abandon(int64_t request_id, const std::string& why);

  DeviceKvPlane& plane_;
  const int32_t num_layers_, block_size_;
  std::map<int64_t, Transfer> transfers_;  // by request id
  std::vector<StepPiece> step_pieces_;
  int64_t num_sent_ = 0, num_failures_ = 0;
};

}  // namespace loom
