// json_options_fuzz.cpp — libFuzzer target for the JSON option reader: every layer kind's
// Options::from_json on any JSON value either builds options or rejects them with
// Error(kInput) carrying a message; nothing else (no crash, no sanitizer report, no other
// exception). Bytes that are not JSON are skipped (nlohmann's parser is not ours).
// Built by TPCHECK_FUZZ; run by scripts/fuzz.sh.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tpcheck/error.h"
#include "tpcheck/layers/multihead_attention.h"
#include "tpcheck/layers/layernorm.h"
#include "tpcheck/layers/layernorm_linear.h"
#include "tpcheck/layers/layernorm_mlp.h"
#include "tpcheck/layers/linear.h"
#include "tpcheck/layers/transformer_layer.h"

namespace {

template <typename Options>
void read_as(const nlohmann::json& j, const char* kind) {
  try {
    (void)Options::from_json(j);
  } catch (const tpcheck::Error& e) {
    if (e.kind() != tpcheck::ErrorKind::kInput || std::string(e.what()).empty()) {
      std::fprintf(stderr, "%s: unclear rejection (kind %d): %s\n", kind,
                   static_cast<int>(e.kind()), e.what());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  read_as<tpcheck::Linear::Options>(j, "Linear");
  read_as<tpcheck::LayerNorm::Options>(j, "LayerNorm");
  read_as<tpcheck::LayerNormLinear::Options>(j, "LayerNormLinear");
  read_as<tpcheck::LayerNormMLP::Options>(j, "LayerNormMLP");
  read_as<tpcheck::MultiheadAttention::Options>(j, "MultiheadAttention");
  read_as<tpcheck::TransformerLayer::Options>(j, "TransformerLayer");
  return 0;
}
