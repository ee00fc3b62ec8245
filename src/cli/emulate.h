// emulate.h — `tpcheck emulate -n N [OPTIONS] -- CMD ARGS...` (emulate.cpp).
// Thread safety: replaces the process; call from the main thread.
#pragma once

namespace tpcheck {

// Runs `PYTHON -m tpcheck emulate argv[2..]` in place of this process (execvp). Returns
// only by throwing Error(kInput) when the interpreter cannot be started.
// REQUIRES: argv[1] is "emulate".
[[noreturn]] int emulate_command(int argc, char** argv);

}  // namespace tpcheck
