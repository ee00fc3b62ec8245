// composed_attention.cpp — Backend::attention_forward / attention_backward: scaled dot-product
// attention (masks, grouped-query attention), written once for every backend as a
// composition of the backend's attention primitives and the GEMM front end.
//
// Buffers (s = sequence, b = batch, h = query heads, g = key/value groups, d = head dim,
// T = q's storage dtype, R = f32, f64 for f64 inputs):
//   q, dq, out, dout   [s, b, h, d]     T      (the layers' layout)
//   k, v, dk, dv       [s, b, g, d]     T      query head i reads group i / (h / g)
//   Qh, Kh, Vh, dOh    [b·h, s, d]      T      heads-major; Kh, Vh expanded to h heads
//   S, dP, dS          [b·h, s, s]      T
//   probs              [b·h, s, s]      R      saved (returned as [b, h, s, s])
//   P                  [b·h, s, s]      T      probs rounded to T (probs itself for f32, f64)
//   Oh, dQh, dKh, dVh  [b·h, s, d]      T
//
// Forward                                             site (batch b·h)
//   Qh, Kh, Vh = heads_in(q, k, v)                    (copies; Kh, Vh repeat each group)
//   S     = scale · Qh Khᵀ                            attn.scores/fwd      m=s n=s k=d
//   probs = masked softmax_rows(S)     (in R)
//   P     = round_T(probs)
//   Oh    = P Vh                                      attn.context/fwd     m=s n=d k=s
//   out   = heads_out(Oh)                             (a copy)
// Backward (probs saved; the mask is in probs: it is exactly 0 at masked keys)
//   dP  = dOh Vhᵀ                                     attn.context/dprobs  m=s n=s k=d
//   dVh = Pᵀ dOh                                      attn.context/dvalue  m=s n=d k=s
//   dS  = probs ⊙ (dP − rowsum(dP ⊙ probs))  (in R, rounded to T)
//   dQh = scale · dS Kh                               attn.scores/dquery   m=s n=d k=s
//   dKh = scale · dSᵀ Qh                              attn.scores/dkey     m=s n=d k=s
//   dq = heads_out(dQh); dk, dv = heads_out(dKh, dVh) summed over each group's h / g
//   heads in R, rounded once to T.
//
// Fused: both functions first offer the problem to the backend's fused engine
// (run_fused_attention_forward / _backward: cuDNN's flash attention on the CUDA backend with
// --attention fused) and, when it takes it, record the same six sites with its
// implementation text; the composition below runs otherwise.
//
// Rounding points: those of TransformerEngine's unfused attention
// (UnfusedDotProductAttention: baddbmm for S with alpha = scale, FusedScaleMaskSoftmax,
// bmm for O; their autograd for the backward), the path the reference takes for f32.
// Every GEMM rounds once to T (alpha inside the GEMM); the softmax reads T scores,
// computes in R and its output is rounded to T before the context product (a no-op for
// f32); the softmax backward reads dP in T and the R probabilities (torch's softmax
// saves its R output; with softmax_in_fp32 the f16/bf16 cast comes after it) and its
// result is rounded to T, as autograd's cast back from f32 does; the repeat_interleave
// of GQA is summed in R from the per-head T gradients and rounded once. Known difference:
// autograd forms dQ, dK as bmm(dS, ·) rounded to T and then multiplies by alpha (a
// second rounding); here alpha is inside the GEMM. The two agree exactly when scale is
// a power of two (1/sqrt(d) with d = 4, 16, 64, 256), else by at most one rounding of T.
// TE's fused f16 softmax kernel (aligned shapes) would save P in T for the backward;
// the saved probabilities here stay in R, as torch's path keeps them.
// Thread safety: a Backend is used by one rank (thread) at a time.
#include <climits>
#include <string>

#include "tpcheck/backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

struct Dims {
  std::int64_t s, b, h, g, d;
};

std::string describe_or_undefined(const Tensor& t) {
  return t.defined() ? t.describe() : std::string("an undefined tensor");
}

