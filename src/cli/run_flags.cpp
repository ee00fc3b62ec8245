// run_flags.cpp — see run_flags.h.
#include "cli/run_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

namespace tpcheck {
namespace {

// What --help shows after the flag: the choices, or the value's kind.
std::string type_label(const RunOptionInfo& info) {
  switch (info.kind) {
    case OptionKind::kChoice:
      return fmt::format("{}", fmt::join(info.choices, "|"));
    case OptionKind::kInteger:
      return "INT";
    case OptionKind::kNumber:
      return "FLOAT";
    case OptionKind::kFlag:
    case OptionKind::kText:
      break;
  }
  return "TEXT";
}

}  // namespace

void add_run_flags(CLI::App* cmd, RunOptions& options, unsigned command) {
  for (const RunOptionInfo& info : run_option_table()) {
    if ((info.commands & command) == 0) continue;
    const std::string flag = "--" + info.name;
    const std::string help(info.help);
    CLI::Option* option = nullptr;
    if (info.kind == OptionKind::kFlag) {
      option = cmd->add_flag_callback(
          flag, [&options, &info] { info.set(options, "true"); }, help);
    } else {
      // The row parses the text: the same check and message as for Python's keywords.
      option = cmd->add_option_function<std::string>(
          flag, [&options, &info](const std::string& text) { info.set(options, text); }, help);
      option->type_name(type_label(info));
      option->default_str(info.default_text);
    }
    if (info.commands & kHiddenOption) option->group("");
  }
}

}  // namespace tpcheck
