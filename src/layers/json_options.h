// json_options.h — reading a layer's JSON options: every key checked, every value typed.
//
// Each layer's Options::from_json builds an OptionReader, reads the keys it knows (with
// their defaults) and calls finish(), which rejects any key that was not read. Every
// error is Error(kInput) naming the layer, the key, the offending value and what was
// expected, so `tpcheck` can print it and exit 2 before any work starts.
// Thread safety: a reader is used by one thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tpcheck/backend.h"
#include "tpcheck/dtype.h"
#include "tpcheck/layers/linear.h"
#include "tpcheck/layers/option_groups.h"

namespace tpcheck {

class OptionReader {
 public:
  // REQUIRES nothing of j: a non-object is reported as bad input.
  OptionReader(const nlohmann::json& j, std::string_view layer);

  bool get_bool(std::string_view key, bool fallback);
  // A positive integer; `required`: absence is an error.
  std::int64_t get_size(std::string_view key, bool required);
  double get_positive_double(std::string_view key, double fallback);
  // A string from `choices`.
  std::string get_choice(std::string_view key, std::string_view fallback,
                         const std::vector<std::string_view>& choices);

  DType get_params_dtype(DType fallback);  // "params_dtype": f32 f16 bf16 f64
  ParallelMode get_parallel_mode(ParallelMode fallback, bool allow_row = true);
  InitMethod get_init_method(std::string_view key, InitMethod fallback);
  NormKind get_normalization(NormKind fallback);   // "normalization"
  Activation get_activation(Activation fallback);  // "activation"
  // "window_size": [left, right] integers (-1: unbounded) into left and right; both
  // unchanged when the key is absent. The one reader of the key (MultiheadAttention and
  // TransformerLayer both take it).
  void get_window_size(std::int64_t& left, std::int64_t& right);
  // The attention shape MultiheadAttention and TransformerLayer share, read once:
  // window_size, hidden_size (required), num_attention_heads (required), num_gqa_groups.
  template <typename AttentionOptions>
  void get_attention_shape(AttentionOptions& o) {
    get_window_size(o.window_left, o.window_right);
    o.hidden_size = get_size("hidden_size", true);
    o.num_attention_heads = get_size("num_attention_heads", true);
    o.num_gqa_groups = get_size("num_gqa_groups", false);
  }

  // The option groups (option_groups.h), each read here and nowhere else, with the
  // group's own defaults. `eps_key`: "eps" or "layernorm_epsilon" (the layer's name for it).
  NormOptions get_norm_options(std::string_view eps_key);
  ParamOptions get_param_options();
  // `delay_is_a_key`: false where the layer has no delay_wgrad_compute key (it stays false).
  WgradOptions get_wgrad_options(bool delay_is_a_key);

  // Throws on any key not read above, listing the accepted keys.
  void finish() const;

 private:
  const nlohmann::json* find(std::string_view key);

  const nlohmann::json& j_;
  std::string layer_;
  std::set<std::string> read_;
};

}  // namespace tpcheck
