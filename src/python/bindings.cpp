// bindings.cpp — tpcheck._tpcheck, the compiled half of the Python package (python/tpcheck
// is the other half: the Verdict class, argument defaults, the torchrun launch).
//
//   compare(...)        compare_tensors + evaluate on DLPack arrays, zero-copy; a dict
//   run_layer(...)      run_layer (truth.h) on DLPack arrays; numpy f64 results
//   layer_parameters()  a layer's parameter names and shapes
//   run(options)        run_suite (tpcheck_run) from {keyword: text}; the JSON report
//                       as a string and the console
//   run_options()       the run options' table, for tpcheck.run's signature
//   main(argv)          the whole CLI (`python -m tpcheck ...`), its exit code
//   make_nccl_id(), set_process_nccl_id(bytes)   the NCCL id through torchrun's store
//   ipc_alloc/ipc_open/ipc_close/ipc_free, cuda_bytes   CUDA IPC buffers of `tpcheck
//                       emulate`'s CUDA exchange (cuda_ipc.cpp)
//   probe_factors_into(address, first, count, u, seed)
//                       the rounding probe's factors (random_math::probe_factor, the one
//                       definition) for stream positions first.. into a CPU float64 buffer
//   trace_ledger(logs, pid, query), trace_summary(ledger), trace_diff(a, b)
//                       tpcheck.trace(): cuBLASLt logs → a ledger (tpcheck.trace/1), its
//                       summary and the difference of two, through the forensics parser
// Errors: tpcheck's Error(kInput) → ValueError, other Errors → RuntimeError; bad arrays
// → TypeError / ValueError (dlpack.h). Long work runs with the GIL released.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>

#include "core/random_math.h"
#include "python/dlpack.h"
#include "python/truth.h"
#include "tpcheck/cli.h"
#include "tpcheck/cublaslt_log.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/device.h"
#include "tpcheck/error.h"
#include "tpcheck/gemm_record.h"
#include "tpcheck/ledger_diff.h"
#include "tpcheck/names.h"
#include "tpcheck/numerics.h"
#include "tpcheck/run_options.h"
#include "tpcheck/run_suite.h"
#include "tpcheck/suite.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tpcheck::python {
namespace {

// Makes `device` current for wrapping CUDA arrays, and restores the caller's device.
class ExternalCudaDevice {
 public:
  explicit ExternalCudaDevice(const std::vector<const WrappedArray*>& arrays) {
    for (const WrappedArray* a : arrays) {
      if (a == nullptr || a->tensor.device() != Device::kCuda) continue;
      if (active_) {
        if (a->device_id != device_) {
          throw nb::value_error(fmt::format("arrays on different GPUs (cuda:{} and cuda:{}); "
                                            "compare tensors on one device",
                                            device_, a->device_id)
                                    .c_str());
        }
        continue;
      }
      device_ = a->device_id;
      previous_ = use_external_cuda_device(device_);
      active_ = true;
    }
  }
  ~ExternalCudaDevice() {
    if (active_) restore_cuda_device(previous_);
  }

