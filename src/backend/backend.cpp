// backend.cpp — the backend-independent parts of the Backend contract: names of the op
// enums (and their parsers), attention mask semantics, and the GEMM class rule.
// Thread safety: pure functions; choose_math_class only reads the backend's rule.
#include "tpcheck/backend.h"

#include <algorithm>
#include <array>
#include <climits>
#include <string>

#include "backend/gemm_record_stamp.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// "a, b, c" from a list of names, for "expected one of ..." messages.
template <std::size_t N>
std::string join_names(const std::array<std::string_view, N>& names) {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  return out;
}

constexpr std::array<std::string_view, 9> kMathClassNames = {
    "fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp8_block", "mxfp8", "nvfp4"};
constexpr std::array<std::string_view, 3> kGemmImplMaskNames = {"any", "tensor-core", "fma"};
constexpr std::array<std::string_view, 2> kNormKindNames = {"LayerNorm", "RMSNorm"};
constexpr std::array<std::string_view, 6> kActivationNames = {"gelu",  "relu",  "srelu",
                                                              "qgelu", "geglu", "swiglu"};

// Index of `name` in `names`; throws Error(kInput) naming the text and the accepted names.
template <std::size_t N>
std::size_t parse_name(std::string_view what, std::string_view name,
                       const std::array<std::string_view, N>& names) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == name) return i;
  }
  TPCHECK_CHECK_INPUT(false, "unknown {} '{}'; expected one of {}", what, name, join_names(names));
  return 0;
}

}  // namespace

// The arrays above are in enum order; these casts rely on it.
std::string_view math_class_name(MathClass c) { return kMathClassNames[static_cast<int>(c)]; }
MathClass parse_math_class(std::string_view name) {
  return static_cast<MathClass>(parse_name("math class", name, kMathClassNames));
}
bool is_quantized_class(MathClass c) {
  return c == MathClass::kFp8 || c == MathClass::kFp8Block || c == MathClass::kMxfp8 ||
         c == MathClass::kNvfp4;
}

std::string_view gemm_impl_mask_name(GemmImplMask m) {
  return kGemmImplMaskNames[static_cast<int>(m)];
}
GemmImplMask parse_gemm_impl_mask(std::string_view name) {
  return static_cast<GemmImplMask>(parse_name("--gemm-impl", name, kGemmImplMaskNames));
}

std::string_view norm_kind_name(NormKind k) { return kNormKindNames[static_cast<int>(k)]; }
NormKind parse_norm_kind(std::string_view name) {
  return static_cast<NormKind>(parse_name("normalization", name, kNormKindNames));
}

std::string_view activation_name(Activation a) { return kActivationNames[static_cast<int>(a)]; }
Activation parse_activation(std::string_view name) {
  return static_cast<Activation>(parse_name("activation", name, kActivationNames));
}
bool is_gated(Activation a) { return a == Activation::kGeglu || a == Activation::kSwiglu; }

Shape activation_output_shape(Activation act, const Tensor& x) {
  TPCHECK_CHECK_INPUT(x.defined() && x.rank() >= 1,
                      "activation {}: expected an input of rank >= 1, got {}", activation_name(act),
                      x.defined() ? x.describe() : "an undefined tensor");
  Shape shape = x.shape();
  if (is_gated(act)) {
    TPCHECK_CHECK_INPUT(shape.back() % 2 == 0,
                        "activation {}: the gated input's last dimension holds [a | b] and must "
                        "be even, got shape {}",
                        activation_name(act), shape_str(shape));
    shape.back() /= 2;
  }
  return shape;
}

void check_norm_input(NormKind kind, const Tensor& x) {
  TPCHECK_CHECK_INPUT(x.defined() && x.rank() >= 1 && x.dim(-1) > 0,
                      "{}: input {}; expected a tensor with a non-empty last dimension",
                      norm_kind_name(kind), x.defined() ? x.describe() : "undefined");
}

