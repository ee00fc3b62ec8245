// backend_wrapper.cpp — BackendWrapper (tpcheck/backend.h): every op forwarded to the
// target between the hook's before_op and after_op, with the tensors the op wrote in the
// order the target stores them.
// Thread safety: like every Backend, one rank (thread) at a time.
#include <array>
#include <string_view>

#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

constexpr std::array<std::string_view, 23> kOpNames = {
    "gemm",
    "gemm_quantized",
    "quantize",
    "add_bias",
    "accumulate_bias_grad",
    "norm_forward",
    "norm_backward",
    "activation_forward",
    "activation_backward",
    "bias_gelu_forward",
    "bias_gelu_backward",
    "bias_residual_add",
    "add",
    "accumulate",
    "scale",
    "mse_loss",
    "mse_loss_backward",
    "attention_heads_in",
    "attention_heads_out",
    "attention_softmax_forward",
    "attention_softmax_backward",
    "fused_attention_forward",
    "fused_attention_backward",
};
static_assert(kOpNames.size() == static_cast<std::size_t>(Op::kFusedAttentionBackward) + 1);

}  // namespace

std::string_view op_name(Op op) { return kOpNames.at(static_cast<std::size_t>(op)); }

void BackendWrapper::report(OpCall& call, std::initializer_list<OpOutput> outputs) {
  std::array<OpOutput, 5> defined{};
  std::size_t n = 0;
  for (const OpOutput& o : outputs) {
    TPCHECK_CHECK(n < defined.size(), "{}: more outputs than the hook takes", op_name(call.op));
    if (o.tensor != nullptr && o.tensor->defined()) defined[n++] = o;
  }
  call.outputs = std::span<const OpOutput>(defined.data(), n);
  after_op(call);
}

void BackendWrapper::report_gemm(OpCall& call, Tensor& c, const GemmEpilogue& epilogue) {
  Tensor* aux = epilogue.activation == GemmEpilogue::Activation::kGelu ? epilogue.aux : nullptr;
  if (store_order().gelu_aux_first) {
    report(call, {{"aux", aux}, {"c", &c}});
  } else {
    report(call, {{"c", &c}, {"aux", aux}});
  }
}

template <typename Run>
Tensor BackendWrapper::returned(Op op, std::int64_t elements, std::string_view name, Run&& run) {
  OpCall call(op, elements);
  before_op(call);
  Tensor out = run();
  report(call, {{name, &out}});
  return out;
}

template <typename Run>
void BackendWrapper::updated(Op op, std::int64_t elements, std::string_view name, Tensor& t,
                             Run&& run) {
  OpCall call(op, elements);
  before_op(call);
  run();
  report(call, {{name, &t}});
}

// ---- GEMMs and quantization ---------------------------------------------------------------

void BackendWrapper::run_gemm(const GemmProblem& p, GemmRecord& record) {
  OpCall call(Op::kGemm, p.m * p.n, p.site);
  before_op(call);
  target_.run_gemm(p, record);
  report_gemm(call, *p.c, p.epilogue);
}

void BackendWrapper::run_gemm_quantized(const QuantizedGemmProblem& p, GemmRecord& record) {
  OpCall call(Op::kGemmQuantized, p.m * p.n, p.site);
  before_op(call);
  target_.run_gemm_quantized(p, record);
  report_gemm(call, *p.c, p.epilogue);
}

std::shared_ptr<QuantizedData> BackendWrapper::quantize(const Tensor& x,
                                                        const QuantizeOptions& options,
                                                        std::string_view what) {
  OpCall call(Op::kQuantize, x.numel());
  before_op(call);
  std::shared_ptr<QuantizedData> q = target_.quantize(x, options, what);
  report(call, {});
  return q;
}

// ---- bias, norms, activations -------------------------------------------------------------

void BackendWrapper::add_bias(Tensor& y, const Tensor& bias) {
  updated(Op::kAddBias, y.numel(), "y", y, [&] { target_.add_bias(y, bias); });
}

void BackendWrapper::accumulate_bias_grad(const Tensor& dy, Tensor& dbias) {
  OpCall call(Op::kAccumulateBiasGrad, dy.numel());
  before_op(call);
  target_.accumulate_bias_grad(dy, dbias);
  // An empty dy adds nothing: no backend writes dbias then.
  report(call, {{"dbias", dy.numel() > 0 ? &dbias : nullptr}});
}

NormForward BackendWrapper::norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma,
                                         const Tensor& beta, double eps, bool zero_centered_gamma) {
  OpCall call(Op::kNormForward, x.numel());
  before_op(call);
  NormForward f = target_.norm_forward(kind, x, gamma, beta, eps, zero_centered_gamma);
  report(call, {{"y", &f.y}, {"mean", &f.mean}, {"rstd", &f.rstd}});
  return f;
}

Tensor BackendWrapper::norm_backward(NormKind kind, const Tensor& dy, const Tensor& x,
                                     const Tensor& gamma, const NormForward& saved,
                                     bool zero_centered_gamma, Tensor& dgamma, Tensor& dbeta) {
  OpCall call(Op::kNormBackward, x.numel());
  before_op(call);
  Tensor dx = target_.norm_backward(kind, dy, x, gamma, saved, zero_centered_gamma, dgamma, dbeta);
  // RMSNorm has no shift: dbeta is not written even when the caller passes one.
  Tensor* db = kind == NormKind::kLayerNorm ? &dbeta : nullptr;
  if (store_order().norm_param_grads_first) {
    report(call, {{"dgamma", &dgamma}, {"dbeta", db}, {"dx", &dx}});
  } else {
    report(call, {{"dx", &dx}, {"dgamma", &dgamma}, {"dbeta", db}});
  }
  return dx;
}