 private:
  bool active_ = false;
  int device_ = 0, previous_ = 0;
};

nb::dict comparison_dict(const TensorComparison& c, const Shape& shape) {
  nb::dict d;
  d["numel"] = c.numel;
  d["dtype"] = std::string(dtype_name(c.dtype));
  d["has_tolerance"] = c.has_tolerance;
  d["rtol"] = c.tolerance.rtol;
  d["atol"] = c.tolerance.atol;
  d["argmax"] = c.argmax;
  // The position in the arrays' own shape (the C++ side saw them flat).
  std::vector<std::int64_t> index;
  if (c.argmax >= 0) {
    std::int64_t rest = c.argmax;
    index.assign(shape.size(), 0);
    for (std::size_t i = shape.size(); i-- > 0;) {
      index[i] = rest % shape[i];
      rest /= shape[i];
    }
  }
  d["argmax_index"] = nb::tuple(nb::cast(index));
  d["sharded_value"] = c.sharded_value;
  d["single_value"] = c.single_value;
  d["max_abs_diff"] = c.max_abs_diff;
  d["rel_at_max"] = c.rel_at_max;
  d["norm_rel_diff"] = c.norm_rel_diff;
  d["count_over_allclose"] = c.count_over_allclose;
  d["count_bits_differ"] = c.count_bits_differ;
  d["bitwise_equal"] = c.bitwise_equal;
  d["sharded_nan"] = c.sharded_nan;
  d["sharded_inf"] = c.sharded_inf;
  d["single_nan"] = c.single_nan;
  d["single_inf"] = c.single_inf;
  d["sharded_all_zero"] = c.sharded_all_zero;
  d["single_all_zero"] = c.single_all_zero;
  d["has_truth"] = c.has_truth;
  if (c.has_truth) {
    d["truth_nonfinite"] = c.truth_nonfinite;
    d["truth_rms"] = c.truth_rms;
    d["truth_max_abs"] = c.truth_max_abs;
    for (const auto& [key, e] : {std::pair{"single_vs_truth", &c.single_vs_truth},
                                 std::pair{"sharded_vs_truth", &c.sharded_vs_truth}}) {
      nb::dict t;
      t["max_abs"] = e->max_abs;
      t["argmax"] = e->argmax;
      t["rms"] = e->rms;
      d[key] = t;
    }
    d["scale_shift"] = c.scale_shift;
    d["scale_shift_sigma"] = c.scale_shift_sigma;
    d["single_scale_error"] = c.single_scale_error;
    d["single_error_offset_share"] = c.single_error_offset_share;
    d["truth_variation"] = c.truth_variation;
  }
  d["has_rounding_noise"] = c.has_rounding_noise;
  if (c.has_rounding_noise) {
    d["rounding_noise_rms"] = c.rounding_noise_rms;
    d["rounding_noise_max_abs"] = c.rounding_noise_max_abs;
  }
  return d;
}

nb::dict compare(nb::ndarray<> sharded, nb::ndarray<> single, std::optional<nb::ndarray<>> truth,
                 std::optional<nb::ndarray<>> rounding_noise, const std::string& policy,
                 std::optional<double> rtol, std::optional<double> atol,
                 std::optional<double> unit_roundoff, std::int64_t reduction_length, int tp_size,
                 double multiplier, double floor_factor, const std::string& name) {
  const WrappedArray a = wrap_array(sharded, "sharded");
  const WrappedArray b = wrap_array(single, "single");
  std::optional<WrappedArray> t, n;
  if (truth) t = wrap_array(*truth, "truth");
  if (rounding_noise) n = wrap_array(*rounding_noise, "rounding_noise");
  if (a.shape != b.shape) {
    throw nb::value_error(fmt::format("sharded has shape {} but single has shape {}",
                                      shape_str(a.shape), shape_str(b.shape))
                              .c_str());
  }
  for (const auto& [w, label] : {std::pair{&t, "truth"}, std::pair{&n, "rounding_noise"}}) {
    if (w->has_value() && (*w)->shape != b.shape) {
      throw nb::value_error(fmt::format("{} has shape {} but single has shape {}", label,
                                        shape_str((*w)->shape), shape_str(b.shape))
                                .c_str());
    }
    if (w->has_value() && (*w)->tensor.dtype() != DType::kF64) {
      throw nb::type_error(fmt::format("{}: dtype {} given; the fp64 truth must be float64", label,
                                       dtype_name((*w)->tensor.dtype()))
                               .c_str());
    }
  }
  TPCHECK_CHECK_INPUT(reduction_length >= 1, "reduction_length must be >= 1, got {}",
                      reduction_length);
  TPCHECK_CHECK_INPUT(tp_size >= 1, "tp_size must be >= 1, got {}", tp_size);
  if (rtol) TPCHECK_CHECK_INPUT(*rtol >= 0, "rtol must be >= 0, got {}", *rtol);
  if (atol) TPCHECK_CHECK_INPUT(*atol >= 0, "atol must be >= 0, got {}", *atol);
  Policy p = parse_policy(policy);
  p.truth.unit_roundoff = unit_roundoff;
  p.truth.reduction_length = reduction_length;
  p.truth.tp_size = tp_size;
  p.truth.multiplier = multiplier;
  p.truth.floor_factor = floor_factor;

  ExternalCudaDevice cuda({&a, &b, t ? &*t : nullptr, n ? &*n : nullptr});
  TensorComparison c;
  Verdict v;
  {
    nb::gil_scoped_release release;  // the arrays stay referenced by a, b, t, n
    c = compare_tensors(a.tensor, b.tensor, t ? &t->tensor : nullptr, CompareOptions{rtol, atol},
                        n ? &n->tensor : nullptr);
    v = evaluate(p, c);
  }
  nb::dict d;
  d["status"] = std::string(verdict_status_name(v.status));
  d["passed"] = v.passed();
  d["reason"] = v.reason;
  d["policy"] = policy;
  d["statistics"] = comparison_dict(c, b.shape);
  if (c.has_tolerance && c.numel > 0) d["reference_line"] = format_te_failure(name, c);
  return d;
}

std::map<std::string, Tensor> wrap_dict(const std::map<std::string, nb::ndarray<>>& arrays,
                                        const std::string& label,
                                        std::vector<WrappedArray>& keep) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, array] : arrays) {
    const std::string what = fmt::format("{}['{}']", label, name);
    keep.push_back(wrap_array(array, what));
    out[name] = shaped(keep.back(), what);
  }
  return out;
}

