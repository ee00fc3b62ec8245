// names.h — the names the C++ program and the Python package both write or read, defined
// once here. The Python package reads them from its compiled module
// (`_tpcheck.shared_names()`, python/tpcheck/_names.py), so the two sides cannot drift.
#pragma once

#include <array>
#include <string_view>

namespace tpcheck::names {

// What a compared tensor is, in every report (`kind` of a tensor in tpcheck.run/1 and
// tpcheck.compare_tp/1): a forward output, a parameter's gradient, the input's gradient.
inline constexpr std::string_view kOutput = "output";
inline constexpr std::string_view kParameterGradient = "gradient";
inline constexpr std::string_view kInputGradient = "input_gradient";

// Report and ledger schemas.
inline constexpr std::string_view kRunSchema = "tpcheck.run/1";          // tpcheck run --json
inline constexpr std::string_view kExplainSchema = "tpcheck.explain/1";  // tpcheck explain --json
inline constexpr std::string_view kTraceSchema = "tpcheck.trace/1";      // tpcheck trace, tpcheck.trace()
inline constexpr std::string_view kEmulateSchema = "tpcheck.emulate/1";  // tpcheck emulate --trace
inline constexpr std::string_view kCompareTpSchema = "tpcheck.compare_tp/1";  // compare_tp's to_dict()

// The rounding probe's relative perturbation (docs/POLICIES.md, "cancellation floor"):
// small enough for first order, far above f64 rounding (2⁻⁵²). The suite's truth runs and
// the Python truth (tpcheck.judge) probe with this u.
inline constexpr double kProbeU = 0x1.0p-30;

}  // namespace tpcheck::names
