// html_report.cpp — see tpcheck/html_report.h. The page is static HTML plus one inline
// script that reads the embedded JSON and draws every chart with Chart.js; each drawn
// canvas is marked data-drawn="1" and the body gets data-charts-drawn="<count>", which the
// headless-browser test reads.
#include "tpcheck/html_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tpcheck {
namespace {

constexpr int kMaxPlottedCases = 40;
constexpr std::size_t kMaxPointsFailing = 20000, kMaxPointsPassing = 2000, kLargestKept = 500;
constexpr int kHistogramBins = 40;

std::string escape_html(std::string_view s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}

// Points (|single|, |sharded − single|) with both coordinates > 0: the largest
// differences and an even sample of the rest.
nlohmann::json scatter_points(const ComparedTensor& t, std::size_t cap, std::int64_t& zeros) {
  const std::vector<double> s = t.single.to_f64(), sh = t.sharded.to_f64();
  std::vector<std::size_t> idx;
  zeros = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double x = std::abs(s[i]), y = std::abs(sh[i] - s[i]);
    if (x > 0 && y > 0 && std::isfinite(x) && std::isfinite(y)) {
      idx.push_back(i);
    } else {
      ++zeros;
    }
  }
  std::vector<std::size_t> keep;
  if (idx.size() <= cap) {
    keep = idx;
  } else {
    std::vector<std::size_t> by_diff = idx;
    const std::size_t top = std::min(kLargestKept, cap / 2);
    std::partial_sort(by_diff.begin(), by_diff.begin() + top, by_diff.end(),
                      [&](std::size_t a, std::size_t b) {
                        return std::abs(sh[a] - s[a]) > std::abs(sh[b] - s[b]);
                      });
    keep.assign(by_diff.begin(), by_diff.begin() + top);
    const std::size_t rest = cap - top;
    for (std::size_t j = 0; j < rest; ++j) keep.push_back(idx[j * idx.size() / rest]);
  }
  nlohmann::json pts = nlohmann::json::array();
  for (std::size_t i : keep) {
    pts.push_back({std::abs(s[i]), std::abs(sh[i] - s[i])});
  }
  return pts;
}

// Histograms of log10 |x − truth| for both runs on shared bins.
nlohmann::json error_histograms(const ComparedTensor& t) {
  const std::vector<double> s = t.single.to_f64(), sh = t.sharded.to_f64(), tr = t.truth.to_f64();
  std::vector<double> ls, lsh;
  std::int64_t zs = 0, zsh = 0;
  auto add = [](double e, std::vector<double>& out, std::int64_t& z) {
    if (e > 0 && std::isfinite(e))
      out.push_back(std::log10(e));
    else
      ++z;
  };
  for (std::size_t i = 0; i < tr.size(); ++i) {
    add(std::abs(s[i] - tr[i]), ls, zs);
    add(std::abs(sh[i] - tr[i]), lsh, zsh);
  }
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* v : {&ls, &lsh}) {
    for (double x : *v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  }
  nlohmann::json j = {{"single_zero", zs}, {"sharded_zero", zsh}};
  if (!(lo <= hi)) return j;
  if (hi - lo < 1e-9) {
    lo -= 0.5;
    hi += 0.5;
  }
  const double w = (hi - lo) / kHistogramBins;
  std::vector<std::int64_t> cs(kHistogramBins, 0), csh(kHistogramBins, 0);
  auto bin = [&](double x) { return std::min(kHistogramBins - 1, static_cast<int>((x - lo) / w)); };
  for (double x : ls) ++cs[bin(x)];
  for (double x : lsh) ++csh[bin(x)];
  nlohmann::json edges = nlohmann::json::array();
  for (int b = 0; b < kHistogramBins; ++b) edges.push_back(lo + (b + 0.5) * w);
  j["centers_log10"] = edges;
  j["single"] = cs;
  j["sharded"] = csh;
  return j;
}

nlohmann::json tensor_plot(const ComparedTensor& t, const TensorResult& r, std::size_t chosen,
                           bool failing) {
  std::int64_t zeros = 0;
  nlohmann::json j = {
      {"name", t.name},
      {"kind", t.kind},
      {"verdict", std::string(verdict_status_name(r.verdicts[chosen].status))},
      {"reason", r.verdicts[chosen].reason},
      {"points", scatter_points(t, failing ? kMaxPointsFailing : kMaxPointsPassing, zeros)},
      {"numel", t.single.numel()},
      {"histograms", error_histograms(t)}};
  j["points_dropped_zero"] = zeros;
  if (r.comparison.has_tolerance) {
    j["atol"] = r.comparison.tolerance.atol;
    j["rtol"] = r.comparison.tolerance.rtol;
  }
  return j;
}

