#include "engine/device_kv_sender.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace loom {

void DeviceKvSender::start(int64_t request_id, const DeviceKvSend& send, int32_t num_prompt_tokens) {
  Transfer transfer{send, num_prompt_tokens / block_size_, send.first_block};
  const int32_t expected = std::max(0, transfer.num_prompt_blocks - send.first_block);
  if (send.destination.num_blocks() != expected ||
      (!send.destination.residual_blocks.empty() &&
       send.destination.residual_blocks.size() != send.destination.main_blocks.size())) {
    spdlog::warn("device KV transfer {}: the reservation holds {} blocks, the prompt has {} past block {}: not sent",
                 send.destination.id, send.destination.num_blocks(), expected, send.first_block);
    ++num_failures_;
    return;
  }
  if (!plane_.begin_send(send.peer, send.destination, num_layers_)) {
    spdlog::warn("device KV transfer {}: the plane cannot reach {}: the decode engine recomputes",
                 send.destination.id, send.peer);
    ++num_failures_;
    return;
  }
  transfers_[request_id] = std::move(transfer);
}

KvLayerListener* DeviceKvSender::prepare_step(const ScheduledBatch& scheduled) {
  step_pieces_.clear();
  if (transfers_.empty()) return nullptr;
  for (const ScheduledRequest& entry : scheduled.requests) {
    auto it = transfers_.find(entry.id);
    if (it == transfers_.end()) continue;
    Transfer& transfer = it->second;
    const bool forked = !transfer.send.destination.residual_blocks.empty();
    // Blocks complete before the step (cached, or computed earlier) and those it completes.
    const int32_t done_before = std::min(transfer.num_prompt_blocks, entry.num_computed_tokens / block_size_);
    const int32_t done_after =
        std::min(transfer.num_prompt_blocks, (entry.num_computed_tokens + entry.num_new_tokens) / block_size_);
    auto piece = [&](int32_t begin, int32_t end) {
      StepPiece step{entry.id, begin, end, {}, {}};
      step.main_sources.assign(entry.block_ids.begin() + begin, entry.block_ids.begin() + end);
      if (forked) step.residual_sources.assign(entry.residual_block_ids.begin() + begin,
                                               entry.residual_block_ids.begin() + end);
      return step;
    };
    if (transfer.next_block < done_before) {
      const StepPiece ready = piece(transfer.next_block, done_before);
      for (int32_t layer = 0; layer < num_layers_ && transfers_.count(entry.id); ++layer) send(ready, layer, {});
      if (!transfers_.count(entry.id)) continue;
    }
    const int32_t begin = std::max(transfer.next_block, done_before);
    if (begin < done_after) step_pieces_.push_back(piece(begin, done_after));
    transfer.next_block = std::max(transfer.next_block, done_after);
  }
  return step_pieces_.empty() ? nullptr : this;
}

void DeviceKvSender::layer_written(int32_t layer, const KvLayerFence& fence) {
  for (const StepPiece& piece : step_pieces_)
    if (transfers_.count(piece.request_id)) send(piece, layer, fence);
}

void DeviceKvSender::send(const StepPiece& piece, int32_t layer, const KvLayerFence& fence) {
  const Transfer& transfer = transfers_.at(piece.request_id);
  DeviceKvLayerPiece layer_piece{layer, piece.begin - transfer.send.first_block, piece.main_sources,
                                 piece.residual_sources, fence};
  if (!plane_.send_layer(transfer.send.destination.id, layer_piece))
    abandon(piece.request_id, "the receiver no longer takes it");
}

void DeviceKvSender::finish_step() {
  step_pieces_.clear();
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    if (it->second.next_block < it->second.num_prompt_blocks) {
      ++it;
      continue;
    }
    plane_.end_send(it->second.send.destination.id, "");
    ++num_sent_;
    it = transfers_.erase(it);
  }
}

void DeviceKvSender::end_request(int64_t request_id) {
  if (transfers_.count(request_id)) abandon(request_id, "the prefill request ended first");
}

void DeviceKvSender::abandon(int64_t request_id, const std::string& why) {
  auto it = transfers_.find(request_id);
  if (it == transfers_.end()) return;
  spdlog::warn("device KV transfer {} abandoned: {}", it->second.send.destination.id, why);
  plane_.end_send(it->second.send.destination.id, why);
  ++num_failures_;
  transfers_.erase(it);
}

}  // namespace loom
