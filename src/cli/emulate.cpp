// emulate.cpp — `tpcheck emulate ARGS...`: the torchrun-like launcher of the `tpcheck`
// torch.distributed backend lives in the Python package (python/tpcheck/emulate/launcher.py,
// docs/EMULATE.md), so the program hands its arguments, untouched, to
// `PYTHON -m tpcheck emulate ARGS...`. PYTHON is $TPCHECK_PYTHON, else python3 on PATH.
// In a build tree (build/tpcheck next to build/python/tpcheck) build/python is put first
// on PYTHONPATH, so the package built with this program is the one that runs.
// Thread safety: replaces the process (execvp); call from the main thread.
#include "cli/emulate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// build/python when this program is build/tpcheck of a tree that built the package.
std::string package_dir_beside_program() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const std::filesystem::path dir = exe.parent_path() / "python";
  return std::filesystem::exists(dir / "tpcheck" / "__init__.py", ec) ? dir.string() : "";
}

}  // namespace

int emulate_command(int argc, char** argv) {
  const char* from_env = std::getenv("TPCHECK_PYTHON");
  const std::string python = from_env != nullptr && *from_env != '\0' ? from_env : "python3";
  if (const std::string dir = package_dir_beside_program(); !dir.empty()) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path = old != nullptr && *old != '\0' ? dir + ":" + old : dir;
    setenv("PYTHONPATH", path.c_str(), 1);
  }
  std::vector<std::string> args = {python, "-m", "tpcheck", "emulate"};
  for (int i = 2; i < argc; ++i) args.emplace_back(argv[i]);  // argv[1] is "emulate"
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execvp(cargs[0], cargs.data());
  // Only reached when the interpreter could not be started.
  throw Error(ErrorKind::kInput,
              fmt::format("tpcheck emulate runs `{} -m tpcheck emulate`, and '{}' could not be "
                          "started: {}; set TPCHECK_PYTHON to the Python that has the tpcheck "
                          "package (pip install .)",
                          python, python, std::strerror(errno)));
}

}  // namespace tpcheck
