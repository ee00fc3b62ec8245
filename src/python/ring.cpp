// ring.cpp — NCCL's ring reductions over raw buffers, for the `tpcheck` torch.distributed
// backend (python/tpcheck/emulate): one process per rank, every rank's input mapped into
// every process (shared memory), each rank computing its own output here.
//
//   ring_reduce(inputs, out, kind, op, order, rank, root, chunk_bytes)
//       inputs: one DLPack array per rank (CPU, float dtypes, C-contiguous, equal numel and
//       dtype); out: this rank's output (same dtype).
//       kind "all_reduce":     out[i] = the fold of inputs[*][i]   (out.numel == in.numel)
//       kind "reduce_scatter": out[j] = the fold of inputs[*][rank*B + j], B = out.numel
//                                                                  (in.numel == N*B)
//       kind "reduce":         like all_reduce, the chain of NCCL's ring reduce: it starts
//                              at the rank after `root` and ends at `root` (nccl-ring)
//       op: "sum", "avg" (NCCL's PreMulSum: every input times 1/N rounded to the dtype, then
//       summed), "max", "min" (fmax/fmin: a NaN loses to a number), "prod".
//       order "nccl-ring": the fold of element i starts at rank (k + 1) mod N and goes round
//       the ring to rank k, k being the chunk that finishes at rank k — for all_reduce k is
//       comm/ring_reference's `all_reduce_chunk_of(i, ...)` (the host model's own chunking,
//       the one definition), for reduce_scatter the block, for reduce the root. Every step
//       is rounded to the dtype (ring_reference.h says why a rounded f64 step is NCCL's).
//       order "rank": the fold goes 0, 1, ..., N-1 for every element, accumulated in f32
//       (f64 for f64) and rounded once to the dtype: the rank order of every tpcheck group
//       (the thread group's and the device group's, include/tpcheck/comm.h).
//   ring_model(kind, inputs, op) -> list of numpy f64 arrays: the host model itself
//       (ring::all_reduce / reduce_scatter / all_gather, op "sum" or "max"), every rank's
//       result — for tests of ring_reduce against the model.
//   ring_segments(count, world, dtype, chunk_bytes) -> [(begin, end, first_rank)]: the
//       all-reduce's chunking as runs of elements whose nccl-ring fold starts at first_rank
//       (for folds done elsewhere, e.g. by torch ops on a GPU), from all_reduce_chunk_of.
//   ring_fold_cuda(inputs, out, n_out, dtype, first, offset, count, stream, device,
//                  chunk_bytes, extra_outs, order)
//       The same sums on a GPU, by the C++ device group's kernel (comm/cuda/
//       device_collectives.cu: one definition for both). inputs: one device address per
//       rank, each of `count` elements of `dtype` (f64, f32, f16, bf16); out: a device
//       address of n_out elements; out[j] = the sum of inputs[*][offset + j]. Order
//       "nccl-ring" (the default): every step rounded to the dtype, starting at rank `first`
//       (0..N-1) or, with first = -1, at the nccl-ring start of element offset + j's
//       all-reduce chunk. Order "rank": ranks 0..N-1 in f32 (f64), rounded once (`first`
//       is not used).
//       extra_outs: more device addresses, each written like `out` (the in-place
//       all-reduce writes every rank's tensor). Enqueued on `stream` (a cudaStream_t as an
//       integer) of GPU `device`; returns at once. Built without CUDA: RuntimeError.
//   thread_group_reduce(kind, inputs, op, order) -> list of numpy f64 arrays: every rank's
//       result of the C++ thread group (run_thread_group, one thread per input) for kind
//       "all_reduce" (op "sum" or "max") or "reduce_scatter" (sum, along dimension 0) —
//       for tests that hold `tpcheck run`'s ranks to the same reference as the backend's.
// Errors: ValueError naming the argument. The work runs with the GIL released.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "comm/ring_reference.h"
#ifdef TPCHECK_HAVE_CUDA
#include <cuda_runtime.h>

