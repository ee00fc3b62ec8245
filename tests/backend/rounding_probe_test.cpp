// rounding_probe_test.cpp — BackendWrapper's hook and the rounding probe built on it
// (make_rounding_probe_backend).
//
// The hook: every op a wrapper forwards reaches before_op and after_op once, in pairs,
// with the op's outputs in the order the target stores them (Backend::store_order); a
// layout copy is marked as such; the fusions reach the hook as their parts unless the
// wrapper forwards them whole.
// The probe: every f64 tensor an op writes moves by a relative amount below u, differently
// per element, reproducibly, each value by the factor of its position in the stream of
// stored values; other dtypes and layout copies are untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/random_math.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"
#include "tpcheck/rng.h"

namespace tpcheck {
namespace {

constexpr double kU = 0x1p-30;

Tensor normal(Shape shape, const char* name, DType dtype = DType::kF64) {
  return generate(FillSpec::normal(0, 1), 1, name, std::move(shape), dtype);
}

// ---- the hook ----------------------------------------------------------------------------

// Logs every hook call: "op" for before_op, "op: out1 out2 ..." for after_op ("~" marks a
// copy), and checks that they pair up.
class HookLog final : public BackendWrapper {
 public:
  explicit HookLog(Backend& target, Fusions fusions = Fusions::kCompose)
      : BackendWrapper(target, fusions) {}
  std::vector<std::string> calls;  // after_op lines, in order
  std::set<Op> seen;

 protected:
  void before_op(const OpCall& call) override {
    EXPECT_FALSE(in_op_) << "before_op of " << op_name(call.op) << " inside another op";
    EXPECT_TRUE(call.outputs.empty());
    in_op_ = true;
  }
  void after_op(const OpCall& call) override {
    EXPECT_TRUE(in_op_) << "after_op of " << op_name(call.op) << " without before_op";
    in_op_ = false;
    std::string line(op_name(call.op));
    line += ":";
    for (const OpOutput& out : call.outputs) {
      EXPECT_TRUE(out.tensor->defined());
      line += " " + std::string(out.computed ? "" : "~") + std::string(out.name);
    }
    if (call.op == Op::kGemm) line += " @" + std::string(call.site);
    calls.push_back(line);
    seen.insert(call.op);
  }

