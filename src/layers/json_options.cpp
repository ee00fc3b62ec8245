// json_options.cpp — OptionReader (see json_options.h).
#include "layers/json_options.h"

#include <fmt/ranges.h>

#include "tpcheck/error.h"

namespace tpcheck {

OptionReader::OptionReader(const nlohmann::json& j, std::string_view layer) : j_(j), layer_(layer) {
  TPCHECK_CHECK_INPUT(j.is_object() || j.is_null(), "{} options: expected a JSON object, got {}",
                      layer_, j.dump());
}

const nlohmann::json* OptionReader::find(std::string_view key) {
  read_.insert(std::string(key));
  if (!j_.is_object()) return nullptr;
  auto it = j_.find(std::string(key));
  return it == j_.end() ? nullptr : &*it;
}

bool OptionReader::get_bool(std::string_view key, bool fallback) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) return fallback;
  TPCHECK_CHECK_INPUT(v->is_boolean(), "{} option {}: expected true or false, got {}", layer_, key,
                      v->dump());
  return v->get<bool>();
}

std::int64_t OptionReader::get_size(std::string_view key, bool required) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) {
    TPCHECK_CHECK_INPUT(!required, "{} option {} is required (a positive integer)", layer_, key);
    return 0;
  }
  TPCHECK_CHECK_INPUT(v->is_number_integer() && v->get<std::int64_t>() > 0,
                      "{} option {}: expected a positive integer, got {}", layer_, key, v->dump());
  return v->get<std::int64_t>();
}

double OptionReader::get_positive_double(std::string_view key, double fallback) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) return fallback;
  TPCHECK_CHECK_INPUT(v->is_number() && v->get<double>() > 0,
                      "{} option {}: expected a positive number, got {}", layer_, key, v->dump());
  return v->get<double>();
}

std::string OptionReader::get_choice(std::string_view key, std::string_view fallback,
                                     const std::vector<std::string_view>& choices) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) return std::string(fallback);
  bool ok = v->is_string();
  if (ok) {
    ok = false;
    for (std::string_view c : choices) ok = ok || v->get<std::string>() == c;
  }
  TPCHECK_CHECK_INPUT(ok, "{} option {}: expected one of {}, got {}", layer_, key,
                      fmt::join(choices, " | "), v->dump());
  return v->get<std::string>();
}

DType OptionReader::get_params_dtype(DType fallback) {
  return parse_dtype(
      get_choice("params_dtype", dtype_name(fallback), {"f32", "f16", "bf16", "f64"}));
}

ParallelMode OptionReader::get_parallel_mode(ParallelMode fallback, bool allow_row) {
  std::vector<std::string_view> choices = {"none", "column"};
  if (allow_row) choices.push_back("row");
  const std::string m = get_choice("parallel_mode", parallel_mode_name(fallback), choices);
  if (m == "column") return ParallelMode::kColumn;
  if (m == "row") return ParallelMode::kRow;
  return ParallelMode::kNone;
}

InitMethod OptionReader::get_init_method(std::string_view key, InitMethod fallback) {
  const std::string m = get_choice(key, init_method_name(fallback), {"normal", "constant"});
  return m == "constant" ? InitMethod::kConstant : InitMethod::kNormal;
}

NormKind OptionReader::get_normalization(NormKind fallback) {
  return parse_norm_kind(
      get_choice("normalization", norm_kind_name(fallback), {"LayerNorm", "RMSNorm"}));
}

Activation OptionReader::get_activation(Activation fallback) {
  return parse_activation(get_choice("activation", activation_name(fallback),
                                     {"gelu", "relu", "srelu", "qgelu", "geglu", "swiglu"}));
}

NormOptions OptionReader::get_norm_options(std::string_view eps_key) {
  NormOptions o;
  o.normalization = get_normalization(o.normalization);
  o.zero_centered_gamma = get_bool("zero_centered_gamma", o.zero_centered_gamma);
  o.eps = get_positive_double(eps_key, o.eps);
  return o;
}

ParamOptions OptionReader::get_param_options() {
  ParamOptions o;
  o.bias = get_bool("bias", o.bias);
  o.init_method = get_init_method("init_method", o.init_method);
  o.params_dtype = get_params_dtype(o.params_dtype);
  return o;
}

WgradOptions OptionReader::get_wgrad_options(bool delay_is_a_key) {
  WgradOptions o;
  o.fuse_wgrad_accumulation = get_bool("fuse_wgrad_accumulation", o.fuse_wgrad_accumulation);
  if (delay_is_a_key) {
    o.delay_wgrad_compute = get_bool("delay_wgrad_compute", o.delay_wgrad_compute);
  }
  return o;
}

void OptionReader::get_window_size(std::int64_t& left, std::int64_t& right) {
  const nlohmann::json* v = find("window_size");
  if (v == nullptr) return;
  const nlohmann::json& w = *v;
  TPCHECK_CHECK_INPUT(
      w.is_array() && w.size() == 2 && w[0].is_number_integer() && w[1].is_number_integer(),
      "{} option window_size: expected [left, right] integers (-1: unbounded), got {}", layer_,
      w.dump());
  left = w[0].get<std::int64_t>();
  right = w[1].get<std::int64_t>();
}

void OptionReader::finish() const {
  if (!j_.is_object()) return;
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    TPCHECK_CHECK_INPUT(read_.count(it.key()) == 1, "{}: unknown option {}; expected one of {}",
                        layer_, it.key(), fmt::join(read_, ", "));
  }
}

}  // namespace tpcheck