#include "comm/cuda/device_collectives.h"
#endif
#include "python/dlpack.h"
#include "tpcheck/comm.h"
#include "tpcheck/dtype.h"
#include "tpcheck/error.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tpcheck::python {
namespace {

enum class Op { kSum, kAvg, kMax, kMin, kProd };

Op parse_op(const std::string& op) {
  if (op == "sum") return Op::kSum;
  if (op == "avg") return Op::kAvg;
  if (op == "max") return Op::kMax;
  if (op == "min") return Op::kMin;
  if (op == "prod" || op == "product") return Op::kProd;
  throw nb::value_error(
      fmt::format("ring: reduce op '{}' is not one of sum, avg, max, min, prod", op).c_str());
}

double load(DType dtype, const void* base, std::int64_t i) {
  switch (dtype) {
    case DType::kF64:
      return static_cast<const double*>(base)[i];
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return f16_bits_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kBF16:
      return bf16_bits_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    default:
      break;
  }
  TPCHECK_CHECK(false, "ring: dtype {} cannot be reduced", dtype_name(dtype));
  return 0.0;
}

void store(DType dtype, void* base, std::int64_t i, double v) {
  switch (dtype) {
    case DType::kF64:
      static_cast<double*>(base)[i] = v;
      return;
    case DType::kF32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DType::kF16:
      static_cast<std::uint16_t*>(base)[i] = f64_to_f16_bits(v);
      return;
    case DType::kBF16:
      static_cast<std::uint16_t*>(base)[i] = f64_to_bf16_bits(v);
      return;
    default:
      break;
  }
  TPCHECK_CHECK(false, "ring: dtype {} cannot be reduced", dtype_name(dtype));
}

// v is already a value of the dtype (f64 holds f16/bf16/f32 values exactly), so rounding
// the exact-in-f64 sum/product once gives the correctly rounded step (ring_reference.h).
double combine(Op op, DType dtype, double acc, double x) {
  switch (op) {
    case Op::kMax:
      return std::fmax(acc, x);
    case Op::kMin:
      return std::fmin(acc, x);
    case Op::kProd:
      return round_to(dtype, acc * x);
    default:
      return round_to(dtype, acc + x);
  }
}

struct Fold {
  Op op;
  DType dtype;
  std::vector<const void*> in;
  double premul = 1.0;  // avg: round(1/N) in the dtype

  double value(int r, std::int64_t i) const {
    double v = load(dtype, in[r], i);
    return op == Op::kAvg ? round_to(dtype, v * premul) : v;
  }
  // Fold element i over ranks first, first+1, ... (mod N), rounded to the dtype at every
  // step: NCCL's ring.
  double run(std::int64_t i, int first) const {
    const int n = static_cast<int>(in.size());
    double acc = value(first, i);
    for (int s = 1; s < n; ++s) acc = combine(op, dtype, acc, value((first + s) % n, i));
    return acc;
  }
  // Fold element i over ranks 0, 1, ..., N-1 in f32 (f64 for f64), rounded to the dtype
  // once: rank order.
  double run_rank_order(std::int64_t i) const {
    const int n = static_cast<int>(in.size());
    const DType acc_type = dtype == DType::kF64 ? DType::kF64 : DType::kF32;
    double acc = value(0, i);
    for (int r = 1; r < n; ++r) acc = combine(op, acc_type, acc, value(r, i));
    return round_to(dtype, acc);
  }
};

// The order a reduction adds in, from its name (comm.h's names; one definition).
CommOrder order_of(const char* fn, const std::string& order) {
  for (CommOrder o : {CommOrder::kNcclRing, CommOrder::kRank}) {
    if (order == comm_order_name(o)) return o;
  }
  throw nb::value_error(fmt::format("{}: order '{}' is not {} or {}", fn, order,
                                    comm_order_name(CommOrder::kNcclRing),
                                    comm_order_name(CommOrder::kRank))
                            .c_str());
}

// The all-reduce's chunking as runs [begin, end) whose nccl-ring fold starts at
// first_rank. Chunk indices rise within a loop of N*C elements and restart at the next
// loop: each run's end is found by binary search over all_reduce_chunk_of (the model's).
using Segments = std::vector<std::tuple<std::int64_t, std::int64_t, int>>;
Segments segments_of(std::int64_t count, int world, DType dt, std::size_t chunk_bytes) {
  Segments segs;
  const std::int64_t loop = world * ring::chunk_elements(chunk_bytes, dt);
  std::int64_t b = 0;
  while (b < count) {
    const int k = ring::all_reduce_chunk_of(b, count, world, dt, chunk_bytes);
    std::int64_t lo = b, hi = std::min(count, (b / loop + 1) * loop);  // chunk k at lo
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (ring::all_reduce_chunk_of(mid, count, world, dt, chunk_bytes) == k)
        lo = mid;
      else
        hi = mid;
    }
    segs.emplace_back(b, hi, (k + 1) % world);
    b = hi;
  }
  return segs;
}

