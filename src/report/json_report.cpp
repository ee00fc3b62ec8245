// JSON report, schema "tpcheck.run/1". Keys are snake_case and reuse the console's names.
#include <ctime>

#include "tpcheck/device.h"
#include "tpcheck/names.h"
#include "tpcheck/report.h"

namespace tpcheck {
namespace {

using nlohmann::json;

// Per step: the sharded ranks' replicated quantizer state (StepResult::replicated_state).
json replicated_state_json(const std::vector<StepResult>& steps) {
  json out = json::array();
  for (const StepResult& s : steps) {
    out.push_back({{"step", s.step},
                   {"entries", s.replicated_state.entries},
                   {"consistent", s.replicated_state.consistent()},
                   {"difference", s.replicated_state.difference}});
  }
  return out;
}

// JSON has no NaN/Inf: they become strings so the file stays valid.
json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

json truth_error_json(const TruthError& e) {
  return {{"max_abs", number(e.max_abs)}, {"argmax", e.argmax}, {"rms", number(e.rms)}};
}

json comparison_json(const TensorComparison& c) {
  json j = {
      {"shape", c.shape},
      {"dtype", dtype_name(c.dtype)},
      {"numel", c.numel},
      {"max_abs_diff", number(c.max_abs_diff)},
      {"argmax", c.argmax},
      {"argmax_index", c.argmax_index},
      {"sharded_value", number(c.sharded_value)},
      {"single_value", number(c.single_value)},
      {"rel_at_max", number(c.rel_at_max)},
      {"norm_rel_diff", number(c.norm_rel_diff)},
      {"count_over_allclose", c.count_over_allclose},
      {"count_bits_differ", c.count_bits_differ},
      {"sharded_nonfinite", c.sharded_nan + c.sharded_inf},
      {"single_nonfinite", c.single_nan + c.single_inf},
  };
  if (c.has_tolerance) j["tolerance"] = {{"rtol", c.tolerance.rtol}, {"atol", c.tolerance.atol}};
  if (c.has_truth) {
    j["truth"] = {{"rms", number(c.truth_rms)},
                  {"max_abs", number(c.truth_max_abs)},
                  {"single_error", truth_error_json(c.single_vs_truth)},
                  {"sharded_error", truth_error_json(c.sharded_vs_truth)},
                  {"scale_shift", number(c.scale_shift)},
                  {"scale_shift_sigma", number(c.scale_shift_sigma)},
                  {"single_scale_error", number(c.single_scale_error)},
                  {"single_error_offset_share", number(c.single_error_offset_share)},
                  {"variation", number(c.truth_variation)}};
    if (c.has_rounding_noise) {
      j["truth"]["rounding_noise"] = {{"rms", number(c.rounding_noise_rms)},
                                      {"max_abs", number(c.rounding_noise_max_abs)}};
    }
  }
  return j;
}

json verdicts_json(const std::vector<Verdict>& verdicts, const RunSettings& settings) {
  json j = json::object();
  for (std::size_t p = 0; p < verdicts.size(); ++p) {
    j[std::string(policy_name(settings.policies[p].kind))] = {
        {"status", verdict_status_name(verdicts[p].status)}, {"reason", verdicts[p].reason}};
  }
  return j;
}

json gemm_json(const GemmRecord& r) {
  json j = {{"m", r.m}, {"n", r.n}, {"k", r.k}, {"batch", r.batch},
            {"rank", r.rank}, {"trans_a", r.trans_a}, {"trans_b", r.trans_b},
            {"dtypes", {dtype_name(r.a_dtype), dtype_name(r.b_dtype), dtype_name(r.c_dtype)}},
            {"epilogue", r.epilogue}, {"math_class", math_class_name(r.math_class)},
            {"implementation", r.implementation}};
  if (r.cublaslt) {
    const CublasLtAlgoRecord& a = *r.cublaslt;
    j["cublaslt"] = {{"compute_type", a.compute_type}, {"scale_type", a.scale_type},
                     {"epilogue", a.epilogue}, {"algo_id", a.algo_id},
                     {"tile", a.tile_name}, {"stages", a.stages_name}, {"split_k", a.split_k},
                     {"reduction_scheme", a.reduction_scheme_name},
                     {"cta_swizzling", a.cta_swizzling}, {"custom_option", a.custom_option},
                     {"cluster_shape", a.cluster_shape_name},
                     {"numerical_impl_flags", a.numerical_impl_flags},
                     {"numerical_impl", a.numerical_impl},
                     {"workspace_bytes", a.workspace_bytes},
                     {"workspace_limit", a.workspace_limit},
                     {"alignments", {a.alignment_a, a.alignment_b, a.alignment_c, a.alignment_d}},
                     {"waves_count", a.waves_count}, {"impl_mask", a.impl_mask}};
    if (!a.scale_mode.empty()) {
      j["cublaslt"]["scale_mode"] = a.scale_mode;
      j["cublaslt"]["fast_accumulation"] = a.fast_accumulation;
    }
  }
  return j;
}

json tensors_json(const std::vector<TensorResult>& results, const RunSettings& settings) {
  json tensors = json::array();
  for (const TensorResult& t : results) {
    tensors.push_back({{"name", t.name},
                       {"kind", t.kind},
                       {"index", t.index},
                       {"statistics", comparison_json(t.comparison)},
                       {"verdicts", verdicts_json(t.verdicts, settings)}});
  }
  return tensors;
}

}  // namespace

json case_to_json(const CaseResult& result, const RunSettings& settings) {
  json diffs = json::array();
  for (const GemmClassDiff& d : result.gemm_class_diffs) {
    diffs.push_back({{"site", d.site}, {"occurrence", d.occurrence},
                     {"class_differs", d.class_differs},
                     {"algorithm_differs", d.algorithm_differs},
                     {"single", gemm_json(d.single)}, {"sharded", gemm_json(d.sharded)}});
  }
  json collectives = json::array();
  for (const CommRecord& r : result.collectives) {
    collectives.push_back({{"kind", comm_kind_name(r.kind)}, {"dtype", dtype_name(r.dtype)},
                           {"shape", r.shape}, {"bytes", r.bytes}, {"algorithm", r.algorithm}});
  }
  json truth_model = json::object();
  for (const Policy& p : result.policies) {
    if (p.kind != PolicyKind::kTruth) continue;
    truth_model = {{"multiplier", p.truth.multiplier},
                   {"floor_factor", p.truth.floor_factor},
                   {"unit_roundoff", p.truth.unit_roundoff ? json(*p.truth.unit_roundoff) : json()},
                   {"reduction_length", p.truth.reduction_length},
                   {"tp_size", p.truth.tp_size},
                   {"scale_z", p.truth.scale_z},
                   {"scale_min_shift", p.truth.scale_min_shift},
                   {"scale_min_variation", p.truth.scale_min_variation},
                   {"scale_max_single", p.truth.scale_max_single},
                   {"format_unit_roundoff", p.truth.format_unit_roundoff},
                   {"one_sample_share", p.truth.one_sample_share}};
  }
  json j = {{"id", result.spec.id},
            {"module", result.spec.module},
            {"variant", result.spec.variant},
            {"options", result.spec.options},
            {"tp", result.tp},
            {"sequence_parallel", result.spec.sequence_parallel},
            {"dtype", dtype_name(result.spec.dtype)},
            {"input_shape", result.spec.input_shape},
            {"verdicts", verdicts_json(result.verdicts, settings)},
            {"truth_model", std::move(truth_model)},
            {"gemm_class_diffs", std::move(diffs)},
            {"collectives", std::move(collectives)},
            {"gemm_count", {{"single", result.gemm_count_single}, {"sharded_rank0", result.gemm_count_sharded}}},
            {"replicated_state", replicated_state_json(result.steps)},
            {"seconds", result.seconds}};
  if (result.steps.size() == 1) {
    j["tensors"] = tensors_json(result.steps.front().tensors, settings);
  } else {
    // Several training steps: each step's verdicts and tensors; the case's verdicts above
    // are its worst step's.
    json steps = json::array();
    for (const StepResult& s : result.steps) {
      steps.push_back({{"step", s.step},
                       {"verdicts", verdicts_json(s.verdicts, settings)},
                       {"tensors", tensors_json(s.tensors, settings)}});
    }
    j["steps"] = std::move(steps);
  }
  return j;
}

json run_to_json(const std::vector<CaseResult>& results, const RunSettings& settings) {
  json cases = json::array();
  for (const CaseResult& r : results) cases.push_back(case_to_json(r, settings));
  const Summary s = summarize(results, settings.chosen_policy);
  const DeviceInfo device = query_devices();
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  json compare = json::object();
  if (settings.compare.rtol) compare["rtol"] = *settings.compare.rtol;
  if (settings.compare.atol) compare["atol"] = *settings.compare.atol;
  json environment = {{"tpcheck_version", TPCHECK_VERSION},
                     {"compiler", __VERSION__},
                     {"date", date},
                     {"backend", settings.backend},
                     {"devices", device.description},
                     {"cpu_gemm_library", cpu_gemm_library()},
                     {"cpu_gemm_fingerprint", cpu_gemm_fingerprint()},
                     {"cpu_gemm_threads", cpu_gemm_threads()},
                     {"suite", settings.suite},
                     {"tp", settings.tp},
                     {"seed", settings.seed},
                     {"mutation", settings.mutation},
                     {"recipe", settings.recipe},
                     {"steps", settings.steps},
                     {"cpu_gemm", settings.cpu_gemm},
                     {"policy", policy_name(settings.policies[settings.chosen_policy].kind)},
                     {"tolerance_override", compare},
                     {"notes", settings.notes}};
  environment.update(settings.environment);
  return {{"schema", names::kRunSchema},
          {"environment", std::move(environment)},
          {"cases", std::move(cases)},
          {"summary", {{"passed", s.passed}, {"failed", s.failed},
                       {"policy", policy_name(settings.policies[settings.chosen_policy].kind)}}}};
}

}  // namespace tpcheck
