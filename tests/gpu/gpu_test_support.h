// gpu_test_support.h — what the GPU tests share: skip without a GPU, fresh random
// tensors, norm-wise relative error in f64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tpcheck/device.h"
#include "tpcheck/rng.h"
#include "tpcheck/tensor.h"

namespace tpcheck::gpu_test {

// Skips the test (CI has no GPU) with the reason the runtime gives.
#define TPCHECK_REQUIRE_GPU()                                                   \
  do {                                                                          \
    const ::tpcheck::DeviceInfo info_ = ::tpcheck::query_devices();             \
    if (info_.cuda_devices == 0) GTEST_SKIP() << "no GPU: " << info_.description; \
  } while (0)

// N(0, 1) values generated from (seed, name, index), rounded to dtype, on the host.
inline Tensor random_host(std::uint64_t seed, const std::string& name, Shape shape, DType dtype,
                          double stddev = 1.0) {
  return generate(FillSpec::normal(0.0, stddev), seed, name, std::move(shape), dtype);
}

// ‖a − b‖₂ / ‖b‖₂ in f64 (any devices, any dtypes).
inline double norm_rel(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_f64(), y = b.to_f64();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace tpcheck::gpu_test