void ring_reduce(const std::vector<nb::ndarray<>>& inputs, nb::ndarray<> out,
                 const std::string& kind, const std::string& op_name, const std::string& order,
                 int rank, int root, std::size_t chunk_bytes) {
  const int n = static_cast<int>(inputs.size());
  if (n == 0) throw nb::value_error("ring_reduce: no inputs");
  if (rank < 0 || rank >= n)
    throw nb::value_error(fmt::format("ring_reduce: rank {} of {}", rank, n).c_str());
  const bool ring = order_of("ring_reduce", order) == CommOrder::kNcclRing;
  Fold f{parse_op(op_name), DType::kF64, {}, 1.0};
  std::int64_t count = -1;
  std::vector<WrappedArray> keep;
  for (int r = 0; r < n; ++r) {
    keep.push_back(wrap_array(inputs[r], fmt::format("inputs[{}]", r)));
    const Tensor& t = keep.back().tensor;
    if (t.device() != Device::kCpu) throw nb::value_error("ring_reduce: inputs must be CPU arrays");
    if (r == 0) {
      f.dtype = t.dtype();
      count = t.numel();
    } else if (t.dtype() != f.dtype || t.numel() != count) {
      throw nb::value_error(fmt::format("ring_reduce: inputs[{}] is {} but inputs[0] is {}", r,
                                        t.describe(), keep[0].tensor.describe())
                                .c_str());
    }
    f.in.push_back(t.raw());
  }
  if (f.dtype != DType::kF64 && f.dtype != DType::kF32 && f.dtype != DType::kF16 &&
      f.dtype != DType::kBF16) {
    throw nb::type_error(
        fmt::format("ring_reduce: dtype {} cannot be reduced (f64, f32, f16, bf16)",
                    dtype_name(f.dtype))
            .c_str());
  }
  WrappedArray o = wrap_array(out, "out");
  if (o.tensor.device() != Device::kCpu || o.tensor.dtype() != f.dtype) {
    throw nb::value_error(fmt::format("ring_reduce: out is {}, expected a CPU {} array",
                                      o.tensor.describe(), dtype_name(f.dtype))
                              .c_str());
  }
  f.premul = round_to(f.dtype, 1.0 / n);
  void* dst = o.tensor.raw();
  const std::int64_t m = o.tensor.numel();
  nb::gil_scoped_release release;
  if (kind == "all_reduce" || kind == "reduce") {
    if (m != count)
      throw std::invalid_argument(
          fmt::format("ring_reduce {}: out has {} elements, inputs {}", kind, m, count));
    if (!ring) {
      for (std::int64_t i = 0; i < count; ++i) store(f.dtype, dst, i, f.run_rank_order(i));
      return;
    }
    const Segments segs = kind == "reduce" ? Segments{{0, count, (root + 1) % n}}
                                           : segments_of(count, n, f.dtype, chunk_bytes);
    for (const auto& [b, e, first] : segs) {
      for (std::int64_t i = b; i < e; ++i) store(f.dtype, dst, i, f.run(i, first));
    }
  } else if (kind == "reduce_scatter") {
    if (m * n != count)
      throw std::invalid_argument(fmt::format(
          "ring_reduce reduce_scatter: out has {} elements, inputs {} for {} ranks", m, count, n));
    for (std::int64_t j = 0; j < m; ++j) {
      store(f.dtype, dst, j,
            ring ? f.run(rank * m + j, (rank + 1) % n) : f.run_rank_order(rank * m + j));
    }
  } else {
    throw std::invalid_argument(
        fmt::format("ring_reduce: kind '{}' is not all_reduce, reduce_scatter or reduce", kind));
  }
}

