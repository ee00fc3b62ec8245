// cuda_ops_test.cpp — the CUDA backend's own kernels (bias.cu, norm.cu, activation.cu,
// elementwise.cu) against the CPU backend, forward and backward, on the same random
// inputs (the project's counter-based RNG, several seeds, odd sizes: 37 rows, hidden
// 200, 101 and 4096, 1000 rows for multi-chunk column reductions), for f64, f32, f16 and
// bf16 storage; parameter-gradient accumulation; run-to-run bit reproducibility of the
// reductions; and the error messages for a CPU tensor and a bad shape.
//
// Needs a GPU: without one every test is skipped with the reason (CI has none). On the
// GPU machine: `ctest -L gpu` or run build/tests/cuda_ops_test directly.
//
// Bounds (norm-wise relative error ‖gpu − cpu‖₂ / ‖cpu‖₂, computed in f64):
//  * Ops that are one f32 (f64) operation per element followed by one rounding to the
//    storage dtype — add, accumulate, scale, add_bias, mse_loss_backward: both backends
//    perform the same correctly rounded IEEE operation and round once to nearest even,
//    so they agree bit for bit (checked with bitwise_equal). This also pins the
//    f32/f64 → f16/bf16 rounding of the kernels.
//  * f64 math (f64 inputs): 1e-12. The backends differ only in summation order (and FMA
//    contraction on the GPU); the worst-case recursive-summation error for the longest
//    sums here (n ≤ 4096 terms, u64 = 2^-53) is n·u64 ≈ 4.5e-13, and the typical one is
//    far smaller. mse_loss (always f64 math) uses the same bound for every storage dtype:
//    its ≤ 4.5e5 positive terms give a typical relative error of u64·√n/3 ≈ 3e-14.
//  * f32 math (f32, f16, bf16 storage): k·u32 (u32 = 2^-24), plus 2·u_s when the result
//    is stored narrower than f32 (u_s its unit roundoff: two f32 results a few u32 apart
//    may round to neighbouring storage values, one spacing being ≤ 2·u_s of the value).
//    k per op:
//      - activations, forward and backward: k = 128. A few f32 operations and one tanh or
//        exp (CUDA ≤ 2 ulp, glibc ≤ 1 ulp), FMA contraction, and the cancellation in
//        (1 − t²) and (1 − s) of the derivatives, which turns an absolute error of a few
//        u32 into at most |x|·(a few) units for the |x| ≤ ~8 of these inputs; the vector
//        norm is dominated by O(1) values.
//      - norm outputs (y, mean, rstd, dx) over rows of n: k = 2n + 32. The row sums (Σx,
//        Σ(x−μ)², Σg, Σg·x̂) are sequential on the CPU (error ≤ (n−1)·u32·Σ|terms|) and
//        trees on the GPU (≤ log2(n)·u32·Σ|terms|); each output moves by about that
//        relative amount at most.
//      - column sums over R rows (dbias, dgamma, dbeta): k = 2R + 32, the same argument
//        with R terms. (Terms of random sign cancel, so the worst case is larger by up to
//        √R, but the typical error grows like √R·u32 and the bound is ≥ 20× that.)
// Measured on an NVIDIA H200 (commit after 545437b, 2026-11-30): every test passes; the
// largest error/bound ratio per test (printed at its end) is ≤ 0.09 (mse_loss 8.8e-14
// relative; f32 column sums and norms ≤ 0.03 of their bounds; activations ≤ 0.008).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/device.h"
#include "tpcheck/error.h"
#include "tpcheck/rng.h"
#include "tpcheck/shard.h"

