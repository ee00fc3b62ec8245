// explain_command.cpp — `tpcheck explain CASE`: one case run with every intermediate recorded,
// GEMM class changes attributed and proved by forced re-runs, and a sentence that says
// why the sharded run differs (tpcheck/explain.h).
#include "cli/explain_command.h"

#include <fmt/ostream.h>

#include <fstream>
#include <iostream>

#include "cli/run_flags.h"
#include "tpcheck/error.h"
#include "tpcheck/explain.h"
#include "tpcheck/html_report.h"
#include "tpcheck/names.h"
#include "tpcheck/run_suite.h"

namespace tpcheck {

CLI::App* add_explain_command(CLI::App& app, RunOptions& options, std::string& case_id) {
  CLI::App* cmd = app.add_subcommand(
      "explain",
      "why does the sharded run differ? first divergence, GEMM attribution, forced re-runs");
  cmd->add_option("case", case_id,
                  "case id (see `tpcheck list`; a regex matching exactly one case works too)")
      ->required();
  add_run_flags(cmd, options, kForExplain);
  cmd->get_option("--json")->description(
      "write the explanation as JSON (schema tpcheck.explain/1) here");
  return cmd;
}

namespace {

// The case named `id`: an exact id, else the one case a regex matches.
SuiteCase find_case(const Suite& suite, const std::string& id) {
  for (const SuiteCase& c : suite.cases) {
    if (c.id == id) return c;
  }
  const std::vector<SuiteCase> matches = select_cases(suite, id, "case");
  TPCHECK_CHECK_INPUT(
      matches.size() == 1,
      "explain: '{}' is not a case id and matches {} cases of suite '{}' (first: {}); "
      "give one id from `tpcheck list`",
      id, matches.size(), suite.name, matches.front().id);
  return matches.front();
}

}  // namespace

int explain_command(const RunOptions& options, const std::string& case_id) {
  PreparedRun prepared = prepare_run(options);
  TPCHECK_CHECK_INPUT(!prepared.config.execution.one_process_per_rank,
                      "tpcheck explain runs every rank in one process; start it without mpirun / "
                      "torchrun (--comm emulated runs the sharded shapes on one GPU)");
  TPCHECK_CHECK_INPUT(options.tp >= 2,
                      "tpcheck explain compares a sharded run: --tp must be >= 2, got {}",
                      options.tp);
  const SuiteCase c = find_case(prepared.suite, case_id);
  std::ofstream json_file, html_file;
  if (options.json) {
    json_file.open(*options.json);
    TPCHECK_CHECK_INPUT(json_file.good(), "cannot write --json file '{}'", *options.json);
  }
  if (options.html) {
    html_file.open(*options.html);
    TPCHECK_CHECK_INPUT(html_file.good(), "cannot write --html file '{}'", *options.html);
  }
  check_case(c, prepared.config);
  set_cpu_gemm_threads(1);

  ExplainOptions explain_options;
  explain_options.chosen_policy = prepared.settings.chosen_policy;
  const CaseExplanation e = explain_case(c, prepared.config, prepared.judge, explain_options);

  print_header(std::cout, prepared.settings, 1);
  print_case(std::cout, e.result, prepared.settings);
  print_explanation(std::cout, e);
  if (json_file.is_open()) {
    nlohmann::json j = {{"schema", names::kExplainSchema},
                        {"run", run_to_json({e.result}, prepared.settings)},
                        {"explanation", explanation_to_json(e)}};
    json_file << j.dump(1) << "\n";
  }
  if (html_file.is_open()) {
    write_html_report(html_file, {e.result}, {e.run}, prepared.settings, {&e});
  }
  return e.result.verdicts[prepared.settings.chosen_policy].passed() ? 0 : 1;
}

}  // namespace tpcheck
