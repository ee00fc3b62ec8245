// tests/support/test_depth.h — how much of a statistical sweep one test run covers.
//
// The sweeps (held-out seeds, mutation counts, recipe × mutation) cost about an hour of CPU
// in full. `scripts/test.sh` (CI's command) runs a rotating sample of each; `scripts/test.sh
// --long` (TPCHECK_TEST_LONG=1) runs all of it, and is what a change to the policies or the
// layers must pass before it lands (docs/TESTING.md).
//
// The sample rotates with TPCHECK_TEST_ROTATION (default: the UTC day number), taking
// consecutive blocks of the sweep, so consecutive days cover every element; each test prints
// the rotation it ran, and setting TPCHECK_TEST_ROTATION to it reruns the same sample.
// Thread safety: pure functions of the environment, read once at start-up.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace tpcheck::testing {

// TPCHECK_TEST_LONG=1: every element of every sweep.
inline bool long_run() {
  const char* v = std::getenv("TPCHECK_TEST_LONG");
  return v != nullptr && std::string(v) == "1";
}

// TPCHECK_TEST_ROTATION when set (a whole number), else days since 1970-01-01 UTC.
inline std::uint64_t rotation() {
  if (const char* v = std::getenv("TPCHECK_TEST_ROTATION"); v != nullptr && *v != '\0') {
    return std::strtoull(v, nullptr, 10);
  }
  using Days = std::chrono::duration<std::int64_t, std::ratio<86400>>;
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<Days>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

// `k` elements of `all` (every element in a long run, or when k >= all.size()): the block
// starting at (rotation() · k + salt) mod n, wrapping around. `salt` lets two sweeps of one
// binary start at different places on the same day.
template <typename T>
std::vector<T> rotating_sample(const std::vector<T>& all, std::size_t k, std::uint64_t salt = 0) {
  if (long_run() || k >= all.size()) return all;
  std::vector<T> out;
  const std::size_t n = all.size();
  const std::size_t start = static_cast<std::size_t>((rotation() * k + salt) % n);
  for (std::size_t i = 0; i < k; ++i) out.push_back(all[(start + i) % n]);
  return out;
}

}  // namespace tpcheck::testing
