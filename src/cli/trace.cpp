// `tpcheck trace [--out DIR] -- CMD ARGS...`: runs any program (a PyTorch script, a test,
// torchrun) with cuBLASLt logging into one file per process, then parses the logs into a
// GEMM ledger (DIR/ledger.json, schema tpcheck.trace/1) and prints a summary: GEMM count
// by shape, algorithm and numerical class (known with --query on the GPU machine).
//
// The child gets CUBLASLT_LOG_LEVEL=2 (Trace: one line per matmul launch; --level 5 adds
// every API call) and CUBLASLT_LOG_FILE=DIR/cublaslt.%i.log: cuBLASLt replaces %i with the
// process id, so every process of a multi-process launch writes its own file (the
// NVIDIA libraries sharing this logger document %i, e.g. cuSPARSELt's and cuDSS's
// "Logging" pages; logs named cublaslt_<pid>.log are seen in public projects). Files
// whose name still holds a literal %i are read too. CUBLASLT_LOG_MASK is removed from the
// child's environment (a mask would override the level).
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "cli/log_tools.h"
#include "tpcheck/cublaslt_log.h"
#include "tpcheck/device.h"
#include "tpcheck/error.h"
#include "tpcheck/ledger_diff.h"

extern char** environ;

namespace tpcheck {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLogPrefix = "cublaslt.";
constexpr const char* kLogSuffix = ".log";

bool is_trace_log(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.size() > std::strlen(kLogPrefix) + std::strlen(kLogSuffix) &&
         name.rfind(kLogPrefix, 0) == 0 &&
         name.compare(name.size() - std::strlen(kLogSuffix), std::string::npos, kLogSuffix) == 0;
}

// The variables that decide which GEMM kernels a program gets, as the child saw them.
nlohmann::json trace_environment(const std::vector<std::string>& child_env) {
  static const char* kKeys[] = {"CUDA_VISIBLE_DEVICES",       "NVIDIA_TF32_OVERRIDE",
                                "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG",
                                "CUBLASLT_WORKSPACE_SIZE",    "CUBLAS_EMULATION_STRATEGY",
                                "CUBLASLT_HEURISTICS_CACHE_CAPACITY", "WORLD_SIZE",
                                "OMPI_COMM_WORLD_SIZE",        "CUBLASLT_LOG_LEVEL"};
  nlohmann::json env = nlohmann::json::object();
  for (const char* key : kKeys) {
    const std::string prefix = std::string(key) + "=";
    for (const std::string& kv : child_env) {
      if (kv.rfind(prefix, 0) == 0) env[key] = kv.substr(prefix.size());
    }
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"variables", env}, {"host", host}, {"date", date},
          {"devices", query_devices().description}};
}

}  // namespace

CLI::App* add_trace_command(CLI::App& app, TraceArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "trace", "run a program with cuBLASLt logging (one log per process) and write its GEMM ledger");
  cmd->add_option("--out", args.out, "directory for the logs and ledger.json (default tpcheck-trace)");
  cmd->add_option("--level", args.level, "CUBLASLT_LOG_LEVEL for the program: 2 (default) or 5");
  cmd->add_flag("--query", args.query,
                "decode each algorithm's numerical implementation (CUDA build, on the GPU)");
  cmd->add_option("command", args.command, "the program and its arguments, after --")->required();
  return cmd;
}

namespace {

// The --out folder, created, without the logs of an earlier trace (they would mix with
// this run's).
fs::path prepare_out_dir(const TraceArgs& args) {
  const fs::path out(args.out);
  std::error_code ec;
  fs::create_directories(out, ec);
  TPCHECK_CHECK_INPUT(!ec && fs::is_directory(out), "cannot create --out directory '{}': {}",
                      args.out, ec.message());
  for (const fs::directory_entry& e : fs::directory_iterator(out)) {
    if (e.is_regular_file() && is_trace_log(e.path())) {
      fmt::print(stderr, "tpcheck: removing the earlier log {}\n", e.path().string());
      fs::remove(e.path());
    }
  }
  return out;
}

// The child's environment: ours, with the logging variables replaced.
std::vector<std::string> logging_environment(const TraceArgs& args, const std::string& pattern) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    if (kv.rfind("CUBLASLT_LOG_LEVEL=", 0) == 0 || kv.rfind("CUBLASLT_LOG_MASK=", 0) == 0 ||
        kv.rfind("CUBLASLT_LOG_FILE=", 0) == 0) {
      continue;
    }
    env.push_back(kv);
  }
  env.push_back(fmt::format("CUBLASLT_LOG_LEVEL={}", args.level));
  env.push_back("CUBLASLT_LOG_FILE=" + pattern);
  return env;
}

