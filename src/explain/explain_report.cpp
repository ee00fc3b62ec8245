// explain_report.cpp — the console and JSON forms of a CaseExplanation.
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cmath>
#include <set>

#include "tpcheck/explain.h"

namespace tpcheck {
namespace {

nlohmann::json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? nlohmann::json("nan") : nlohmann::json(v > 0 ? "inf" : "-inf");
}

nlohmann::json gemm_json(const GemmRecord& r) {
  nlohmann::json j = {{"site", r.site},
                      {"rank", r.rank},
                      {"m", r.m},
                      {"n", r.n},
                      {"k", r.k},
                      {"batch", r.batch},
                      {"math_class", std::string(math_class_name(r.math_class))},
                      {"implementation", r.implementation}};
  if (r.cublaslt) {
    const CublasLtAlgoRecord& a = *r.cublaslt;
    j["cublaslt"] = {{"compute_type", a.compute_type},
                     {"algo_id", a.algo_id},
                     {"tile", a.tile_name},
                     {"stages", a.stages_name},
                     {"split_k", a.split_k},
                     {"reduction_scheme", a.reduction_scheme_name},
                     {"cta_swizzling", a.cta_swizzling},
                     {"custom_option", a.custom_option},
                     {"cluster_shape", a.cluster_shape_name},
                     {"numerical_impl_flags", a.numerical_impl_flags},
                     {"numerical_impl", a.numerical_impl}};
  }
  return j;
}

std::string gemm_line(const GemmRecord& r) {
  std::string s =
      fmt::format("{} m={} n={} k={}{}: {}", math_class_name(r.math_class), r.m, r.n, r.k,
                  r.batch > 1 ? fmt::format(" batch={}", r.batch) : "", r.implementation);
  if (r.cublaslt) {
    s += fmt::format(
        " [compute {}, algo {}, {}, {}, splitK {}, reduction {}, swizzle {}, custom {}]",
        r.cublaslt->compute_type, r.cublaslt->algo_id, r.cublaslt->tile_name,
        r.cublaslt->stages_name, r.cublaslt->split_k, r.cublaslt->reduction_scheme_name,
        r.cublaslt->cta_swizzling, r.cublaslt->custom_option);
  }
  return s;
}

std::string sci(double v) {
  return std::isfinite(v) ? fmt::format("{:.2e}", v) : fmt::format("{}", v);
}

}  // namespace

nlohmann::json explanation_to_json(const CaseExplanation& e) {
  nlohmann::json trail = nlohmann::json::array();
  for (const TrailEntry& t : e.trail) {
    nlohmann::json j = {{"order", t.order},
                        {"name", t.name},
                        {"op", t.op},
                        {"occurrence", t.occurrence},
                        {"comparable", t.comparable},
                        {"single_shape", t.single_shape},
                        {"sharded_shape", t.sharded_shape}};
    if (!t.note.empty()) j["note"] = t.note;
    if (t.comparable) {
      j["layout"] = t.layout;
      j["max_abs_diff"] = number(t.max_abs_diff);
      j["norm_rel_diff"] = number(t.norm_rel_diff);
      if (t.has_truth) {
        j["single_err"] = number(t.single_err);
        j["sharded_err"] = number(t.sharded_err);
        j["truth_rms"] = number(t.truth_rms);
        j["diverges"] = t.diverges;
      }
    }
    trail.push_back(std::move(j));
  }
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorExplanation& x : e.tensors) {
    nlohmann::json diffs = nlohmann::json::array();
    for (const GemmClassDiff& d : x.upstream_diffs) {
      diffs.push_back({{"site", d.site},
                       {"occurrence", d.occurrence},
                       {"class_differs", d.class_differs},
                       {"algorithm_differs", d.algorithm_differs},
                       {"single", gemm_json(d.single)},
                       {"sharded", gemm_json(d.sharded)}});
    }
    tensors.push_back({{"name", x.name},
                       {"kind", x.kind},
                       {"failing", x.failing},
                       {"norm_rel_diff", number(x.norm_rel_diff)},
                       {"max_abs_diff", number(x.max_abs_diff)},
                       {"single_err", number(x.single_err)},
                       {"sharded_err", number(x.sharded_err)},
                       {"first_divergence", x.first_divergence},
                       {"upstream_gemm_diffs", diffs},
                       {"best_site", x.best_site},
                       {"best_direction", x.best_direction},
                       {"best_removed", number(x.best_removed)},
                       {"cause", x.cause},
                       {"sentence", x.sentence}});
  }
  nlohmann::json cfs = nlohmann::json::array();
  for (const Counterfactual& c : e.counterfactuals) {
    nlohmann::json remaining = nlohmann::json::array(), removed = nlohmann::json::array();
    for (double v : c.remaining) remaining.push_back(number(v));
    for (double v : c.removed) removed.push_back(number(v));
    cfs.push_back({{"site", c.site},
                   {"forced_run", c.forced_run},
                   {"forced_to", c.forced_to},
                   {"remaining", remaining},
                   {"removed", removed}});
  }
  return {{"trail", trail},
          {"tensors", tensors},
          {"counterfactuals", cfs},
          {"reruns", e.reruns},
          {"seconds", e.seconds}};
}