 private:
  bool in_op_ = false;
};

// Reports the CUDA backend's store order over any target.
class CudaStoreOrder final : public BackendWrapper {
 public:
  explicit CudaStoreOrder(Backend& target) : BackendWrapper(target) {}
  StoreOrder store_order() const override { return {}; }
};

Tensor quantized(Shape shape, QuantRole role) {
  Tensor t = normal(std::move(shape), "q", DType::kF32);
  QuantizeOptions o;
  o.recipe = Recipe::kFp8Current;
  o.role = role;
  t.set_quantized(quantize(t, o));
  return t;
}

TEST(BackendWrapperHook, SeesEveryOpWithTheOutputsItWrote) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  HookLog log(*cpu);
  const Tensor x = normal({8, 16}, "x"), w = normal({12, 16}, "w"), b = normal({12}, "b");
  const Tensor gamma = normal({16}, "gamma"), beta = normal({16}, "beta");
  Tensor y({8, 12}, DType::kF64), aux({8, 12}, DType::kF64);
  Tensor db = Tensor::zeros({12}, DType::kF64);
  Tensor dgamma = Tensor::zeros({16}, DType::kF64), dbeta = Tensor::zeros({16}, DType::kF64);
  GemmEpilogue gelu;
  gelu.bias = &b;
  gelu.activation = GemmEpilogue::Activation::kGelu;
  gelu.aux = &aux;
  log.gemm("fc/fwd", x, false, w, true, y, false, gelu);
  log.add_bias(y, b);
  log.accumulate_bias_grad(y, db);
  const NormForward ln = log.norm_forward(NormKind::kLayerNorm, x, gamma, beta, 1e-5, false);
  log.norm_backward(NormKind::kLayerNorm, x, x, gamma, ln, false, dgamma, dbeta);
  const NormForward rms = log.norm_forward(NormKind::kRMSNorm, x, gamma, Tensor(), 1e-5, false);
  Tensor no_dbeta;
  log.norm_backward(NormKind::kRMSNorm, x, x, gamma, rms, false, dgamma, no_dbeta);
  const Tensor a = log.activation_forward(Activation::kSwiglu, x);
  log.activation_backward(Activation::kSwiglu, a, x);
  log.add(x, x);
  Tensor acc = x.clone();
  log.accumulate(acc, x);
  log.scale(x, 2.0);
  log.mse_loss(x, x);
  log.mse_loss_backward(x, x);
  Tensor qy({16, 16}, DType::kF32);
  log.gemm_quantized("fc/fp8", quantized({16, 32}, QuantRole::kInput), false,
                     quantized({16, 32}, QuantRole::kWeight), true, qy, false);
  QuantizeOptions qo;
  qo.recipe = Recipe::kFp8Current;
  log.quantize(normal({16, 32}, "xq", DType::kF32), qo, "x");
  const std::vector<std::string> want = {
      // The CPU's store order: the gelu aux before C, dgamma and dbeta before dx.
      "gemm: aux c @fc/fwd",
      "add_bias: y",
      "accumulate_bias_grad: dbias",
      "norm_forward: y mean rstd",
      "norm_backward: dgamma dbeta dx",
      "norm_forward: y rstd",      // RMSNorm: no mean
      "norm_backward: dgamma dx",  // nor a dbeta
      "activation_forward: y",
      "activation_backward: dx",
      "add: sum",
      "accumulate: into",
      "scale: y",
      "mse_loss:",
      "mse_loss_backward: dy",
      "gemm_quantized: c",
      "quantize:",
  };
  EXPECT_EQ(log.calls, want);
}

TEST(BackendWrapperHook, FollowsTheTargetsStoreOrder) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  CudaStoreOrder cuda_order(*cpu);
  HookLog log(cuda_order);
  const Tensor x = normal({8, 16}, "x"), gamma = normal({16}, "gamma");
  const Tensor beta = normal({16}, "beta"), w = normal({12, 16}, "w");
  Tensor dgamma = Tensor::zeros({16}, DType::kF64), dbeta = Tensor::zeros({16}, DType::kF64);
  Tensor y({8, 12}, DType::kF64), aux({8, 12}, DType::kF64);
  GemmEpilogue gelu;
  gelu.activation = GemmEpilogue::Activation::kGelu;
  gelu.aux = &aux;
  log.gemm("fc/fwd", x, false, w, true, y, false, gelu);
  const NormForward ln = log.norm_forward(NormKind::kLayerNorm, x, gamma, beta, 1e-5, false);
  log.norm_backward(NormKind::kLayerNorm, x, x, gamma, ln, false, dgamma, dbeta);
  EXPECT_EQ(log.calls, (std::vector<std::string>{"gemm: c aux @fc/fwd", "norm_forward: y mean rstd",
                                                 "norm_backward: dx dgamma dbeta"}));
}

TEST(BackendWrapperHook, SeesAttentionAsItsPrimitivesAndProducts) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  HookLog log(*cpu);
  // s 4, b 2, 4 query heads, 2 key/value groups, d 8.
  const Tensor q = normal({4, 2, 4, 8}, "q"), k = normal({4, 2, 2, 8}, "k");
  const Tensor v = normal({4, 2, 2, 8}, "v");
  const AttentionMask mask;
  const AttentionForward fwd = log.attention_forward(q, k, v, mask, 0.25);
  log.attention_backward(normal({4, 2, 4, 8}, "dout"), q, k, v, fwd, mask, 0.25);
  // The fused engine is asked first (the CPU does not fuse); "~": a layout copy.
  const std::vector<std::string> want = {
      "fused_attention_forward:",  "attention_heads_in: ~out", "attention_heads_in: ~out",
      "attention_heads_in: ~out",  "gemm: c @attn.scores/fwd", "attention_softmax_forward: probs",
      "gemm: c @attn.context/fwd", "attention_heads_out: out",
  };
  ASSERT_GE(log.calls.size(), want.size());
  EXPECT_EQ(std::vector<std::string>(log.calls.begin(), log.calls.begin() + want.size()), want);
  for (Op op : {Op::kAttentionSoftmaxBackward, Op::kAttentionHeadsOut, Op::kGemm}) {
    EXPECT_TRUE(log.seen.count(op)) << op_name(op);
  }
  EXPECT_FALSE(log.seen.count(Op::kFusedAttentionBackward));  // the forward did not fuse
}