nb::dict run_layer(const std::string& kind, const std::string& options_json,
                   const std::map<std::string, nb::ndarray<>>& params, nb::ndarray<> input,
                   const std::map<std::string, nb::ndarray<>>& grad_outputs,
                   const std::string& device, const std::string& dtype, bool allow_tf32,
                   int tp_size, const std::string& recipe, double probe_u,
                   std::uint64_t probe_seed) {
  LayerRunRequest r;
  r.kind = kind;
  r.dtype = dtype;
  r.allow_tf32 = allow_tf32;
  r.tp_size = tp_size;
  r.recipe = recipe;
  r.probe_u = probe_u;
  r.probe_seed = probe_seed;
  r.options = nlohmann::json::parse(options_json);
  r.device = device;
  std::vector<WrappedArray> keep;
  keep.reserve(params.size() + grad_outputs.size() + 1);
  r.params = wrap_dict(params, "params", keep);
  r.grad_outputs = wrap_dict(grad_outputs, "grad_output", keep);
  keep.push_back(wrap_array(input, "inputs"));
  r.input = shaped(keep.back(), "inputs");
  std::vector<const WrappedArray*> all;
  for (const WrappedArray& w : keep) all.push_back(&w);
  ExternalCudaDevice cuda(all);
  LayerRunResult result;
  {
    nb::gil_scoped_release release;
    result = tpcheck::run_layer(r);
  }
  nb::dict d, outputs, grads;
  for (const auto& [name, t] : result.outputs) outputs[name.c_str()] = to_numpy(t);
  for (const auto& [name, t] : result.grads) grads[name.c_str()] = to_numpy(t);
  d["outputs"] = outputs;
  d["grads"] = grads;
  d["grad_input"] = result.grad_input.defined() ? to_numpy(result.grad_input) : nb::none();
  return d;
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> layer_parameters(
    const std::string& kind, const std::string& options_json) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  for (auto& [name, shape] : layer_parameter_shapes(kind, nlohmann::json::parse(options_json))) {
    out.emplace_back(name, shape);
  }
  return out;
}

// tpcheck.run's options, those of `tpcheck run` (the hidden testing hooks aside), as the
// table has them: keyword, flag, kind, choices, whether None is allowed, the default as the
// command line would give it, help. python/tpcheck builds run()'s signature from it.
nb::list run_options() {
  static const char* const kKindNames[] = {"flag", "int", "float", "str", "choice"};
  nb::list out;
  for (const RunOptionInfo& info : run_option_table()) {
    if ((info.commands & kForRun) == 0 || (info.commands & kHiddenOption) != 0) continue;
    nb::dict d;
    d["keyword"] = info.keyword;
    d["flag"] = "--" + info.name;
    d["kind"] = kKindNames[static_cast<int>(info.kind)];
    std::vector<std::string> choices(info.choices.begin(), info.choices.end());
    d["choices"] = choices;
    d["optional"] = info.optional;
    d["default"] = info.default_text;
    d["help"] = std::string(info.help);
    out.append(d);
  }
  return out;
}

