// Portable deterministic PRNG: the same seed gives the same numbers on every
// machine and compiler (no std::distribution, whose output is unspecified).
// Used for random models (`loom make-model`) and sampling.
#pragma once

#include <cstdint>

namespace loom {

class Prng {
 public:
  explicit Prng(uint64_t seed) : state_(seed) {}

  // SplitMix64.
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1) with 24 random bits: exactly representable as float.
  float next_unit_float() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

  // Uniform in [-1, 1), exact in float arithmetic (no rounding differences across machines).
  float next_symmetric_float() { return next_unit_float() * 2.0f - 1.0f; }

  // Uniform integer in [0, bound).
  uint64_t next_below(uint64_t bound) { return next_u64() % bound; }

 private:
  uint64_t state_;
};

}  // namespace loom
