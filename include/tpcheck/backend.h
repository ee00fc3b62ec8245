// tpcheck/backend.h — the operations layers are written against.
//
// A Backend computes; layers never know which one. The CPU backend (src/backend/cpu) is
// the reference and runs in CI; a CUDA backend implements the same interface.
//
// Conventions:
//   * Row-major. Tensors of rank > 2 are viewed as 2-D [rows, last dim] where an op works
//     on matrices.
//   * Precision: an op's math is in f64 when its inputs are f64 (truth runs) and in f32
//     otherwise; results are rounded to the storage dtype of the input, where a GPU
//     kernel would store them. Saved statistics (norm mean/rstd, attention
//     probabilities) are kept in f32 (f64 for f64 inputs).
//   * Forward returns what backward needs. Backward *writes* activation gradients
//     (returned tensors) and *accumulates* (+=) parameter gradients into tensors passed
//     by reference, in their own dtype.
// Thread safety: a Backend object is used by one rank (thread) at a time.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "tpcheck/gemm_record.h"
#include "tpcheck/quant.h"
#include "tpcheck/tensor.h"

namespace tpcheck {

// ---- GEMM class rule -------------------------------------------------------------
// How the backend picks the numerical class of each GEMM.
//   kAsStored: from the input dtype: f64 → fp64, f32 → `f32_class`, f16 → fp16, bf16 → bf16.
//   kAuto:     like kAsStored, but f32 GEMMs with a short reduction (k < auto_min_k)
//              run as fp32 (FMA kernels) and longer ones as tf32 (tensor cores),
//              modelled on what cuBLASLt's heuristic does for fp32 with TF32 allowed.
struct GemmClassRule {
  enum class Mode { kAsStored, kAuto };
  Mode mode = Mode::kAsStored;
  MathClass f32_class = MathClass::kFp32;
  std::int64_t auto_min_k = 16;
};

// ---- op enums ----------------------------------------------------------------------
enum class NormKind { kLayerNorm, kRMSNorm };
std::string_view norm_kind_name(NormKind k);       // "LayerNorm", "RMSNorm"
NormKind parse_norm_kind(std::string_view name);   // throws Error(kInput)

// gelu: tanh approximation. srelu: relu(x)². qgelu: x·sigmoid(1.702x).
// Gated (geglu, swiglu): input [.., 2n] = [a | b] (a first), output [.., n] = act(a) · b
// with act = gelu (tanh) for geglu and silu for swiglu.
enum class Activation { kGelu, kRelu, kSrelu, kQgelu, kGeglu, kSwiglu };
std::string_view activation_name(Activation a);     // "gelu", "relu", ...
Activation parse_activation(std::string_view name); // throws Error(kInput)
bool is_gated(Activation a);

// Which keys a query may attend to. For query i and key j (positions in the sequence):
//   kNoMask:  all j;
//   kCausal:  j <= i, and j >= i - window_left when window_left >= 0;
//   kSlidingWindow: i - window_left <= j <= i + window_right (a negative bound is
//             unbounded on that side).
struct AttentionMask {
  enum class Type { kNoMask, kCausal, kSlidingWindow };
  Type type = Type::kCausal;
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  bool allows(std::int64_t query, std::int64_t key) const;
};

// ---- checks every backend applies (backend.cpp; same messages on every backend) ----------
// The output shape of `act` on x: x's, with the last dimension halved when gated.
// Error(kInput) when x is undefined or rank 0, or a gated input's last dimension is odd.
Shape activation_output_shape(Activation act, const Tensor& x);
// A norm's input: defined, rank >= 1, a non-empty last dimension.
void check_norm_input(NormKind kind, const Tensor& x);
// A norm parameter or its gradient (`what`: "gamma", "dbeta", ...): [x.dim(-1)].
void check_norm_param(NormKind kind, std::string_view what, const Tensor& x, const Tensor& p);

// ---- saved state -------------------------------------------------------------------
struct NormForward {
  Tensor y;     // normalized output, input dtype
  Tensor mean;  // [rows] (undefined for RMSNorm)
  Tensor rstd;  // [rows] 1/sqrt(var + eps) (RMSNorm: 1/sqrt(mean(x²) + eps))
};

// What attention's backward needs. The unfused path saves the probabilities; the fused
// one (flash attention) saves only each query row's log-sum-exp and recomputes them.
struct AttentionForward {
  Tensor out;    // [s, b, h, d], input dtype
  Tensor probs;  // unfused: [b, h, s_q, s_k] softmax probabilities, f32 (f64 for f64
                 // inputs); undefined when fused
  Tensor stats;  // fused: [b, h, s_q, 1] f32, log Σ_j exp(scale·q·k_j) over the allowed
                 // keys (natural log, the row maximum included); undefined when unfused
  bool fused() const { return stats.defined(); }
};

struct AttentionGrads {
  Tensor dq, dk, dv;
};

// ---- GEMM ------------------------------------------------------------------------
// What a GEMM does to its f32 (f64) accumulator before the single rounding to C's dtype,
// as cuBLASLt's epilogues do (and as the reference library asks for them):
//   bias         D = P + bias[n]                                   (CUBLASLT_EPILOGUE_BIAS)
//   kGelu        pre = P (+ bias); D = gelu(pre); `aux` receives pre rounded to C's
//                dtype (the gelu input the backward needs)        (GELU_AUX[_BIAS])
//   kDgelu       D = P · gelu'(aux), aux read in its dtype          (DGELU)
// where P = op(A)·op(B). With `accumulate`, C's stored value is added to D last.
struct GemmEpilogue {
  enum class Activation { kNone, kGelu, kDgelu };
  const Tensor* bias = nullptr;   // [n], any float dtype; nullptr: no bias
  Activation activation = Activation::kNone;
  Tensor* aux = nullptr;          // [m, n]: written by kGelu, read by kDgelu
  bool any() const { return bias != nullptr || activation != Activation::kNone; }
};
std::string_view gemm_epilogue_name(const GemmEpilogue& e);  // "none", "bias", "gelu_aux_bias", ...

// One GEMM as the front end hands it to an engine: validated, the math class chosen,
// and canonicalized once to the column-major form BLAS and cuBLASLt take.
//
// The caller writes row-major C[m, n] (+)= op(A)[m, k] · op(B)[k, n]. Read column-major,
// a row-major [r, c] matrix is its own transpose [c, r], so the same memory holds
//   Cᵀ[n, m] = op(B)ᵀ[n, k] · op(A)ᵀ[k, m]:
// the column-major product has M = n, N = m, its first operand is B (leading dimension
// B's row length), its second is A. `col` is that form; engines use it and nothing else.
struct GemmProblem {
  std::string_view site;
  // Row-major, as called.
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false, accumulate = false;
  const Tensor* a = nullptr;
  const Tensor* b = nullptr;
  Tensor* c = nullptr;
  GemmEpilogue epilogue;
  MathClass math_class = MathClass::kFp32;  // asked for by the class rule
  std::int64_t batch = 1;  // gemm_batched: independent products, strided in dim 0
  double alpha = 1.0;      // D = alpha · P (+ epilogue); gemm() uses 1
  // Set only by a forcing decorator (tpcheck explain's counterfactual re-runs): the CUDA
  // engine runs this cuBLASLt algorithm (compute type, implementation, id, tile, stages,
  // split-K, ...) when cublasLtMatmulAlgoCheck accepts it for this problem, else the
  // heuristic's first algorithm under the pinned compute type and implementation mask.
  // The CPU engine ignores it (math_class is all it has).
  const CublasLtAlgoRecord* pin = nullptr;
  // Column-major: D[M, N] = op(X)[M, K] · op(Y)[K, N], leading dimensions in elements;
  // batch strides in elements (0 when batch == 1).
  struct ColumnMajor {
    std::int64_t m = 0, n = 0, k = 0;
    const Tensor* x = nullptr;  // = B
    bool trans_x = false;
    std::int64_t ldx = 0;
    const Tensor* y = nullptr;  // = A
    bool trans_y = false;
    std::int64_t ldy = 0;
    std::int64_t ldd = 0;
    std::int64_t stride_x = 0, stride_y = 0, stride_d = 0;
  } col;
};

// A GEMM on quantized operands as the front end hands it to an engine, in the one form
// every quantized GEMM takes (TN, cuBLASLt's only FP8 layout on Hopper): A' [m, k] and
// B' [n, k], each the operand copy whose blocks run along k, and
//   C[m, n] (+)= alpha · (A' · B'ᵀ) (+ epilogue),
// where A'·B'ᵀ multiplies the quantized values times their block scale_inv and alpha holds
// the per-tensor factors (FP8 per tensor: scale_inv_a · scale_inv_b; NVFP4:
// nvfp4_gemm_alpha of the two global amaxes; block recipes: 1), rounded to f32.
struct QuantizedGemmProblem {
  std::string_view site;
  std::int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;
  const QuantizedData* a = nullptr;  // A' is a->columnwise_data when a_columnwise
  bool a_columnwise = false;
  const QuantizedData* b = nullptr;  // B' likewise
  bool b_columnwise = false;
  Tensor* c = nullptr;
  GemmEpilogue epilogue;
  MathClass math_class = MathClass::kFp8;
  float alpha = 1.0f;
  bool fast_accumulation = false;  // see Backend::gemm_quantized
};

// ---- the interface -----------------------------------------------------------------
class BackendWrapper;

// What a backend and every wrapper around it share: the GEMM class rule, the ledger and
// the rank the records are stamped with. A wrapper holds the same object as its target,
// so a set_* call on either reaches both.
struct BackendState {
  GemmClassRule gemm_rule;
  GemmLedger ledger;
  int rank = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Where this backend's tensors live; layers allocate their buffers there.
  virtual Device device() const = 0;

