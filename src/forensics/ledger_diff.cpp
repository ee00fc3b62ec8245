// Trace ledgers (JSON), the grouped diff of two call streams, the call summary, and the
// diff of two run reports (include/tpcheck/ledger_diff.h).
#include "tpcheck/ledger_diff.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using nlohmann::json;

// cuBLASLt's type names as tpcheck's dtype names where there is one ("32F" → "f32").
std::string dtype_of(const std::string& type) {
  static const std::map<std::string, std::string> kNames = {
      {"64F", "f64"}, {"32F", "f32"}, {"16F", "f16"}, {"16BF", "bf16"},
      {"8F_E4M3", "f8e4m3"}, {"8F_E5M2", "f8e5m2"}};
  auto it = kNames.find(type);
  return it == kNames.end() ? type : it->second;
}

json layout_json(const CublasLtLayout& l) {
  return {{"type", l.type}, {"rows", l.rows}, {"cols", l.cols}, {"ld", l.ld},
          {"order", l.order}, {"batch_count", l.batch_count}, {"batch_stride", l.batch_stride}};
}

template <typename T>
T get(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  TPCHECK_CHECK_INPUT(it != j.end(), "{}: key '{}' missing", where, key);
  try {
    return it->get<T>();
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kInput, fmt::format("{}: key '{}' has the wrong type ({})", where, key,
                                               it->dump()));
  }
}

CublasLtLayout layout_from_json(const json& j, const std::string& where) {
  TPCHECK_CHECK_INPUT(j.is_object(), "{}: expected a layout object, got {}", where, j.dump());
  CublasLtLayout l;
  l.type = get<std::string>(j, "type", where);
  l.rows = get<std::int64_t>(j, "rows", where);
  l.cols = get<std::int64_t>(j, "cols", where);
  l.ld = get<std::int64_t>(j, "ld", where);
  l.order = get<std::string>(j, "order", where);
  l.batch_count = get<std::int64_t>(j, "batch_count", where);
  l.batch_stride = get<std::int64_t>(j, "batch_stride", where);
  return l;
}

std::string lines_text(const std::vector<std::int64_t>& lines, std::size_t count) {
  std::string s;
  for (std::size_t i = 0; i < lines.size(); ++i) s += fmt::format("{}{}", i ? "," : "", lines[i]);
  if (count > lines.size()) s += ",…";
  return s;
}

std::string impl_text(const CublasLtCall& c) {
  if (c.numerical_impl.empty()) return "";
  return c.math_class.empty() ? fmt::format("  [{}]", c.numerical_impl)
                              : fmt::format("  [{}: {}]", c.math_class, c.numerical_impl);
}

constexpr std::size_t kLinesShown = 4;

}  // namespace

json cublaslt_call_to_json(const CublasLtCall& c) {
  json lt = {{"compute_type", c.compute_type}, {"scale_type", c.scale_type},
             {"epilogue", c.epilogue}, {"algo_id", c.algo_id}, {"tile", c.tile},
             {"stages", c.stages}, {"split_k", c.split_k},
             {"reduction_scheme", c.reduction_scheme}, {"cta_swizzling", c.cta_swizzling},
             {"custom_option", c.custom_option}, {"cluster_shape", c.cluster_shape},
             {"numerical_impl", c.numerical_impl}, {"workspace_bytes", c.workspace_bytes},
             {"beta", c.beta},
             {"layouts", {{"a", layout_json(c.a)}, {"b", layout_json(c.b)},
                          {"c", layout_json(c.c)}, {"d", layout_json(c.d)}}}};
  lt["numerical_impl_flags"] = c.numerical_impl_flags ? json(*c.numerical_impl_flags) : json();
  return {{"m", c.m}, {"n", c.n}, {"k", c.k}, {"batch", c.d.batch_count},
          {"trans_a", c.trans_a}, {"trans_b", c.trans_b},
          {"dtypes", {dtype_of(c.a.type), dtype_of(c.b.type), dtype_of(c.d.type)}},
          {"epilogue", c.epilogue}, {"math_class", c.math_class},
          {"function", c.function}, {"pid", c.pid}, {"line", c.line}, {"cublaslt", std::move(lt)}};
}