nlohmann::json explanation_plot(const CaseExplanation& e) {
  nlohmann::json names = nlohmann::json::array(), single = nlohmann::json::array(),
                 sharded = nlohmann::json::array(), diverges = nlohmann::json::array();
  for (const TrailEntry& t : e.trail) {
    if (!t.comparable || !t.has_truth) continue;
    const double scale = t.truth_rms > 0 ? t.truth_rms : 1.0;
    names.push_back(t.occurrence > 0 ? fmt::format("{} #{}", t.name, t.occurrence + 1) : t.name);
    single.push_back(finite_or_null(t.single_err / scale));
    sharded.push_back(finite_or_null(t.sharded_err / scale));
    diverges.push_back(t.diverges);
  }
  nlohmann::json sentences = nlohmann::json::array();
  for (const TensorExplanation& x : e.tensors) sentences.push_back(x.name + ": " + x.sentence);
  return {{"names", names},
          {"single", single},
          {"sharded", sharded},
          {"diverges", diverges},
          {"sentences", sentences}};
}

// The page's script: draws the charts from the embedded JSON (no network, no animation).
constexpr const char* kPageScript = R"js(
(function () {
  const data = JSON.parse(document.getElementById('tpcheck-data').textContent);
  let drawn = 0;
  const base = { animation: false, responsive: false, plugins: { legend: { display: true } } };
  function canvas(parent, title) {
    const box = document.createElement('div'); box.className = 'chart';
    const h = document.createElement('h4'); h.textContent = title; box.appendChild(h);
    const c = document.createElement('canvas'); c.width = 520; c.height = 340; box.appendChild(c);
    parent.appendChild(box); return c;
  }
  // Log axes: label the powers of ten only, as 1e-5.
  const logTicks = { callback: function (v) { const e = Math.log10(v); return Math.abs(e - Math.round(e)) < 1e-9 ? '1e' + Math.round(e) : ''; } };
  function done(c) { c.dataset.drawn = '1'; drawn++; }
  for (const cs of data.cases) {
    const sec = document.getElementById('case-' + cs.index);
    if (cs.explanation) {
      const ex = cs.explanation;
      const c = canvas(sec, 'first divergence: rms error against truth / truth rms, every intermediate in execution order');
      c.width = 1060;
      new Chart(c, { type: 'line', data: { labels: ex.names, datasets: [
          { label: 'single', data: ex.single, borderColor: '#1f77b4', pointRadius: 2 },
          { label: 'sharded', data: ex.sharded, borderColor: '#d62728', pointRadius: ex.diverges.map(d => d ? 5 : 2),
            pointBackgroundColor: ex.diverges.map(d => d ? '#d62728' : '#ffffff') } ] },
        options: Object.assign({}, base, { scales: { y: { type: 'logarithmic', ticks: logTicks, title: { display: true, text: 'relative error' } },
          x: { ticks: { autoSkip: true, maxRotation: 60, font: { size: 9 } } } } }) });
      done(c);
    }
    for (const t of cs.tensors) {
      const row = document.createElement('div'); row.className = 'row'; sec.appendChild(row);
      const xs = t.points.map(p => p[0]);
      const lo = xs.length ? Math.min(...xs) : 1e-6, hi = xs.length ? Math.max(...xs) : 1;
      const sets = [{ label: '|sharded − single| (' + t.points.length + ' of ' + t.numel + ')', data: t.points.map(p => ({ x: p[0], y: p[1] })),
                      pointRadius: 1.5, backgroundColor: 'rgba(31,119,180,0.5)' }];
      if (t.atol !== undefined) {
        sets.push({ label: 'te atol = ' + t.atol, type: 'line', data: [{ x: lo, y: t.atol }, { x: hi, y: t.atol }],
                    borderColor: '#2ca02c', pointRadius: 0, borderDash: [6, 3] });
        sets.push({ label: 'te rtol·|single|, rtol = ' + t.rtol, type: 'line', data: [{ x: lo, y: t.rtol * lo }, { x: hi, y: t.rtol * hi }],
                    borderColor: '#ff7f0e', pointRadius: 0, borderDash: [6, 3] });
      }
      const c1 = canvas(row, t.name + ' (' + t.kind + ', ' + t.verdict + '): |sharded − single| vs |single|');
      new Chart(c1, { type: 'scatter', data: { datasets: sets }, options: Object.assign({}, base, { scales: {
          x: { type: 'logarithmic', ticks: logTicks, title: { display: true, text: '|single|' } },
          y: { type: 'logarithmic', ticks: logTicks, title: { display: true, text: '|sharded − single|' } } } }) });
      done(c1);
      const h = t.histograms;
      if (h.centers_log10) {
        const c2 = canvas(row, t.name + ': error against truth, log10 |run − truth|');
        new Chart(c2, { type: 'bar', data: { labels: h.centers_log10.map(v => v.toFixed(2)), datasets: [
            { label: 'single' + (h.single_zero ? ' (+' + h.single_zero + ' exact)' : ''), data: h.single, backgroundColor: 'rgba(31,119,180,0.6)' },
            { label: 'sharded' + (h.sharded_zero ? ' (+' + h.sharded_zero + ' exact)' : ''), data: h.sharded, backgroundColor: 'rgba(214,39,40,0.6)' } ] },
          options: Object.assign({}, base, { scales: { x: { title: { display: true, text: 'log10 |error|' } }, y: { title: { display: true, text: 'elements' } } } }) });
        done(c2);
      }
    }
  }
  document.body.dataset.chartsDrawn = String(drawn);
})();
)js";