  // The one entry point of every GEMM (non-virtual): validates the operands, chooses
  // the math class (gemm_rule()), canonicalizes to column-major (GemmProblem), runs the
  // backend's engine and appends one GemmRecord, stamped with site and rank, to the
  // ledger.
  // C = op(A) · op(B)  (accumulate: C += op(A) · op(B)); op(X) = Xᵀ when trans_x.
  // A is [m, k] ([k, m] if trans_a), B is [k, n] ([n, k] if trans_b), C is [m, n] and
  // must be allocated by the caller, in any dtype (its dtype is the output dtype); rank
  // > 2 tensors are viewed as [rows, last dim]. All three on device().
  void gemm(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            Tensor& c, bool accumulate, const GemmEpilogue& epilogue = {});
  // `batch` independent products in one call (a strided batched GEMM, as attention's
  // score and context products are): A, B, C are rank 3 with the batch in dim 0 and
  // each [batch, ., .] slice as in gemm(); C[i] = alpha · op(A[i]) · op(B[i]), rounded
  // once to C's dtype. One ledger record (with `batch`).
  void gemm_batched(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                    bool trans_b, Tensor& c, double alpha = 1.0);
  // C (+)= op(A) · op(B) on quantized operands: A and B are the high-precision tensors
  // (shapes as in gemm()) carrying their QuantizedData (Tensor::quantized(), quant.h), both
  // from one recipe. The copy each operand needs is TE's rule: the one whose blocks run
  // along k — A's rowwise copy when !trans_a, its columnwise copy when trans_a; B's
  // columnwise copy when !trans_b, its rowwise copy when trans_b (fprop Y = X Wᵀ: X and W
  // rowwise; dgrad dX = dY W: dY rowwise, W columnwise; wgrad dW = dYᵀ X: both columnwise).
  // The math class is the recipe's (quant_math_class); the record's a_dtype / b_dtype are
  // the data formats. Error(kInput) when a copy is missing or shapes disagree.
  // fast_accumulation: Hopper's FP8 "fast accumulation" (CUBLASLT_MATMUL_DESC_FAST_ACCUM),
  // which the reference's per-tensor FP8 recipes use for the forward GEMM and not for
  // dgrad / wgrad (their split accumulator). The CUDA engine passes it to cuBLASLt; the CPU
  // records it and accumulates exactly in f32 either way (docs/QUANTIZATION.md).
  // A bias epilogue with an f32 output is rounded to bf16 first, under every recipe: the
  // reference does so because cuBLASLt's FP8 GEMMs take no f32 bias.
  void gemm_quantized(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                      bool trans_b, Tensor& c, bool accumulate,
                      const GemmEpilogue& epilogue = {}, bool fast_accumulation = false);