TEST(BackendWrapperHook, FusionsAreComposedOrForwardedWhole) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  const Tensor h = normal({8, 16}, "h"), bias = normal({16}, "bias"), r = normal({8, 16}, "r");
  Tensor dbias = Tensor::zeros({16}, DType::kF64);
  HookLog composed(*cpu);
  composed.bias_gelu_forward(h, bias);
  composed.bias_gelu_backward(h, h, bias, dbias);
  composed.bias_residual_add(h, bias, r);
  EXPECT_EQ(composed.calls,
            (std::vector<std::string>{"add_bias: y", "activation_forward: y", "add_bias: y",
                                      "activation_backward: dx", "accumulate_bias_grad: dbias",
                                      "add_bias: y", "accumulate: into"}));
  HookLog whole(*cpu, BackendWrapper::Fusions::kForward);
  whole.bias_gelu_forward(h, bias);
  whole.bias_gelu_backward(h, h, bias, dbias);
  whole.bias_residual_add(h, bias, r);
  EXPECT_EQ(whole.calls,
            (std::vector<std::string>{"bias_gelu_forward: y", "bias_gelu_backward: dh dbias",
                                      "bias_residual_add: y"}));
}

TEST(BackendWrapperHook, AnEmptyBiasGradientWritesNothing) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  HookLog log(*cpu);
  Tensor dbias = Tensor::zeros({16}, DType::kF64);
  log.accumulate_bias_grad(Tensor({0, 16}, DType::kF64), dbias);
  EXPECT_EQ(log.calls, (std::vector<std::string>{"accumulate_bias_grad:"}));
}

// ---- the rounding probe ------------------------------------------------------------------

// Checks that `probed` is `plain` times (1 + δ), |δ| ≤ u, with δ ≠ 0 for most elements.
void expect_perturbed(const Tensor& probed, const Tensor& plain, const char* what) {
  const std::vector<double> p = probed.to_f64(), q = plain.to_f64();
  ASSERT_EQ(p.size(), q.size()) << what;
  int moved = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (q[i] == 0) continue;
    const double rel = std::abs(p[i] / q[i] - 1);
    EXPECT_LE(rel, kU * (1 + 1e-6)) << what << " element " << i;
    moved += rel > 0;
  }
  EXPECT_GT(moved, static_cast<int>(p.size()) / 2) << what << ": the probe moved too few";
}

// Checks that `probed` is exactly `plain` times the probe's factors for stream positions
// first, first + 1, ... (seed 5).
void expect_stream(const Tensor& probed, const Tensor& plain, std::uint64_t first,
                   const char* what) {
  const std::vector<double> p = probed.to_f64(), q = plain.to_f64();
  ASSERT_EQ(p.size(), q.size()) << what;
  for (std::size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(p[i], q[i] * random_math::probe_factor(kU, 5, first + i))
        << what << " element " << i << " (stream position " << first + i << ")";
  }
}

TEST(RoundingProbeBackend, PerturbsEveryF64OutputByLessThanU) {
  auto probed = make_rounding_probe_backend(make_cpu_backend(), kU, 5);
  auto plain = make_cpu_backend();
  const Tensor a = normal({16, 24}, "a");
  const Tensor b = normal({24, 8}, "b");
  Tensor c1({16, 8}, DType::kF64), c2({16, 8}, DType::kF64);
  probed->gemm("t", a, false, b, false, c1, false);
  plain->gemm("t", a, false, b, false, c2, false);
  expect_perturbed(c1, c2, "gemm");
  EXPECT_EQ(probed->ledger().records().size(), 1u);  // still one ledger record

  const Tensor gamma = generate(FillSpec::normal(1, 0.1), 1, "g", {24}, DType::kF64);
  const Tensor beta = generate(FillSpec::normal(0, 0.1), 1, "be", {24}, DType::kF64);
  const NormForward n1 = probed->norm_forward(NormKind::kLayerNorm, a, gamma, beta, 1e-5, false);
  const NormForward n2 = plain->norm_forward(NormKind::kLayerNorm, a, gamma, beta, 1e-5, false);
  expect_perturbed(n1.y, n2.y, "norm y");
  expect_perturbed(n1.rstd, n2.rstd, "norm rstd");
  expect_perturbed(probed->activation_forward(Activation::kGelu, a),
                   plain->activation_forward(Activation::kGelu, a), "gelu");
  expect_perturbed(probed->add(a, a), plain->add(a, a), "add");
}

