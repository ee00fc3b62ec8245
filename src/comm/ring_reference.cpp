// ring_reference.cpp — the host model of NCCL's ring collectives (see ring_reference.h).
// Values live in f64 vectors holding values of the dtype; every reduction rounds back to
// the dtype (an f64 sum of two f16/bf16/f32 values rounded once is their correctly rounded
// sum in that format: 53 >= 2p + 2 for p = 11, 8, 24).
#include "comm/ring_reference.h"

#include <algorithm>
#include <cmath>

#include "tpcheck/error.h"

namespace tpcheck::ring {
namespace {

std::int64_t mod(std::int64_t a, std::int64_t n) { return ((a % n) + n) % n; }

void check_inputs(const std::vector<Tensor>& inputs, const char* what) {
  TPCHECK_CHECK(!inputs.empty(), "ring {}: no inputs", what);
  for (const Tensor& t : inputs) {
    TPCHECK_CHECK(t.defined() && t.numel() == inputs[0].numel() && t.dtype() == inputs[0].dtype(),
                  "ring {}: inputs differ ({} vs {})", what, t.describe(), inputs[0].describe());
  }
}

double combine(ReduceOp op, DType dtype, double received, double own) {
  if (op == ReduceOp::kMax) return std::fmax(received, own);
  return round_to(dtype, received + own);
}

// One loop's chunk boundaries: [begin(k), end(k)) for k = 0..N-1.
struct Loop {
  std::int64_t start = 0, rem = 0, chunk = 0;
  std::int64_t begin(std::int64_t k) const { return start + std::min(k * chunk, rem); }
  std::int64_t end(std::int64_t k) const { return start + std::min((k + 1) * chunk, rem); }
};

std::vector<Loop> all_reduce_loops(std::int64_t count, int world, DType dtype,
                                   std::size_t chunk_bytes) {
  const std::int64_t c = chunk_elements(chunk_bytes, dtype);
  const std::int64_t loop = world * c;
  const std::int64_t align = std::max<std::int64_t>(1, 16 / static_cast<std::int64_t>(dtype_size(dtype)));
  std::vector<Loop> loops;
  for (std::int64_t start = 0; start < count; start += loop) {
    Loop l{start, count - start, c};
    if (l.rem < loop) {
      std::int64_t per_rank = (l.rem + world - 1) / world;
      l.chunk = (per_rank + align - 1) / align * align;
    }
    loops.push_back(l);
  }
  return loops;
}

// The reduce-scatter phase over N pieces (piece k of every rank is [begin(k), end(k))):
// afterwards acc[r] holds piece r fully reduced. acc starts as a copy of the inputs.
template <typename Range>
void ring_reduce_phase(std::vector<std::vector<double>>& acc,
                       const std::vector<std::vector<double>>& in, ReduceOp op, DType dtype,
                       Range piece) {
  const int n = static_cast<int>(acc.size());
  for (int s = 0; s <= n - 2; ++s) {
    // Everyone sends at once: take the messages first, then deliver them.
    std::vector<std::vector<double>> msg(n);
    std::vector<std::int64_t> sent(n);
    for (int r = 0; r < n; ++r) {
      sent[r] = mod(r - 1 - s, n);
      auto [b, e] = piece(sent[r]);
      msg[r].assign(acc[r].begin() + b, acc[r].begin() + e);
    }
    for (int r = 0; r < n; ++r) {
      const int to = (r + 1) % n;
      auto [b, e] = piece(sent[r]);
      for (std::int64_t i = b; i < e; ++i) acc[to][i] = combine(op, dtype, msg[r][i - b], in[to][i]);
    }
  }
}

// The all-gather phase: rank r starts with piece r; afterwards every rank has every piece.
template <typename Range>
void ring_gather_phase(std::vector<std::vector<double>>& acc, Range piece) {
  const int n = static_cast<int>(acc.size());
  for (int s = 0; s <= n - 2; ++s) {
    std::vector<std::vector<double>> msg(n);
    std::vector<std::int64_t> sent(n);
    for (int r = 0; r < n; ++r) {
      sent[r] = mod(r - s, n);
      auto [b, e] = piece(sent[r]);
      msg[r].assign(acc[r].begin() + b, acc[r].begin() + e);
    }
    for (int r = 0; r < n; ++r) {
      auto [b, e] = piece(sent[r]);
      std::copy(msg[r].begin(), msg[r].end(), acc[(r + 1) % n].begin() + b);
    }
  }
}

std::vector<std::vector<double>> values(const std::vector<Tensor>& inputs) {
  std::vector<std::vector<double>> v;
  for (const Tensor& t : inputs) v.push_back(t.to_f64());
  return v;
}

}  // namespace

std::int64_t chunk_elements(std::size_t chunk_bytes, DType dtype) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(chunk_bytes / dtype_size(dtype)));
}