void check_norm_param(NormKind kind, std::string_view what, const Tensor& x, const Tensor& p) {
  TPCHECK_CHECK_INPUT(p.defined(), "{}: {} is undefined; expected a [{}] tensor",
                      norm_kind_name(kind), what, x.dim(-1));
  TPCHECK_CHECK_INPUT(p.rank() == 1 && p.dim(0) == x.dim(-1),
                      "{}: {} is {}, input {}; expected {} of shape [{}] (the last dimension)",
                      norm_kind_name(kind), what, p.describe(), x.describe(), what, x.dim(-1));
}

bool AttentionMask::allows(std::int64_t query, std::int64_t key) const {
  switch (type) {
    case Type::kNoMask:
      return true;
    case Type::kCausal:
      return key <= query && (window_left < 0 || key >= query - window_left);
    case Type::kSlidingWindow:
      return (window_left < 0 || key >= query - window_left) &&
             (window_right < 0 || key <= query + window_right);
  }
  return false;
}

// The class follows the operands A and B (C's dtype is only where the result is
// stored: an f32 main_grad accumulating an f16 GEMM is still an fp16-class GEMM).
//
// kAuto models the story in README.md ("Where it came from"): for an fp32 GEMM with
// TF32 allowed, cuBLASLt's heuristic on an H200 chose an FMA kernel reading full-fp32
// inputs for the sharded shape (K = ffn/TP = 8) and a TF32 tensor-core kernel for the
// unsharded one (K = 32).
// So the same layer computed in two different numerical classes depending only on K.
// Short reductions do not fill a tensor-core tile, so the library prefers FMA kernels
// there; `auto_min_k` is the threshold at which we switch, 16 by default (between the
// two K of the story).
MathClass Backend::choose_math_class(DType a, DType b, std::int64_t k) const {
  TPCHECK_CHECK_INPUT(!is_quantized_format(a) && !is_quantized_format(b),
                      "GEMM operands {} x {}: quantized data goes through gemm_quantized "
                      "(expected f64, f32, f16 or bf16 operands)",
                      dtype_name(a), dtype_name(b));
  if (a == DType::kF64 || b == DType::kF64) {
    TPCHECK_CHECK_INPUT(a == b,
                        "GEMM operands {} x {}: an f64 operand needs an f64 partner (the fp64 "
                        "class is for truth runs, where everything is f64)",
                        dtype_name(a), dtype_name(b));
    return MathClass::kFp64;
  }
  // A 16-bit operand decides the class: its values are rounded to that format anyway,
  // and a GPU mixed-input GEMM reads the wider operand at the narrower precision.
  const bool has_f16 = a == DType::kF16 || b == DType::kF16;
  const bool has_bf16 = a == DType::kBF16 || b == DType::kBF16;
  TPCHECK_CHECK_INPUT(!(has_f16 && has_bf16),
                      "GEMM operands {} x {}: f16 and bf16 cannot be mixed in one GEMM",
                      dtype_name(a), dtype_name(b));
  if (has_f16) return MathClass::kFp16;
  if (has_bf16) return MathClass::kBf16;
  // Both operands f32.
  if (state_->gemm_rule.mode == GemmClassRule::Mode::kAuto) {
    return k < state_->gemm_rule.auto_min_k ? MathClass::kFp32 : MathClass::kTf32;
  }
  return state_->gemm_rule.f32_class;
}

std::string_view gemm_epilogue_name(const GemmEpilogue& e) {
  const bool bias = e.bias != nullptr;
  switch (e.activation) {
    case GemmEpilogue::Activation::kNone:
      return bias ? "bias" : "none";
    case GemmEpilogue::Activation::kGelu:
      return bias ? "gelu_aux_bias" : "gelu_aux";
    case GemmEpilogue::Activation::kDgelu:
      return bias ? "dgelu_bias" : "dgelu";
  }
  return "none";
}

bool GemmRecord::same_algorithm(const GemmRecord& other) const {
  if (math_class != other.math_class) return false;
  if (cublaslt.has_value() != other.cublaslt.has_value()) return false;
  if (!cublaslt) return implementation == other.implementation;
  const CublasLtAlgoRecord& x = *cublaslt;
  const CublasLtAlgoRecord& y = *other.cublaslt;
  return x.algo_id == y.algo_id && x.tile == y.tile && x.stages == y.stages &&
         x.split_k == y.split_k && x.reduction_scheme == y.reduction_scheme &&
         x.cta_swizzling == y.cta_swizzling && x.custom_option == y.custom_option &&
         x.cluster_shape == y.cluster_shape && x.compute_type == y.compute_type;
}