// Which cases get plots: failing ones first, then the others, at most kMaxPlottedCases.
std::vector<std::size_t> plotted_cases(const std::vector<CaseResult>& results, std::size_t chosen) {
  std::vector<std::size_t> order(results.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_partition(order.begin(), order.end(),
                        [&](std::size_t i) { return !results[i].verdicts[chosen].passed(); });
  if (order.size() > kMaxPlottedCases) order.resize(kMaxPlottedCases);
  return order;
}

// The plotted cases' data for the page script, as JSON safe inside a script element.
std::string plot_data(const std::vector<std::size_t>& order, const std::vector<CaseResult>& results,
                      const std::vector<CaseRun>& runs, std::size_t chosen,
                      const std::vector<const CaseExplanation*>& explanations) {
  nlohmann::json data = {{"cases", nlohmann::json::array()}};
  for (std::size_t i : order) {
    if (i >= runs.size()) continue;
    const CaseResult& r = results[i];
    const bool case_fails = !r.verdicts[chosen].passed();
    nlohmann::json c = {{"index", i}, {"tensors", nlohmann::json::array()}};
    // The step that decides the case (the first failing one).
    const StepResult& step = deciding_step(r, chosen);
    const std::vector<ComparedTensor>& compared = runs[i].steps[step.step - 1];
    if (r.steps.size() > 1) c["step"] = step.step;
    std::vector<int> plotted;
    for (std::size_t t = 0; t < step.tensors.size() && plotted.size() < 3; ++t) {
      if (!step.tensors[t].verdicts[chosen].passed()) plotted.push_back(static_cast<int>(t));
    }
    if (plotted.empty()) {
      const int w = worst_tensor(r, chosen);
      if (w >= 0) plotted.push_back(w);
    }
    for (int t : plotted) {
      c["tensors"].push_back(tensor_plot(compared[t], step.tensors[t], chosen, case_fails));
    }
    if (i < explanations.size() && explanations[i] != nullptr)
      c["explanation"] = explanation_plot(*explanations[i]);
    data["cases"].push_back(std::move(c));
  }
  std::string json = data.dump();
  // "</" inside a script element would end it.
  for (std::size_t p = json.find("</"); p != std::string::npos; p = json.find("</", p + 2))
    json.replace(p, 2, "<\\/");
  return json;
}

// The document's head and the run's header: settings, notes and the pass/fail count.
void write_header(std::ostream& out, const std::vector<CaseResult>& results,
                  const RunSettings& settings) {
  const std::size_t chosen = settings.chosen_policy;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      // Nothing may be fetched: scripts and styles are inline, images data: only.
      << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
         "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
      << "<title>tpcheck report: " << escape_html(settings.suite) << ", tp " << settings.tp
      << "</title>\n"
      << "<style>body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:"
         "collapse;font-size:13px}"
         "td,th{border:1px solid #ccc;padding:3px "
         "6px;text-align:left}.pass{color:#2a7d2a}.fail{color:#c22;font-weight:bold}"
         ".warning{color:#b80}.row{display:flex;flex-wrap:wrap}.chart{margin:0.5em 1em 0.5em 0}"
         "h4{margin:0.2em "
         "0;font-size:13px;font-weight:normal}.sentence{background:#f4f4f4;padding:0.5em;margin:0."
         "5em 0}"
         "</style>\n</head><body>\n";
  const std::string policy = std::string(policy_name(settings.policies[chosen].kind));
  out << fmt::format(
      "<h1>tpcheck: suite {}, tp {}</h1>\n<p>backend {} | seed {} | cpu-gemm {} | policy "
      "<b>{}</b>{}{}</p>\n",
      escape_html(settings.suite), settings.tp, escape_html(settings.backend), settings.seed,
      escape_html(settings.cpu_gemm), policy,
      settings.recipe == "none" ? "" : " | recipe <b>" + escape_html(settings.recipe) + "</b>",
      settings.mutation == "none" ? ""
                                  : " | mutation <b>" + escape_html(settings.mutation) + "</b>");
  for (const std::string& n : settings.notes) out << "<p>note: " << escape_html(n) << "</p>\n";
  int failed = 0;
  for (const CaseResult& r : results) failed += r.verdicts[chosen].passed() ? 0 : 1;
  out << fmt::format("<p>{} passed, {} failed</p>\n", results.size() - failed, failed);
}

// The table of every case: its verdicts and its deciding tensor.
void write_case_table(std::ostream& out, const std::vector<CaseResult>& results,
                      const RunSettings& settings) {
  const std::size_t chosen = settings.chosen_policy;
  out << "<table id=\"cases\"><tr><th>case</th>";
  for (const Policy& p : settings.policies) out << "<th>" << policy_name(p.kind) << "</th>";
  out << "<th>deciding tensor</th><th>max |diff|</th><th>norm-wise</th></tr>\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const CaseResult& r = results[i];
    out << "<tr><td><a href=\"#case-" << i << "\">" << escape_html(r.spec.id) << "</a></td>";
    for (const Verdict& v : r.verdicts) {
      const std::string s(verdict_status_name(v.status));
      out << "<td class=\"" << s << "\" title=\"" << escape_html(v.reason) << "\">" << s << "</td>";
    }
    const int w = worst_tensor(r, chosen);
    if (w >= 0) {
      const StepResult& step = deciding_step(r, chosen);
      const TensorComparison& c = step.tensors[w].comparison;
      const std::string at = r.steps.size() > 1 ? fmt::format(" (step {})", step.step) : "";
      out << fmt::format("<td>{}{}</td><td>{:.3g}</td><td>{:.3g}</td>",
                         escape_html(step.tensors[w].name), at, c.max_abs_diff, c.norm_rel_diff);
    } else {
      out << "<td>-</td><td></td><td></td>";
    }
    out << "</tr>\n";
  }
  out << "</table>\n";
}