namespace tpcheck {
namespace {

constexpr DType kStorage[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16};
constexpr std::uint64_t kSeeds[] = {11, 12};
constexpr double kNormEps = 1e-5;

const double kU32 = dtype_unit_roundoff(DType::kF32);

DType math_of(DType storage) { return storage == DType::kF64 ? DType::kF64 : DType::kF32; }

// The bound for a result stored in `result` and computed in `math`, k as in the header.
double bound(DType result, DType math, double k) {
  double b = math == DType::kF64 ? 1e-12 : k * kU32;
  if (dtype_unit_roundoff(result) > dtype_unit_roundoff(math)) b += 2 * dtype_unit_roundoff(result);
  return b;
}

Tensor random(const Shape& shape, DType dtype, std::string_view name, std::uint64_t seed,
              double mean = 0.0, double std = 1.0) {
  return generate(FillSpec::normal(mean, std), seed, name, shape, dtype);
}

Tensor on_gpu(const Tensor& t) { return t.defined() ? t.to_device(Device::kCuda) : Tensor(); }

// ‖got − want‖₂ / ‖want‖₂ in f64; also checks that got is the GPU twin of want.
double rel_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.device(), Device::kCuda);
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.shape(), want.shape());
  if (got.shape() != want.shape()) return INFINITY;
  const std::vector<double> a = got.to_f64(), b = want.to_f64();
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-300);
}

// The largest error/bound ratio seen by the running test (printed when it ends, so a
// GPU run shows how much margin each bound has).
double g_worst_ratio = 0;
std::string g_worst_what;

::testing::AssertionResult within(double error, double limit, const std::string& what) {
  if (error / limit > g_worst_ratio) {
    g_worst_ratio = error / limit;
    g_worst_what = what;
  }
  if (error <= limit) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": error " << error << " > bound " << limit;
}

// True when got (on the GPU) holds exactly want's bits.
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want) {
  if (got.device() != Device::kCuda) return ::testing::AssertionFailure() << "not a GPU tensor";
  if (bitwise_equal(got.to_host(), want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << got.describe() << " differs from " << want.describe()
                                       << " (relative error " << rel_error(got, want) << ")";
}

std::string label(std::string_view what, const Shape& shape, DType dtype, std::uint64_t seed) {
  return std::string(what) + " " + std::string(dtype_name(dtype)) + shape_str(shape) + " seed " +
         std::to_string(seed);
}

// Runs f, which must throw Error(kInput) whose message contains `fragment`.
void expect_input_error(const std::function<void()>& f, std::string_view fragment) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one containing \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << fragment;
  }
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceInfo info = query_devices();
    if (info.cuda_devices == 0) {
      GTEST_SKIP() << "no GPU on this machine (" << info.description
                   << "); the CUDA kernels are tested on the GPU machine";
    }
    gpu_ = make_cuda_backend();
    cpu_ = make_cpu_backend();
    g_worst_ratio = 0;
    g_worst_what.clear();
  }
  void TearDown() override {
    if (g_worst_ratio > 0) {
      std::printf("  worst error/bound: %.3g (%s)\n", g_worst_ratio, g_worst_what.c_str());
    }
  }

  std::unique_ptr<Backend> gpu_, cpu_;
};

// ---- bias -------------------------------------------------------------------------------

TEST_F(CudaOps, AddBiasMatchesCpuBitForBit) {
  struct Case {
    DType y, bias;
  };
  std::vector<Case> cases;
  for (DType d : kStorage) cases.push_back({d, d});
  cases.push_back({DType::kF16, DType::kF32});   // f32 bias on f16 activations
  cases.push_back({DType::kBF16, DType::kF64});  // f64 bias rounds to f32 first
  cases.push_back({DType::kF32, DType::kF64});
  cases.push_back({DType::kF64, DType::kF16});
  for (const Case& c : cases) {
    for (const Shape& shape : {Shape{37, 200}, Shape{3, 37, 4096}, Shape{5, 1}}) {
      for (std::uint64_t seed : kSeeds) {
        const std::string what =
            label("add_bias", shape, c.y, seed) + " bias " + std::string(dtype_name(c.bias));
        Tensor y = random(shape, c.y, "y", seed, 0.0, 2.0);
        const Tensor bias = random({shape.back()}, c.bias, "bias", seed);
        Tensor y_gpu = on_gpu(y);
        gpu_->add_bias(y_gpu, on_gpu(bias));
        cpu_->add_bias(y, bias);
        EXPECT_TRUE(same_bits(y_gpu, y)) << what;
      }
    }
  }
}

