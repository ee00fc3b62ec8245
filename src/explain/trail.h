// explain/trail.h — lining up the recorded intermediates of the single, sharded and truth
// runs (the first-divergence table of tpcheck explain).
//
// Naming and alignment. A GEMM is named by its site ("mlp.fc1/fwd"); any other op by the
// GEMM site that ran last before it and the op ("mlp.fc1/fwd → activation_forward";
// "input → norm_forward" before the first GEMM). Ops are matched between runs by
// (name, occurrence), collectives by the kind-free name "… → collective", because the
// single run (sequence parallel off) reduces with all_reduce where the sharded run
// reduce-scatters. Ops that run in one run only (what a mutation adds or drops) are
// listed, not compared — except a sharded-only all-gather right after a matched op (the
// sequence-parallel gather of a norm output, a residual): single holds that tensor whole,
// as the output of the op before, and is compared with it.
//
// Layout. How a rank's intermediate relates to single's is not recorded by the layers, so
// it is derived from the shapes: when the ranks' shape equals single's, the candidates are
// "replicated" (every rank compared, the worst kept) and "sum over ranks" (a row-parallel
// partial product); when one dimension is N times smaller, the ranks' tensors are
// assembled along it with every even block count that fits (1 block: a plain split; 2:
// a gated [a | b] weight; b: heads folded into the batch of attention's [b·h, s, d]), and
// the unequal [Q | K | V] blocks of a fused GQA/MQA projection (Q = k·KV, k ≥ 2). The
// candidate closest to single is used and named in the table; a mutation that breaks a
// layout shows up as a large difference under every candidate. Other shapes are "not
// comparable" (the rank shapes are reported).
// Thread safety: pure functions.
#pragma once

#include <vector>

#include "explain/recorder.h"
#include "tpcheck/explain.h"
#include "tpcheck/numerics.h"

namespace tpcheck::explain {

// `bound`: the truth policy as judge_case applied it to this case (m, f, u, K, N).
std::vector<TrailEntry> build_trail(const Recording& single, const Recording* truth,
                                    const std::vector<std::shared_ptr<Recording>>& sharded,
                                    const TruthPolicyParams& bound);

// True for entries of the backward pass (a GEMM site whose pass is not "fwd", or an op
// after such a site, or a backward op).
bool is_backward(const TrailEntry& e);

}  // namespace tpcheck::explain
