// A fresh seed for each run of a randomised engine test, printed so that a failing run can be repeated.
#pragma once

#include <cstdint>
#include <cstdio>
#include <random>

namespace tern::testing {

inline uint64_t fresh_seed() {
  const uint64_t s = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(s));
  return s;
}

}  // namespace tern::testing