namespace {

// A tensor viewed as a row-major matrix [rows, last dim].
struct MatrixView {
  std::int64_t rows = 0, cols = 0;
};

MatrixView as_matrix(std::string_view site, std::string_view operand, const Tensor& t,
                     Device device, bool batched) {
  TPCHECK_CHECK_INPUT(t.defined(), "GEMM '{}': operand {} is undefined", site, operand);
  TPCHECK_CHECK_INPUT(t.device() == device,
                      "GEMM '{}': operand {} ({}) is on the {}; this backend computes on the {}",
                      site, operand, t.describe(), device_name(t.device()), device_name(device));
  if (batched) {
    TPCHECK_CHECK_INPUT(t.rank() == 3,
                        "batched GEMM '{}': operand {} is {}; expected [batch, rows, cols]", site,
                        operand, t.describe());
    return {t.dim(1), t.dim(2)};
  }
  TPCHECK_CHECK_INPUT(t.rank() >= 2,
                      "GEMM '{}': operand {} is {}; expected a matrix (rank >= 2, viewed as "
                      "[rows, last dim])",
                      site, operand, t.describe());
  const std::int64_t cols = t.dim(-1);
  return {cols == 0 ? 0 : t.numel() / cols, cols};
}

// A GEMM's sizes after validation: op(A) [m, k] · op(B) [k, n] per batch entry, and each
// operand viewed as a matrix.
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  MatrixView av, bv;
};

// Validates every operand's shape and device and the epilogue's tensors before any work.
GemmShape check_gemm(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                     bool trans_b, const Tensor& c, const GemmEpilogue& epilogue, bool batched,
                     Device dev) {
  const MatrixView av = as_matrix(site, "A", a, dev, batched);
  const MatrixView bv = as_matrix(site, "B", b, dev, batched);
  const MatrixView cv = as_matrix(site, "C", c, dev, batched);
  const std::int64_t batch = batched ? a.dim(0) : 1;
  if (batched) {
    TPCHECK_CHECK_INPUT(b.dim(0) == batch && c.dim(0) == batch,
                        "batched GEMM '{}': batch sizes differ: A {}, B {}, C {}", site,
                        a.describe(), b.describe(), c.describe());
  }
  const std::int64_t m = trans_a ? av.cols : av.rows;
  const std::int64_t k = trans_a ? av.rows : av.cols;
  const std::int64_t kb = trans_b ? bv.cols : bv.rows;
  const std::int64_t n = trans_b ? bv.rows : bv.cols;
  TPCHECK_CHECK_INPUT(k == kb,
                      "GEMM '{}': inner dimensions differ: op(A) is [{}, {}] (A {}{}), op(B) is "
                      "[{}, {}] (B {}{}); expected equal K",
                      site, m, k, a.describe(), trans_a ? "^T" : "", kb, n, b.describe(),
                      trans_b ? "^T" : "");
  TPCHECK_CHECK_INPUT(cv.rows == m && cv.cols == n,
                      "GEMM '{}': C is {} (viewed as [{}, {}]); expected [{}, {}] = op(A) {}{} · "
                      "op(B) {}{}",
                      site, c.describe(), cv.rows, cv.cols, m, n, a.describe(), trans_a ? "^T" : "",
                      b.describe(), trans_b ? "^T" : "");
  TPCHECK_CHECK_INPUT(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
                      "GEMM '{}': m={} n={} k={} exceeds the 32-bit index range of BLAS and "
                      "cuBLASLt",
                      site, m, n, k);
  if (epilogue.bias != nullptr) {
    const Tensor& bias = *epilogue.bias;
    TPCHECK_CHECK_INPUT(bias.defined() && bias.device() == dev && bias.numel() == n,
                        "GEMM '{}': epilogue bias is {}; expected {} values on the {}", site,
                        bias.describe(), n, device_name(dev));
  }
  if (epilogue.activation != GemmEpilogue::Activation::kNone) {
    TPCHECK_CHECK_INPUT(epilogue.aux != nullptr && epilogue.aux->defined() &&
                            epilogue.aux->device() == dev && epilogue.aux->numel() == m * n &&
                            epilogue.aux->dtype() == c.dtype(),
                        "GEMM '{}': epilogue {} needs an aux tensor of {} {} values on the {} "
                        "(the gelu input); got {}",
                        site, gemm_epilogue_name(epilogue), m * n, dtype_name(c.dtype()),
                        device_name(dev), epilogue.aux ? epilogue.aux->describe() : "none");
  }
  return {m, n, k, batch, av, bv};
}

