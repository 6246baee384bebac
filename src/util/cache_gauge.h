// The size of one bounded cache on the serving path, as /metrics reports it
// (loom_cache_entries / loom_cache_capacity / loom_cache_bytes /
// loom_cache_evictions_total, label cache="NAME"). Every cache whose keys come
// from request content or batch shapes has a documented entry limit and evicts
// past it; reporting it makes growth visible before it hurts.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct CacheGauge {
  std::string name;        // e.g. "cuda_graphs", "grammars": a Prometheus label value
  int64_t entries = 0;     // held now
  int64_t capacity = 0;    // the most it holds (entries)
  int64_t bytes = -1;      // host bytes held now, where known (-1: not known, not exported)
  int64_t evictions = 0;   // entries dropped to stay within capacity, since start
};

}  // namespace loom
