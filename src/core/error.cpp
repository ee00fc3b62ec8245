#include "tpcheck/error.h"

#include <cstring>

namespace tpcheck::detail {

void fail(ErrorKind kind, const char* file, int line, std::string message) {
  // Keep only the path below the source root so messages are stable across checkouts.
  const char* rel = std::strstr(file, "/src/");
  if (rel == nullptr) rel = std::strstr(file, "/include/");
  std::string where = fmt::format("{}:{}", rel ? rel + 1 : file, line);
  throw Error(kind, std::move(message), std::move(where));
}

}  // namespace tpcheck::detail