TEST_F(CudaOps, BiasGradMatchesCpuAndAccumulates) {
  struct Case {
    DType dy, dbias;
  };
  std::vector<Case> cases;
  for (DType d : kStorage) cases.push_back({d, d});
  cases.push_back({DType::kBF16, DType::kF32});  // f32 grads of bf16 activations
  cases.push_back({DType::kF32, DType::kF64});   // f32 sums, added in f64
  cases.push_back({DType::kF64, DType::kF32});   // f64 sums, rounded into f32
  // 37 rows (one chunk), 1000 rows (four chunks of 256), a rank-3 view.
  for (const Case& c : cases) {
    for (const Shape& shape : {Shape{37, 200}, Shape{37, 4096}, Shape{10, 100, 101}}) {
      for (std::uint64_t seed : kSeeds) {
        const std::string what = label("accumulate_bias_grad", shape, c.dy, seed) + " dbias " +
                                 std::string(dtype_name(c.dbias));
        const std::int64_t n = shape.back(), rows = shape_numel(shape) / n;
        const Tensor dy = random(shape, c.dy, "dy", seed);
        Tensor dbias = random({n}, c.dbias, "dbias0", seed);  // accumulates onto this
        Tensor dbias_gpu = on_gpu(dbias);
        gpu_->accumulate_bias_grad(on_gpu(dy), dbias_gpu);
        cpu_->accumulate_bias_grad(dy, dbias);
        EXPECT_TRUE(within(rel_error(dbias_gpu, dbias),
                           bound(c.dbias, math_of(c.dy), 2.0 * rows + 32), what));
      }
    }
  }
}

// ---- norms ------------------------------------------------------------------------------

struct NormInputs {
  Tensor x, gamma, beta, dy, dgamma, dbeta;
};

// x with a non-zero mean; gamma around 1 (around 0 when zero-centered); non-zero starting
// dgamma/dbeta (the backward accumulates onto them). Parameters in `param` dtype.
NormInputs norm_inputs(NormKind kind, const Shape& shape, DType dtype, DType param, bool zc,
                       std::uint64_t seed) {
  const std::int64_t n = shape.back();
  NormInputs in;
  in.x = random(shape, dtype, "x", seed, 0.3, 1.5);
  in.gamma = random({n}, param, "gamma", seed, zc ? 0.0 : 1.0, 0.3);
  in.dy = random(shape, dtype, "dy", seed);
  in.dgamma = random({n}, param, "dgamma0", seed, 0.0, 2.0);
  if (kind == NormKind::kLayerNorm) {
    in.beta = random({n}, param, "beta", seed, 0.0, 0.5);
    in.dbeta = random({n}, param, "dbeta0", seed, 0.0, 2.0);
  }
  return in;
}

