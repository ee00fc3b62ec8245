// run_options.cpp — run_option_table() from TPCHECK_RUN_OPTIONS (tpcheck/run_options.h):
// how each member type reads its text (OptionCodec), and the table's rows.
#include "tpcheck/run_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <string>
#include <type_traits>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <class E>
concept Choice = std::is_enum_v<E> && requires {
  ChoiceNames<E>::kNames;
};
template <class T>
concept WholeNumber = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// "a, b or c"
template <class E>
std::string choice_list() {
  const auto& names = ChoiceNames<E>::kNames;
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

// How a member of type T is read from its text and written as a default. `flag` is the
// option's "--name", for the message of Error(kInput).
template <class T>
struct OptionCodec;

template <WholeNumber T>
struct OptionCodec<T> {
  static constexpr OptionKind kKind = OptionKind::kInteger;
  static T parse(const std::string& flag, std::string_view text) {
    T value{};
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    TPCHECK_CHECK_INPUT(!text.empty() && ec == std::errc() && ptr == end,
                        "{} '{}': expected a whole number", flag, text);
    return value;
  }
  static std::string format(T value) { return std::to_string(value); }
};

template <>
struct OptionCodec<double> {
  static constexpr OptionKind kKind = OptionKind::kNumber;
  static double parse(const std::string& flag, std::string_view text) {
    double value = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    TPCHECK_CHECK_INPUT(!text.empty() && ec == std::errc() && ptr == end,
                        "{} '{}': expected a number", flag, text);
    return value;
  }
  static std::string format(double value) { return fmt::format("{}", value); }
};

template <>
struct OptionCodec<std::string> {
  static constexpr OptionKind kKind = OptionKind::kText;
  static std::string parse(const std::string&, std::string_view text) { return std::string(text); }
  static std::string format(const std::string& value) { return value; }
};

template <>
struct OptionCodec<bool> {
  static constexpr OptionKind kKind = OptionKind::kFlag;
  static bool parse(const std::string& flag, std::string_view text) {
    TPCHECK_CHECK_INPUT(text == "true" || text == "false", "{} '{}': expected true or false", flag,
                        text);
    return text == "true";
  }
  static std::string format(bool value) { return value ? "true" : "false"; }
};

template <Choice E>
struct OptionCodec<E> {
  static constexpr OptionKind kKind = OptionKind::kChoice;
  static E parse(const std::string& flag, std::string_view text) {
    const auto& names = ChoiceNames<E>::kNames;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (names[i] == text) return static_cast<E>(i);
    }
    throw Error(ErrorKind::kInput,
                fmt::format("unknown {} '{}'; expected {}", flag, text, choice_list<E>()));
  }
  static std::string format(E value) { return std::string(choice_name(value)); }
};

template <class T>
struct OptionCodec<std::optional<T>> {
  static constexpr OptionKind kKind = OptionCodec<T>::kKind;
  static std::optional<T> parse(const std::string& flag, std::string_view text) {
    return OptionCodec<T>::parse(flag, text);
  }
  static std::string format(const std::optional<T>& value) {
    return value ? OptionCodec<T>::format(*value) : std::string();
  }
};

template <class T>
std::vector<std::string_view> choices_of() {
  if constexpr (IsOptional<T>::value) {
    return choices_of<typename T::value_type>();
  } else if constexpr (Choice<T>) {
    return {ChoiceNames<T>::kNames.begin(), ChoiceNames<T>::kNames.end()};
  } else {
    return {};
  }
}

// "cpu_gemm" → "cpu-gemm"
std::string flag_name(std::string_view member) {
  std::string name(member);
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  return name;
}

// One row: everything but `set`, which the table's lambda provides (it names the member).
template <class T>
RunOptionInfo describe(std::string_view member, const T& default_value, unsigned commands,
                       std::string_view help) {
  RunOptionInfo info;
  info.name = flag_name(member);
  info.keyword = std::string(member);
  info.kind = OptionCodec<T>::kKind;
  info.choices = choices_of<T>();
  info.optional = IsOptional<T>::value;
  info.default_text = OptionCodec<T>::format(default_value);
  info.commands = commands;
  info.help = help;
  return info;
}

std::vector<RunOptionInfo> make_table() {
  const RunOptions defaults;
  std::vector<RunOptionInfo> table;
#define TPCHECK_RUN_OPTION_ROW(type, member, default_value, commands, help)  \
  table.push_back(describe<type>(#member, defaults.member, commands, help)); \
  table.back().set = [](RunOptions& o, std::string_view text) {              \
    o.member = OptionCodec<type>::parse("--" + flag_name(#member), text);    \
  };
  TPCHECK_RUN_OPTIONS(TPCHECK_RUN_OPTION_ROW)
#undef TPCHECK_RUN_OPTION_ROW
  return table;
}

}  // namespace

const std::vector<RunOptionInfo>& run_option_table() {
  static const std::vector<RunOptionInfo> table = make_table();
  return table;
}

void set_run_option(RunOptions& options, std::string_view name, std::string_view text) {
  for (const RunOptionInfo& info : run_option_table()) {
    if (info.name == name || info.keyword == name) {
      info.set(options, text);
      return;
    }
  }
  std::vector<std::string> names;
  for (const RunOptionInfo& info : run_option_table()) names.push_back(info.keyword);
  throw Error(ErrorKind::kInput, fmt::format("unknown run option '{}'; expected one of {}", name,
                                             fmt::join(names, ", ")));
}

}  // namespace tpcheck