Tensor BackendWrapper::activation_forward(Activation act, const Tensor& x) {
  return returned(Op::kActivationForward, x.numel(), "y",
                  [&] { return target_.activation_forward(act, x); });
}

Tensor BackendWrapper::activation_backward(Activation act, const Tensor& dy, const Tensor& x) {
  return returned(Op::kActivationBackward, x.numel(), "dx",
                  [&] { return target_.activation_backward(act, dy, x); });
}

// ---- fusions: composed over the hooked parts, or forwarded as one op ----------------------

Tensor BackendWrapper::bias_gelu_forward(const Tensor& h, const Tensor& bias) {
  if (fusions_ == Fusions::kCompose) return Backend::bias_gelu_forward(h, bias);
  return returned(Op::kBiasGeluForward, h.numel(), "y",
                  [&] { return target_.bias_gelu_forward(h, bias); });
}

Tensor BackendWrapper::bias_gelu_backward(const Tensor& da, const Tensor& h, const Tensor& bias,
                                          Tensor& dbias) {
  if (fusions_ == Fusions::kCompose) return Backend::bias_gelu_backward(da, h, bias, dbias);
  OpCall call(Op::kBiasGeluBackward, h.numel());
  before_op(call);
  Tensor dh = target_.bias_gelu_backward(da, h, bias, dbias);
  report(call, {{"dh", &dh}, {"dbias", bias.defined() ? &dbias : nullptr}});
  return dh;
}

Tensor BackendWrapper::bias_residual_add(const Tensor& out, const Tensor& bias,
                                         const Tensor& residual) {
  if (fusions_ == Fusions::kCompose) return Backend::bias_residual_add(out, bias, residual);
  return returned(Op::kBiasResidualAdd, out.numel(), "y",
                  [&] { return target_.bias_residual_add(out, bias, residual); });
}

// ---- elementwise and the loss -------------------------------------------------------------

Tensor BackendWrapper::add(const Tensor& a, const Tensor& b) {
  return returned(Op::kAdd, a.numel(), "sum", [&] { return target_.add(a, b); });
}

void BackendWrapper::accumulate(Tensor& into, const Tensor& x) {
  updated(Op::kAccumulate, x.numel(), "into", into, [&] { target_.accumulate(into, x); });
}

Tensor BackendWrapper::scale(const Tensor& x, double s) {
  return returned(Op::kScale, x.numel(), "y", [&] { return target_.scale(x, s); });
}

double BackendWrapper::mse_loss(const Tensor& y, const Tensor& target) {
  OpCall call(Op::kMseLoss, y.numel());
  before_op(call);
  const double loss = target_.mse_loss(y, target);
  report(call, {});
  return loss;
}

Tensor BackendWrapper::mse_loss_backward(const Tensor& y, const Tensor& target) {
  return returned(Op::kMseLossBackward, y.numel(), "dy",
                  [&] { return target_.mse_loss_backward(y, target); });
}

// ---- attention ----------------------------------------------------------------------------

// A copy into the heads-major layout: reported, but as a copy (nothing computed).
Tensor BackendWrapper::attention_heads_in(const Tensor& x, std::int64_t heads) {
  OpCall call(Op::kAttentionHeadsIn, x.numel());
  before_op(call);
  Tensor out = target_.attention_heads_in(x, heads);
  report(call, {{"out", &out, false}});
  return out;
}

Tensor BackendWrapper::attention_heads_out(const Tensor& x, std::int64_t batch,
                                           std::int64_t groups) {
  return returned(Op::kAttentionHeadsOut, x.numel(), "out",
                  [&] { return target_.attention_heads_out(x, batch, groups); });
}

Tensor BackendWrapper::attention_softmax_forward(const Tensor& scores, const AttentionMask& mask) {
  return returned(Op::kAttentionSoftmaxForward, scores.numel(), "probs",
                  [&] { return target_.attention_softmax_forward(scores, mask); });
}

Tensor BackendWrapper::attention_softmax_backward(const Tensor& dprobs, const Tensor& probs) {
  return returned(Op::kAttentionSoftmaxBackward, dprobs.numel(), "dscores",
                  [&] { return target_.attention_softmax_backward(dprobs, probs); });
}

bool BackendWrapper::run_fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const AttentionMask& mask, double scale,
                                                 AttentionForward& out,
                                                 std::string& implementation) {
  OpCall call(Op::kFusedAttentionForward, q.numel());
  before_op(call);
  const bool fused = target_.run_fused_attention_forward(q, k, v, mask, scale, out, implementation);
  // Not fused: nothing ran here (attention_forward composes the primitives next).
  if (fused) {
    report(call, {{"out", &out.out}, {"stats", &out.stats}});
  } else {
    report(call, {});
  }
  return fused;
}

AttentionGrads BackendWrapper::run_fused_attention_backward(const Tensor& dout, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const AttentionForward& saved,
                                                            const AttentionMask& mask, double scale,
                                                            std::string& implementation) {
  OpCall call(Op::kFusedAttentionBackward, q.numel());
  before_op(call);
  AttentionGrads g =
      target_.run_fused_attention_backward(dout, q, k, v, saved, mask, scale, implementation);
  report(call, {{"dq", &g.dq}, {"dk", &g.dk}, {"dv", &g.dv}});
  return g;
}

}  // namespace tpcheck