CublasLtCall cublaslt_call_from_json(const json& j, const std::string& where) {
  TPCHECK_CHECK_INPUT(j.is_object(), "{}: expected a GEMM object, got {}", where, j.dump());
  CublasLtCall c;
  c.m = get<std::int64_t>(j, "m", where);
  c.n = get<std::int64_t>(j, "n", where);
  c.k = get<std::int64_t>(j, "k", where);
  c.trans_a = get<bool>(j, "trans_a", where);
  c.trans_b = get<bool>(j, "trans_b", where);
  c.epilogue = get<std::string>(j, "epilogue", where);
  c.math_class = get<std::string>(j, "math_class", where);
  c.function = get<std::string>(j, "function", where);
  c.pid = get<int>(j, "pid", where);
  c.line = get<std::int64_t>(j, "line", where);
  const json lt = get<json>(j, "cublaslt", where);
  const std::string lw = where + ".cublaslt";
  c.compute_type = get<std::string>(lt, "compute_type", lw);
  c.scale_type = get<std::string>(lt, "scale_type", lw);
  c.algo_id = get<int>(lt, "algo_id", lw);
  c.tile = get<std::string>(lt, "tile", lw);
  c.stages = get<std::string>(lt, "stages", lw);
  c.split_k = get<int>(lt, "split_k", lw);
  c.reduction_scheme = get<std::string>(lt, "reduction_scheme", lw);
  c.cta_swizzling = get<int>(lt, "cta_swizzling", lw);
  c.custom_option = get<int>(lt, "custom_option", lw);
  c.cluster_shape = get<std::string>(lt, "cluster_shape", lw);
  c.numerical_impl = get<std::string>(lt, "numerical_impl", lw);
  c.workspace_bytes = get<std::uint64_t>(lt, "workspace_bytes", lw);
  c.beta = get<std::string>(lt, "beta", lw);
  if (auto f = lt.find("numerical_impl_flags"); f != lt.end() && !f->is_null()) {
    c.numerical_impl_flags = get<std::uint64_t>(lt, "numerical_impl_flags", lw);
  }
  const json layouts = get<json>(lt, "layouts", lw);
  c.a = layout_from_json(get<json>(layouts, "a", lw), lw + ".layouts.a");
  c.b = layout_from_json(get<json>(layouts, "b", lw), lw + ".layouts.b");
  c.c = layout_from_json(get<json>(layouts, "c", lw), lw + ".layouts.c");
  c.d = layout_from_json(get<json>(layouts, "d", lw), lw + ".layouts.d");
  return c;
}

json trace_to_json(const TraceLedger& t) {
  json processes = json::array();
  std::size_t total = 0;
  for (const TraceProcess& p : t.processes) {
    json gemms = json::array();
    for (const CublasLtCall& c : p.calls) gemms.push_back(cublaslt_call_to_json(c));
    json problems = json::array();
    for (const CublasLtLogProblem& q : p.problems) {
      problems.push_back({{"line", q.line}, {"reason", q.reason}});
    }
    total += p.calls.size();
    processes.push_back({{"pid", p.pid}, {"log", p.log}, {"gemm_count", p.calls.size()},
                         {"gemms", std::move(gemms)}, {"malformed_lines", std::move(problems)}});
  }
  return {{"schema", kTraceSchema}, {"command", t.command}, {"exit_status", t.exit_status},
          {"environment", t.environment}, {"gemm_count", total},
          {"processes", std::move(processes)}};
}