  // quantize() (quant.h) on this backend's device: the quantized copies (data and
  // scale_inv) on device(); amax / global_amax / scale on the host or on device()
  // (QuantizedData's placement rule). Same checks and errors as quantize(). The default
  // quantizes on the host (the CPU backend).
  virtual std::shared_ptr<QuantizedData> quantize(const Tensor& x, const QuantizeOptions& options,
                                                  std::string_view what);

  // y[.., n] += bias[n] (in place).
  virtual void add_bias(Tensor& y, const Tensor& bias) = 0;
  // dbias[n] += Σ_rows dy[.., n].
  virtual void accumulate_bias_grad(const Tensor& dy, Tensor& dbias) = 0;

  // Normalizes over the last dimension. gamma/beta are [hidden]; beta undefined for RMSNorm.
  // zero_centered_gamma: the scale is (1 + gamma).
  virtual NormForward norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps, bool zero_centered_gamma) = 0;
  // Returns dx; dgamma += ..., dbeta += ... (dbeta ignored for RMSNorm; may be undefined).
  virtual Tensor norm_backward(NormKind kind, const Tensor& dy, const Tensor& x,
                               const Tensor& gamma, const NormForward& saved,
                               bool zero_centered_gamma, Tensor& dgamma, Tensor& dbeta) = 0;

