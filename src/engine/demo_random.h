// The demo model's deterministic random numbers: one stream of uniform values per (seed, tensor, row), the same on
// every machine (splitmix64). Shared by the language model's weights (demo_model.cpp) and the vision encoder's
// (demo_vision.cpp).
#pragma once

#include <cstdint>

namespace tern::demo {

inline uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A deterministic stream of uniform numbers in [-1, 1) for one (tensor, row).
class Uniform {
 public:
  Uniform(uint64_t seed, uint64_t tensor, uint64_t row) : state_(mix(mix(seed ^ mix(tensor)) ^ row)) {}
  float next() {
    state_ = mix(state_);
    return float(int64_t(state_ >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23);
  }

 private:
  uint64_t state_;
};

}  // namespace tern::demo
