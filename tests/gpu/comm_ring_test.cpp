// GPU test of the device-local communicator (N ranks on one GPU): bit for bit against the
// host model of NCCL's ring (src/comm/ring_reference.h) in nccl-ring order, and against
// the CPU thread group in rank order; N = 2..8, f32/f16/bf16/f64, sizes not divisible by
// N·chunk (small chunks to exercise several loops, and the default 2 MiB chunk past one
// loop). Skipped without a GPU.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/ring_reference.h"
#include "tpcheck/comm.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/cuda_comm.h"

namespace tpcheck {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no GPU"

double value(int rank, std::int64_t i) {
  std::uint64_t h = static_cast<std::uint64_t>(rank + 1) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return std::ldexp((static_cast<double>(h % 4001) - 2000.0) / 1000.0, static_cast<int>((h >> 20) % 14) - 7);
}

std::vector<Tensor> inputs(int world, const Shape& shape, DType dtype) {
  std::vector<Tensor> in;
  for (int r = 0; r < world; ++r) {
    std::vector<double> v(shape_numel(shape));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(r, static_cast<std::int64_t>(i));
    in.push_back(Tensor::from_f64(v, shape, dtype));
  }
  return in;
}

// Runs `op` on every rank of a device group (inputs copied to the GPU inside each rank,
// after its backend exists) and returns each rank's result on the host.
std::vector<Tensor> on_device_group(int world, const CudaGroupOptions& opts,
                                    const std::vector<Tensor>& in,
                                    const std::function<Tensor(Communicator&, Tensor)>& op,
                                    std::vector<std::vector<CommRecord>>* ledgers = nullptr) {
  std::vector<Tensor> out(world);
  if (ledgers) ledgers->assign(world, {});
  run_device_group(world, [&](Communicator& comm) {
    std::unique_ptr<Backend> backend = make_cuda_backend({});
    Tensor d = in[comm.rank()].to_device(Device::kCuda);
    Tensor r = op(comm, d);
    out[comm.rank()] = r.to_host();
    if (ledgers) (*ledgers)[comm.rank()] = comm.comm_ledger();
  }, opts);
  return out;
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64};

TEST(DeviceGroupRing, AllReduceMatchesHostModelBitForBit) {
  REQUIRE_GPU();
  for (int world = 2; world <= 8; ++world) {
    for (DType dtype : kDtypes) {
      // 48-byte chunks: several full loops plus a partial one; 2 MiB: one partial loop.
      for (std::size_t cb : {std::size_t{48}, std::size_t{512}, ring::kDefaultChunkBytes}) {
        for (std::int64_t count : {std::int64_t{1}, std::int64_t{37}, std::int64_t{1001}, std::int64_t{4099}}) {
          CudaGroupOptions opts;
          opts.nccl_chunk_bytes = cb;
          std::vector<Tensor> in = inputs(world, {count}, dtype);
          std::vector<std::vector<CommRecord>> ledgers;
          std::vector<Tensor> got = on_device_group(world, opts, in, [](Communicator& c, Tensor t) {
            c.all_reduce(t);
            return t;
          }, &ledgers);
          std::vector<Tensor> want = ring::all_reduce(in, ReduceOp::kSum, cb);
          for (int r = 0; r < world; ++r) {
            ASSERT_TRUE(bitwise_equal(got[r], want[r]))
                << dtype_name(dtype) << " world " << world << " count " << count << " chunk bytes " << cb
                << " rank " << r;
            ASSERT_EQ(ledgers[r].size(), 1u);
            EXPECT_EQ(ledgers[r][0].algorithm,
                      fmt::format("nccl-ring emulated ({} chunks, 1 channel)",
                                  ring::all_reduce_chunk_count(count, world, dtype, cb)));
          }
        }
      }
    }
  }
}

TEST(DeviceGroupRing, AllReducePastOneDefaultLoop) {
  REQUIRE_GPU();
  for (int world : {2, 3}) {
    for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
      const std::int64_t c = ring::chunk_elements(ring::kDefaultChunkBytes, dtype);
      const std::int64_t count = world * c + 12345;  // one full loop and a partial one
      std::vector<Tensor> in = inputs(world, {count}, dtype);
      std::vector<Tensor> got = on_device_group(world, {}, in, [](Communicator& comm, Tensor t) {
        comm.all_reduce(t);
        return t;
      });
      std::vector<Tensor> want = ring::all_reduce(in, ReduceOp::kSum);
      for (int r = 0; r < world; ++r)
        ASSERT_TRUE(bitwise_equal(got[r], want[r])) << dtype_name(dtype) << " world " << world;
    }
  }
}

