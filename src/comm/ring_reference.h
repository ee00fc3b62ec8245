// ring_reference.h — a plain host model of NCCL's ring collectives (one channel, Simple
// protocol), written straight from the algorithm, for tests and for the CPU thread group's
// nccl-ring order.
//
// What it models (NCCL src/device/all_reduce.h, reduce_scatter.h, all_gather.h,
// src/enqueue.cc, read at NVIDIA/nccl 5067397, 2026-06; the same in 2.28):
//   * Ring order 0 → 1 → ... → N-1 → 0: rank r receives from r-1 and sends to r+1, and
//     its ring index is r (NCCL's ring->index is the distance from rank 0 along the ring;
//     with 2 ranks every ring is this one; with more, check NCCL_DEBUG=INFO's "Channel 00/01 :
//     0 1 2 ..." line).
//   * One channel (NCCL_MIN_NCHANNELS=NCCL_MAX_NCHANNELS=1): the channel's part is the whole
//     buffer (enqueue.cc: on the last channel everything goes to "lo").
//   * Chunk size (Simple, Ring): chunkSize = (NCCL_BUFFSIZE / NCCL_STEPS) × chunkSteps =
//     (4 MiB / 8) × 4 = 2 MiB, so C = 2 MiB / sizeof(T) elements (`chunk_bytes`).
//   * all-reduce: the buffer of `count` elements is walked in loops of N·C elements. In the
//     last, partial loop (rem = count - loop start < N·C) the chunk is shrunk to
//     c' = alignUp(ceil(rem / N), 16 / sizeof(T)). Chunk k of a loop is elements
//     [start + k·c', start + min((k+1)·c', rem)) (it may be empty).
//     Reduce-scatter phase, steps s = 0 .. N-2: rank r sends chunk (r - 1 - s) mod N to r+1
//     (at s = 0 its own input, later the partial it reduced at step s-1); the receiver
//     stores partial = round(received + its own input). After it, rank r holds chunk r
//     reduced over r+1, r+2, ..., r+N (= r) in that order.
//     All-gather phase, steps s = 0 .. N-2: rank r sends chunk (r - s) mod N to r+1, which
//     keeps it.
//   * reduce-scatter of N blocks of count/N: rank r sends block (r - 1) mod N at step 0 and
//     block (r - 1 - s) mod N at step s (reducing as above); rank r ends with block r.
//   * all-gather: rank r sends its block at step 0, then the block it received last.
//   * Reductions: sum rounds to the dtype after every addition (NCCL adds f16 with __hadd,
//     bf16 with __hadd or f32-add-then-round, which agree: an f32 sum of two f16/bf16 values
//     rounded once more is the correctly rounded sum); f32 in f32, f64 in f64. max is fmax
//     (a NaN loses to a number).
// Tensors in and out are CPU tensors of equal shape and dtype (float dtypes only for
// reductions); results are flat ([numel]) or, for all-reduce, of the input's shape.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tpcheck/comm.h"
#include "tpcheck/tensor.h"

namespace tpcheck::ring {

inline constexpr std::size_t kDefaultChunkBytes = std::size_t{2} << 20;

// C: elements of a full all-reduce chunk (chunk_bytes / dtype size, at least 1).
std::int64_t chunk_elements(std::size_t chunk_bytes, DType dtype);
// The all-reduce chunk (= ring index of the rank that finishes it) that element `i` of a
// `count`-element buffer belongs to, by the rule above. The sum of element i starts at
// rank (chunk + 1) mod N.
int all_reduce_chunk_of(std::int64_t i, std::int64_t count, int world, DType dtype,
                        std::size_t chunk_bytes);
// How many non-empty chunks the all-reduce of `count` elements moves (for ledgers).
std::int64_t all_reduce_chunk_count(std::int64_t count, int world, DType dtype,
                                    std::size_t chunk_bytes);

// Every rank's all-reduce result (each of the input's shape), by simulating the ring.
std::vector<Tensor> all_reduce(const std::vector<Tensor>& inputs, ReduceOp op,
                               std::size_t chunk_bytes = kDefaultChunkBytes);
// Rank r's block r ([numel / N], flat) of the ring reduce-scatter of the flat inputs.
// REQUIRES: numel divisible by N.
std::vector<Tensor> reduce_scatter(const std::vector<Tensor>& inputs, ReduceOp op);
// Every rank's ring all-gather result: the flat inputs concatenated in rank order.
std::vector<Tensor> all_gather(const std::vector<Tensor>& inputs);

}  // namespace tpcheck::ring