int all_reduce_chunk_of(std::int64_t i, std::int64_t count, int world, DType dtype,
                        std::size_t chunk_bytes) {
  const std::int64_t c = chunk_elements(chunk_bytes, dtype);
  const std::int64_t loop = world * c;
  const std::int64_t start = i / loop * loop;
  const std::int64_t rem = count - start;
  std::int64_t chunk = c;
  if (rem < loop) {
    const std::int64_t align = std::max<std::int64_t>(1, 16 / static_cast<std::int64_t>(dtype_size(dtype)));
    chunk = ((rem + world - 1) / world + align - 1) / align * align;
  }
  return static_cast<int>((i - start) / chunk);
}

std::int64_t all_reduce_chunk_count(std::int64_t count, int world, DType dtype,
                                    std::size_t chunk_bytes) {
  std::int64_t n = 0;
  for (const Loop& l : all_reduce_loops(count, world, dtype, chunk_bytes))
    for (int k = 0; k < world; ++k) n += l.end(k) > l.begin(k) ? 1 : 0;
  return n;
}

std::vector<Tensor> all_reduce(const std::vector<Tensor>& inputs, ReduceOp op,
                               std::size_t chunk_bytes) {
  check_inputs(inputs, "all_reduce");
  const int n = static_cast<int>(inputs.size());
  const DType dtype = inputs[0].dtype();
  const std::vector<std::vector<double>> in = values(inputs);
  std::vector<std::vector<double>> acc = in;
  for (const Loop& l : all_reduce_loops(inputs[0].numel(), n, dtype, chunk_bytes)) {
    auto piece = [&](std::int64_t k) { return std::pair{l.begin(k), l.end(k)}; };
    ring_reduce_phase(acc, in, op, dtype, piece);
    ring_gather_phase(acc, piece);
  }
  std::vector<Tensor> out;
  for (int r = 0; r < n; ++r) out.push_back(Tensor::from_f64(acc[r], inputs[0].shape(), dtype));
  return out;
}

std::vector<Tensor> reduce_scatter(const std::vector<Tensor>& inputs, ReduceOp op) {
  check_inputs(inputs, "reduce_scatter");
  const int n = static_cast<int>(inputs.size());
  const DType dtype = inputs[0].dtype();
  TPCHECK_CHECK(inputs[0].numel() % n == 0, "ring reduce_scatter: {} elements for {} ranks",
                inputs[0].numel(), n);
  const std::int64_t block = inputs[0].numel() / n;
  const std::vector<std::vector<double>> in = values(inputs);
  std::vector<std::vector<double>> acc = in;
  ring_reduce_phase(acc, in, op, dtype,
                    [&](std::int64_t k) { return std::pair{k * block, (k + 1) * block}; });
  std::vector<Tensor> out;
  for (int r = 0; r < n; ++r) {
    std::vector<double> mine(acc[r].begin() + r * block, acc[r].begin() + (r + 1) * block);
    out.push_back(Tensor::from_f64(mine, {block}, dtype));
  }
  return out;
}

std::vector<Tensor> all_gather(const std::vector<Tensor>& inputs) {
  check_inputs(inputs, "all_gather");
  const int n = static_cast<int>(inputs.size());
  const std::int64_t block = inputs[0].numel();
  std::vector<std::vector<double>> acc(n, std::vector<double>(block * n, 0.0));
  for (int r = 0; r < n; ++r) {
    std::vector<double> v = inputs[r].to_f64();
    std::copy(v.begin(), v.end(), acc[r].begin() + r * block);
  }
  ring_gather_phase(acc, [&](std::int64_t k) { return std::pair{k * block, (k + 1) * block}; });
  std::vector<Tensor> out;
  for (int r = 0; r < n; ++r) out.push_back(Tensor::from_f64(acc[r], {block * n}, inputs[0].dtype()));
  return out;
}

}  // namespace tpcheck::ring