TEST(DeviceGroupRing, ReduceScatterAllGatherBroadcastMax) {
  REQUIRE_GPU();
  for (int world = 2; world <= 8; ++world) {
    for (DType dtype : kDtypes) {
      const Shape full = {3, 2 * world, 5};
      std::vector<Tensor> in = inputs(world, full, dtype);
      for (int dim : {0, 1}) {
        Shape f = full;
        if (dim == 0) f = {3 * world, 2, 5};
        std::vector<Tensor> fin = inputs(world, f, dtype);
        std::vector<Tensor> got = on_device_group(world, {}, fin, [dim](Communicator& c, Tensor t) {
          return c.reduce_scatter(t, dim);
        });
        // The model on the slices along dim laid out one after the other.
        std::vector<Tensor> flat;
        for (const Tensor& t : fin) {
          const std::int64_t chunk = f[dim] / world;
          std::vector<Tensor> parts;
          for (int r = 0; r < world; ++r) parts.push_back(t.slice(dim, r * chunk, chunk).reshape({1, t.numel() / world}));
          flat.push_back(Tensor::cat(parts, 0).reshape({t.numel()}));
        }
        std::vector<Tensor> want = ring::reduce_scatter(flat, ReduceOp::kSum);
        for (int r = 0; r < world; ++r)
          ASSERT_TRUE(bitwise_equal(got[r].reshape({got[r].numel()}), want[r]))
              << "reduce_scatter " << dtype_name(dtype) << " world " << world << " dim " << dim;
      }
      for (int dim : {0, 2}) {
        std::vector<Tensor> got = on_device_group(world, {}, in, [dim](Communicator& c, Tensor t) {
          return c.all_gather(t, dim);
        });
        Tensor want = Tensor::cat(in, dim);
        for (int r = 0; r < world; ++r) ASSERT_TRUE(bitwise_equal(got[r], want)) << "all_gather dim " << dim;
      }
      std::vector<Tensor> got = on_device_group(world, {}, in, [world](Communicator& c, Tensor t) {
        c.broadcast(t, world - 1);
        return t;
      });
      for (int r = 0; r < world; ++r) ASSERT_TRUE(bitwise_equal(got[r], in[world - 1])) << "broadcast";
      got = on_device_group(world, {}, in, [](Communicator& c, Tensor t) {
        c.all_reduce(t, ReduceOp::kMax);
        return t;
      });
      std::vector<Tensor> want = ring::all_reduce(in, ReduceOp::kMax);
      for (int r = 0; r < world; ++r) ASSERT_TRUE(bitwise_equal(got[r], want[r])) << "max";
    }
  }
}

TEST(DeviceGroupRank, MatchesCpuThreadGroupBitForBit) {
  REQUIRE_GPU();
  for (int world : {2, 3, 5, 8}) {
    for (DType dtype : kDtypes) {
      const Shape shape = {4, 2 * world};
      std::vector<Tensor> in = inputs(world, shape, dtype);
      CudaGroupOptions opts;
      opts.order = CommOrder::kRank;
      std::vector<Tensor> got_ar = on_device_group(world, opts, in, [](Communicator& c, Tensor t) {
        c.all_reduce(t);
        return t;
      });
      std::vector<Tensor> got_rs = on_device_group(world, opts, in, [](Communicator& c, Tensor t) {
        return c.reduce_scatter(t, 1);
      });
      std::vector<Tensor> cpu_ar(world), cpu_rs(world);
      run_thread_group(world, [&](Communicator& c) {
        Tensor t = in[c.rank()].clone();
        c.all_reduce(t);
        cpu_ar[c.rank()] = t;
        cpu_rs[c.rank()] = c.reduce_scatter(in[c.rank()], 1);
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(bitwise_equal(got_ar[r], cpu_ar[r])) << dtype_name(dtype) << " world " << world;
        ASSERT_TRUE(bitwise_equal(got_rs[r], cpu_rs[r])) << dtype_name(dtype) << " world " << world;
      }
    }
  }
}

}  // namespace
}  // namespace tpcheck
