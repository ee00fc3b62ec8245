// tpcheck/error.h — the one exception type tpcheck throws, and the check macros.
//
// Every failure inside tpcheck is an `Error` that says what went wrong (naming the
// offending value and what was expected), where (file:line of the check) and on which
// rank. The CLI maps ErrorKind to an exit code: kInput → 2, kRuntime/kAborted → 3.
// Thread safety: Error is an immutable value.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tpcheck {

enum class ErrorKind {
  kInput,    // bad user input: options, shapes, files (caught before work starts)
  kRuntime,  // an internal or device failure while running
  kAborted,  // this rank stopped because another rank of its group failed
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, std::string where = {}, int rank = -1)
      : std::runtime_error(std::move(message)), kind_(kind), where_(std::move(where)), rank_(rank) {}

  ErrorKind kind() const { return kind_; }
  // "file:line" of the check that failed; empty when not known.
  const std::string& where() const { return where_; }
  // The rank that raised it, or -1 outside multi-rank code.
  int rank() const { return rank_; }

 private:
  ErrorKind kind_;
  std::string where_;
  int rank_;
};

namespace detail {
[[noreturn]] void fail(ErrorKind kind, const char* file, int line, std::string message);

// The message of a check, formatted at run time: nvcc cannot evaluate fmt's consteval
// format-string check, so .cu files use this (g++ still checks every string it compiles).
template <typename... Args>
std::string format_message(fmt::string_view format, const Args&... args) {
  return fmt::vformat(format, fmt::make_format_args(args...));
}
}  // namespace detail

}  // namespace tpcheck

#if defined(__CUDACC__)
#define TPCHECK_FORMAT(...) ::tpcheck::detail::format_message(__VA_ARGS__)
#else
#define TPCHECK_FORMAT(...) ::fmt::format(__VA_ARGS__)
#endif

// TPCHECK_CHECK(cond, "fmt {}", args...): internal invariant; throws Error(kRuntime).
#define TPCHECK_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::tpcheck::detail::fail(::tpcheck::ErrorKind::kRuntime, __FILE__, __LINE__,         \
                              TPCHECK_FORMAT(__VA_ARGS__));                                \
  } while (0)

// TPCHECK_CHECK_INPUT(cond, "fmt {}", args...): user input; throws Error(kInput).
// The message names the offending value and what was expected.
#define TPCHECK_CHECK_INPUT(cond, ...)                                                    \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::tpcheck::detail::fail(::tpcheck::ErrorKind::kInput, __FILE__, __LINE__,           \
                              TPCHECK_FORMAT(__VA_ARGS__));                                \
  } while (0)
