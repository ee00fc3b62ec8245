// gemm_quantized.cpp — Backend::gemm_quantized, the front end of every GEMM on quantized
// operands: it validates the operands and their quantized copies, picks the copy each
// operand needs (TE's rule, backend.h), computes the per-tensor alpha, and records the
// GEMM in the ledger with the recipe's math class.
// Thread safety: as Backend (one rank at a time).
#include <string>

#include "backend/gemm_record_stamp.h"
#include "tpcheck/backend.h"
#include "tpcheck/error.h"
#include "tpcheck/quant.h"

namespace tpcheck {
namespace {

// The operand's quantized copy that gemm_quantized reads; Error(kInput) if it is missing.
const QuantizedData& quantized_operand(std::string_view site, std::string_view name,
                                       const Tensor& t, Device device, bool columnwise) {
  TPCHECK_CHECK_INPUT(t.defined() && t.rank() >= 2,
                      "quantized GEMM '{}': operand {} is {}; expected a matrix (rank >= 2)", site,
                      name, t.defined() ? t.describe() : "undefined");
  TPCHECK_CHECK_INPUT(t.quantized() != nullptr,
                      "quantized GEMM '{}': operand {} ({}) carries no quantized data; quantize "
                      "it first (quant.h)",
                      site, name, t.describe());
  const QuantizedData& q = *t.quantized();
  TPCHECK_CHECK_INPUT(q.cols == t.dim(-1) && q.rows * q.cols == t.numel(),
                      "quantized GEMM '{}': operand {} is {} but its quantized data is [{}, {}]",
                      site, name, t.describe(), q.rows, q.cols);
  const Tensor& data = columnwise ? q.columnwise_data : q.rowwise_data;
  TPCHECK_CHECK_INPUT(data.defined(),
                      "quantized GEMM '{}': operand {} needs its {} copy (the one whose blocks "
                      "run along the reduction), which was not made",
                      site, name, columnwise ? "columnwise" : "rowwise");
  TPCHECK_CHECK_INPUT(data.device() == device,
                      "quantized GEMM '{}': operand {}'s quantized data is on the {}; this "
                      "backend computes on the {}",
                      site, name, device_name(data.device()), device_name(device));
  return q;
}

// The epilogue the engine runs: `given`, checked against C [m, n], with an f32 bias rounded
// to bf16 into `bias_bf16` (which must outlive the result) when C is f32.
GemmEpilogue quantized_epilogue(std::string_view site, const GemmEpilogue& given, const Tensor& c,
                                Device dev, std::int64_t m, std::int64_t n, Tensor& bias_bf16) {
  GemmEpilogue epilogue = given;
  if (epilogue.bias != nullptr) {
    TPCHECK_CHECK_INPUT(
        epilogue.bias->defined() && epilogue.bias->device() == dev && epilogue.bias->numel() == n,
        "quantized GEMM '{}': epilogue bias is {}; expected {} values on the {}", site,
        epilogue.bias->describe(), n, device_name(dev));
    // The reference rounds a GEMM-fused bias to bf16 when the activations are f32 and the
    // GEMM is quantized (cuBLASLt's FP8 GEMMs take a bf16 bias with an f32 output, not an
    // f32 one). It does so under every recipe, so both backends do: one contract.
    if (c.dtype() == DType::kF32 && epilogue.bias->dtype() == DType::kF32) {
      bias_bf16 = epilogue.bias->to(DType::kBF16);
      epilogue.bias = &bias_bf16;
    }
  }
  if (epilogue.activation != GemmEpilogue::Activation::kNone) {
    TPCHECK_CHECK_INPUT(epilogue.aux != nullptr && epilogue.aux->defined() &&
                            epilogue.aux->device() == dev && epilogue.aux->numel() == m * n &&
                            epilogue.aux->dtype() == c.dtype(),
                        "quantized GEMM '{}': epilogue {} needs an aux tensor of {} {} values",
                        site, gemm_epilogue_name(epilogue), m * n, dtype_name(c.dtype()));
  }
  return epilogue;
}

// The recipe's alpha in p (left as it is where the recipe has none here).
void set_alpha(QuantizedGemmProblem& p, const QuantizedData& qa, const QuantizedData& qb,
               bool trans_a, bool trans_b) {
  if (qa.block.empty()) {
    // The accumulated sum times scale_inv_a · scale_inv_b. Scales on the host (the CPU
    // backend) become alpha, which the engine applies and the record shows. Scales on the
    // GPU stay there: cuBLASLt reads them through its scale pointers, and reading them here
    // would make every GEMM wait for the quantization before it (alpha stays 1; the
    // record's scale_mode says "per-tensor scale_inv pointers").
    const Tensor& sa = trans_a ? qa.columnwise_scale_inv : qa.rowwise_scale_inv;
    const Tensor& sb = trans_b ? qb.rowwise_scale_inv : qb.columnwise_scale_inv;
    if (sa.device() == Device::kCpu && sb.device() == Device::kCpu) {
      p.alpha = static_cast<float>(sa.at(0)) * static_cast<float>(sb.at(0));
    }
  } else if (qa.format == DType::kF4E2M1) {
    p.alpha = nvfp4_gemm_alpha(static_cast<float>(qa.global_amax.at(0)),
                               static_cast<float>(qb.global_amax.at(0)));
  }
}

}  // namespace

void Backend::run_gemm_quantized(const QuantizedGemmProblem& p, GemmRecord&) {
  TPCHECK_CHECK_INPUT(false, "quantized GEMM '{}': the {} backend does not run {} GEMMs", p.site,
                      name(), math_class_name(p.math_class));
}

std::shared_ptr<QuantizedData> Backend::quantize(const Tensor& x, const QuantizeOptions& options,
                                                std::string_view what) {
  TPCHECK_CHECK_INPUT(!x.defined() || x.device() == device(),
                      "{} {}: this {} backend quantizes tensors on the {}", what, x.describe(),
                      name(), device_name(device()));
  return ::tpcheck::quantize(x, options, what);
}

void Backend::gemm_quantized(std::string_view site, const Tensor& a, bool trans_a, const Tensor& b,
                             bool trans_b, Tensor& c, bool accumulate,
                             const GemmEpilogue& given_epilogue, bool fast_accumulation) {
  const Device dev = device();
  // A [m, k] reduces over its last dimension (rowwise blocks); Aᵀ over its first.
  const QuantizedData& qa = quantized_operand(site, "A", a, dev, trans_a);
  const QuantizedData& qb = quantized_operand(site, "B", b, dev, !trans_b);
  TPCHECK_CHECK_INPUT(qa.recipe == qb.recipe,
                      "quantized GEMM '{}': operands from different recipes ({} and {})", site,
                      qa.recipe, qb.recipe);
  const std::int64_t m = trans_a ? qa.cols : qa.rows;
  const std::int64_t k = trans_a ? qa.rows : qa.cols;
  const std::int64_t kb = trans_b ? qb.cols : qb.rows;
  const std::int64_t n = trans_b ? qb.rows : qb.cols;
  TPCHECK_CHECK_INPUT(k == kb,
                      "quantized GEMM '{}': inner dimensions differ: op(A) is [{}, {}], op(B) is "
                      "[{}, {}]; expected equal K",
                      site, m, k, kb, n);
  TPCHECK_CHECK_INPUT(c.defined() && c.device() == dev && c.rank() >= 2 && c.dim(-1) == n &&
                          c.numel() == m * n && !is_quantized_format(c.dtype()),
                      "quantized GEMM '{}': C is {}; expected [{}, {}] in f32, f16 or bf16 on the "
                      "{}",
                      site, c.defined() ? c.describe() : "undefined", m, n, device_name(dev));
  Tensor bias_bf16;
  const GemmEpilogue epilogue = quantized_epilogue(site, given_epilogue, c, dev, m, n, bias_bf16);

  QuantizedGemmProblem p;
  p.site = site;
  p.m = m;
  p.n = n;
  p.k = k;
  p.accumulate = accumulate;
  p.a = &qa;
  p.a_columnwise = trans_a;
  p.b = &qb;
  p.b_columnwise = !trans_b;
  p.c = &c;
  p.epilogue = epilogue;
  p.math_class = quant_math_class(parse_recipe(qa.recipe));
  p.fast_accumulation = fast_accumulation;
  set_alpha(p, qa, qb, trans_a, trans_b);

  GemmRecord record = stamped_gemm_record(site, state_->rank, m, n, k, trans_a, trans_b);
  record.accumulate = accumulate;
  record.a_dtype = qa.format;
  record.b_dtype = qb.format;
  record.c_dtype = c.dtype();
  record.alpha = p.alpha;
  record.epilogue = std::string(gemm_epilogue_name(epilogue));
  record.math_class = p.math_class;
  run_gemm_quantized(p, record);
  state_->ledger.add(std::move(record));
}

}  // namespace tpcheck