// The problem an engine runs (all but its math class): row-major C = op(A)·op(B) is
// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ over the same memory.
GemmProblem make_gemm_problem(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                              bool trans_b, Tensor& c, bool accumulate,
                              const GemmEpilogue& epilogue, bool batched, double alpha,
                              const GemmShape& g) {
  GemmProblem p;
  p.site = site;
  p.m = g.m;
  p.n = g.n;
  p.k = g.k;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.accumulate = accumulate;
  p.a = &a;
  p.b = &b;
  p.c = &c;
  p.epilogue = epilogue;
  p.col.m = g.n;
  p.col.n = g.m;
  p.col.k = g.k;
  p.col.x = &b;
  p.col.trans_x = trans_b;
  p.col.ldx = std::max<std::int64_t>(1, g.bv.cols);
  p.col.y = &a;
  p.col.trans_y = trans_a;
  p.col.ldy = std::max<std::int64_t>(1, g.av.cols);
  p.col.ldd = std::max<std::int64_t>(1, g.n);
  p.batch = g.batch;
  p.alpha = alpha;
  if (batched) {
    p.col.stride_x = g.bv.rows * g.bv.cols;
    p.col.stride_y = g.av.rows * g.av.cols;
    p.col.stride_d = g.m * g.n;
  }
  return p;
}

}  // namespace

void Backend::gemm(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                   bool trans_b, Tensor& c, bool accumulate, const GemmEpilogue& epilogue) {
  gemm_front_end(site, a, trans_a, b, trans_b, c, accumulate, epilogue, false, 1.0);
}

void Backend::gemm_batched(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                           bool trans_b, Tensor& c, double alpha) {
  gemm_front_end(site, a, trans_a, b, trans_b, c, false, GemmEpilogue{}, true, alpha);
}

void Backend::gemm_front_end(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                             bool trans_b, Tensor& c, bool accumulate, const GemmEpilogue& epilogue,
                             bool batched, double alpha) {
  const GemmShape g = check_gemm(site, a, trans_a, b, trans_b, c, epilogue, batched, device());
  GemmProblem p =
      make_gemm_problem(site, a, trans_a, b, trans_b, c, accumulate, epilogue, batched, alpha, g);
  p.math_class = choose_math_class(a.dtype(), b.dtype(), g.k);

  GemmRecord record = stamped_gemm_record(site, state_->rank, g.m, g.n, g.k, trans_a, trans_b);
  record.accumulate = accumulate;
  record.a_dtype = a.dtype();
  record.b_dtype = b.dtype();
  record.c_dtype = c.dtype();
  record.batch = g.batch;
  record.alpha = alpha;
  record.epilogue = std::string(gemm_epilogue_name(epilogue));
  record.math_class = p.math_class;
  run_gemm(p, record);
  state_->ledger.add(std::move(record));
}

void Backend::record_fused_product(std::string_view site, std::int64_t m, std::int64_t n,
                                   std::int64_t k, std::int64_t batch, bool trans_a, bool trans_b,
                                   double alpha, DType dtype, const std::string& implementation) {
  GemmRecord record = stamped_gemm_record(site, state_->rank, m, n, k, trans_a, trans_b);
  record.batch = batch;
  record.alpha = alpha;
  record.a_dtype = record.b_dtype = record.c_dtype = dtype;
  // The kernel's tensor-core products read their operands in the storage format and
  // accumulate in f32: the class of a GEMM on those inputs.
  record.math_class = dtype == DType::kF16 ? MathClass::kFp16 : MathClass::kBf16;
  record.implementation = implementation;
  state_->ledger.add(std::move(record));
}

}  // namespace tpcheck
