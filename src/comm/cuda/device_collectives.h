// device_collectives.h — the reduction kernel of the device group (N ranks on one GPU):
// every rank computes its own result from all ranks' input buffers (same device).
//
// Output element j of rank r is read from flat index
//   src(j) = o·dim_size·inner + (row_start + k)·inner + i,  j = (o·rows + k)·inner + i,
// i.e. rows [row_start, row_start + rows) of dimension `dim` of a [outer, dim_size, inner]
// view (all-reduce: dim_size = rows = 1, inner = 1, row_start = 0, so src(j) = j).
// Modes:
//   kRingSum  NCCL ring order: start s = fixed_start, or for the all-reduce (fixed_start < 0)
//             s = (chunk(src) + 1) mod N with chunk() the rule of ring_reference.h (count,
//             chunk_elems, 16-byte alignment); acc = x_s; acc = T(acc + x_{s+1}); ...;
//             acc = T(acc + x_{s+N-1}) — rounded to T after every addition (f16/bf16 via an
//             f32 addition rounded once, which equals the correctly rounded f16/bf16 sum).
//   kRankSum  x_0 + x_1 + ... in f32 (f64 for f64), rounded once to T.
//   kRingMax  fmax (a NaN loses to a number), as NCCL.
//   kRankMax  max with NaN propagating, as the CPU thread group.
// A contiguous src(j) = src(0) + j with 16-byte aligned buffers runs 16 bytes per thread
// and step (vector loads and stores, the same per-element arithmetic; TPCHECK_REDUCE_VECTOR=0
// turns it off); otherwise one element at a time.
// Thread safety: launches on the given stream.
#pragma once

#include <cuda_runtime.h>

#include "tpcheck/dtype.h"

namespace tpcheck::cuda {

inline constexpr int kMaxDeviceRanks = 64;

enum class ReduceMode { kRankSum, kRingSum, kRankMax, kRingMax };

struct ReduceLaunch {
  const void* inputs[kMaxDeviceRanks] = {};
  int world = 1;
  DType dtype = DType::kF32;
  ReduceMode mode = ReduceMode::kRankSum;
  void* out = nullptr;
  // More outputs (tpcheck emulate's in-place all-reduce): when extra_outs > 0, each result
  // is also written to outs[0..extra_outs) at the same index as to `out`.
  void* outs[kMaxDeviceRanks] = {};
  int extra_outs = 0;
  long long n_out = 0;
  long long dim_size = 1, inner = 1, rows = 1, row_start = 0;
  int fixed_start = 0;          // kRingSum: < 0 selects the all-reduce chunk rule
  long long count = 0;          // all-reduce chunk rule: elements in the buffer
  long long chunk_elems = 1;    // all-reduce chunk rule: C (full-loop chunk)
};

// REQUIRES: dtype f64/f32/f16/bf16 (else Error(kInput)); 1 <= world <= kMaxDeviceRanks.
void launch_reduce(const ReduceLaunch& p, cudaStream_t stream);

}  // namespace tpcheck::cuda