void print_explanation(std::ostream& out, const CaseExplanation& e) {
  const CaseResult& r = e.result;
  fmt::print(out,
             "explain {} (tp {}): {} tensor{} explained, {} intermediates, {} re-run{}, {:.2f} s\n",
             r.spec.id, r.tp, e.tensors.size(), e.tensors.size() == 1 ? "" : "s", e.trail.size(),
             e.reruns, e.reruns == 1 ? "" : "s", e.seconds);

  std::set<int> firsts;
  for (const TensorExplanation& x : e.tensors) {
    if (x.first_divergence >= 0) firsts.insert(x.first_divergence);
  }
  fmt::print(
      out,
      "\nfirst divergence — every intermediate in execution order; errors are rms against truth;\n"
      "'!' marks a sharded error beyond what rounding explains (the truth policy's bound)\n");
  fmt::print(out, "  {:>4}  {:<52} {:<44} {:>10} {:>10} {:>10} {:>8}\n", "#", "op", "layout",
             "|sh-si|rel", "single", "sharded", "ratio");
  for (const TrailEntry& t : e.trail) {
    const std::string name =
        t.occurrence > 0 ? fmt::format("{} #{}", t.name, t.occurrence + 1) : t.name;
    if (!t.comparable) {
      fmt::print(out, "  {:>4}  {:<52} ({})\n", t.order, name, t.note);
      continue;
    }
    const std::string ratio =
        t.has_truth && t.single_err > 0 ? fmt::format("{:.3g}", t.sharded_err / t.single_err) : "-";
    fmt::print(out, "  {:>4}{} {:<52} {:<44} {:>10} {:>10} {:>10} {:>8}{}{}\n", t.order,
               t.diverges ? "!" : " ", name, t.layout, sci(t.norm_rel_diff),
               t.has_truth ? sci(t.single_err) : "-", t.has_truth ? sci(t.sharded_err) : "-", ratio,
               firsts.count(t.order) ? "  << first divergence" : "",
               t.note.empty() ? "" : "  (" + t.note + ")");
  }

  for (std::size_t k = 0; k < e.tensors.size(); ++k) {
    const TensorExplanation& x = e.tensors[k];
    fmt::print(out,
               "\n{} `{}` ({}): |sharded-single|/|single| {}, max |diff| {}; error vs truth (rms): "
               "single {}, sharded {}\n",
               x.failing ? "failing" : "worst", x.name, x.kind, sci(x.norm_rel_diff),
               sci(x.max_abs_diff), sci(x.single_err), sci(x.sharded_err));
    if (x.upstream_diffs.empty()) {
      fmt::print(out,
                 "  GEMM attribution: no GEMM upstream changes numerical class or algorithm\n");
    } else {
      fmt::print(out, "  GEMM attribution: upstream sites whose class or algorithm differs\n");
      for (const GemmClassDiff& d : x.upstream_diffs) {
        fmt::print(out, "    {}{}{}\n      single:  {}\n      sharded: {}\n", d.site,
                   d.occurrence > 0 ? fmt::format(" #{}", d.occurrence + 1) : "",
                   d.class_differs ? " (class differs)" : " (algorithm differs)",
                   gemm_line(d.single), gemm_line(d.sharded));
      }
    }
    bool any = false;
    for (const Counterfactual& c : e.counterfactuals) {
      if (!any)
        fmt::print(out, "  counterfactual re-runs (difference remaining, share removed):\n");
      any = true;
      fmt::print(out, "    force {:<7} {:<28} to {:<24} remaining {}  removed {:.1f}%\n",
                 c.forced_run, c.site, c.forced_to, sci(c.remaining[k]), 100 * c.removed[k]);
    }
    fmt::print(out, "  => {}\n", x.sentence);
  }
}

}  // namespace tpcheck
