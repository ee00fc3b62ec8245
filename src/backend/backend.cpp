// backend.cpp — the backend-independent parts of the Backend contract: names of the op
// enums (and their parsers), attention mask semantics, and the GEMM class rule.
// Thread safety: pure functions; choose_math_class only reads the backend's rule.
#include "tpcheck/backend.h"

#include <array>
#include <string>

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

constexpr std::array<std::string_view, 5> kMathClassNames = {"fp64", "fp32", "tf32", "bf16",
                                                             "fp16"};
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

std::string_view norm_kind_name(NormKind k) { return kNormKindNames[static_cast<int>(k)]; }
NormKind parse_norm_kind(std::string_view name) {
  return static_cast<NormKind>(parse_name("normalization", name, kNormKindNames));
}

std::string_view activation_name(Activation a) { return kActivationNames[static_cast<int>(a)]; }
Activation parse_activation(std::string_view name) {
  return static_cast<Activation>(parse_name("activation", name, kActivationNames));
}
bool is_gated(Activation a) { return a == Activation::kGeglu || a == Activation::kSwiglu; }

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
// kAuto models the story in DESIGN.md: for an fp32 GEMM with TF32 allowed, cuBLASLt's
// heuristic on an H200 chose an FMA kernel reading full-fp32 inputs for the sharded
// shape (K = ffn/TP = 8) and a TF32 tensor-core kernel for the unsharded one (K = 32).
// So the same layer computed in two different numerical classes depending only on K.
// Short reductions do not fill a tensor-core tile, so the library prefers FMA kernels
// there; `auto_min_k` is the threshold at which we switch, 16 by default (between the
// two K of the story).
MathClass Backend::choose_math_class(DType a, DType b, std::int64_t k) const {
  TPCHECK_CHECK_INPUT(!is_fp8(a) && !is_fp8(b),
                      "GEMM operands {} x {}: fp8 GEMMs have no math class here (expected "
                      "f64, f32, f16 or bf16 operands)",
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
  if (gemm_rule_.mode == GemmClassRule::Mode::kAuto) {
    return k < gemm_rule_.auto_min_k ? MathClass::kFp32 : MathClass::kTf32;
  }
  return gemm_rule_.f32_class;
}

}  // namespace tpcheck
