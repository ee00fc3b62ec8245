// run_options.cpp — see run_options.h.
#include "cli/run_options.h"

#include <charconv>
#include <regex>

#include "tpcheck/error.h"

namespace tpcheck {

void add_size_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--hidden", a.sizes.hidden, "hidden size (default 64)");
  cmd->add_option("--ffn", a.sizes.ffn, "FFN hidden size (default 32)");
  cmd->add_option("--heads", a.sizes.heads,
                  "attention heads (default 4, raised to --tp if larger)");
  cmd->add_option("--seq", a.sizes.seq, "sequence length per rank (default 16)");
  cmd->add_option("--batch", a.sizes.batch, "batch size (default 16)");
}

void add_case_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--backend", a.execution.backend,
                  "auto (default: cuda when a GPU is present, else cpu), cpu or cuda");
  cmd->add_option("--tf32", a.execution.tf32,
                  "cuda: f32 GEMMs may use TF32 (on, default) or not (off)");
  cmd->add_option("--gemm-impl", a.execution.gemm_impl,
                  "cuda: cuBLASLt implementations allowed: any (default), tensor-core or fma");
  cmd->add_option(
      "--comm", a.execution.comm,
      "cuda: auto (default: NCCL when there is a GPU per rank, else emulated), emulated or nccl");
  cmd->add_option(
      "--comm-order", a.execution.comm_order,
      "cuda emulated collectives: nccl-ring (default: NCCL's ring order and rounding) or rank");
  cmd->add_option("--attention", a.execution.attention,
                  "cuda: unfused (default: the reference's unfused rounding points) or fused "
                  "(cuDNN's flash attention for f16/bf16 with no mask or causal; the others "
                  "stay unfused, the ledger says which ran)");
  cmd->add_option("--tp", a.tp, "tensor-parallel size (thread ranks on the CPU)");
  // Not in --help: a testing hook for the fault tests (execution.h, inject_failure).
  cmd->add_option("--inject-failure", a.execution.inject_failure,
                  "testing: RANK@RUN makes rank RANK throw at the start of the RUN-th sharded run")
      ->group("");
  cmd->add_option("--suite", a.suite,
                  "full (default: every sharded path) or te (the reference's 118-case matrix)");
  cmd->add_option("--policy", a.policy, "te, allclose, truth (default) or bitwise");
  cmd->add_option("--seed", a.seed, "seed of parameters, inputs and targets");
  cmd->add_option("--mutate", a.mutate,
                  "build the sharded layers with a TP bug (see `tpcheck mutations`)");
  a.cpu_gemm_option = cmd->add_option("--cpu-gemm", a.cpu_gemm,
                                      "CPU GEMM class for f32: fp32, tf32 or auto (by K)");
  cmd->add_option("--recipe", a.recipe,
                  "quantized recipe of the Linear GEMMs: none (default), fp8, fp8_cs, "
                  "fp8_block_scaling, mxfp8, nvfp4, or all (the suite once per recipe, none "
                  "included; --json/--html files get the recipe's name before the extension)");
  cmd->add_option("--steps", a.steps,
                  "training steps per run (default 1): the same input each step, SGD with "
                  "learning rate 1 between steps, FP8 delayed scaling's amaxes reduced and "
                  "histories updated; compared after every step");
  cmd->add_option("--rtol", a.rtol, "override rtol of te/allclose");
  cmd->add_option("--atol", a.atol, "override atol of te/allclose");
  add_size_options(cmd, a);
}

GemmClassRule parse_cpu_gemm(const std::string& name) {
  GemmClassRule rule;
  if (name == "fp32") return rule;
  if (name == "tf32") {
    rule.f32_class = MathClass::kTf32;
    return rule;
  }
  if (name == "auto") {
    rule.mode = GemmClassRule::Mode::kAuto;
    return rule;
  }
  throw Error(ErrorKind::kInput,
              fmt::format("unknown --cpu-gemm '{}'; expected one of fp32, tf32, auto", name));
}

