// judge_case: statistics for every compared tensor of every step, every policy's verdict
// per step and for the case, and the GEMM sites whose numerical class differs between the
// single and the sharded run.
#include "tpcheck/error.h"
#include "tpcheck/suite.h"

namespace tpcheck {

double math_class_unit_roundoff(MathClass c) {
  switch (c) {
    case MathClass::kFp64: return dtype_unit_roundoff(DType::kF64);
    case MathClass::kFp32: return dtype_unit_roundoff(DType::kF32);
    case MathClass::kTf32: return dtype_unit_roundoff(DType::kF16);  // 10 mantissa bits, like f16
    case MathClass::kBf16: return dtype_unit_roundoff(DType::kBF16);
    case MathClass::kFp16: return dtype_unit_roundoff(DType::kF16);
    // Quantized classes: their accumulation is f32 (the CPU engine; the GPU's tensor cores
    // accumulate at least as wide), and that is what the floor (f·u·√K·…, which grows
    // with the reduction) models. The quantization itself is in *single's* error too —
    // single runs the same recipe — so the multiplier term m·√N·single carries it. The
    // format's u in the √K floor made the bound larger than the tensors: with E4M3's
    // 2^-4 and K = 64 it is 0.5·|truth|, and under fp8_cs truth passed every case of
    // no-row-allreduce at TP 2 (measured 2026-12-01, before this rule).
    case MathClass::kFp8:
    case MathClass::kFp8Block:
    case MathClass::kMxfp8:
    case MathClass::kNvfp4: return dtype_unit_roundoff(DType::kF32);
  }
  return 0;
}

namespace {

// The truth policy's error model for this case (see TruthPolicyParams): u is the larger of
// the storage dtype's unit roundoff and that of the coarsest GEMM class either run used;
// K the longest GEMM reduction; N the TP size; the format's u that of the coarsest
// quantized element format among the GEMMs' operands (E2M1 2^-2, E5M2 2^-3, E4M3 2^-4).
TruthPolicyParams truth_params_for(const SuiteCase& c, int tp, const CaseRun& run,
                                   TruthPolicyParams p) {
  double u = dtype_unit_roundoff(c.dtype);
  double format_u = 0;  // the coarsest quantized element format's (0: no recipe)
  std::int64_t k = 1;
  for (const auto* ledger : {&run.single_gemms, &run.sharded_gemms}) {
    for (const GemmRecord& r : *ledger) {
      u = std::max(u, math_class_unit_roundoff(r.math_class));
      k = std::max(k, r.k);
      for (DType d : {r.a_dtype, r.b_dtype}) {
        if (is_quantized_format(d)) format_u = std::max(format_u, dtype_unit_roundoff(d));
      }
    }
  }
  p.format_unit_roundoff = std::max(p.format_unit_roundoff, format_u);
  if (!p.unit_roundoff) p.unit_roundoff = u;
  p.reduction_length = std::max(p.reduction_length, k);
  p.tp_size = tp;
  return p;
}

}  // namespace

CaseResult judge_case(const SuiteCase& c, int tp, const CaseRun& run, const JudgeConfig& config) {
  CaseResult result;
  result.spec = c;
  result.tp = tp;
  result.seconds = run.seconds;
  result.gemm_count_single = run.single_gemms.size();
  result.gemm_count_sharded = run.sharded_gemms.size();
  result.gemm_class_diffs = diff_gemm_classes(run.single_gemms, run.sharded_gemms);
  if (!run.sharded_comms_by_rank.empty()) result.collectives = run.sharded_comms_by_rank[0];

  std::vector<Policy> policies = config.policies;
  for (Policy& p : policies) {
    if (p.kind == PolicyKind::kTruth) p.truth = truth_params_for(c, tp, run, p.truth);
  }
  result.policies = policies;

  for (std::size_t s = 0; s < run.steps.size(); ++s) {
    StepResult& step = result.steps.emplace_back();
    step.step = static_cast<int>(s) + 1;
    for (const ComparedTensor& t : run.steps[s]) {
      TensorResult r{t.name, t.kind, t.index,
                     compare_tensors(t.sharded, t.single, &t.truth, config.compare,
                                     t.rounding_noise.defined() ? &t.rounding_noise : nullptr),
                     {}};
      for (const Policy& p : policies) r.verdicts.push_back(evaluate(p, r.comparison));
      step.tensors.push_back(std::move(r));
    }
    if (s < run.replicated_state.size()) step.replicated_state = run.replicated_state[s];
    // A step's verdict under a policy: its worst tensor's (fail > warning > pass); under
    // truth and bitwise, a replicated state that differs across ranks fails it first.
    for (std::size_t p = 0; p < config.policies.size(); ++p) {
      Verdict v{VerdictStatus::kPass, "every tensor passes"};
      for (const TensorResult& t : step.tensors) {
        const Verdict& tv = t.verdicts[p];
        if (tv.status > v.status) v = Verdict{tv.status, t.name + ": " + tv.reason};
      }
      const PolicyKind kind = config.policies[p].kind;
      if (!step.replicated_state.consistent() &&
          (kind == PolicyKind::kTruth || kind == PolicyKind::kBitwise)) {
        v = Verdict{VerdictStatus::kFail, "replicated quantizer state differs across ranks: " +
                                              step.replicated_state.difference};
      }
      step.verdicts.push_back(std::move(v));
    }
  }

  // The case's verdict: its worst step's, the first of them; which step, when there are
  // several.
  for (std::size_t p = 0; p < config.policies.size(); ++p) {
    const StepResult& decisive = deciding_step(result, p);
    Verdict v = decisive.verdicts[p];
    if (result.steps.size() > 1) {
      v.reason = v.status == VerdictStatus::kPass
                     ? fmt::format("every tensor passes at each of the {} steps", result.steps.size())
                     : fmt::format("step {}: {}", decisive.step, v.reason);
    }
    result.verdicts.push_back(std::move(v));
  }
  return result;
}

const StepResult& deciding_step(const CaseResult& result, std::size_t p) {
  TPCHECK_CHECK(!result.steps.empty(), "case {}: no step was judged", result.spec.id);
  const StepResult* worst = &result.steps.front();
  for (const StepResult& s : result.steps) {
    if (s.verdicts[p].status > worst->verdicts[p].status) worst = &s;
  }
  // A passing case: its last step (the one furthest from the start).
  if (worst->verdicts[p].status == VerdictStatus::kPass) return result.steps.back();
  return *worst;
}

int worst_tensor(const CaseResult& result, std::size_t p) {
  const std::vector<TensorResult>& tensors = deciding_step(result, p).tensors;
  int worst = -1;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorResult& t = tensors[i];
    if (!t.verdicts[p].passed()) return static_cast<int>(i);
    if (worst < 0 || t.comparison.norm_rel_diff > tensors[worst].comparison.norm_rel_diff) {
      worst = static_cast<int>(i);
    }
  }
  return worst;
}

}  // namespace tpcheck
