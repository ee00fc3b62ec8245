// GPU tests of the NCCL communicator and of the device group's failure paths, runnable on
// ONE GPU: NCCL with one rank through run_nccl_group (a) and through the process-group
// path (b) with a launch of one; a rank that throws in a device group ends the group within
// 5 s; a device-group rank that stops answering times out naming it. With 2+ GPUs also:
// NCCL (Ring, Simple, one channel) bit for bit against the emulated ring, and a throwing
// NCCL rank aborting its peer. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tpcheck/comm.h"
#include "tpcheck/cuda_backend.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// NCCL caches some settings at its first init in the process: choose the configuration the
// emulation reproduces before any test runs (a user's own settings win).
const bool kNcclEnvironment = [] {
  ::setenv("NCCL_ALGO", "Ring", 0);
  ::setenv("NCCL_PROTO", "Simple", 0);
  ::setenv("NCCL_MIN_NCHANNELS", "1", 0);
  ::setenv("NCCL_MAX_NCHANNELS", "1", 0);
  return true;
}();

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

Tensor host_input(int rank, std::int64_t n, DType dtype) {
  std::vector<double> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = std::ldexp(static_cast<double>((rank * 131 + i * 71) % 1999) - 999.0, -6);
  return Tensor::from_f64(v, {n}, dtype);
}

// Two ranks on GPUs 0 and 1: rank 1 throws while rank 0 goes into an all-reduce.
void rank1_throws_before_all_reduce(Communicator& comm) {
  CudaBackendOptions o;
  o.device = comm.rank();
  std::unique_ptr<Backend> backend = make_cuda_backend(o);
  Tensor t = host_input(comm.rank(), 100, DType::kF32).to_device(Device::kCuda);
  if (comm.rank() == 1) throw std::runtime_error("injected failure on rank 1");
  comm.all_reduce(t);
}

// The collectives of a group of one are identities; the ledger says "nccl".
void check_group_of_one(Communicator& comm) {
  std::unique_ptr<Backend> backend = make_cuda_backend({});
  Tensor h = Tensor::from_f64(std::vector<double>{1.5, -2.25, 3.0, 4.0, 0.5, 8.0}, {2, 3}, DType::kF32);
  Tensor t = h.to_device(Device::kCuda);
  comm.all_reduce(t);
  EXPECT_TRUE(bitwise_equal(t.to_host(), h));
  EXPECT_TRUE(bitwise_equal(comm.all_gather(t, 1).to_host(), h));
  EXPECT_TRUE(bitwise_equal(comm.reduce_scatter(t, 0).to_host(), h));
  comm.broadcast(t, 0);
  comm.barrier();
  EXPECT_TRUE(bitwise_equal(t.to_host(), h));
  ASSERT_EQ(comm.comm_ledger().size(), 4u);
  EXPECT_EQ(comm.comm_ledger()[0].algorithm, "nccl");
  EXPECT_EQ(comm.comm_ledger()[0].kind, CommKind::kAllReduce);
  EXPECT_EQ(comm.comm_ledger()[1].kind, CommKind::kAllGather);
  EXPECT_EQ(comm.comm_ledger()[1].dim, 1);
}

TEST(Nccl, OneRankThroughRunNcclGroup) {
  if (gpu_count() < 1) GTEST_SKIP() << "no GPU";
  int calls = 0;
  run_nccl_group(1, [&](Communicator& comm) {
    ++calls;
    EXPECT_EQ(comm.size(), 1);
    check_group_of_one(comm);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
}

// The kept group (--comm nccl's launcher): the communicator made on the first run is the
// one every later run gets; after a failed run the group refuses to run again.
TEST(Nccl, KeptGroupReusesItsCommunicatorAndRefusesAfterAFailure) {
  if (gpu_count() < 1) GTEST_SKIP() << "no GPU";
  NcclThreadGroup group(1);
  std::vector<const Communicator*> seen;
  for (int run = 0; run < 3; ++run) {
    group.run([&](Communicator& comm) {
      seen.push_back(&comm);
      comm.clear_comm_ledger();  // the kept communicator's ledger spans runs (the runner clears it per case)
      check_group_of_one(comm);
    });
  }
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[1], seen[2]);
  EXPECT_THROW(group.run([](Communicator&) { throw std::runtime_error("injected"); }), Error);
  try {
    group.run([](Communicator&) { ADD_FAILURE() << "ran after a failed run"; });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("an earlier run failed"), std::string::npos) << e.what();
  }
}

TEST(Nccl, OneRankThroughProcessGroup) {
  if (gpu_count() < 1) GTEST_SKIP() << "no GPU";
  NcclProcessLaunch launch;
  launch.launcher = "test";
  launch.master_port = 20000 + static_cast<int>(::getpid() % 20000);
  std::unique_ptr<Communicator> comm = connect_nccl_process_group(launch);
  check_group_of_one(*comm);
}