// A section per plotted case: its verdict and reason, and explain's sentences (or how to
// get them).
void write_case_sections(std::ostream& out, const std::vector<std::size_t>& order,
                         const std::vector<CaseResult>& results, const std::vector<CaseRun>& runs,
                         std::size_t chosen,
                         const std::vector<const CaseExplanation*>& explanations) {
  for (std::size_t i : order) {
    if (i >= runs.size()) continue;
    const CaseResult& r = results[i];
    out << "<section id=\"case-" << i << "\"><h2>" << escape_html(r.spec.id) << ": "
        << verdict_status_name(r.verdicts[chosen].status) << "</h2>\n<p>"
        << escape_html(r.verdicts[chosen].reason) << "</p>\n";
    if (i < explanations.size() && explanations[i] != nullptr) {
      for (const TensorExplanation& x : explanations[i]->tensors) {
        out << "<p class=\"sentence\"><b>" << escape_html(x.name)
            << "</b>: " << escape_html(x.sentence) << "</p>\n";
      }
    } else {
      out << "<p>The first-divergence chart needs the recorded intermediates: <code>tpcheck "
             "explain "
          << escape_html(r.spec.id) << " --html FILE</code>.</p>\n";
    }
    out << "</section>\n";
  }
}

}  // namespace

void write_html_report(std::ostream& out, const std::vector<CaseResult>& results,
                       const std::vector<CaseRun>& runs, const RunSettings& settings,
                       const std::vector<const CaseExplanation*>& explanations) {
  const std::size_t chosen = settings.chosen_policy;
  const std::vector<std::size_t> order = plotted_cases(results, chosen);
  const std::string json = plot_data(order, results, runs, chosen, explanations);
  write_header(out, results, settings);
  write_case_table(out, results, settings);
  write_case_sections(out, order, results, runs, chosen, explanations);
  out << "<script>" << chartjs_source() << "</script>\n";
  out << "<script type=\"application/json\" id=\"tpcheck-data\">" << json << "</script>\n";
  out << "<script>" << kPageScript << "</script>\n</body></html>\n";
}

}  // namespace tpcheck