  virtual Tensor activation_forward(Activation act, const Tensor& x) = 0;
  virtual Tensor activation_backward(Activation act, const Tensor& dy, const Tensor& x) = 0;

  // LayerNormMLP's bias + gelu, as the reference fuses them (NVTE_BIAS_GELU_NVFUSION):
  // with R = f32 (f64 for f64 h) and pre = round_R(h + bias),
  //   forward   returns round_T(gelu(pre)), T = h's dtype;
  //   backward  dpre = da · gelu'(pre) in R; returns round_T(dpre), T = da's dtype, and
  //             dbias += Σ_rows dpre (summed in R as accumulate_bias_grad sums an R
  //             tensor, rounded once to dbias's dtype).
  // h, da [.., n]; bias [n] any kernel dtype, or undefined (no bias: pre = h; dbias is
  // then not touched). The defaults compose to(), add_bias(), activation_*() and
  // accumulate_bias_grad() (src/backend/bias_gelu.cpp); a backend may fuse them into one kernel with
  // the same roundings and the same summation order, i.e. the same bits. Decorators
  // (BackendWrapper) keep the composition, so they see its parts.
  virtual Tensor bias_gelu_forward(const Tensor& h, const Tensor& bias);
  virtual Tensor bias_gelu_backward(const Tensor& da, const Tensor& h, const Tensor& bias,
                                    Tensor& dbias);

  // TransformerLayer's residual join, as the reference fuses it (bias_dropout_add, dropout
  // 0): with R = f32 (f64 for f64 out), returns round_T((round_R(out + bias)) + residual)
  // — out widened exactly to R, the bias added in R (add_bias), the residual added in R
  // (accumulate), one rounding to T = out's dtype. out, residual [.., n]; bias [n] any
  // kernel dtype, or undefined (no bias). The default composes to(), add_bias(),
  // accumulate() and to() (src/backend/bias_residual_add.cpp); a backend may fuse them
  // into one kernel with the same roundings (the same bits). Decorators keep the
  // composition, as for bias_gelu.
  virtual Tensor bias_residual_add(const Tensor& out, const Tensor& bias, const Tensor& residual);