std::vector<nb::object> ring_model(const std::string& kind,
                                   const std::vector<nb::ndarray<>>& inputs,
                                   const std::string& op_name) {
  std::vector<Tensor> in;
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    in.push_back(wrap_array(inputs[r], fmt::format("inputs[{}]", r)).tensor);
  }
  const Op op = parse_op(op_name);
  if (kind != "all_gather" && op != Op::kSum && op != Op::kMax) {
    throw nb::value_error("ring_model: the host model has sum and max only");
  }
  const ReduceOp rop = op == Op::kMax ? ReduceOp::kMax : ReduceOp::kSum;
  std::vector<Tensor> res;
  if (kind == "all_reduce")
    res = ring::all_reduce(in, rop);
  else if (kind == "reduce_scatter")
    res = ring::reduce_scatter(in, rop);
  else if (kind == "all_gather")
    res = ring::all_gather(in);
  else
    throw nb::value_error(fmt::format("ring_model: kind '{}'", kind).c_str());
  std::vector<nb::object> out;
  for (const Tensor& t : res) out.push_back(to_numpy(t));
  return out;
}

Segments ring_segments(std::int64_t count, int world, const std::string& dtype,
                       std::size_t chunk_bytes) {
  if (world <= 0) throw nb::value_error("ring_segments: world must be positive");
  return segments_of(count, world, parse_dtype(dtype), chunk_bytes);
}

std::vector<nb::object> thread_group_reduce(const std::string& kind,
                                            const std::vector<nb::ndarray<>>& inputs,
                                            const std::string& op_name, const std::string& order) {
  ThreadGroupOptions options;
  options.order = order_of("thread_group_reduce", order);
  const Op op = parse_op(op_name);
  const bool reduce_scatter = kind == "reduce_scatter";
  if (!reduce_scatter && kind != "all_reduce") {
    throw nb::value_error(
        fmt::format("thread_group_reduce: kind '{}' is not all_reduce or reduce_scatter", kind)
            .c_str());
  }
  if (op != Op::kSum && (op != Op::kMax || reduce_scatter)) {
    throw nb::value_error(
        fmt::format("thread_group_reduce: op '{}'; the thread group has sum (and max for "
                    "all_reduce)",
                    op_name)
            .c_str());
  }
  std::vector<Tensor> in;
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    in.push_back(wrap_array(inputs[r], fmt::format("inputs[{}]", r)).tensor.clone());
  }
  std::vector<Tensor> res(in.size());
  {
    nb::gil_scoped_release release;
    run_thread_group(
        static_cast<int>(in.size()),
        [&](Communicator& comm) {
          Tensor& t = in[comm.rank()];
          if (reduce_scatter) {
            res[comm.rank()] = comm.reduce_scatter(t, 0);
          } else {
            comm.all_reduce(t, op == Op::kMax ? ReduceOp::kMax : ReduceOp::kSum);
            res[comm.rank()] = t;
          }
        },
        options);
  }
  std::vector<nb::object> out;
  for (const Tensor& t : res) out.push_back(to_numpy(t));
  return out;
}

