// tpcheck/html_report.h — one self-contained HTML file for a run or an explanation.
//
// The file inlines Chart.js (third_party/chartjs, MIT; no network needed to view it) and
// its data as JSON, and holds: the settings, the case table (every policy's verdict, the
// deciding tensor), and for each failing tensor — or a passing case's worst tensor —
//   * a scatter of |sharded − single| against |single| on log axes, with the te policy's
//     atol (horizontal) and rtol·|single| (diagonal) lines; at most 20,000 points per
//     tensor (2,000 for a passing case): the 500 largest differences, the rest evenly
//     spaced; zeros cannot sit on a log axis and are counted instead;
//   * histograms of log10 |run − truth| for the single and the sharded run;
//   * with an explanation: the first-divergence chart (rms error against truth of every
//     intermediate, single and sharded, relative to the truth's rms, in execution order)
//     and the closing sentences.
// Plots are drawn for at most 40 cases (failing cases first); the table lists all.
// Thread safety: pure function of its arguments.
#pragma once

#include <ostream>
#include <string_view>
#include <vector>

#include "tpcheck/explain.h"
#include "tpcheck/report.h"

namespace tpcheck {

// `runs[i]` holds `results[i]`'s tensors (empty: table only); `explanations[i]`, when
// given and not null, adds the explanation of results[i].
void write_html_report(std::ostream& out, const std::vector<CaseResult>& results,
                       const std::vector<CaseRun>& runs, const RunSettings& settings,
                       const std::vector<const CaseExplanation*>& explanations);

// The minified Chart.js the report inlines (generated from third_party/chartjs).
std::string_view chartjs_source();

}  // namespace tpcheck