// A suite run from the options as text (the command line's text, so the same checks and
// messages): (report JSON, console text, passed, failed, reports).
std::tuple<std::string, std::string, int, int, bool> run(
    const std::map<std::string, std::string>& texts) {
  RunOptions options;
  for (const auto& [name, text] : texts) set_run_option(options, name, text);
  std::ostringstream console;
  RunOutcome outcome;
  {
    nb::gil_scoped_release release;
    outcome = run_suite(options, console);
  }
  return {outcome.report.dump(), console.str(), outcome.summary.passed, outcome.summary.failed,
          outcome.reports};
}

int main(const std::vector<std::string>& argv) {
  std::vector<std::string> args = argv;
  std::vector<char*> ptrs;
  for (std::string& s : args) ptrs.push_back(s.data());
  ptrs.push_back(nullptr);
  nb::gil_scoped_release release;
  const int rc = cli_main(static_cast<int>(args.size()), ptrs.data());
  std::cout.flush();
  std::fflush(stdout);
  return rc;
}

nb::bytes make_nccl_id_bytes() {
  const NcclId id = make_nccl_id();
  return nb::bytes(id.bytes.data(), id.bytes.size());
}

void set_process_nccl_id_bytes(nb::bytes bytes) {
  NcclId id;
  if (bytes.size() != id.bytes.size()) {
    throw nb::value_error(fmt::format("an NCCL id is {} bytes, got {}", id.bytes.size(), bytes.size())
                              .c_str());
  }
  std::memcpy(id.bytes.data(), bytes.c_str(), id.bytes.size());
  set_process_nccl_id(id);
}

// tpcheck.trace(): the logs the process's cuBLASLt copies wrote during the `with` block
// (one file per loaded copy: PyTorch's and tpcheck's own may be two libraries), one ledger
// process per file, in the schema `tpcheck trace` writes, so `tpcheck diff` reads it too.
std::string trace_ledger(const std::vector<std::string>& logs, int pid, bool query) {
  TPCHECK_CHECK_INPUT(!query || cublaslt_query_available(),
                      "query=True needs tpcheck built with CUDA (this build has TPCHECK_CUDA=OFF)");
  TraceLedger ledger;
  ledger.command = {"tpcheck.trace() in python"};
  for (const std::string& path : logs) {
    CublasLtLog log = read_cublaslt_log(path);
    TraceProcess p;
    p.pid = pid;
    p.log = path;
    p.calls = std::move(log.calls);
    p.problems = std::move(log.problems);
    if (query) query_numerical_impls(p.calls);
    ledger.processes.push_back(std::move(p));
  }
  ledger.environment = {{"devices", query_devices().description}};
  return trace_to_json(ledger).dump();
}

std::vector<CublasLtCall> all_calls(const std::string& ledger_json, const char* what) {
  const TraceLedger ledger = trace_from_json(nlohmann::json::parse(ledger_json), what);
  std::vector<CublasLtCall> calls;
  for (const TraceProcess& p : ledger.processes) calls.insert(calls.end(), p.calls.begin(), p.calls.end());
  return calls;
}

// GEMM count by shape, algorithm and numerical class, over every process of the ledger.
std::string trace_summary(const std::string& ledger_json) {
  return format_call_summary(all_calls(ledger_json, "trace"));
}

// The calls of two ledgers aligned and compared (as `tpcheck logdiff`); the text and
// whether anything differs.
std::pair<std::string, bool> trace_diff(const std::string& a_json, const std::string& b_json,
                                        const std::string& label_a, const std::string& label_b) {
  const CublasLtDiff d = diff_cublaslt_calls(all_calls(a_json, "this trace"),
                                             all_calls(b_json, "the other trace"));
  return {format_cublaslt_diff(d, label_a, label_b), d.any()};
}