  // Scaled dot-product attention. q [s, b, h, d]; k, v [s, b, g, d] with g dividing h;
  // query head i uses key/value group i / (h / g). out = softmax(scale · q kᵀ + mask) v.
  // Non-virtual: one composition for every backend (src/backend/composed_attention.cpp) of the
  // attention primitives below and six strided batched GEMMs through gemm_batched(), so
  // the products are in the ledger and follow gemm_rule(). Sites, batch b·h:
  //   forward   attn.scores/fwd    S  = scale · Q Kᵀ     [s, s] k = d
  //             attn.context/fwd   O  = P V              [s, d] k = s
  //   backward  attn.context/dprobs dP = dO Vᵀ           [s, s] k = d
  //             attn.context/dvalue dV = Pᵀ dO           [s, d] k = s
  //             attn.scores/dquery  dQ = scale · dS K    [s, d] k = s
  //             attn.scores/dkey    dK = scale · dSᵀ Q   [s, d] k = s
  // Rounding points (TransformerEngine's unfused attention; docs/LAYERS.md): S, P before
  // the context product, O, dP, dS and the per-head dQ, dK, dV are stored in q's dtype;
  // the softmax and its backward compute in f32 (f64), and `probs` is saved in f32 (f64).
  // Fused: when the backend's engine takes the problem (run_fused_attention_forward: the
  // CUDA backend with fused_attention on; f16 / bf16, no mask or causal, head dim a
  // multiple of 8 up to 256), one library
  // call per pass computes it (flash attention: no s×s tensor is stored, P is rounded to
  // q's dtype before the context product inside the kernel, the softmax runs online in
  // f32); the ledger gets the same sites, shapes and math class, with the engine's
  // implementation text and no cuBLASLt part. The backward takes the fused path when
  // the forward did (saved.fused()).
  AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const AttentionMask& mask, double scale);
  AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionForward& saved,
                                    const AttentionMask& mask, double scale);

  // a + b (same shape), rounded to a's dtype.
  virtual Tensor add(const Tensor& a, const Tensor& b) = 0;
  // into += x (same shape), rounded to into's dtype.
  virtual void accumulate(Tensor& into, const Tensor& x) = 0;
  // x · s
  virtual Tensor scale(const Tensor& x, double s) = 0;
  // mean((y - target)²) computed in f64; and its gradient 2 (y - target) / numel, in y's dtype.
  virtual double mse_loss(const Tensor& y, const Tensor& target) = 0;
  virtual Tensor mse_loss_backward(const Tensor& y, const Tensor& target) = 0;

  // Waits until every op issued so far has finished (a no-op on the CPU).
  virtual void synchronize() {}

  // The backend that computes, under every decorator (timing, the rounding probe): for
  // arithmetic that belongs to the harness, not to the layer under test (the suite's
  // loss gradient), which a decorator must not perturb or time.
  virtual Backend& undecorated() { return *this; }

  // The order in which this backend's ops with several outputs store them. BackendWrapper
  // hands an op's outputs to its hook in this order, so the rounding probe gives each
  // value the stream position its store had: the probed bits follow the backend that
  // computes. The default is the CUDA kernels' order (dx before the parameter gradients;
  // a GEMM's C before its gelu aux, which cuBLASLt writes in one kernel); the CPU's loops
  // store the other way round (cpu_backend.h).
  struct StoreOrder {
    bool norm_param_grads_first = false;  // norm_backward: dgamma, dbeta, then dx
    bool gelu_aux_first = false;          // a GEMM with a gelu epilogue: aux, then C
  };
  virtual StoreOrder store_order() const { return {}; }

  void set_gemm_rule(const GemmClassRule& rule) { state_->gemm_rule = rule; }
  const GemmClassRule& gemm_rule() const { return state_->gemm_rule; }
  void set_rank(int rank) { state_->rank = rank; }
  int rank() const { return state_->rank; }
  GemmLedger& ledger() { return state_->ledger; }
  const GemmLedger& ledger() const { return state_->ledger; }

 protected:
  // The backend's GEMM engine: computes `p` (column-major form in p.col, epilogue, beta
  // = 1 when accumulating) and completes `record` with what really ran: the math class
  // (the engine may refine the requested one: cuBLASLt reports the algorithm's class),
  // the implementation text and, on CUDA, the cuBLASLt part.
  virtual void run_gemm(const GemmProblem& p, GemmRecord& record) = 0;
  // The quantized GEMM engine (gemm_quantized). The default refuses: a backend that
  // supports quantized recipes overrides it.
  virtual void run_gemm_quantized(const QuantizedGemmProblem& p, GemmRecord& record);

  // The fused attention engine. Returns false when this backend does not fuse the problem
  // (the default), and attention_forward composes the primitives below instead; true
  // after computing `out` (out.out and out.stats) and naming what ran in `implementation`.
  // Inputs are validated (check_qkv's rules) before the call.
  virtual bool run_fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const AttentionMask& mask, double scale,
                                           AttentionForward& out, std::string& implementation);
  // Its backward, for a `saved` that run_fused_attention_forward produced. The default
  // refuses (Error): a backend whose forward fuses overrides both.
  virtual AttentionGrads run_fused_attention_backward(const Tensor& dout, const Tensor& q,
                                                      const Tensor& k, const Tensor& v,
                                                      const AttentionForward& saved,
                                                      const AttentionMask& mask, double scale,
                                                      std::string& implementation);
  // Appends the ledger record of one product a fused attention kernel computed inside
  // (C[m, n] = alpha · op(A)[m, k] · op(B)[k, n], `batch` times, A, B, C in `dtype`).
  void record_fused_product(std::string_view site, std::int64_t m, std::int64_t n,
                            std::int64_t k, std::int64_t batch, bool trans_a, bool trans_b,
                            double alpha, DType dtype, const std::string& implementation);

  // Validation, class choice, canonicalization and recording shared by gemm() and
  // gemm_batched().
  void gemm_front_end(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                      bool trans_b, Tensor& c, bool accumulate, const GemmEpilogue& epilogue,
                      bool batched, double alpha);

  // The class `gemm_rule()` gives a GEMM with these input dtypes and reduction length.
  MathClass choose_math_class(DType a, DType b, std::int64_t k) const;

  // ---- attention primitives (attention_forward / attention_backward compose them) ----
  // Layouts: heads-major [b·h, s, d] is what the batched GEMMs take; [s, b, n, d] is the
  // layers' layout. Every primitive runs on device() and leaves its inputs unchanged.
  //
  // x [s, b, n, d] → [b·h, s, d] in x's dtype (a copy, no rounding); head i of the
  // result is x's head i / (h / n), so n = g expands key/value groups to heads.
  // REQUIRES: n divides heads.
  virtual Tensor attention_heads_in(const Tensor& x, std::int64_t heads) = 0;
  // x [b·h, s, d] → [s, b, groups, d]: out head j is the sum over the h / groups heads
  // j·(h / groups) ... (j + 1)·(h / groups) − 1 of x (exactly x's head j when groups = h),
  // summed in f32 (f64 for f64) and rounded once to x's dtype. REQUIRES: groups divides h.
  virtual Tensor attention_heads_out(const Tensor& x, std::int64_t batch,
                                     std::int64_t groups) = 0;
  // scores [b·h, s_q, s_k] → probs [b·h, s_q, s_k] in f32 (f64 for f64 scores): per row
  // i (a query position), softmax over the keys j that mask.allows(i, j), computed in
  // f32 (f64) after subtracting the row maximum; 0 at masked keys; a row with no allowed
  // key is all 0 (a guard: no AttentionMask masks a whole row when s_q = s_k).
  virtual Tensor attention_softmax_forward(const Tensor& scores, const AttentionMask& mask) = 0;
  // dS = P ⊙ (dP − rowsum(dP ⊙ P)) in f32 (f64), rounded once to dprobs' dtype.
  // dprobs [b·h, s_q, s_k] any float dtype; probs as attention_softmax_forward returns.
  virtual Tensor attention_softmax_backward(const Tensor& dprobs, const Tensor& probs) = 0;

 private:
  friend class BackendWrapper;
  std::shared_ptr<BackendState> state_ = std::make_shared<BackendState>();
};

