// cuda_allocator_test.cpp — the caching allocator reuses device memory across backends:
// a rank's backend (and its stream) lives for one run, and the next run's backends must
// take the blocks the last one left instead of calling cudaMalloc again.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_runtime.h"
#include "gpu_test_support.h"
#include "tpcheck/backend.h"
#include "tpcheck/cuda_backend.h"

namespace tpcheck {
namespace {

constexpr std::int64_t kRows = 1024, kCols = 1024;  // 4 MiB in f32: the large-block path

TEST(CudaAllocator, ANewBackendReusesWhatTheLastOneFreed) {
  TPCHECK_REQUIRE_GPU();
  // Warm up: one backend's workspace and one tensor, both given back when it goes.
  {
    std::unique_ptr<Backend> be = make_cuda_backend();
    Tensor t = Tensor::zeros({kRows, kCols}, DType::kF32, Device::kCuda);
  }
  const std::size_t reserved = cuda_memory_reserved();
  ASSERT_GT(reserved, 0u);
  for (int run = 0; run < 5; ++run) {
    std::unique_ptr<Backend> be = make_cuda_backend();
    Tensor t = Tensor::zeros({kRows, kCols}, DType::kF32, Device::kCuda);
    EXPECT_EQ(cuda_memory_reserved(), reserved) << "run " << run << " allocated afresh";
  }
}

TEST(CudaAllocator, ATensorThatOutlivesItsBackendIsReusedAfterwards) {
  TPCHECK_REQUIRE_GPU();
  Tensor survivor;
  {
    std::unique_ptr<Backend> be = make_cuda_backend();
    survivor = Tensor::zeros({kRows, kCols}, DType::kF32, Device::kCuda);
  }
  // Released after its stream was retired: the block goes to the idle pool.
  survivor = Tensor();
  const std::size_t reserved = cuda_memory_reserved();
  std::unique_ptr<Backend> be = make_cuda_backend();
  Tensor t = Tensor::zeros({kRows, kCols}, DType::kF32, Device::kCuda);
  EXPECT_EQ(cuda_memory_reserved(), reserved);
}

TEST(CudaAllocator, LiveStreamsDoNotShareBlocks) {
  TPCHECK_REQUIRE_GPU();
  // Two backends alive at once (two emulated ranks): a block freed by one stays with its
  // stream while that stream lives (queued work of that stream may still read it), so the
  // other allocates its own. A size no other test uses, so no idle block of it exists.
  constexpr std::int64_t kOwnCols = 1536;  // 6 MiB
  std::unique_ptr<Backend> first = make_cuda_backend();
  { Tensor t = Tensor::zeros({kRows, kOwnCols}, DType::kF32, Device::kCuda); }
  std::size_t before = 0, after = 0;
  std::thread other([&] {
    std::unique_ptr<Backend> second = make_cuda_backend();
    before = cuda_memory_reserved();
    Tensor u = Tensor::zeros({kRows, kOwnCols}, DType::kF32, Device::kCuda);
    after = cuda_memory_reserved();
  });
  other.join();
  // A tensor asks for one byte more than its data (tensor.cpp), so 6 MiB + 1 rounds up to
  // 8 MiB (2 MiB steps above 1 MiB).
  EXPECT_EQ(after - before, std::size_t{8} << 20);
}

void CUDART_CB sleep_on_stream(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

TEST(CudaAllocator, ABlockFreedFromAnotherStreamIsNotReusedUnderItsPendingReads) {
  TPCHECK_REQUIRE_GPU();
  // The suite's pattern: a rank's result outlives the rank's stream, the case's thread
  // queues a read of it on its own stream and drops it before that read has run, and a
  // concurrent case's rank allocates the same size at once. The new owner's writes must
  // wait for the read (the allocator's event). Without it they overtook it: the garbage
  // in the emulated recipes' TP 8 gradients (tests/gpu/RESULTS.md, 2026-12-02).
  constexpr std::int64_t kOwnCols = 2560;  // 10 MiB (+1 byte) -> a 12 MiB block no other test uses
  constexpr std::size_t kBytes = std::size_t{kRows} * kOwnCols * sizeof(float);
  // The case's thread has its own stream (made first, so the rank's stream, once
  // retired, is not handed back to this thread by the stream pool).
  std::unique_ptr<Backend> comparison = make_cuda_backend();
  cudaStream_t reader = cuda::current_stream();
  Tensor result;
  std::thread rank_thread([&] {
    std::unique_ptr<Backend> rank = make_cuda_backend();
    result = Tensor::empty({kRows, kOwnCols}, DType::kF32, Device::kCuda);
    EXPECT_EQ(cudaMemsetAsync(result.raw(), 0x3F, kBytes, cuda::current_stream()), cudaSuccess);
  });  // the rank's stream is synchronized and retired; `result` lives on
  rank_thread.join();
  unsigned char* seen = nullptr;
  ASSERT_EQ(cudaMallocHost(&seen, kBytes), cudaSuccess);
  // The read waits behind 300 ms of host work on the reader's stream.
  ASSERT_EQ(cudaLaunchHostFunc(reader, sleep_on_stream, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(seen, result.raw(), kBytes, cudaMemcpyDeviceToHost, reader),
            cudaSuccess);
  const void* block = result.raw();
  result = Tensor();  // freed while the read is queued
  const void* reused = nullptr;
  std::thread other_rank([&] {
    std::unique_ptr<Backend> rank = make_cuda_backend();
    Tensor t = Tensor::empty({kRows, kOwnCols}, DType::kF32, Device::kCuda);
    reused = t.raw();
    EXPECT_EQ(cudaMemsetAsync(t.raw(), 0, kBytes, cuda::current_stream()), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(cuda::current_stream()), cudaSuccess);
  });
  other_rank.join();
  ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
  // Otherwise this test shows nothing: the other rank must have taken the same block.
  EXPECT_EQ(reused, block);
  std::size_t overwritten = 0;
  for (std::size_t i = 0; i < kBytes; ++i) overwritten += seen[i] != 0x3F;
  EXPECT_EQ(overwritten, 0u) << "bytes the other rank's memset wrote before the read";
  cudaFreeHost(seen);
}

}  // namespace
}  // namespace tpcheck