// The stream positions follow the store order across ops: a norm's backward takes 1..n
// for dgamma, then dbeta, then dx (the CPU's order); the next op continues the stream.
TEST(RoundingProbeBackend, EachValueTakesTheFactorOfItsStorePosition) {
  auto probed = make_rounding_probe_backend(make_cpu_backend(), kU, 5);
  auto plain = make_cpu_backend();
  const Tensor x = normal({6, 10}, "x"), dy = normal({6, 10}, "dy");
  const Tensor gamma = normal({10}, "gamma"), beta = normal({10}, "beta");
  const NormForward saved = plain->norm_forward(NormKind::kLayerNorm, x, gamma, beta, 1e-5, false);
  Tensor dg1 = Tensor::zeros({10}, DType::kF64), db1 = Tensor::zeros({10}, DType::kF64);
  Tensor dg2 = Tensor::zeros({10}, DType::kF64), db2 = Tensor::zeros({10}, DType::kF64);
  const Tensor dx1 =
      probed->norm_backward(NormKind::kLayerNorm, dy, x, gamma, saved, false, dg1, db1);
  const Tensor dx2 =
      plain->norm_backward(NormKind::kLayerNorm, dy, x, gamma, saved, false, dg2, db2);
  expect_stream(dg1, dg2, 1, "dgamma");
  expect_stream(db1, db2, 11, "dbeta");
  expect_stream(dx1, dx2, 21, "dx");

  Tensor y1({6, 4}, DType::kF64), y2({6, 4}, DType::kF64);
  Tensor aux1({6, 4}, DType::kF64), aux2({6, 4}, DType::kF64);
  const Tensor w = normal({4, 10}, "w");
  GemmEpilogue e1, e2;
  e1.activation = e2.activation = GemmEpilogue::Activation::kGelu;
  e1.aux = &aux1;
  e2.aux = &aux2;
  probed->gemm("fc", x, false, w, true, y1, false, e1);
  plain->gemm("fc", x, false, w, true, y2, false, e2);
  expect_stream(aux1, aux2, 81, "gelu aux");
  expect_stream(y1, y2, 105, "gemm c");
}

// Keeps a copy of the first GEMM output it sees (attention's scores).
class FirstGemm final : public BackendWrapper {
 public:
  explicit FirstGemm(Backend& target) : BackendWrapper(target) {}
  Tensor c;

 protected:
  void after_op(const OpCall& call) override {
    if (call.op == Op::kGemm && !c.defined()) c = call.outputs.back().tensor->clone();
  }
};

// Attention's layout copies into heads store nothing new: the scores product reads q and
// k unperturbed and takes the stream's first positions.
TEST(RoundingProbeBackend, LeavesLayoutCopiesAlone) {
  std::unique_ptr<Backend> probe = make_rounding_probe_backend(make_cpu_backend(), kU, 5);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  FirstGemm probed(*probe), plain(*cpu);
  const Tensor q = normal({4, 1, 2, 8}, "q"), k = normal({4, 1, 2, 8}, "k");
  const Tensor v = normal({4, 1, 2, 8}, "v");
  probed.attention_forward(q, k, v, AttentionMask{}, 0.5);
  plain.attention_forward(q, k, v, AttentionMask{}, 0.5);
  ASSERT_EQ(plain.c.numel(), 2 * 4 * 4);  // [b·h, s, s]
  expect_stream(probed.c, plain.c, 1, "attention scores");
}

TEST(RoundingProbeBackend, ReproducibleAndSeeded) {
  const Tensor a = normal({32, 32}, "a");
  auto run = [&](std::uint64_t seed) {
    auto be = make_rounding_probe_backend(make_cpu_backend(), kU, seed);
    return be->scale(a, 3.0).to_f64();
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

TEST(RoundingProbeBackend, LeavesOtherDtypesAlone) {
  auto probed = make_rounding_probe_backend(make_cpu_backend(), kU, 5);
  auto plain = make_cpu_backend();
  const Tensor a = normal({32, 32}, "a", DType::kF32);
  EXPECT_EQ(probed->scale(a, 3.0).to_f64(), plain->scale(a, 3.0).to_f64());
}

TEST(RoundingProbeBackend, RejectsUOutsideZeroOne) {
  EXPECT_THROW(make_rounding_probe_backend(make_cpu_backend(), 0.0, 1), Error);
  EXPECT_THROW(make_rounding_probe_backend(make_cpu_backend(), 1.5, 1), Error);
}

}  // namespace
}  // namespace tpcheck