TraceLedger trace_from_json(const json& j, const std::string& where) {
  TPCHECK_CHECK_INPUT(j.is_object() && j.value("schema", "") == kTraceSchema,
                      "{}: not a trace ledger (expected schema '{}')", where, kTraceSchema);
  TraceLedger t;
  t.command = get<std::vector<std::string>>(j, "command", where);
  t.exit_status = get<int>(j, "exit_status", where);
  t.environment = get<json>(j, "environment", where);
  const json processes = get<json>(j, "processes", where);
  TPCHECK_CHECK_INPUT(processes.is_array(), "{}: 'processes' is not an array", where);
  for (std::size_t p = 0; p < processes.size(); ++p) {
    const std::string pw = fmt::format("{}: processes[{}]", where, p);
    TraceProcess proc;
    proc.pid = get<int>(processes[p], "pid", pw);
    proc.log = get<std::string>(processes[p], "log", pw);
    const json gemms = get<json>(processes[p], "gemms", pw);
    TPCHECK_CHECK_INPUT(gemms.is_array(), "{}: 'gemms' is not an array", pw);
    for (std::size_t g = 0; g < gemms.size(); ++g) {
      proc.calls.push_back(cublaslt_call_from_json(gemms[g], fmt::format("{}.gemms[{}]", pw, g)));
    }
    t.processes.push_back(std::move(proc));
  }
  return t;
}

CublasLtDiff diff_cublaslt_calls(const std::vector<CublasLtCall>& a,
                                 const std::vector<CublasLtCall>& b) {
  CublasLtDiff diff;
  diff.a_calls = a.size();
  diff.b_calls = b.size();
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string>;
  std::map<Key, std::size_t> group_of;
  for (const CublasLtPair& p : align_cublaslt_calls(a, b)) {
    if (!p.a) {
      ++diff.only_b;
      continue;
    }
    if (!p.b) {
      ++diff.only_a;
      continue;
    }
    ++diff.paired;
    if (p.shape_differs) ++diff.paired_shape_differs;
    const CublasLtCall& x = a[*p.a];
    const CublasLtCall& y = b[*p.b];
    const bool class_differs = !x.math_class.empty() && !y.math_class.empty() &&
                               x.math_class != y.math_class;
    if (!p.algorithm_differs && !p.compute_differs && !class_differs) continue;
    const Key key{x.shape_text() + " " + x.kind_text(), y.shape_text() + " " + y.kind_text(),
                  x.algorithm_text(), y.algorithm_text(), x.compute_type + "|" + y.compute_type};
    auto [it, inserted] = group_of.try_emplace(key, diff.groups.size());
    if (inserted) {
      CublasLtDiffGroup g;
      g.a = x;
      g.b = y;
      g.shape_differs = p.shape_differs;
      g.algorithm_differs = p.algorithm_differs;
      g.compute_differs = p.compute_differs;
      g.class_differs = class_differs;
      diff.groups.push_back(std::move(g));
    }
    CublasLtDiffGroup& g = diff.groups[it->second];
    ++g.count;
    if (g.a_lines.size() < kLinesShown) {
      g.a_lines.push_back(x.line);
      g.b_lines.push_back(y.line);
    }
  }
  return diff;
}

std::string format_cublaslt_diff(const CublasLtDiff& d, std::string_view la, std::string_view lb) {
  std::string out = fmt::format(
      "A = {}: {} matmul calls\nB = {}: {} matmul calls\naligned {} pairs ({} with shapes "
      "different by whole factors, as a sharded run's are), {} only in A, {} only in B\n",
      la, d.a_calls, lb, d.b_calls, d.paired, d.paired_shape_differs, d.only_a, d.only_b);
  std::size_t differing = 0;
  for (const CublasLtDiffGroup& g : d.groups) differing += g.count;
  if (d.groups.empty()) {
    out += "every aligned call ran the same algorithm with the same compute type\n";
    return out;
  }
  out += fmt::format("{} aligned calls differ, in {} group{}:\n", differing, d.groups.size(), d.groups.size() == 1 ? "" : "s");
  for (const CublasLtDiffGroup& g : d.groups) {
    std::string what;
    if (g.algorithm_differs) what += "algorithm";
    if (g.compute_differs) what += what.empty() ? "compute type" : ", compute type";
    if (g.class_differs) what += what.empty() ? "numerical class" : ", numerical class";
    out += fmt::format("\n  {} call{}: {} differs ({})\n", g.count, g.count == 1 ? "" : "s", what,
                       g.a.kind_text());
    if (g.shape_differs || g.a.kind_text() != g.b.kind_text()) {
      out += fmt::format("    A {:<28} B {}\n", g.a.shape_text(), g.b.shape_text());
    } else {
      out += fmt::format("    shape {}\n", g.a.shape_text());
    }
    out += fmt::format("    A: {}{}{}  (lines {})\n", g.a.algorithm_text(),
                       g.compute_differs ? ", compute " + g.a.compute_type : "", impl_text(g.a),
                       lines_text(g.a_lines, g.count));
    out += fmt::format("    B: {}{}{}  (lines {})\n", g.b.algorithm_text(),
                       g.compute_differs ? ", compute " + g.b.compute_type : "", impl_text(g.b),
                       lines_text(g.b_lines, g.count));
  }
  return out;
}