TEST(DeviceGroupFailure, ThrowingRankEndsTheGroupWithin5s) {
  if (gpu_count() < 1) GTEST_SKIP() << "no GPU";
  const auto start = Clock::now();
  std::string rank0_error;
  try {
    run_device_group(3, [&](Communicator& comm) {
      std::unique_ptr<Backend> backend = make_cuda_backend({});
      Tensor t = host_input(comm.rank(), 100, DType::kF32).to_device(Device::kCuda);
      comm.all_reduce(t);  // everyone once
      if (comm.rank() == 1) throw std::runtime_error("injected failure on rank 1");
      try {
        comm.all_reduce(t);  // ranks 0 and 2 wait here for rank 1
      } catch (const Error& e) {
        if (comm.rank() == 0) rank0_error = e.what();
        EXPECT_EQ(e.kind(), ErrorKind::kAborted);
        throw;
      }
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_NE(std::string(e.what()).find("injected failure on rank 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  EXPECT_NE(rank0_error.find("rank 1 failed"), std::string::npos) << rank0_error;
}

TEST(DeviceGroupFailure, SilentRankTimesOut) {
  if (gpu_count() < 1) GTEST_SKIP() << "no GPU";
  CudaGroupOptions opts;
  opts.timeout = milliseconds(1000);
  const auto start = Clock::now();
  try {
    run_device_group(2, [&](Communicator& comm) {
      std::unique_ptr<Backend> backend = make_cuda_backend({});
      Tensor t = host_input(comm.rank(), 10, DType::kF16).to_device(Device::kCuda);
      if (comm.rank() == 1) std::this_thread::sleep_for(milliseconds(3000));  // stops answering
      comm.all_reduce(t);
    }, opts);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 never arrived"), std::string::npos) << e.what();
  }
  // rank 0 gives up after 1 s; the group ends when the sleeping rank wakes (3 s) and finds
  // the group aborted.
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
}

// Needs two GPUs: NCCL's ring (forced: Ring, Simple, one channel) against the emulation.
// With two ranks every order and both roundings agree (round(a + b) either way), so this
// checks the plumbing and the per-step dtype; the order itself needs 3+ GPUs.
TEST(Nccl, TwoGpusMatchEmulatedRingBitForBit) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  ASSERT_TRUE(kNcclEnvironment);
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    for (std::int64_t n : {std::int64_t{1000}, std::int64_t{3} << 20}) {
      std::vector<Tensor> nccl(2), emu(2);
      run_nccl_group(2, [&](Communicator& comm) {
        CudaBackendOptions o;
        o.device = comm.rank();
        std::unique_ptr<Backend> backend = make_cuda_backend(o);
        Tensor t = host_input(comm.rank(), n, dtype).to_device(Device::kCuda);
        comm.all_reduce(t);
        nccl[comm.rank()] = t.to_host();
      });
      run_device_group(2, [&](Communicator& comm) {
        std::unique_ptr<Backend> backend = make_cuda_backend({});
        Tensor t = host_input(comm.rank(), n, dtype).to_device(Device::kCuda);
        comm.all_reduce(t);
        emu[comm.rank()] = t.to_host();
      });
      for (int r = 0; r < 2; ++r) EXPECT_TRUE(bitwise_equal(nccl[r], emu[r])) << dtype_name(dtype) << " n " << n;
    }
  }
}

// Two GPUs, the kept group: several runs over the same communicators give NCCL's sums;
// then rank 1 throws at the start of a run while rank 0 waits in an all-reduce: rank 0
// ends (no hang) and the error names rank 1.
TEST(Nccl, TwoGpusKeptGroupRunsAgainAndEndsOnAThrowingRank) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  NcclThreadGroup group(2);
  for (int run = 0; run < 3; ++run) {
    std::vector<Tensor> sums(2);
    group.run([&](Communicator& comm) {
      CudaBackendOptions o;
      o.device = comm.rank();
      std::unique_ptr<Backend> backend = make_cuda_backend(o);
      Tensor t = host_input(comm.rank() + run, 1000, DType::kF32).to_device(Device::kCuda);
      comm.all_reduce(t);
      sums[comm.rank()] = t.to_host();
    });
    const std::vector<double> a = host_input(run, 1000, DType::kF32).to_f64();
    const std::vector<double> b = host_input(1 + run, 1000, DType::kF32).to_f64();
    std::vector<double> exact(a.size());  // multiples of 2^-6 below 32: exact in f32
    for (std::size_t i = 0; i < a.size(); ++i) exact[i] = a[i] + b[i];
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(bitwise_equal(sums[r], Tensor::from_f64(exact, {1000}, DType::kF32)))
          << "run " << run << " rank " << r;
    }
  }
  const auto start = Clock::now();
  try {
    group.run(rank1_throws_before_all_reduce);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 1);
  }
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
}

TEST(Nccl, TwoGpusThrowingRankAbortsPeer) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const auto start = Clock::now();
  try {
    run_nccl_group(2, rank1_throws_before_all_reduce);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 1);
  }
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
}

}  // namespace
}  // namespace tpcheck
