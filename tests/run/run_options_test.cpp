// run_options_test.cpp — the run options' table (tpcheck/run_options.h): names, defaults
// as the command line and Python see them, typed parsing and the messages of bad input.
// The command line's --help against Python's signature is tests/python/test_package.py's.
#include "tpcheck/run_options.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tpcheck/error.h"
#include "tpcheck/run_suite.h"

namespace tpcheck {
namespace {

const RunOptionInfo& row(const std::string& name) {
  for (const RunOptionInfo& info : run_option_table()) {
    if (info.name == name) return info;
  }
  ADD_FAILURE() << "no row " << name;
  return run_option_table().front();
}

// The message of the Error(kInput) that `set` throws; "" when it does not.
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    return e.what();
  }
  return "";
}

TEST(RunOptions, NamesAreUniqueFlagsOfTheirMembers) {
  std::set<std::string> names;
  for (const RunOptionInfo& info : run_option_table()) {
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    std::string keyword = info.name;
    for (char& c : keyword) c = c == '-' ? '_' : c;
    EXPECT_EQ(info.keyword, keyword);
    EXPECT_FALSE(info.help.empty()) << info.name;
    EXPECT_NE(info.commands & kForAll, 0u) << info.name;
  }
}

TEST(RunOptions, DefaultsAsTheCommandLineShowsThem) {
  EXPECT_EQ(row("backend").default_text, "auto");
  EXPECT_EQ(row("backend").kind, OptionKind::kChoice);
  EXPECT_EQ(row("suite").default_text, "full");
  EXPECT_EQ(row("steps").default_text, "1");
  EXPECT_EQ(row("steps").kind, OptionKind::kInteger);
  EXPECT_EQ(row("quiet").default_text, "false");
  EXPECT_EQ(row("quiet").kind, OptionKind::kFlag);
  EXPECT_TRUE(row("cpu-gemm").optional);
  EXPECT_EQ(row("cpu-gemm").default_text, "");
  EXPECT_TRUE(row("html").optional);
  EXPECT_NE(row("inject-failure").commands & kHiddenOption, 0u);
  // Every non-optional default reads back as the default.
  for (const RunOptionInfo& info : run_option_table()) {
    if (info.optional) continue;
    RunOptions o;
    EXPECT_EQ(input_error([&] { info.set(o, info.default_text); }), "") << info.name;
  }
}

TEST(RunOptions, TextBecomesTypedValues) {
  RunOptions o;
  set_run_option(o, "backend", "cuda");
  set_run_option(o, "comm", "nccl");
  set_run_option(o, "steps", "3");
  set_run_option(o, "cpu_gemm", "tf32");
  set_run_option(o, "rtol", "1e-05");
  set_run_option(o, "hidden", "128");
  set_run_option(o, "quiet", "true");
  set_run_option(o, "seed", "18446744073709551615");
  EXPECT_EQ(o.backend, BackendChoice::kCuda);
  EXPECT_EQ(o.comm, CommChoice::kNccl);
  EXPECT_EQ(o.steps, 3);
  EXPECT_EQ(o.cpu_gemm, "tf32");
  EXPECT_EQ(o.rtol, 1e-5);
  EXPECT_EQ(o.hidden, 128);
  EXPECT_TRUE(o.quiet);
  EXPECT_EQ(o.seed, 18446744073709551615ull);
  EXPECT_FALSE(o.json.has_value());
}

TEST(RunOptions, BadTextNamesTheFlagAndTheValue) {
  RunOptions o;
  const auto set = [&](const char* name, const char* text) {
    return input_error([&] { set_run_option(o, name, text); });
  };
  EXPECT_EQ(set("backend", "gpu"), "unknown --backend 'gpu'; expected auto, cpu or cuda");
  EXPECT_EQ(set("attention", "flash"), "unknown --attention 'flash'; expected unfused or fused");
  EXPECT_NE(set("steps", "1.5").find("--steps '1.5': expected a whole number"), std::string::npos);
  EXPECT_NE(set("tp", "four").find("--tp 'four'"), std::string::npos);
  EXPECT_NE(set("seed", "-1").find("--seed '-1'"), std::string::npos);
  EXPECT_NE(set("rtol", "small").find("--rtol 'small': expected a number"), std::string::npos);
  EXPECT_NE(set("frobnicate", "1").find("'frobnicate'"), std::string::npos);
}

TEST(RunOptions, PrepareRunChecksTheRanges) {
  RunOptions o;
  o.backend = BackendChoice::kCpu;
  o.suite = "te";
  o.tp = 2;
  o.steps = 0;
  EXPECT_NE(input_error([&] { prepare_run(o); }).find("--steps '0'"), std::string::npos);
  o.steps = 1;
  o.tp = 0;
  EXPECT_NE(input_error([&] { prepare_run(o); }).find("--tp must be between 1 and 64, got 0"),
            std::string::npos);
  o.tp = 2;
  o.cpu_gemm = "fp16";
  EXPECT_NE(input_error([&] { prepare_run(o); }).find("--cpu-gemm 'fp16'"), std::string::npos);
}

}  // namespace
}  // namespace tpcheck
