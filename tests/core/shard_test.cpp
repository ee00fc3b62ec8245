// Tests for ShardSpec semantics: hand-worked examples of which global rows each rank
// holds, the input checks and their messages, and property tests that take_shard,
// assemble_shards and global_flat_index agree and are exact inverses.
#include "tpcheck/shard.h"

#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <random>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// A tensor whose every element holds its own global flat index (exact in f64 and f32
// below 2^24, the largest size used here).
Tensor iota(const Shape& shape, DType dtype = DType::kF64) {
  std::vector<double> v(shape_numel(shape));
  std::iota(v.begin(), v.end(), 0.0);
  return Tensor::from_f64(v, shape, dtype);
}

std::string input_error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected Error(kInput)";
  return {};
}

// Hand-worked: shape [6, 2], blocks {4, 2}, world 2. Block 0 = rows 0..3 (pieces of 2),
// block 1 = rows 4..5 (pieces of 1). Rank 0: rows 0, 1, 4; rank 1: rows 2, 3, 5.
TEST(Shard, HandWorkedMultiBlockExample) {
  Shape global{6, 2};
  ShardSpec spec = ShardSpec::along(0, {4, 2});
  EXPECT_EQ(local_shape(global, spec, 2), (Shape{3, 2}));
  std::vector<std::int64_t> rank1;
  for (std::int64_t i = 0; i < 6; ++i) rank1.push_back(global_flat_index(global, spec, 1, 2, i));
  EXPECT_EQ(rank1, (std::vector<std::int64_t>{4, 5, 6, 7, 10, 11}));
  Tensor shard0 = take_shard(iota(global), spec, 0, 2);
  EXPECT_EQ(shard0.to_f64(), (std::vector<double>{0, 1, 2, 3, 8, 9}));
}

// Hand-worked: shape [2, 6], last dim split 3 ways in one block: rank 2 holds columns 4, 5.
TEST(Shard, HandWorkedLastDimExample) {
  Shape global{2, 6};
  ShardSpec spec = ShardSpec::along(1);
  EXPECT_EQ(local_shape(global, spec, 3), (Shape{2, 2}));
  Tensor shard2 = take_shard(iota(global), spec, 2, 3);
  EXPECT_EQ(shard2.to_f64(), (std::vector<double>{4, 5, 10, 11}));
  EXPECT_EQ(global_flat_index(global, spec, 2, 3, 3), 11);
}

TEST(Shard, ReplicatedIsTheWholeTensor) {
  Shape global{3, 5};
  Tensor x = iota(global, DType::kF32);
  EXPECT_EQ(local_shape(global, ShardSpec::replicated(), 4), global);
  EXPECT_TRUE(bitwise_equal(take_shard(x, ShardSpec::replicated(), 3, 4), x));
  EXPECT_TRUE(bitwise_equal(assemble_shards({x, x, x, x}, ShardSpec::replicated()), x));
  EXPECT_EQ(global_flat_index(global, ShardSpec::replicated(), 2, 4, 7), 7);
}

TEST(Shard, BlockNotDivisibleNamesTensorDimensionBlockAndTp) {
  std::string msg = input_error_message([] {
    check_shardable({96, 16}, ShardSpec::along(0, {50, 46}), 5, "fc1_weight");
  });
  EXPECT_NE(
      msg.find("fc1_weight: dimension 0 of size 96 (block 1 of size 46) is not divisible by tp=5"),
      std::string::npos)
      << msg;
}

TEST(Shard, SingleBlockNotDivisible) {
  std::string msg = input_error_message([] {
    check_shardable({16, 30}, ShardSpec::along(1), 4, "proj_weight");
  });
  EXPECT_NE(msg.find("proj_weight: dimension 1 of size 30 is not divisible by tp=4"),
            std::string::npos)
      << msg;
}