json cublaslt_diff_to_json(const CublasLtDiff& d) {
  json groups = json::array();
  for (const CublasLtDiffGroup& g : d.groups) {
    groups.push_back({{"count", g.count}, {"shape_differs", g.shape_differs},
                      {"algorithm_differs", g.algorithm_differs},
                      {"compute_differs", g.compute_differs}, {"class_differs", g.class_differs},
                      {"a", cublaslt_call_to_json(g.a)}, {"b", cublaslt_call_to_json(g.b)},
                      {"a_lines", g.a_lines}, {"b_lines", g.b_lines}});
  }
  return {{"a_calls", d.a_calls}, {"b_calls", d.b_calls}, {"paired", d.paired},
          {"paired_shape_differs", d.paired_shape_differs}, {"only_a", d.only_a},
          {"only_b", d.only_b}, {"groups", std::move(groups)}};
}

std::string format_call_summary(const std::vector<CublasLtCall>& calls) {
  // (shape and kind, algorithm, class) → count, in order of first appearance.
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> index;
  struct Row {
    std::string shape, algorithm, klass;
    std::size_t count = 0;
  };
  std::vector<Row> rows;
  for (const CublasLtCall& c : calls) {
    const std::string shape = c.shape_text() + "  " + c.kind_text();
    const std::string klass = c.math_class.empty() ? "class unknown (--query on the GPU)"
                                                   : c.math_class + ": " + c.numerical_impl;
    auto [it, inserted] = index.try_emplace({shape, c.algorithm_text(), klass}, rows.size());
    if (inserted) rows.push_back({shape, c.algorithm_text(), klass, 0});
    ++rows[it->second].count;
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& x, const Row& y) { return x.count > y.count; });
  std::string out;
  for (const Row& r : rows) {
    out += fmt::format("  {:>6} × {}\n           {}  [{}]\n", r.count, r.shape, r.algorithm, r.klass);
  }
  return out;
}