int parse_steps(const std::string& text) {
  int steps = 0;
  const char* end = text.data() + text.size();
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  const auto [ptr, ec] = std::from_chars(text.data(), end, steps);
  TPCHECK_CHECK_INPUT(digits && ec == std::errc() && ptr == end && steps >= 1,
                      "--steps '{}': expected a whole number of training steps >= 1 (default 1)",
                      text);
  return steps;
}

std::vector<SuiteCase> select_cases(const Suite& suite, const std::string& filter) {
  if (filter.empty()) return suite.cases;
  std::regex re;
  try {
    re = std::regex(filter);
  } catch (const std::regex_error& e) {
    throw Error(ErrorKind::kInput,
                fmt::format("--filter '{}' is not a valid regex: {}", filter, e.what()));
  }
  std::vector<SuiteCase> out;
  for (const SuiteCase& c : suite.cases) {
    if (std::regex_search(c.id, re)) out.push_back(c);
  }
  if (out.empty()) {
    throw Error(
        ErrorKind::kInput,
        fmt::format("--filter '{}' matches none of the {} cases of suite '{}' (see `tpcheck list`)",
                    filter, suite.cases.size(), suite.name));
  }
  return out;
}

PreparedRun prepare_run(const RunArgs& a) {
  const Policy chosen = parse_policy(a.policy);
  const Mutation mutation = parse_mutation(a.mutate);
  const GemmClassRule rule = parse_cpu_gemm(a.cpu_gemm);
  const Recipe recipe = parse_recipe(a.recipe);
  const int steps = parse_steps(a.steps);
  TPCHECK_CHECK_INPUT(a.tp >= 1 && a.tp <= 64, "--tp must be between 1 and 64, got {}", a.tp);
  if (a.rtol) TPCHECK_CHECK_INPUT(*a.rtol >= 0, "--rtol must be >= 0, got {}", *a.rtol);
  if (a.atol) TPCHECK_CHECK_INPUT(*a.atol >= 0, "--atol must be >= 0, got {}", *a.atol);
  PreparedRun p;
  p.suite = make_suite(a.suite, a.tp, a.sizes, recipe);
  RunSettings& settings = p.settings;
  settings.suite = p.suite.name;
  settings.tp = a.tp;
  settings.seed = a.seed;
  settings.mutation = std::string(mutation_name(mutation));
  settings.cpu_gemm = a.cpu_gemm;
  settings.recipe = std::string(recipe_name(recipe));
  settings.steps = steps;
  for (const std::string& name : policy_names()) settings.policies.push_back(parse_policy(name));
  for (std::size_t i = 0; i < settings.policies.size(); ++i) {
    if (settings.policies[i].kind == chosen.kind) settings.chosen_policy = i;
  }
  settings.compare = CompareOptions{a.rtol, a.atol};
  settings.notes = p.suite.notes;
  settings.notes.insert(settings.notes.begin(), "suite " + p.suite.description);
  if (recipe != Recipe::kNone && !a.rtol && !a.atol) {
    // The reference suite's tolerances for this recipe (run_numerics.py), for te and
    // allclose alike; --rtol / --atol still override them.
    const RecipeTolerance t = reference_recipe_tolerance(recipe);
    settings.compare = CompareOptions{t.rtol, t.atol};
    settings.notes.push_back(fmt::format("recipe {}: te and allclose use the reference's "
                                         "tolerances for it, rtol {} atol {}",
                                         recipe_name(recipe), t.rtol, t.atol));
  }
  const bool cpu_gemm_given =
      a.cpu_gemm_given || (a.cpu_gemm_option != nullptr && a.cpu_gemm_option->count() > 0);
  const ResolvedExecution resolved =
      resolve_execution(a.execution, a.tp, rule, cpu_gemm_given, settings);
  p.config = RunConfig{a.tp, a.seed, mutation, resolved.gemm_rule, resolved.execution};
  if (!a.execution.inject_failure.empty())
    inject_failure(p.config.execution, a.execution.inject_failure, a.tp);
  p.config.recipe = recipe;
  p.config.steps = steps;
  check_run_config(p.config);
  p.judge = JudgeConfig{settings.policies, settings.compare};
  p.reports = resolved.reports;
  return p;
}

}  // namespace tpcheck