TEST(Shard, BlocksNotSummingToDimension) {
  std::string msg = input_error_message([] {
    check_shardable({12, 4}, ShardSpec::along(0, {4, 4}), 2, "qkv_weight");
  });
  EXPECT_NE(msg.find("qkv_weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sum to 8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("size 12"), std::string::npos) << msg;
}

TEST(Shard, DimensionOutOfRangeAndBadWorld) {
  std::string msg = input_error_message([] {
    check_shardable({4, 4}, ShardSpec::along(2), 2, "w");
  });
  EXPECT_NE(msg.find("dimension 2 of a rank-2"), std::string::npos) << msg;
  msg = input_error_message([] { check_shardable({4, 4}, ShardSpec::along(0), 0, "w"); });
  EXPECT_NE(msg.find("tp=0"), std::string::npos) << msg;
}

struct RandomCase {
  Shape shape;
  ShardSpec spec;
  int world;
};

// Random rank 1..4 shapes, any sharded dimension, 1..3 blocks (zero-size blocks too),
// world 1..8.
RandomCase random_case(std::mt19937& gen) {
  RandomCase c;
  c.world = 1 + gen() % 8;
  int rank = 1 + gen() % 4;
  c.shape.resize(rank);
  for (auto& d : c.shape) d = 1 + gen() % 4;
  int dim = gen() % rank;
  int nblocks = 1 + gen() % 3;
  std::vector<std::int64_t> blocks;
  std::int64_t total = 0;
  for (int b = 0; b < nblocks; ++b) {
    blocks.push_back(c.world * (gen() % 4));  // may be 0: an empty block is legal
    total += blocks.back();
  }
  if (total == 0) {
    blocks[0] = c.world;
    total = c.world;
  }
  c.shape[dim] = total;
  c.spec = ShardSpec::along(dim, nblocks == 1 && gen() % 2 ? std::vector<std::int64_t>{} : blocks);
  return c;
}

TEST(Shard, AssembleOfTakeIsIdentityBitwise) {
  std::mt19937 gen(1);
  const DType dtypes[] = {DType::kF64,  DType::kF32,    DType::kF16,
                          DType::kBF16, DType::kF8E4M3, DType::kF8E5M2};
  for (int trial = 0; trial < 500; ++trial) {
    RandomCase c = random_case(gen);
    DType dtype = dtypes[gen() % 6];
    // Random bit patterns (NaN payloads included) so the copy must be byte-exact.
    Tensor x(c.shape, dtype);
    auto* bytes = static_cast<unsigned char*>(x.raw());
    for (std::size_t i = 0; i < x.nbytes(); ++i) bytes[i] = gen() & 0xff;
    std::vector<Tensor> shards;
    for (int r = 0; r < c.world; ++r) {
      shards.push_back(take_shard(x, c.spec, r, c.world));
      ASSERT_EQ(shards.back().shape(), local_shape(c.shape, c.spec, c.world));
    }
    ASSERT_TRUE(bitwise_equal(assemble_shards(shards, c.spec), x))
        << "shape " << shape_str(c.shape) << " dim " << c.spec.dim << " world " << c.world;
  }
}

// global_flat_index agrees with take_shard, and every global element lands on exactly
// one rank (the shards partition the tensor).
TEST(Shard, GlobalFlatIndexMatchesTakeShardAndPartitions) {
  std::mt19937 gen(2);
  for (int trial = 0; trial < 300; ++trial) {
    RandomCase c = random_case(gen);
    Tensor x = iota(c.shape);
    std::vector<int> hits(x.numel(), 0);
    for (int r = 0; r < c.world; ++r) {
      Tensor shard = take_shard(x, c.spec, r, c.world);
      for (std::int64_t i = 0; i < shard.numel(); ++i) {
        std::int64_t g = global_flat_index(c.shape, c.spec, r, c.world, i);
        ASSERT_EQ(static_cast<double>(g), shard.at(i));
        ++hits[g];
      }
    }
    for (std::int64_t g = 0; g < x.numel(); ++g) ASSERT_EQ(hits[g], 1) << "element " << g;
  }
}

}  // namespace
}  // namespace tpcheck
