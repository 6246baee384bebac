// Publishes the engine's KV events (kv/kv_event_sink.h) over ZMQ as vLLM does
// (vllm/distributed/kv_events.py ZmqEventPublisher), so that KV-aware routers
// (llm-d's KV-cache indexer, NVIDIA Dynamo's KV router) learn which prefixes
// this server holds by pointing their vLLM KV-event subscriber at it.
//
// Each flush() sends the events gathered since the last one (one engine step's;
// nothing when there are none) as one multipart message on a PUB socket:
//
//   [topic, sequence number (uint64, 8 bytes big-endian, from 0), KVEventBatch (msgpack, kv_event_batch.h)]
//
// A subscriber that sees a gap in the sequence numbers missed a batch (ZMQ
// dropped it at the high-water mark, or it connected late). With a replay
// endpoint (vLLM's replay_endpoint), it asks a ROUTER socket for the missed
// ones, as vLLM's subscribers do: it sends [empty frame, start sequence (8
// bytes big-endian)] from a DEALER or REQ socket and gets one
// [empty, sequence, batch] message per buffered batch from that number on,
// then [empty, -1 (8 bytes, all ones), empty] to end. Batches older than the
// buffer (replay_buffer_batches) are gone: such a subscriber's view stays
// incomplete until the next AllBlocksCleared. The engine publishes
// AllBlocksCleared when its caches are built (start, resize) and when the
// publisher is destroyed.
//
// Never blocks the engine thread on the network: encoding happens in flush(),
// the send hands the message to ZMQ's I/O thread, and a PUB socket drops what
// a subscriber's queue (send_high_water_mark) has no room for.
//
// Thread: one at a time (the engine thread; the engine's constructor and its
// last commands run under the engine's inbox lock). Owns the ZMQ context and
// sockets; the replay socket is served by a thread of its own, which reads
// the buffer under a lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvevents/kv_event_batch.h"
#include "kvevents/kv_events_config.h"

namespace loom {

class KvEventPublisher {
 public:
  // Binds or connects the PUB socket (KvEventsConfig::endpoint). Throws
  // Error(kInvalidArgument) naming the endpoint when ZMQ refuses it (a bad
  // address, a port in use).
  explicit KvEventPublisher(const KvEventsConfig& config);
  // Publishes AllBlocksCleared (this server holds nothing any more), then
  // closes the socket, waiting at most half a second for slow subscribers.
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Where the engine's caches report (valid as long as the publisher).
  KvEventSink& sink() { return batcher_; }
  // Sends what sink() gathered since the last flush as one batch; no-op when nothing.
  void flush();
  // Batches sent so far (the next one's sequence number).
  uint64_t num_batches_sent() const { return next_sequence_; }

 private:
  struct Socket;  // the ZMQ context and PUB socket
  struct Replay;  // the ROUTER socket, its thread and the buffer
  std::unique_ptr<Socket> socket_;
  std::unique_ptr<Replay> replay_;  // null without a replay endpoint
  std::string topic_;
  uint64_t next_sequence_ = 0;
  KvEventBatcher batcher_;
};

}  // namespace loom
