// The `tpcheck` program: run a suite (single, sharded, truth), list its cases, list the
// mutations. Everything is in cli/app.cpp (shared with the Python package).
#include "cli/app.h"

int main(int argc, char** argv) { return tpcheck::cli_main(argc, argv); }