// ---- decorators ------------------------------------------------------------------------
// The ops a BackendWrapper forwards, as its hook names them (op_name: the Backend method's
// name). kBiasGelu* and kBiasResidualAdd reach the hook only from a wrapper that forwards
// fusions (BackendWrapper::Fusions); otherwise their parts do.
enum class Op {
  kGemm,  // gemm, gemm_batched and attention's products: the engine (run_gemm)
  kGemmQuantized,
  kQuantize,
  kAddBias,
  kAccumulateBiasGrad,
  kNormForward,
  kNormBackward,
  kActivationForward,
  kActivationBackward,
  kBiasGeluForward,
  kBiasGeluBackward,
  kBiasResidualAdd,
  kAdd,
  kAccumulate,
  kScale,
  kMseLoss,
  kMseLossBackward,
  kAttentionHeadsIn,
  kAttentionHeadsOut,
  kAttentionSoftmaxForward,
  kAttentionSoftmaxBackward,
  kFusedAttentionForward,
  kFusedAttentionBackward,
};
std::string_view op_name(Op op);  // "gemm", "norm_backward", ...

// One tensor an op wrote (or, accumulating, updated in place).
struct OpOutput {
  std::string_view name;  // the op's name for it: "c", "aux", "y", "mean", "rstd", "dx", ...
  Tensor* tensor;         // defined; the op's own buffer, which a hook may change in place
  // false for a layout copy (attention_heads_in): the input's stored values moved, nothing
  // computed or rounded.
  bool computed = true;
};

