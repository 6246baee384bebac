// Where and how the engine publishes its KV events (kv/kv_event_sink.h) for
// KV-aware routers: vLLM's --kv-events-config, as far as Loom has it (the CLI
// reads vLLM's JSON into this; cli/vllm_flags.h).
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct KvEventsConfig {
  bool enabled = false;  // vLLM: enable_kv_cache_events with publisher "zmq"
  // The ZMQ PUB socket's address. As vLLM: bound when it holds "*" or "::" or
  // is ipc:// or inproc:// (subscribers connect to the server: "tcp://*:5557"),
  // else connected (the server connects to a router that binds, as llm-d does).
  std::string endpoint = "tcp://*:5557";
  // The first frame of every message (subscribers filter on its prefix).
  std::string topic;
  // Messages ZMQ queues per subscriber before it drops new ones (vLLM's hwm):
  // a subscriber that does not keep up loses batches (a gap in the sequence
  // numbers), the engine never waits for it.
  int32_t send_high_water_mark = 100000;
  // vLLM's replay socket ("" = none): a ZMQ ROUTER bound here answers a
  // request for the batches from sequence number N on, out of the last
  // replay_buffer_batches published (vLLM's buffer_steps).
  std::string replay_endpoint;
  int32_t replay_buffer_batches = 10000;
};

}  // namespace loom