// Writes count factors, for stream positions first, first + 1, ..., into the float64
// buffer at `address` (a CPU tensor's data_ptr, owned by the caller).
void probe_factors_into(std::uintptr_t address, std::int64_t first, std::int64_t count, double u,
                        std::uint64_t seed) {
  if (first < 1 || count < 0) {
    throw nb::value_error(
        fmt::format("probe_factors_into: positions {}..{}; expected first >= 1, count >= 0",
                    first, first + count - 1)
            .c_str());
  }
  if (count > 0 && address == 0) throw nb::value_error("probe_factors_into: address 0");
  double* out = reinterpret_cast<double*>(address);
  nb::gil_scoped_release unlocked;
  for (std::int64_t i = 0; i < count; ++i)
    out[i] = random_math::probe_factor(u, seed, static_cast<std::uint64_t>(first + i));
}

// The names both sides use (include/tpcheck/names.h), for python/tpcheck/_names.py.
nb::dict shared_names() {
  namespace n = tpcheck::names;
  nb::dict kinds, schemas;
  kinds["output"] = std::string(n::kOutput);
  kinds["parameter_gradient"] = std::string(n::kParameterGradient);
  kinds["input_gradient"] = std::string(n::kInputGradient);
  schemas["run"] = std::string(n::kRunSchema);
  schemas["explain"] = std::string(n::kExplainSchema);
  schemas["trace"] = std::string(n::kTraceSchema);
  schemas["emulate"] = std::string(n::kEmulateSchema);
  schemas["compare_tp"] = std::string(n::kCompareTpSchema);
  nb::list dtypes, orders;
  nb::dict order_names;
  order_names["nccl_ring"] = std::string(tpcheck::comm_order_name(tpcheck::CommOrder::kNcclRing));
  order_names["rank"] = std::string(tpcheck::comm_order_name(tpcheck::CommOrder::kRank));
  for (tpcheck::DType d : {tpcheck::DType::kF64, tpcheck::DType::kF32, tpcheck::DType::kF16,
                           tpcheck::DType::kBF16, tpcheck::DType::kF8E4M3, tpcheck::DType::kF8E5M2,
                           tpcheck::DType::kF4E2M1, tpcheck::DType::kF8E8M0}) {
    dtypes.append(std::string(tpcheck::dtype_name(d)));
  }
  for (tpcheck::CommOrder o : {tpcheck::CommOrder::kNcclRing, tpcheck::CommOrder::kRank}) {
    orders.append(std::string(tpcheck::comm_order_name(o)));
  }
  nb::dict out;
  out["report_kinds"] = kinds;
  out["schemas"] = schemas;
  out["dtypes"] = dtypes;
  out["comm_orders"] = orders;
  out["comm_order_names"] = order_names;
  out["probe_u"] = n::kProbeU;
  return out;
}

// tpcheck::Error as the package's own exception types (python/tpcheck/_errors.py): input
// errors as InputError, the rest as RunError; the builtin ValueError / RuntimeError where
// the package's module cannot be imported (the module used on its own).
void raise_tpcheck_error(const tpcheck::Error& e) {
  const bool input = e.kind() == tpcheck::ErrorKind::kInput;
  PyObject* type = input ? PyExc_ValueError : PyExc_RuntimeError;
  nb::object cls;
  try {
    cls = nb::module_::import_("tpcheck._errors").attr(input ? "InputError" : "RunError");
    type = cls.ptr();
  } catch (const nb::python_error&) {
  }
  PyErr_SetString(type, e.what());
}

double math_class_u(const std::string& name) {
  return math_class_unit_roundoff(parse_math_class(name));
}

}  // namespace
}  // namespace tpcheck::python