void ring_fold_cuda(const std::vector<std::uintptr_t>& inputs, std::uintptr_t out,
                    std::int64_t n_out, const std::string& dtype, int first, std::int64_t offset,
                    std::int64_t count, std::uintptr_t stream, int device, std::size_t chunk_bytes,
                    const std::vector<std::uintptr_t>& extra_outs, const std::string& order) {
  const bool ring = order_of("ring_fold_cuda", order) == CommOrder::kNcclRing;
#ifdef TPCHECK_HAVE_CUDA
  const int n = static_cast<int>(inputs.size());
  if (n < 1 || n > cuda::kMaxDeviceRanks) {
    throw nb::value_error(
        fmt::format("ring_fold_cuda: {} inputs; expected 1 to {}", n, cuda::kMaxDeviceRanks)
            .c_str());
  }
  if (first < -1 || first >= n) {
    throw nb::value_error(
        fmt::format("ring_fold_cuda: first rank {}; expected -1 or 0..{}", first, n - 1).c_str());
  }
  if (n_out < 0 || offset < 0 || offset + n_out > count) {
    throw nb::value_error(fmt::format("ring_fold_cuda: elements [{}, {}) are outside the "
                                      "inputs' {}",
                                      offset, offset + n_out, count)
                              .c_str());
  }
  const DType dt = parse_dtype(dtype);
  if (dt != DType::kF64 && dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16) {
    throw nb::type_error(
        fmt::format("ring_fold_cuda: dtype {} cannot be reduced (f64, f32, f16, bf16)", dtype)
            .c_str());
  }
  cuda::ReduceLaunch p;
  for (int r = 0; r < n; ++r) p.inputs[r] = reinterpret_cast<const void*>(inputs[r]);
  p.world = n;
  p.dtype = dt;
  p.mode = ring ? cuda::ReduceMode::kRingSum : cuda::ReduceMode::kRankSum;
  p.out = reinterpret_cast<void*>(out);
  if (extra_outs.size() > static_cast<std::size_t>(cuda::kMaxDeviceRanks)) {
    throw nb::value_error(fmt::format("ring_fold_cuda: {} extra outputs; at most {}",
                                      extra_outs.size(), cuda::kMaxDeviceRanks)
                              .c_str());
  }
  p.extra_outs = static_cast<int>(extra_outs.size());
  for (std::size_t k = 0; k < extra_outs.size(); ++k)
    p.outs[k] = reinterpret_cast<void*>(extra_outs[k]);
  p.n_out = n_out;
  p.dim_size = count;  // one row of `count` elements: src(j) = offset + j
  p.rows = n_out;
  p.row_start = offset;
  p.fixed_start = first;
  p.count = count;
  p.chunk_elems = ring::chunk_elements(chunk_bytes, dt);
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    throw nb::value_error(fmt::format("ring_fold_cuda: cannot use GPU {}", device).c_str());
  }
  try {
    cuda::launch_reduce(p, reinterpret_cast<cudaStream_t>(stream));
  } catch (...) {
    cudaSetDevice(previous);
    throw;
  }
  cudaSetDevice(previous);
#else
  (void)inputs, (void)out, (void)n_out, (void)dtype, (void)first, (void)offset, (void)count,
      (void)stream, (void)device, (void)chunk_bytes, (void)extra_outs, (void)ring;
  throw std::runtime_error("ring_fold_cuda: this tpcheck was built without CUDA");
#endif
}

}  // namespace
}  // namespace tpcheck::python

// Registered from module.cpp's NB_MODULE with one line.
void tpcheck_register_ring(nb::module_& m) {
  using namespace tpcheck::python;
  m.def("ring_reduce", &ring_reduce, "inputs"_a, "out"_a, "kind"_a, "op"_a, "order"_a, "rank"_a,
        "root"_a = 0, "chunk_bytes"_a = tpcheck::ring::kDefaultChunkBytes,
        "This rank's output of NCCL's ring reduction (or rank order) over every rank's buffer.");
  m.def("ring_model", &ring_model, "kind"_a, "inputs"_a, "op"_a = "sum",
        "The host model of NCCL's ring (comm/ring_reference): every rank's result, f64.");
  m.def("ring_segments", &ring_segments, "count"_a, "world"_a, "dtype"_a,
        "chunk_bytes"_a = tpcheck::ring::kDefaultChunkBytes,
        "The all-reduce's chunking as (begin, end, first_rank) runs.");
  m.def("ring_fold_cuda", &ring_fold_cuda, "inputs"_a, "out"_a, "n_out"_a, "dtype"_a, "first"_a,
        "offset"_a, "count"_a, "stream"_a, "device"_a,
        "chunk_bytes"_a = tpcheck::ring::kDefaultChunkBytes,
        "extra_outs"_a = std::vector<std::uintptr_t>{},
        "order"_a = std::string(tpcheck::comm_order_name(tpcheck::CommOrder::kNcclRing)),
        "out[j] = the sum of inputs[*][offset + j] on a GPU (the device group's kernel).");
  m.def("thread_group_reduce", &thread_group_reduce, "kind"_a, "inputs"_a, "op"_a = "sum",
        "order"_a = std::string(tpcheck::comm_order_name(tpcheck::CommOrder::kRank)),
        "Every rank's result of the C++ thread group's all_reduce or reduce_scatter, f64.");
}