namespace {

// A JSON value as a report line shows it: strings bare, the rest dumped.
std::string json_words(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Environment keys whose values differ (the date always differs: left out).
void diff_environment(const json& a, const json& b, std::vector<std::string>& out) {
  std::set<std::string> keys;
  for (const json* r : {&a, &b}) {
    for (auto it = (*r)["environment"].begin(); it != (*r)["environment"].end(); ++it) {
      keys.insert(it.key());
    }
  }
  for (const std::string& k : keys) {
    if (k == "date") continue;
    const json va = a["environment"].value(k, json()), vb = b["environment"].value(k, json());
    if (va != vb) {
      out.push_back(fmt::format("environment {}: {} → {}", k, json_words(va), json_words(vb)));
    }
  }
}

// One case's verdicts per policy that changed.
void diff_verdicts(const std::string& id, const json& ca, const json& cb,
                   std::vector<std::string>& out) {
  const json va = ca.value("verdicts", json::object()), vb = cb.value("verdicts", json::object());
  for (auto it = va.begin(); it != va.end(); ++it) {
    const std::string sa = it.value().value("status", "?");
    const std::string sb = vb.contains(it.key()) ? vb[it.key()].value("status", "?") : "absent";
    if (sa != sb) {
      out.push_back(
          fmt::format("case {}: {} verdict {} → {}{}", id, it.key(), sa, sb,
                      vb.contains(it.key()) ? " (" + vb[it.key()].value("reason", "") + ")" : ""));
    }
  }
}

// One case's GEMM sites whose single-vs-sharded class or algorithm difference changed.
void diff_gemm_sites(const std::string& id, const json& ca, const json& cb,
                     std::vector<std::string>& out) {
  auto sites = [](const json& c) {
    std::map<std::string, json> m;
    for (const json& d : c.value("gemm_class_diffs", json::array())) {
      m[fmt::format("{}#{}", d.value("site", ""), d.value("occurrence", 0))] = d;
    }
    return m;
  };
  const auto sa = sites(ca), sb = sites(cb);
  auto describe = [](const json& g) {
    std::string s = g.value("math_class", "?");
    if (g.contains("cublaslt")) {
      const json& lt = g["cublaslt"];
      s += fmt::format(" algo {} {} {} splitK {}", lt.value("algo_id", -1), lt.value("tile", ""),
                       lt.value("stages", ""), lt.value("split_k", 1));
    }
    return s;
  };
  for (const auto& [site, da] : sa) {
    auto it = sb.find(site);
    if (it == sb.end()) {
      out.push_back(
          fmt::format("case {}: GEMM {} no longer differs between single and sharded", id, site));
      continue;
    }
    for (const char* run : {"single", "sharded"}) {
      const std::string xa = describe(da.at(run)), xb = describe(it->second.at(run));
      if (xa != xb)
        out.push_back(fmt::format("case {}: GEMM {} {}: {} → {}", id, site, run, xa, xb));
    }
  }
  for (const auto& [site, db] : sb) {
    if (!sa.count(site)) {
      out.push_back(fmt::format("case {}: GEMM {} now differs between single ({}) and sharded ({})",
                                id, site, describe(db.at("single")), describe(db.at("sharded"))));
    }
  }
}

std::vector<std::string> diff_run_reports_unchecked(const json& a, const json& b) {
  for (const json* r : {&a, &b}) {
    TPCHECK_CHECK_INPUT(r->is_object() && r->value("schema", "") == names::kRunSchema,
                        "not a run report (expected schema 'tpcheck.run/1')");
    TPCHECK_CHECK_INPUT(r->contains("environment") && r->contains("cases"),
                        "run report lacks 'environment' or 'cases'");
  }
  std::vector<std::string> out;
  diff_environment(a, b, out);

  // Cases by id.
  std::map<std::string, const json*> cases_a, cases_b;
  for (const json& c : a["cases"]) cases_a[c.value("id", "")] = &c;
  for (const json& c : b["cases"]) cases_b[c.value("id", "")] = &c;
  for (const auto& [id, c] : cases_a) {
    if (!cases_b.count(id)) out.push_back(fmt::format("case {}: only in A", id));
  }
  for (const auto& [id, c] : cases_b) {
    if (!cases_a.count(id)) out.push_back(fmt::format("case {}: only in B", id));
  }
  for (const auto& [id, ca] : cases_a) {
    auto found = cases_b.find(id);
    if (found == cases_b.end()) continue;
    diff_verdicts(id, *ca, *found->second, out);
    diff_gemm_sites(id, *ca, *found->second, out);
  }
  const json sa = a.value("summary", json::object()), sb = b.value("summary", json::object());
  if (sa != sb) {
    out.push_back(fmt::format(
        "summary: {} passed, {} failed → {} passed, {} failed",
        json_words(sa.value("passed", json())), json_words(sa.value("failed", json())),
        json_words(sb.value("passed", json())), json_words(sb.value("failed", json()))));
  }
  return out;
}

}  // namespace

std::vector<std::string> diff_run_reports(const json& a, const json& b) {
  try {
    return diff_run_reports_unchecked(a, b);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kInput, fmt::format("malformed run report: {}", e.what()));
  }
}

}  // namespace tpcheck