TEST_F(CudaOps, NormForwardAndBackwardMatchCpu) {
  for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRMSNorm}) {
    for (bool zc : {false, true}) {
      for (DType dtype : kStorage) {
        std::vector<DType> params = {dtype};
        if (dtype == DType::kF16 || dtype == DType::kBF16) params.push_back(DType::kF32);
        for (DType param : params) {
          // norm.cu's held rows: 200 and 4096 (one and two 16-byte vectors a thread),
          // 12288 (four for 2-byte types); the element loop: 101 (odd), f64, f32 params
          // next to f16/bf16 x.
          for (const Shape& shape :
               {Shape{37, 200}, Shape{37, 4096}, Shape{5, 12288}, Shape{4, 250, 101}}) {
            for (std::uint64_t seed : kSeeds) {
              const std::string what = label(norm_kind_name(kind), shape, dtype, seed) +
                                       (zc ? " zero_centered" : "") + " params " +
                                       std::string(dtype_name(param));
              const std::int64_t n = shape.back(), rows = shape_numel(shape) / n;
              const DType math = math_of(dtype);
              NormInputs in = norm_inputs(kind, shape, dtype, param, zc, seed);
              const bool ln = kind == NormKind::kLayerNorm;

              // Forward.
              const NormForward want =
                  cpu_->norm_forward(kind, in.x, in.gamma, in.beta, kNormEps, zc);
              const NormForward got = gpu_->norm_forward(kind, on_gpu(in.x), on_gpu(in.gamma),
                                                         on_gpu(in.beta), kNormEps, zc);
              const double k_row = 2.0 * n + 32;
              EXPECT_TRUE(within(rel_error(got.y, want.y), bound(dtype, math, k_row), what + " y"));
              EXPECT_TRUE(
                  within(rel_error(got.rstd, want.rstd), bound(math, math, k_row), what + " rstd"));
              EXPECT_EQ(got.mean.defined(), ln) << what;
              if (ln) {
                EXPECT_TRUE(within(rel_error(got.mean, want.mean), bound(math, math, k_row),
                                   what + " mean"));
              }

              // Backward, on the same saved statistics (the CPU's, copied to the GPU).
              NormForward saved_gpu;
              saved_gpu.y = got.y;
              saved_gpu.mean = on_gpu(want.mean);
              saved_gpu.rstd = on_gpu(want.rstd);
              Tensor dgamma_gpu = on_gpu(in.dgamma), dbeta_gpu = on_gpu(in.dbeta);
              const Tensor dx_gpu =
                  gpu_->norm_backward(kind, on_gpu(in.dy), on_gpu(in.x), on_gpu(in.gamma),
                                      saved_gpu, zc, dgamma_gpu, dbeta_gpu);
              const Tensor dx =
                  cpu_->norm_backward(kind, in.dy, in.x, in.gamma, want, zc, in.dgamma, in.dbeta);
              EXPECT_TRUE(within(rel_error(dx_gpu, dx), bound(dtype, math, k_row), what + " dx"));
              const double k_col = 2.0 * rows + 32;
              EXPECT_TRUE(within(rel_error(dgamma_gpu, in.dgamma), bound(param, math, k_col),
                                 what + " dgamma"));
              if (ln) {
                EXPECT_TRUE(within(rel_error(dbeta_gpu, in.dbeta), bound(param, math, k_col),
                                   what + " dbeta"));
              }
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaOps, NormParameterGradientsAccumulate) {
  // Two backward calls onto a non-zero start equal the CPU's two calls, and differ from
  // one call (they add, they do not overwrite). dbeta may be undefined (then ignored).
  const Shape shape{37, 200};
  for (DType dtype : {DType::kF64, DType::kF32}) {
    NormInputs in = norm_inputs(NormKind::kLayerNorm, shape, dtype, dtype, false, 5);
    const NormForward f =
        cpu_->norm_forward(NormKind::kLayerNorm, in.x, in.gamma, in.beta, kNormEps, false);
    NormForward f_gpu;
    f_gpu.mean = on_gpu(f.mean);
    f_gpu.rstd = on_gpu(f.rstd);
    Tensor dgamma_gpu = on_gpu(in.dgamma), dbeta_gpu = on_gpu(in.dbeta);
    Tensor no_dbeta;
    gpu_->norm_backward(NormKind::kLayerNorm, on_gpu(in.dy), on_gpu(in.x), on_gpu(in.gamma), f_gpu,
                        false, dgamma_gpu, dbeta_gpu);
    const Tensor once = dgamma_gpu.to_host();
    gpu_->norm_backward(NormKind::kLayerNorm, on_gpu(in.dy), on_gpu(in.x), on_gpu(in.gamma), f_gpu,
                        false, dgamma_gpu, no_dbeta);
    for (int i = 0; i < 2; ++i) {
      cpu_->norm_backward(NormKind::kLayerNorm, in.dy, in.x, in.gamma, f, false, in.dgamma,
                          i == 0 ? in.dbeta : no_dbeta);
    }
    const double b = bound(dtype, math_of(dtype), 2.0 * 37 + 32);
    const std::string what(dtype_name(dtype));
    EXPECT_TRUE(within(rel_error(dgamma_gpu, in.dgamma), b, what + " dgamma"));
    EXPECT_TRUE(within(rel_error(dbeta_gpu, in.dbeta), b, what + " dbeta"));  // added once only
    EXPECT_GT(rel_error(dgamma_gpu, once), 1e-3) << "the second call did not accumulate";
  }
}

// ---- activations ------------------------------------------------------------------------

TEST_F(CudaOps, ActivationsMatchCpu) {
  for (Activation act : {Activation::kGelu, Activation::kRelu, Activation::kSrelu,
                         Activation::kQgelu, Activation::kGeglu, Activation::kSwiglu}) {
    for (DType dtype : kStorage) {
      // 202 = 2·101: odd n for the gated ones; 4096 a production width.
      for (const Shape& shape : {Shape{37, 202}, Shape{3, 37, 4096}}) {
        for (std::uint64_t seed : kSeeds) {
          const std::string what = label(activation_name(act), shape, dtype, seed);
          const DType math = math_of(dtype);
          const Tensor x = random(shape, dtype, "x", seed, 0.0, 2.0);
          Shape out_shape = shape;
          if (is_gated(act)) out_shape.back() /= 2;
          const Tensor dy = random(out_shape, dtype, "dy", seed);
          const Tensor y_gpu = gpu_->activation_forward(act, on_gpu(x));
          const Tensor y = cpu_->activation_forward(act, x);
          EXPECT_TRUE(within(rel_error(y_gpu, y), bound(dtype, math, 128), what + " forward"));
          const Tensor dx_gpu = gpu_->activation_backward(act, on_gpu(dy), on_gpu(x));
          const Tensor dx = cpu_->activation_backward(act, dy, x);
          EXPECT_TRUE(within(rel_error(dx_gpu, dx), bound(dtype, math, 128), what + " backward"));
        }
      }
    }
    // dy of another dtype than x (read as x's math type, like the CPU).
    const Shape shape{37, 202};
    const Tensor x = random(shape, DType::kBF16, "x", 3, 0.0, 2.0);
    Shape out_shape = shape;
    if (is_gated(act)) out_shape.back() /= 2;
    const Tensor dy = random(out_shape, DType::kF32, "dy", 3);
    EXPECT_TRUE(within(rel_error(gpu_->activation_backward(act, on_gpu(dy), on_gpu(x)),
                                 cpu_->activation_backward(act, dy, x)),
                       bound(DType::kBF16, DType::kF32, 128),
                       std::string(activation_name(act)) + " f32 dy, bf16 x"));
  }
}

// ---- elementwise ------------------------------------------------------------------------

TEST_F(CudaOps, ElementwiseOpsMatchCpu) {
  struct Case {
    DType a, b;
  };
  std::vector<Case> cases;
  for (DType d : kStorage) cases.push_back({d, d});
  cases.push_back({DType::kF32, DType::kF64});   // f64 math, rounded to f32
  cases.push_back({DType::kF16, DType::kF32});   // f32 math
  cases.push_back({DType::kBF16, DType::kF64});  // f64 math, one rounding to bf16
  cases.push_back({DType::kF64, DType::kBF16});
  for (const Case& c : cases) {
    for (const Shape& shape : {Shape{37, 200}, Shape{3, 37, 4096}, Shape{1}}) {
      for (std::uint64_t seed : kSeeds) {
        const std::string what =
            label("elementwise", shape, c.a, seed) + " and " + std::string(dtype_name(c.b));
        const Tensor a = random(shape, c.a, "a", seed);
        const Tensor b = random(shape, c.b, "b", seed, 0.5, 1.0);
        const Tensor a_gpu = on_gpu(a), b_gpu = on_gpu(b);

        EXPECT_TRUE(same_bits(gpu_->add(a_gpu, b_gpu), cpu_->add(a, b))) << what << " add";

        Tensor into = a.clone();
        Tensor into_gpu = on_gpu(a);
        gpu_->accumulate(into_gpu, b_gpu);
        cpu_->accumulate(into, b);
        EXPECT_TRUE(same_bits(into_gpu, into)) << what << " accumulate";

        for (double s : {0.37, -3.0, 1.0 / 3.0}) {
          EXPECT_TRUE(same_bits(gpu_->scale(a_gpu, s), cpu_->scale(a, s)))
              << what << " scale " << s;
        }

        // mse: y = a, target = b (any dtype). The loss is f64 math whatever the storage.
        const double loss_gpu = gpu_->mse_loss(a_gpu, b_gpu);
        const double loss = cpu_->mse_loss(a, b);
        EXPECT_TRUE(within(std::abs(loss_gpu - loss) / std::abs(loss), 1e-12, what + " mse_loss"));
        EXPECT_TRUE(same_bits(gpu_->mse_loss_backward(a_gpu, b_gpu), cpu_->mse_loss_backward(a, b)))
            << what << " mse_loss_backward";
      }
    }
  }
}

// ---- shards --------------------------------------------------------------------------------

// take_shard and assemble_shards on GPU tensors stay on the GPU and move the host twins'
// bits (the runner shards the loss gradient where it was computed: on the GPU since
// a158a3f, which take_shard did not handle until then).
TEST_F(CudaOps, ShardsOfGpuTensorsStayOnTheGpu) {
  const Shape shape{6, 8, 12};
  const ShardSpec specs[] = {ShardSpec::replicated(), ShardSpec::along(0), ShardSpec::along(1),
                             ShardSpec::along(2, {4, 4, 4})};
  for (DType dtype : kStorage) {
    const Tensor global = random(shape, dtype, "global", 11);
    const Tensor global_gpu = on_gpu(global);
    for (const ShardSpec& spec : specs) {
      std::vector<Tensor> shards_gpu;
      for (int rank = 0; rank < 2; ++rank) {
        const Tensor shard_gpu = take_shard(global_gpu, spec, rank, 2);
        EXPECT_TRUE(same_bits(shard_gpu, take_shard(global, spec, rank, 2)))
            << dtype_name(dtype) << " dim " << spec.dim << " rank " << rank;
        shards_gpu.push_back(shard_gpu);
      }
      EXPECT_TRUE(same_bits(assemble_shards(shards_gpu, spec), global))
          << dtype_name(dtype) << " dim " << spec.dim << " assembled";
    }
  }
}

// ---- reproducibility --------------------------------------------------------------------

TEST_F(CudaOps, ReductionsAreBitReproducible) {
  // Many row chunks (2000 rows = 8 chunks) and a production width: every reduction runs
  // twice on the same inputs and must give the same bits.
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
    const Shape shape{2000, 1024};
    const std::int64_t n = shape.back();
    const Tensor x = on_gpu(random(shape, dtype, "x", 21, 0.3, 1.5));
    const Tensor dy = on_gpu(random(shape, dtype, "dy", 21));
    const Tensor gamma = on_gpu(random({n}, dtype, "gamma", 21, 1.0, 0.3));
    const Tensor beta = on_gpu(random({n}, dtype, "beta", 21));
    const Tensor start = on_gpu(random({n}, dtype, "start", 21));

    Tensor db1 = start.clone(), db2 = start.clone();
    gpu_->accumulate_bias_grad(dy, db1);
    gpu_->accumulate_bias_grad(dy, db2);
    EXPECT_TRUE(same_bits(db1, db2.to_host())) << dtype_name(dtype) << " bias grad";

    for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRMSNorm}) {
      const std::string what =
          std::string(norm_kind_name(kind)) + " " + std::string(dtype_name(dtype));
      const NormForward f1 = gpu_->norm_forward(kind, x, gamma, beta, kNormEps, false);
      const NormForward f2 = gpu_->norm_forward(kind, x, gamma, beta, kNormEps, false);
      EXPECT_TRUE(same_bits(f1.y, f2.y.to_host())) << what << " y";
      EXPECT_TRUE(same_bits(f1.rstd, f2.rstd.to_host())) << what << " rstd";
      Tensor dg1 = start.clone(), dg2 = start.clone(), dbeta1 = start.clone(),
             dbeta2 = start.clone();
      const Tensor dx1 = gpu_->norm_backward(kind, dy, x, gamma, f1, false, dg1, dbeta1);
      const Tensor dx2 = gpu_->norm_backward(kind, dy, x, gamma, f1, false, dg2, dbeta2);
      EXPECT_TRUE(same_bits(dx1, dx2.to_host())) << what << " dx";
      EXPECT_TRUE(same_bits(dg1, dg2.to_host())) << what << " dgamma";
      EXPECT_TRUE(same_bits(dbeta1, dbeta2.to_host())) << what << " dbeta";
    }

    const double l1 = gpu_->mse_loss(x, dy), l2 = gpu_->mse_loss(x, dy);
    EXPECT_EQ(l1, l2) << dtype_name(dtype) << " mse_loss";
  }
}

// ---- throughput (not a check; run with --gtest_also_run_disabled_tests) ----------------

TEST_F(CudaOps, DISABLED_Throughput) {
  // Production size: 16384 tokens × hidden 8192 (1.3e8 elements), bf16. Effective
  // bandwidth counts the bytes an op must move at least (inputs read once, outputs
  // written once); allocation of the outputs (zero-filled) is included in the time.
  // Measured on an H200 (bf16, per call): add_bias 0.41 ms, accumulate_bias_grad 0.11 ms,
  // layernorm forward 0.58 ms / backward 1.15 ms, rmsnorm forward 0.44 ms, gelu forward
  // 0.46 ms / backward 0.53 ms, swiglu forward 0.75 ms / backward 0.92 ms, add 0.49 ms,
  // accumulate 0.43 ms, mse_loss 0.28 ms (0.7–2.5 TB/s effective).
  const Shape shape{16384, 8192};
  const std::int64_t n = shape.back();
  const DType dtype = DType::kBF16;
  const double bytes = static_cast<double>(shape_numel(shape)) * dtype_size(dtype);
  const Tensor x = on_gpu(random(shape, dtype, "x", 1)), dy = on_gpu(random(shape, dtype, "dy", 1));
  const Tensor gamma = on_gpu(random({n}, dtype, "g", 1, 1.0, 0.3)),
               beta = on_gpu(random({n}, dtype, "b", 1));
  Tensor dgamma = on_gpu(random({n}, dtype, "dg", 1)), dbeta = dgamma.clone();
  const Tensor x2 = on_gpu(random({16384, 2 * 8192}, dtype, "x2", 1));
  NormForward f;
  auto time = [&](const char* what, double moved, const std::function<void()>& op) {
    op();
    gpu_->synchronize();
    constexpr int kReps = 5;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i) op();
    gpu_->synchronize();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kReps;
    std::printf("  %-28s %8.3f ms  %7.0f GB/s\n", what, s * 1e3, moved / s / 1e9);
  };
  Tensor y = x.clone();
  time("add_bias", 2 * bytes, [&] { gpu_->add_bias(y, beta); });
  time("accumulate_bias_grad", bytes, [&] { gpu_->accumulate_bias_grad(dy, dbeta); });
  time("layernorm forward", 2 * bytes,
       [&] { f = gpu_->norm_forward(NormKind::kLayerNorm, x, gamma, beta, 1e-5, false); });
  time("layernorm backward", 3 * bytes,
       [&] { gpu_->norm_backward(NormKind::kLayerNorm, dy, x, gamma, f, false, dgamma, dbeta); });
  time("rmsnorm forward", 2 * bytes,
       [&] { f = gpu_->norm_forward(NormKind::kRMSNorm, x, gamma, Tensor(), 1e-5, false); });
  time("gelu forward", 2 * bytes, [&] { gpu_->activation_forward(Activation::kGelu, x); });
  time("gelu backward", 3 * bytes, [&] { gpu_->activation_backward(Activation::kGelu, dy, x); });
  time("swiglu forward", 3 * bytes, [&] { gpu_->activation_forward(Activation::kSwiglu, x2); });
  time("swiglu backward", 5 * bytes,
       [&] { gpu_->activation_backward(Activation::kSwiglu, dy, x2); });
  time("add", 3 * bytes, [&] { gpu_->add(x, dy); });
  time("accumulate", 3 * bytes, [&] { gpu_->accumulate(y, dy); });
  time("mse_loss", 2 * bytes, [&] { gpu_->mse_loss(x, dy); });
}

// ---- bad input --------------------------------------------------------------------------

TEST_F(CudaOps, RejectsCpuTensorsAndBadShapes) {
  const Tensor x_cpu = random({4, 8}, DType::kF32, "x", 1);
  const Tensor v_cpu = random({8}, DType::kF32, "v", 1);
  const Tensor x = on_gpu(x_cpu), v = on_gpu(v_cpu);
  const Tensor v_bad = on_gpu(random({9}, DType::kF32, "v9", 1));
  const std::string host = "the CUDA backend was given";

  // A CPU tensor, as either operand.
  expect_input_error(
      [&] {
        Tensor y = x_cpu.clone();
        gpu_->add_bias(y, v);
      },
      host);
  expect_input_error(
      [&] {
        Tensor y = x.clone();
        gpu_->add_bias(y, v_cpu);
      },
      host);
  expect_input_error(
      [&] {
        Tensor d = v.clone();
        gpu_->accumulate_bias_grad(x_cpu, d);
      },
      host);
  expect_input_error(
      [&] { gpu_->norm_forward(NormKind::kLayerNorm, x_cpu, v, v, kNormEps, false); }, host);
  expect_input_error(
      [&] { gpu_->norm_forward(NormKind::kRMSNorm, x, v_cpu, Tensor(), kNormEps, false); }, host);
  expect_input_error([&] { gpu_->activation_forward(Activation::kGelu, x_cpu); }, host);
  expect_input_error([&] { gpu_->activation_backward(Activation::kRelu, x_cpu, x); }, host);
  expect_input_error([&] { gpu_->add(x, x_cpu); }, host);
  expect_input_error(
      [&] {
        Tensor t = x.clone();
        gpu_->accumulate(t, x_cpu);
      },
      host);
  expect_input_error([&] { gpu_->scale(x_cpu, 2.0); }, host);
  expect_input_error([&] { gpu_->mse_loss(x_cpu, x); }, host);
  expect_input_error([&] { gpu_->mse_loss_backward(x, x_cpu); }, host);

  // Bad shapes, with the CPU backend's messages.
  expect_input_error(
      [&] {
        Tensor y = x.clone();
        gpu_->add_bias(y, v_bad);
      },
      "expected a bias of shape [8]");
  expect_input_error(
      [&] {
        Tensor d = v_bad.clone();
        gpu_->accumulate_bias_grad(x, d);
      },
      "expected a bias of shape [8]");
  expect_input_error(
      [&] { gpu_->norm_forward(NormKind::kLayerNorm, x, v_bad, v, kNormEps, false); },
      "expected gamma of shape [8]");
  expect_input_error(
      [&] {
        const NormForward f =
            gpu_->norm_forward(NormKind::kRMSNorm, x, v, Tensor(), kNormEps, false);
        Tensor dg = v.clone(), db;
        gpu_->norm_backward(NormKind::kRMSNorm, on_gpu(random({4, 9}, DType::kF32, "dy", 1)), x, v,
                            f, false, dg, db);
      },
      "expected the same shape");
  expect_input_error(
      [&] {
        gpu_->activation_forward(Activation::kSwiglu, on_gpu(random({4, 7}, DType::kF32, "x", 1)));
      },
      "must be even");
  expect_input_error([&] { gpu_->activation_backward(Activation::kGeglu, x, x); },
                     "dy must have the output's shape [4, 4]");
  expect_input_error(
      [&] {
        gpu_->add(x, on_gpu(random({8, 4}, DType::kF32, "y", 1)));
      },
      "shapes differ");
  expect_input_error([&] { gpu_->mse_loss(x, v); }, "shapes differ");
  // A dtype the kernels do not take.
  expect_input_error([&] { gpu_->scale(x.to(DType::kF8E4M3), 2.0); }, "f8e4m3");
}

}  // namespace
}  // namespace tpcheck