NB_MODULE(_tpcheck, m) {
  using namespace tpcheck::python;
  m.doc() = "tpcheck's compiled core (use the `tpcheck` package, not this module)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tpcheck::Error& e) {
      raise_tpcheck_error(e);
    } catch (const nlohmann::json::exception& e) {
      raise_tpcheck_error(tpcheck::Error(tpcheck::ErrorKind::kInput, e.what()));
    }
  });
  m.def("compare", &compare, "sharded"_a, "single"_a, "truth"_a.none(), "rounding_noise"_a.none(),
        "policy"_a, "rtol"_a.none(), "atol"_a.none(), "unit_roundoff"_a.none(),
        "reduction_length"_a, "tp_size"_a, "multiplier"_a, "floor_factor"_a, "name"_a,
        "Statistics and verdict of sharded against single (and the fp64 truth), as a dict.");
  m.def("run_layer", &run_layer, "kind"_a, "options_json"_a, "params"_a, "input"_a,
        "grad_outputs"_a, "device"_a, "dtype"_a = "f64", "allow_tf32"_a = false,
        "tp_size"_a = 1, "recipe"_a = "none", "probe_u"_a = 0.0, "probe_seed"_a = 0,
        "Outputs and gradients of tpcheck's implementation of a layer, as f64 arrays: in "
        "f64 the truth (probe_u > 0: under the rounding probe), else the suite's run in "
        "`dtype` (with `recipe`: quantized); tp_size > 1 runs it sharded in the suite's "
        "group and reassembles.");
  m.def("layer_parameters", &layer_parameters, "kind"_a, "options_json"_a,
        "The layer's parameters as (name, shape), in its documented order.");
  m.def("run_options", &run_options, "tpcheck.run's options, from the run options' table.");
  m.def("run", &run, "options"_a,
        "Runs a suite from {keyword: text}; returns (report JSON, console text, passed, "
        "failed, reports).");
  m.def("main", &main, "argv"_a, "The tpcheck command line; returns its exit code.");
  void tpcheck_register_ring(nb::module_&); tpcheck_register_ring(m);  // ring.cpp (issue 32)
  void tpcheck_register_cuda_ipc(nb::module_&); tpcheck_register_cuda_ipc(m);  // cuda_ipc.cpp
  m.def("make_nccl_id", &make_nccl_id_bytes, "A fresh NCCL unique id (128 bytes).");
  m.def("set_process_nccl_id", &set_process_nccl_id_bytes, "id"_a,
        "The NCCL id this process's launch shares (torchrun's store).");
  m.def("dtype_unit_roundoff",
        [](const std::string& name) { return tpcheck::dtype_unit_roundoff(tpcheck::parse_dtype(name)); },
        "name"_a, "Unit roundoff of a storage dtype ('f32', 'bf16', ...).");
  m.def("math_class_unit_roundoff", &math_class_u, "name"_a,
        "Unit roundoff of a GEMM math class ('fp32', 'tf32', 'bf16', 'fp16', 'fp64').");
  m.def("probe_factors_into", &probe_factors_into, "address"_a, "first"_a, "count"_a, "u"_a,
        "seed"_a, "The rounding probe's factors for positions first.. into a CPU float64 buffer.");
  m.def("trace_ledger", &trace_ledger, "logs"_a, "pid"_a, "query"_a,
        "cuBLASLt log files → a trace ledger (JSON, schema tpcheck.trace/1).");
  m.def("trace_summary", &trace_summary, "ledger"_a,
        "GEMM count by shape, algorithm and numerical class of a trace ledger.");
  m.def("trace_diff", &trace_diff, "a"_a, "b"_a, "label_a"_a, "label_b"_a,
        "Two trace ledgers' calls aligned and compared: (text, anything differs).");
  m.def("policy_names", &tpcheck::policy_names, "The policies compare accepts.");
  m.def("shared_names", &shared_names,
        "Names the C++ program and the package share (include/tpcheck/names.h).");
  m.def("cpu_gemm_fingerprint", &tpcheck::cpu_gemm_fingerprint,
        "Hash of this machine's sgemm/dgemm bits at the suite's shapes (reports' "
        "environment.cpu_gemm_fingerprint).");
  m.def("cuda_devices", [] { return tpcheck::query_devices().cuda_devices; },
        "GPUs this build can use (0 when built without CUDA).");
  m.def("built_with_cuda", [] {
#ifdef TPCHECK_HAVE_CUDA
    return true;
#else
    return false;
#endif
  });
}