bool is_attention_dtype(DType t) {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// Checks q [s, b, h, d], k and v [s, b, g, d] with g dividing h, one float dtype, all on
// `device`; returns the sizes. `op` names the caller in messages.
Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, Device device) {
  TPCHECK_CHECK_INPUT(q.defined() && q.rank() == 4, "{}: q must be [s, b, h, d], got {}", op,
                      describe_or_undefined(q));
  TPCHECK_CHECK_INPUT(k.defined() && k.rank() == 4, "{}: k must be [s, b, g, d], got {}", op,
                      describe_or_undefined(k));
  TPCHECK_CHECK_INPUT(v.defined() && v.shape() == k.shape(), "{}: v must have k's shape {}, got {}",
                      op, shape_str(k.shape()), describe_or_undefined(v));
  const Dims dims{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  TPCHECK_CHECK_INPUT(k.dim(0) == dims.s,
                      "{}: q and k must share the sequence length, got q {} and k {}", op,
                      shape_str(q.shape()), shape_str(k.shape()));
  TPCHECK_CHECK_INPUT(k.dim(1) == dims.b, "{}: q and k must share the batch, got q {} and k {}", op,
                      shape_str(q.shape()), shape_str(k.shape()));
  TPCHECK_CHECK_INPUT(k.dim(3) == dims.d,
                      "{}: q and k must share the head dimension, got q {} and k {}", op,
                      shape_str(q.shape()), shape_str(k.shape()));
  TPCHECK_CHECK_INPUT(dims.g >= 1 && dims.h % dims.g == 0,
                      "{}: the number of key/value groups must divide the number of heads, got "
                      "heads {} and groups {}",
                      op, dims.h, dims.g);
  TPCHECK_CHECK_INPUT(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
                      "{}: q, k, v must share one dtype, got {}, {}, {}", op, q.describe(),
                      k.describe(), v.describe());
  TPCHECK_CHECK_INPUT(is_attention_dtype(q.dtype()),
                      "{}: q, k, v are {}; expected f64, f32, f16 or bf16", op,
                      dtype_name(q.dtype()));
  TPCHECK_CHECK_INPUT(q.device() == device && k.device() == device && v.device() == device,
                      "{}: q, k, v ({}, {}, {}) must be on the {}, where this backend computes",
                      op, q.describe(), k.describe(), v.describe(), device_name(device));
  // The GEMMs index [s, s] and [s, d] matrices with 32-bit sizes (BLAS, cuBLASLt).
  TPCHECK_CHECK_INPUT(dims.s <= INT_MAX && dims.d <= INT_MAX,
                      "{}: sequence {} or head dim {} exceeds the 32-bit GEMM index range", op,
                      dims.s, dims.d);
  return dims;
}

DType probs_dtype_for(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

// probs (R) as the T operand of the context products: rounded to T, or probs itself
// when T is R.
Tensor probs_in_storage(const Tensor& probs, DType t) {
  return probs.dtype() == t ? probs : probs.to(t);
}

}  // namespace

AttentionForward Backend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionMask& mask, double scale) {
  const Dims dm = check_qkv("attention_forward", q, k, v, device());
  const DType t = q.dtype();
  const Device dev = device();
  const std::int64_t bh = dm.b * dm.h;

  {  // the fused engine, when this backend fuses the problem
    AttentionForward fused;
    std::string implementation;
    if (run_fused_attention_forward(q, k, v, mask, scale, fused, implementation)) {
      const Shape stats_shape{dm.b, dm.h, dm.s, 1};
      TPCHECK_CHECK(fused.out.defined() && fused.out.shape() == q.shape() &&
                        fused.out.dtype() == t && fused.stats.defined() &&
                        fused.stats.shape() == stats_shape && !fused.probs.defined(),
                    "run_fused_attention_forward of q {} returned out {} and stats {}",
                    q.describe(), describe_or_undefined(fused.out),
                    describe_or_undefined(fused.stats));
      record_fused_product("attn.scores/fwd", dm.s, dm.s, dm.d, bh, false, true, scale, t,
                           implementation);
      record_fused_product("attn.context/fwd", dm.s, dm.d, dm.s, bh, false, false, 1.0, t,
                           implementation);
      return fused;
    }
  }

  const Tensor qh = attention_heads_in(q, dm.h);
  const Tensor kh = attention_heads_in(k, dm.h);
  const Tensor vh = attention_heads_in(v, dm.h);

  Tensor scores({bh, dm.s, dm.s}, t, dev);
  gemm_batched("attn.scores/fwd", qh, false, kh, true, scores, scale);
  const Tensor probs = attention_softmax_forward(scores, mask);
  TPCHECK_CHECK(probs.dtype() == probs_dtype_for(t) && probs.shape() == scores.shape(),
                "attention_softmax_forward of {} returned {}", scores.describe(),
                probs.describe());

  Tensor oh({bh, dm.s, dm.d}, t, dev);
  gemm_batched("attn.context/fwd", probs_in_storage(probs, t), false, vh, false, oh);
  AttentionForward out;
  out.out = attention_heads_out(oh, dm.b, dm.h);
  out.probs = probs.reshape({dm.b, dm.h, dm.s, dm.s});
  return out;
}

