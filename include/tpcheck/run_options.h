// run_options.h — the options of a suite run as one table (TPCHECK_RUN_OPTIONS): each
// option's type, name, default, the commands that take it and its help. RunOptions (the
// typed values), the command line's flags (src/cli/run_flags.cpp) and tpcheck.run's
// keywords in Python (python/tpcheck/__init__.py, through run_option_table()) are all
// generated from it, so adding an option is one row here plus the code that reads it.
// Thread safety: the table is built once and immutable; a RunOptions is a plain value.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tpcheck {

// The backend asked for; kAuto is cuda when a GPU is present, else cpu.
enum class BackendChoice { kAuto, kCpu, kCuda };
// The GPU ranks' communicator; kAuto is NCCL when there is a GPU per rank, else emulated.
enum class CommChoice { kAuto, kEmulated, kNccl };
enum class Tf32Choice { kOn, kOff };
enum class AttentionChoice { kUnfused, kFused };

// The names of a choice, in the enum's order (its underlying values are 0, 1, ...).
template <class E>
struct ChoiceNames;
template <>
struct ChoiceNames<BackendChoice> {
  static constexpr std::array<std::string_view, 3> kNames{"auto", "cpu", "cuda"};
};
template <>
struct ChoiceNames<CommChoice> {
  static constexpr std::array<std::string_view, 3> kNames{"auto", "emulated", "nccl"};
};
template <>
struct ChoiceNames<Tf32Choice> {
  static constexpr std::array<std::string_view, 2> kNames{"on", "off"};
};
template <>
struct ChoiceNames<AttentionChoice> {
  static constexpr std::array<std::string_view, 2> kNames{"unfused", "fused"};
};
template <class E>
constexpr std::string_view choice_name(E value) {
  return ChoiceNames<E>::kNames[static_cast<std::size_t>(value)];
}

// Which commands take an option (a mask); kHiddenOption keeps it out of --help and Python.
inline constexpr unsigned kForRun = 1, kForExplain = 2, kForList = 4, kHiddenOption = 8;
inline constexpr unsigned kForCase = kForRun | kForExplain, kForAll = kForCase | kForList;

