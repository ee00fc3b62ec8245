// The `tpcheck` program: run a suite (single, sharded, truth), list its cases, list the
// mutations, explain one case, the cuBLASLt log tools (logdiff, trace, diff). Everything is
// in cli/app.cpp (shared with the Python package).
#include <cstdio>

#include "tpcheck/cli.h"

int main(int argc, char** argv) {
  // One line per case as it finishes, also into a pipe or a file: a run cut short (a
  // time limit, a killed job) still shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  return tpcheck::cli_main(argc, argv);
}