// Runs the program with `env` and waits for it; its exit status (128 + signal if killed).
int run_program(const std::vector<std::string>& program, std::vector<std::string> env) {
  std::vector<char*> envp, argv;
  for (std::string& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);
  std::vector<std::string> command = program;
  for (std::string& a : command) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  const int spawned = posix_spawnp(&child, argv[0], nullptr, nullptr, argv.data(), envp.data());
  TPCHECK_CHECK_INPUT(spawned == 0, "cannot run '{}': {}", program[0], std::strerror(spawned));
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    TPCHECK_CHECK(errno == EINTR, "waitpid for '{}' failed: {}", program[0], std::strerror(errno));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// One process per log file in `out`, sorted by pid (the file name's, else the lines').
std::vector<TraceProcess> read_trace_logs(const fs::path& out, bool query) {
  std::vector<TraceProcess> processes;
  for (const fs::directory_entry& e : fs::directory_iterator(out)) {
    if (!e.is_regular_file() || !is_trace_log(e.path())) continue;
    CublasLtLog log = read_cublaslt_log(e.path().string());
    TraceProcess p;
    p.log = e.path().string();
    const std::string name = e.path().filename().string();
    const std::string middle = name.substr(
        std::strlen(kLogPrefix), name.size() - std::strlen(kLogPrefix) - std::strlen(kLogSuffix));
    if (!middle.empty() && std::all_of(middle.begin(), middle.end(), ::isdigit) &&
        middle.size() < 10) {
      p.pid = std::stoi(middle);
    } else if (!log.calls.empty()) {
      p.pid = log.calls.front().pid;
    }
    p.calls = std::move(log.calls);
    p.problems = std::move(log.problems);
    if (query) query_numerical_impls(p.calls);
    processes.push_back(std::move(p));
  }
  std::sort(processes.begin(), processes.end(),
            [](const TraceProcess& x, const TraceProcess& y) { return x.pid < y.pid; });
  return processes;
}

void print_trace(const TraceLedger& ledger, const fs::path& ledger_path) {
  if (ledger.exit_status != 0) {
    fmt::print("tpcheck trace: the program exited with status {} (traced anyway)\n",
               ledger.exit_status);
  }
  if (ledger.processes.empty()) {
    fmt::print("tpcheck trace: no cuBLASLt log was written: the program made no cuBLASLt call "
               "(or set its own CUBLASLT_LOG_FILE)\n");
  }
  for (const TraceProcess& p : ledger.processes) {
    fmt::print("\nprocess {}: {} GEMMs ({}{})\n", p.pid, p.calls.size(), p.log,
               p.problems.empty() ? ""
                                  : fmt::format(", {} malformed lines skipped", p.problems.size()));
    for (std::size_t i = 0; i < p.problems.size() && i < 5; ++i) {
      fmt::print(stderr, "tpcheck: warning: {}:{}: {}; line skipped\n", p.log,
                 p.problems[i].line, p.problems[i].reason);
    }
    fmt::print("{}", format_call_summary(p.calls));
  }
  fmt::print("\nledger: {}\n", ledger_path.string());
}

}  // namespace

int trace_command(const TraceArgs& args) {
  TPCHECK_CHECK_INPUT(args.level == 2 || args.level == 5,
                      "--level must be 2 (Trace) or 5 (API trace), got {}", args.level);
  TPCHECK_CHECK_INPUT(!args.command.empty(),
                      "trace needs a program to run: tpcheck trace -- CMD ARGS...");
  if (args.query) {
    TPCHECK_CHECK_INPUT(cublaslt_query_available(),
                        "--query needs tpcheck built with CUDA (this build has TPCHECK_CUDA=OFF)");
  }
  const fs::path out = prepare_out_dir(args);
  const std::string pattern = (fs::absolute(out) / "cublaslt.%i.log").string();
  const std::vector<std::string> env = logging_environment(args, pattern);
  fmt::print("tpcheck trace: {} (logs {})\n", fmt::join(args.command, " "), pattern);
  std::fflush(stdout);

  TraceLedger ledger;
  ledger.command = args.command;
  ledger.exit_status = run_program(args.command, env);
  ledger.environment = trace_environment(env);
  ledger.processes = read_trace_logs(out, args.query);

  const fs::path ledger_path = out / "ledger.json";
  std::ofstream file(ledger_path);
  TPCHECK_CHECK_INPUT(file.good(), "cannot write '{}'", ledger_path.string());
  file << trace_to_json(ledger).dump(1) << "\n";
  file.close();
  print_trace(ledger, ledger_path);
  return 0;
}

}  // namespace tpcheck