// One op as a BackendWrapper's hook sees it.
struct OpCall {
  OpCall(Op o, std::int64_t n, std::string_view gemm_site = {})
      : op(o), elements(n), site(gemm_site) {}
  Op op;
  // The op's size, as the benchmark counts work: C's m·n for a GEMM (per product), else
  // the element count of its activation input (x; add: a; bias grad: dy; softmax: the
  // scores or dprobs; fused attention: q; bias_gelu: h; the residual join: out).
  std::int64_t elements = 0;
  std::string_view site;  // GEMMs: the ledger site; "" for the others
  // after_op only: every tensor the op wrote, in the order the target stored them
  // (Backend::store_order). Undefined tensors (RMSNorm's mean, a missing dbeta) and the
  // bias gradient of an empty dy (nothing written) are left out. quantize's
  // QuantizedData and mse_loss's scalar are not tensors: none.
  std::span<const OpOutput> outputs;
};

// Forwards every op to a target backend and shares its state (rule, ledger, rank). A
// decorator (the rounding probe, explain's recorder, the benchmark's timer) implements
// the hook — before_op / after_op — and nothing else: the wrapper owns the forwarding,
// so an op cannot reach the target without passing the hook. The op methods are final
// for that reason; run_gemm, run_gemm_quantized and quantize stay overridable for
// decorators that change what runs (explain's forced GEMM classes), and must call the
// wrapper's version, which calls the hook.
// GEMMs still pass the front end once: the wrapper's gemm() validates and records, and
// its engine is the target's. Attention composes the wrapper's primitives and GEMMs, so
// a hook sees its products as GEMMs; bias_gelu and the residual join are composed the same
// way (the hook sees their parts), unless the wrapper forwards fusions.
// Thread safety: like every Backend, one rank (thread) at a time.
class BackendWrapper : public Backend {
 public:
  // kCompose: bias_gelu_* and bias_residual_add run Backend's composition over the
  // wrapper's own (hooked) primitives, so a decorator that perturbs or records each op
  // sees the same ops with or without a fusing target. kForward: they go to the target's
  // (possibly fused) version as one hooked op (the timer: it measures what runs).
  enum class Fusions { kCompose, kForward };
  explicit BackendWrapper(Backend& target, Fusions fusions = Fusions::kCompose)
      : target_(target), fusions_(fusions) {
    adopt_state(target);
  }

  std::string_view name() const override { return target_.name(); }
  Backend& undecorated() override { return target_.undecorated(); }
  Device device() const override { return target_.device(); }
  StoreOrder store_order() const override { return target_.store_order(); }
  void synchronize() override { target_.synchronize(); }

  std::shared_ptr<QuantizedData> quantize(const Tensor& x, const QuantizeOptions& options,
                                          std::string_view what) override;
  void add_bias(Tensor& y, const Tensor& bias) final;
  void accumulate_bias_grad(const Tensor& dy, Tensor& dbias) final;
  NormForward norm_forward(NormKind kind, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                           double eps, bool zero_centered_gamma) final;
  Tensor norm_backward(NormKind kind, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                       const NormForward& saved, bool zero_centered_gamma, Tensor& dgamma,
                       Tensor& dbeta) final;
  Tensor activation_forward(Activation act, const Tensor& x) final;
  Tensor activation_backward(Activation act, const Tensor& dy, const Tensor& x) final;
  Tensor bias_gelu_forward(const Tensor& h, const Tensor& bias) final;
  Tensor bias_gelu_backward(const Tensor& da, const Tensor& h, const Tensor& bias,
                            Tensor& dbias) final;
  Tensor bias_residual_add(const Tensor& out, const Tensor& bias, const Tensor& residual) final;
  Tensor add(const Tensor& a, const Tensor& b) final;
  void accumulate(Tensor& into, const Tensor& x) final;
  Tensor scale(const Tensor& x, double s) final;
  double mse_loss(const Tensor& y, const Tensor& target) final;
  Tensor mse_loss_backward(const Tensor& y, const Tensor& target) final;

