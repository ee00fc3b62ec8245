// cuda_allocator_test.cpp — the caching allocator reuses device memory across backends:
// a rank's backend (and its stream) lives for one run, and the next run's backends must
// take the blocks the last one left instead of calling cudaMalloc again.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

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

}  // namespace
}  // namespace tpcheck