// `mask` is not needed by the unfused backward: the saved probabilities are exactly 0 at
// masked keys, so dS and every product with P vanish there. The fused one recomputes P and
// takes it.
AttentionGrads Backend::attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const AttentionForward& saved,
                                           const AttentionMask& mask, double scale) {
  const Dims dm = check_qkv("attention_backward", q, k, v, device());
  TPCHECK_CHECK_INPUT(dout.defined() && dout.shape() == q.shape() && dout.device() == device(),
                      "attention_backward: dout must have q's shape {} on the {}, got {}",
                      shape_str(q.shape()), device_name(device()), describe_or_undefined(dout));
  TPCHECK_CHECK_INPUT(is_attention_dtype(dout.dtype()),
                      "attention_backward: dout is {}; expected f64, f32, f16 or bf16",
                      dtype_name(dout.dtype()));
  const DType t = q.dtype();
  if (saved.fused()) {  // the forward ran fused: so does the backward
    const Shape stats_shape{dm.b, dm.h, dm.s, 1};
    TPCHECK_CHECK_INPUT(saved.stats.shape() == stats_shape && saved.stats.dtype() == DType::kF32 &&
                            saved.stats.device() == device() && saved.out.defined() &&
                            saved.out.shape() == q.shape() && saved.out.dtype() == t,
                        "attention_backward: a fused forward's saved state must be f32 stats {} "
                        "and out {}{} on the {}, got stats {} and out {}",
                        shape_str(stats_shape), dtype_name(t), shape_str(q.shape()),
                        device_name(device()), saved.stats.describe(),
                        describe_or_undefined(saved.out));
    std::string implementation;
    AttentionGrads grads =
        run_fused_attention_backward(dout, q, k, v, saved, mask, scale, implementation);
    TPCHECK_CHECK(grads.dq.defined() && grads.dq.shape() == q.shape() && grads.dk.defined() &&
                      grads.dk.shape() == k.shape() && grads.dv.defined() &&
                      grads.dv.shape() == v.shape(),
                  "run_fused_attention_backward of q {} returned dq {}, dk {}, dv {}",
                  q.describe(), describe_or_undefined(grads.dq), describe_or_undefined(grads.dk),
                  describe_or_undefined(grads.dv));
    const std::int64_t bh = dm.b * dm.h;
    record_fused_product("attn.context/dprobs", dm.s, dm.s, dm.d, bh, false, true, 1.0, t,
                         implementation);
    record_fused_product("attn.context/dvalue", dm.s, dm.d, dm.s, bh, true, false, 1.0, t,
                         implementation);
    record_fused_product("attn.scores/dquery", dm.s, dm.d, dm.s, bh, false, false, scale, t,
                         implementation);
    record_fused_product("attn.scores/dkey", dm.s, dm.d, dm.s, bh, true, false, scale, t,
                         implementation);
    return grads;
  }
  const DType pt = probs_dtype_for(t);
  const Shape probs_shape{dm.b, dm.h, dm.s, dm.s};
  TPCHECK_CHECK_INPUT(saved.probs.defined() && saved.probs.shape() == probs_shape &&
                          saved.probs.dtype() == pt && saved.probs.device() == device(),
                      "attention_backward: saved probs must be {}{} on the {}, got {}",
                      dtype_name(pt), shape_str(probs_shape), device_name(device()),
                      describe_or_undefined(saved.probs));
  const Device dev = device();
  const std::int64_t bh = dm.b * dm.h;

  const Tensor qh = attention_heads_in(q, dm.h);
  const Tensor kh = attention_heads_in(k, dm.h);
  const Tensor vh = attention_heads_in(v, dm.h);
  const Tensor doh = attention_heads_in(dout, dm.h);
  const Tensor probs = saved.probs.reshape({bh, dm.s, dm.s});

  Tensor dp({bh, dm.s, dm.s}, t, dev);
  gemm_batched("attn.context/dprobs", doh, false, vh, true, dp);
  Tensor dvh({bh, dm.s, dm.d}, t, dev);
  gemm_batched("attn.context/dvalue", probs_in_storage(probs, t), true, doh, false, dvh);
  const Tensor ds = attention_softmax_backward(dp, probs);
  TPCHECK_CHECK(ds.dtype() == t && ds.shape() == dp.shape(),
                "attention_softmax_backward of {} returned {}", dp.describe(), ds.describe());
  Tensor dqh({bh, dm.s, dm.d}, t, dev);
  gemm_batched("attn.scores/dquery", ds, false, kh, false, dqh, scale);
  Tensor dkh({bh, dm.s, dm.d}, t, dev);
  gemm_batched("attn.scores/dkey", ds, true, qh, false, dkh, scale);

  return {attention_heads_out(dqh, dm.b, dm.h), attention_heads_out(dkh, dm.b, dm.g),
          attention_heads_out(dvh, dm.b, dm.g)};
}

bool Backend::run_fused_attention_forward(const Tensor&, const Tensor&, const Tensor&,
                                          const AttentionMask&, double, AttentionForward&,
                                          std::string&) {
  return false;
}

AttentionGrads Backend::run_fused_attention_backward(const Tensor&, const Tensor&, const Tensor&,
                                                     const Tensor&, const AttentionForward&,
                                                     const AttentionMask&, double, std::string&) {
  TPCHECK_CHECK_INPUT(false,
                      "attention_backward: the saved state comes from a fused forward, which the "
                      "{} backend does not run; run the backward on the backend of the forward",
                      name());
  return {};
}

}  // namespace tpcheck