  Backend& target() { return target_; }

 protected:
  // The hook. before_op runs before the target's op (call.outputs empty), after_op after
  // it returned (not when it threw), with what it wrote. They come in pairs and never
  // nest: an op the wrapper forwards does not call back into the wrapper. The defaults do
  // nothing.
  virtual void before_op(const OpCall& call) {}
  virtual void after_op(const OpCall& call) {}

  void run_gemm(const GemmProblem& p, GemmRecord& record) override;
  void run_gemm_quantized(const QuantizedGemmProblem& p, GemmRecord& record) override;
  Tensor attention_heads_in(const Tensor& x, std::int64_t heads) final;
  Tensor attention_heads_out(const Tensor& x, std::int64_t batch, std::int64_t groups) final;
  Tensor attention_softmax_forward(const Tensor& scores, const AttentionMask& mask) final;
  Tensor attention_softmax_backward(const Tensor& dprobs, const Tensor& probs) final;
  bool run_fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask, double scale, AttentionForward& out,
                                   std::string& implementation) final;
  AttentionGrads run_fused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                              const Tensor& v, const AttentionForward& saved,
                                              const AttentionMask& mask, double scale,
                                              std::string& implementation) final;

 private:
  void adopt_state(Backend& target) { state_ = target.state_; }
  // after_op with `outputs` (undefined ones dropped) as call.outputs.
  void report(OpCall& call, std::initializer_list<OpOutput> outputs);
  // A GEMM's C and gelu aux in the target's store order.
  void report_gemm(OpCall& call, Tensor& c, const GemmEpilogue& epilogue);
  // The hooked forwarding of an op whose one output is the Tensor `run` returns
  // (returned) or `t`, updated in place (updated); `name` is the output's name.
  template <typename Run>
  Tensor returned(Op op, std::int64_t elements, std::string_view name, Run&& run);
  template <typename Run>
  void updated(Op op, std::int64_t elements, std::string_view name, Tensor& t, Run&& run);

  Backend& target_;
  Fusions fusions_;
};

std::unique_ptr<Backend> make_cpu_backend();

// Threads OpenBLAS uses for one CPU GEMM. Results differ in the last bits between thread
// counts (measured: 1 vs 2 threads on a 300×200×500 sgemm), so runs that compare bits
// fix it; the thread-rank runner uses 1 (the ranks are the parallelism).
void set_cpu_gemm_threads(int threads);
int cpu_gemm_threads();
// The CPU GEMM library and its build ("OpenBLAS 0.3.21 ..."), for reports.
std::string cpu_gemm_library();
// A 16-hex-digit hash of the bits this machine's sgemm and dgemm give on fixed operands at
// the suite's GEMM shapes, one thread. OpenBLAS picks its kernels by CPU at run time, and
// two kernels of one library version can round f32 sums differently: two machines whose
// fingerprints differ give CPU reports that differ in the last bits (the same build printed
// SkylakeX on one 2-core VM and Cooperlake on another). Reports carry it beside
// cpu_gemm_library.
std::string cpu_gemm_fingerprint();

// The rounding probe (Monte-Carlo arithmetic) for the truth policy's cancellation floor
// (docs/POLICIES.md), as a decorator: `target`'s ops run unchanged, then every f64 tensor
// an op wrote (BackendWrapper's after_op: GEMM outputs and gelu aux, norm outputs,
// statistics and gradients, activations, bias, attention, elementwise results) is
// multiplied by (1 + u·r) where it lives, r uniform in [-1, 1) from a fixed stream keyed by
// `seed` (random_math::probe_factor), taken in the order the ops stored the values. An f64
// run under the probe, minus the plain f64 run, divided by u, is to first order the error
// that one rounding of every stored intermediate causes — it follows the size of what was
// summed, so it stays non-zero where the result cancels to zero (the attention key-bias
// gradient). Layout copies are not perturbed, nor are collectives (not backend ops).
// REQUIRES: 0 < u < 1.
std::unique_ptr<Backend> make_rounding_probe_backend(std::unique_ptr<Backend> target, double u,
                                                     std::uint64_t seed);

}  // namespace tpcheck