// The table. X(type, member, default, commands, help): the flag is --member with '_'
// written '-' (--cpu-gemm), Python's keyword is the member (cpu_gemm). An optional
// without a value is "not given": no default in --help, None in Python.
#define TPCHECK_RUN_OPTIONS(X)                                                                     \
  X(BackendChoice, backend, BackendChoice::kAuto, kForCase,                                        \
    "auto (cuda when a GPU is present, else cpu), cpu or cuda")                                    \
  X(Tf32Choice, tf32, Tf32Choice::kOn, kForCase, "cuda: f32 GEMMs may use TF32 (on) or not (off)") \
  X(std::string, gemm_impl, "any", kForCase,                                                       \
    "cuda: cuBLASLt implementations allowed: any, tensor-core or fma")                             \
  X(CommChoice, comm, CommChoice::kAuto, kForCase,                                                 \
    "cuda: auto (NCCL when there is a GPU per rank, else emulated), emulated or nccl")             \
  X(std::string, comm_order, "nccl-ring", kForCase,                                                \
    "cuda emulated collectives: nccl-ring (NCCL's ring order and rounding) or rank")               \
  X(AttentionChoice, attention, AttentionChoice::kUnfused, kForCase,                               \
    "cuda: unfused (the reference's unfused rounding points) or fused (cuDNN's flash "             \
    "attention for f16/bf16 with no mask or causal; the others stay unfused, the ledger "          \
    "says which ran)")                                                                             \
  X(int, tp, 4, kForAll, "tensor-parallel size (thread ranks on the CPU)")                         \
  X(std::string, inject_failure, "", kForCase | kHiddenOption,                                     \
    "testing: RANK@RUN makes rank RANK throw at the start of the RUN-th sharded run")              \
  X(std::string, suite, "full", kForAll,                                                           \
    "full (every sharded path) or te (the reference's 118-case matrix)")                           \
  X(std::string, filter, "", kForRun | kForList, "regex over case ids (see `tpcheck list`)")       \
  X(std::string, policy, "truth", kForCase, "te, allclose, truth or bitwise")                      \
  X(std::uint64_t, seed, 1234, kForCase, "seed of parameters, inputs and targets")                 \
  X(std::string, mutate, "none", kForCase,                                                         \
    "build the sharded layers with a TP bug (see `tpcheck mutations`)")                            \
  X(std::optional<std::string>, cpu_gemm, std::nullopt, kForCase,                                  \
    "CPU GEMM class for f32: fp32 (when not given), tf32 or auto (by K); --backend cpu only")      \
  X(std::string, recipe, "none", kForCase,                                                         \
    "quantized recipe of the Linear GEMMs: none, fp8, fp8_cs, fp8_block_scaling, mxfp8, "          \
    "nvfp4, or all (the suite once per recipe, none included; --json/--html files get the "        \
    "recipe's name before the extension)")                                                         \
  X(int, steps, 1, kForCase,                                                                       \
    "training steps per run: the same input each step, SGD with learning rate 1 between "          \
    "steps, FP8 delayed scaling's amaxes reduced and histories updated; compared after every "     \
    "step")                                                                                        \
  X(std::optional<double>, rtol, std::nullopt, kForCase, "override rtol of te/allclose")           \
  X(std::optional<double>, atol, std::nullopt, kForCase, "override atol of te/allclose")           \
  X(std::optional<std::int64_t>, hidden, std::nullopt, kForAll, "hidden size (64 when not given)") \
  X(std::optional<std::int64_t>, ffn, std::nullopt, kForAll,                                       \
    "FFN hidden size (32 when not given)")                                                         \
  X(std::optional<std::int64_t>, heads, std::nullopt, kForAll,                                     \
    "attention heads (4 when not given, raised to --tp if larger)")                                \
  X(std::optional<std::int64_t>, seq, std::nullopt, kForAll,                                       \
    "sequence length per rank (16 when not given)")                                                \
  X(std::optional<std::int64_t>, batch, std::nullopt, kForAll, "batch size (16 when not given)")   \
  X(std::optional<std::string>, json, std::nullopt, kForCase,                                      \
    "write the JSON report (schema tpcheck.run/1) here")                                           \
  X(std::optional<std::string>, html, std::nullopt, kForCase,                                      \
    "write a self-contained HTML report with plots here")                                          \
  X(bool, quiet, false, kForRun, "print only failing cases and the summary")                       \
  /* the end: every row above ends in a backslash, so a new row is an added line or two */

struct RunOptions {
#define TPCHECK_RUN_OPTION_MEMBER(type, member, default_value, commands, help) \
  type member = default_value;
  TPCHECK_RUN_OPTIONS(TPCHECK_RUN_OPTION_MEMBER)
#undef TPCHECK_RUN_OPTION_MEMBER
};

// What a caller needs to offer an option without knowing its C++ type.
enum class OptionKind { kFlag, kInteger, kNumber, kText, kChoice };
struct RunOptionInfo {
  std::string name;     // "cpu-gemm": the flag without "--"
  std::string keyword;  // "cpu_gemm": Python's keyword, the member
  OptionKind kind = OptionKind::kText;
  std::vector<std::string_view> choices;  // kChoice: the accepted names
  bool optional = false;                  // may be "not given" (Python: None)
  std::string default_text;               // as given on the command line; "" when optional
  unsigned commands = 0;                  // kForRun | kForExplain | kForList | kHiddenOption
  std::string_view help;
  // Parses `text` as the command line gives it (a flag: "true" or "false") into the
  // member; Error(kInput) naming --name, the text and what was expected.
  void (*set)(RunOptions& options, std::string_view text) = nullptr;
};

// Every option, in the table's order.
const std::vector<RunOptionInfo>& run_option_table();
// The option named `name` ("cpu-gemm" or "cpu_gemm") set from its text; an unknown name
// is Error(kInput) naming it.
void set_run_option(RunOptions& options, std::string_view name, std::string_view text);

}  // namespace tpcheck
