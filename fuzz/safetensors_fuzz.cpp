// safetensors_fuzz.cpp — libFuzzer target for read_safetensors: any byte string is either
// read or rejected with Error(kInput) carrying a message; nothing else (no crash, no
// sanitizer report, no other exception, no unbounded allocation).
//
// read_safetensors takes a path, so each input is written to this process's own file
// (under TMPDIR) and read back from there. Built by TPCHECK_FUZZ; run by scripts/fuzz.sh.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tpcheck/error.h"
#include "tpcheck/safetensors.h"

namespace {

const std::string& input_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr ? dir : "/tmp") + "/tpcheck_safetensors_fuzz." +
           std::to_string(getpid()) + ".safetensors";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  {
    std::ofstream out(input_path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    tpcheck::SafetensorsFile file = tpcheck::read_safetensors(input_path());
    // Read back what was accepted: every byte the tensors claim must be there.
    for (const auto& [name, t] : file.tensors) {
      volatile std::uint8_t sink = 0;
      const auto* p = static_cast<const std::uint8_t*>(t.raw());
      for (std::size_t i = 0; i < t.nbytes(); ++i) sink = sink ^ p[i];
      (void)sink;
    }
  } catch (const tpcheck::Error& e) {
    // Every rejection is a clear input error naming the file.
    if (e.kind() != tpcheck::ErrorKind::kInput || std::string(e.what()).find(input_path()) ==
                                                       std::string::npos) {
      std::fprintf(stderr, "unclear rejection (kind %d): %s\n", static_cast<int>(e.kind()),
                   e.what());
      std::abort();
    }
  }
  return 0;
}
