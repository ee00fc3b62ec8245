// Tests of the host model of NCCL's ring collectives (src/comm/ring_reference.h): a
// hand-computed 3-rank f16 example whose results depend on where each chunk's sum starts;
// the chunk rule by hand; f64 integers against the rank-order sum; the simulation against
// a closed-form per-element sum (the form the device kernel uses); and the thread group's
// nccl-ring order against the model, with its ledger.
#include "comm/ring_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tpcheck/comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

Tensor f16(std::vector<double> v) {
  Shape s{static_cast<std::int64_t>(v.size())};
  return Tensor::from_f64(v, s, DType::kF16);
}

// 2048 + 1 = 2049 is a tie in f16 (spacing 2 there) and rounds to even, 2048; 1 + 1 = 2 then
// 2 + 2048 = 2050 is exact. So the f16 result depends on which rank's value comes first.
TEST(RingReference, HandComputedThreeRankF16AllReduce) {
  // Element e has 2048 on rank e, 1 elsewhere. 3 elements, 3 ranks: the partial loop's
  // chunk is alignUp(ceil(3/3), 8) = 8 elements, so all three are in chunk 0, whose sum
  // starts at rank 1 and goes 1, 2, 0.
  std::vector<Tensor> in = {f16({2048, 1, 1}), f16({1, 2048, 1}), f16({1, 1, 2048})};
  std::vector<Tensor> out = ring::all_reduce(in, ReduceOp::kSum);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[r].at(0), 2050.0) << "1 + 1 = 2, 2 + 2048 = 2050";
    EXPECT_EQ(out[r].at(1), 2048.0) << "2048 + 1 -> 2048 (tie to even), + 1 -> 2048";
    EXPECT_EQ(out[r].at(2), 2048.0) << "1 + 2048 -> 2048, + 1 -> 2048";
  }
}

TEST(RingReference, HandComputedThreeRankF16ReduceScatter) {
  // Block d (one element here) is summed from rank d+1 around to d: block 0 in order
  // 1, 2, 0; block 1 in order 2, 0, 1; block 2 in order 0, 1, 2. Each sees 1 + 1 first.
  std::vector<Tensor> in = {f16({2048, 1, 1}), f16({1, 2048, 1}), f16({1, 1, 2048})};
  std::vector<Tensor> out = ring::reduce_scatter(in, ReduceOp::kSum);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(out[r].numel(), 1);
    EXPECT_EQ(out[r].at(0), 2050.0) << "block " << r;
  }
}

TEST(RingReference, ChunkRuleByHand) {
  // f16, 16-byte chunks: C = 8 elements, a loop of 3 ranks covers 24. Elements 24..29 form
  // a partial loop of 6: chunk alignUp(ceil(6/3), 8) = 8, so all of them are chunk 0.
  const std::size_t cb = 16;
  EXPECT_EQ(ring::chunk_elements(cb, DType::kF16), 8);
  EXPECT_EQ(ring::all_reduce_chunk_of(0, 30, 3, DType::kF16, cb), 0);
  EXPECT_EQ(ring::all_reduce_chunk_of(7, 30, 3, DType::kF16, cb), 0);
  EXPECT_EQ(ring::all_reduce_chunk_of(8, 30, 3, DType::kF16, cb), 1);
  EXPECT_EQ(ring::all_reduce_chunk_of(23, 30, 3, DType::kF16, cb), 2);
  EXPECT_EQ(ring::all_reduce_chunk_of(24, 30, 3, DType::kF16, cb), 0);
  EXPECT_EQ(ring::all_reduce_chunk_of(29, 30, 3, DType::kF16, cb), 0);
  EXPECT_EQ(ring::all_reduce_chunk_count(30, 3, DType::kF16, cb), 4);
  // f32, default 2 MiB chunks, 100 elements on 4 ranks: chunk alignUp(25, 4) = 28.
  EXPECT_EQ(ring::all_reduce_chunk_of(27, 100, 4, DType::kF32, ring::kDefaultChunkBytes), 0);
  EXPECT_EQ(ring::all_reduce_chunk_of(28, 100, 4, DType::kF32, ring::kDefaultChunkBytes), 1);
  EXPECT_EQ(ring::all_reduce_chunk_of(99, 100, 4, DType::kF32, ring::kDefaultChunkBytes), 3);
  EXPECT_EQ(ring::all_reduce_chunk_count(100, 4, DType::kF32, ring::kDefaultChunkBytes), 4);
  // 10 f32 on 4 ranks: chunk alignUp(3, 4) = 4: chunks 0, 1 and a 2-element chunk 2; 3 empty.
  EXPECT_EQ(ring::all_reduce_chunk_count(10, 4, DType::kF32, ring::kDefaultChunkBytes), 3);
  // The same element in chunk 1 instead of 0: the sum starts at rank 2 (2, 0, 1).
  std::vector<double> a(30, 1.0), b(30, 1.0), c(30, 1.0);
  a[0] = a[8] = 2048;
  std::vector<Tensor> out = ring::all_reduce({f16(a), f16(b), f16(c)}, ReduceOp::kSum, cb);
  EXPECT_EQ(out[0].at(0), 2050.0);  // 1, 2, 0: (1 + 1) + 2048
  EXPECT_EQ(out[0].at(8), 2048.0);  // 2, 0, 1: (1 + 2048) + 1
}

// Integers in f64 add exactly in any order: the ring must equal the rank-order sum.
TEST(RingReference, F64IntegersEqualRankOrderSum) {
  for (int world = 1; world <= 8; ++world) {
    for (std::int64_t count : {1, 7, 37, 100, 1000}) {
      std::vector<Tensor> in;
      for (int r = 0; r < world; ++r) {
        std::vector<double> v(count);
        for (std::int64_t i = 0; i < count; ++i) v[i] = static_cast<double>((r * 7919 + i * 104729) % 20001) - 10000;
        in.push_back(Tensor::from_f64(v, {count}, DType::kF64));
      }
      for (std::size_t cb : {std::size_t{16}, std::size_t{64}, ring::kDefaultChunkBytes}) {
        std::vector<Tensor> out = ring::all_reduce(in, ReduceOp::kSum, cb);
        for (int r = 0; r < world; ++r) {
          for (std::int64_t i = 0; i < count; ++i) {
            double sum = 0;
            for (int q = 0; q < world; ++q) sum += in[q].at(i);
            ASSERT_EQ(out[r].at(i), sum) << "world " << world << " count " << count << " i " << i;
          }
        }
      }
      if (count % world == 0) {
        std::vector<Tensor> rs = ring::reduce_scatter(in, ReduceOp::kSum);
        for (int r = 0; r < world; ++r) {
          for (std::int64_t j = 0; j < count / world; ++j) {
            double sum = 0;
            for (int q = 0; q < world; ++q) sum += in[q].at(r * (count / world) + j);
            ASSERT_EQ(rs[r].at(j), sum);
          }
        }
      }
      std::vector<Tensor> ag = ring::all_gather(in);
      for (int r = 0; r < world; ++r)
        for (std::int64_t i = 0; i < count * world; ++i) ASSERT_EQ(ag[r].at(i), in[i / count].at(i % count));
    }
  }
}

double value(int rank, std::int64_t i) {
  std::uint64_t h = static_cast<std::uint64_t>(rank) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) * 0xBF58476D1CE4E5B9ull + 7;
  h ^= h >> 29;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return std::ldexp((static_cast<double>(h % 4001) - 2000.0) / 1000.0, static_cast<int>((h >> 12) % 12) - 6);
}

// The closed form the device kernel computes: element i's chunk c, then
// acc = x[c+1]; acc = round(acc + x[c+2]); ...; acc = round(acc + x[c]).
TEST(RingReference, SimulationMatchesClosedFormPerElementOrder) {
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32, DType::kF64}) {
    for (int world = 2; world <= 8; ++world) {
      for (std::int64_t count : {5, 61, 333}) {
        for (std::size_t cb : {std::size_t{16}, std::size_t{48}, ring::kDefaultChunkBytes}) {
          std::vector<Tensor> in;
          for (int r = 0; r < world; ++r) {
            std::vector<double> v(count);
            for (std::int64_t i = 0; i < count; ++i) v[i] = value(r, i);
            in.push_back(Tensor::from_f64(v, {count}, dtype));
          }
          std::vector<Tensor> out = ring::all_reduce(in, ReduceOp::kSum, cb);
          for (std::int64_t i = 0; i < count; ++i) {
            int c = ring::all_reduce_chunk_of(i, count, world, dtype, cb);
            double acc = in[(c + 1) % world].at(i);
            for (int k = 2; k <= world; ++k) acc = round_to(dtype, acc + in[(c + k) % world].at(i));
            for (int r = 0; r < world; ++r)
              ASSERT_EQ(out[r].at(i), acc) << dtype_name(dtype) << " world " << world << " count "
                                           << count << " chunk bytes " << cb << " i " << i;
          }
        }
      }
    }
  }
}

TEST(RingReference, MaxIsFmax) {
  std::vector<Tensor> in = {Tensor::from_f64(std::vector<double>{NAN, 1, -3}, {3}, DType::kF32),
                            Tensor::from_f64(std::vector<double>{2, NAN, -4}, {3}, DType::kF32)};
  std::vector<Tensor> out = ring::all_reduce(in, ReduceOp::kMax);
  EXPECT_EQ(out[0].at(0), 2.0);
  EXPECT_EQ(out[0].at(1), 1.0);
  EXPECT_EQ(out[0].at(2), -3.0);
}

TEST(ThreadGroupNcclRing, MatchesModelAndRecordsLedger) {
  const int world = 4;
  const Shape shape = {6, 8};
  ThreadGroupOptions opts;
  opts.order = CommOrder::kNcclRing;
  opts.nccl_chunk_bytes = 16;
  std::vector<Tensor> in;
  for (int r = 0; r < world; ++r) {
    std::vector<double> v(48);
    for (int i = 0; i < 48; ++i) v[i] = value(r, i);
    in.push_back(Tensor::from_f64(v, shape, DType::kF16));
  }
  std::vector<Tensor> ar(world), rs(world);
  std::vector<std::vector<CommRecord>> ledgers(world);
  run_thread_group(world, [&](Communicator& comm) {
    Tensor t = in[comm.rank()].clone();
    comm.all_reduce(t);
    ar[comm.rank()] = t;
    rs[comm.rank()] = comm.reduce_scatter(in[comm.rank()], 1);
    ledgers[comm.rank()] = comm.comm_ledger();
  }, opts);
  std::vector<Tensor> expect = ring::all_reduce(in, ReduceOp::kSum, 16);
  for (int r = 0; r < world; ++r) EXPECT_TRUE(bitwise_equal(ar[r], expect[r])) << r;
  // reduce_scatter along dim 1: rank r's slice is columns [2r, 2r+2) of every row.
  std::vector<Tensor> flat;
  for (const Tensor& t : in) {
    std::vector<double> v;
    for (int r = 0; r < world; ++r)
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 2; ++j) v.push_back(t.at(i * 8 + 2 * r + j));
    flat.push_back(Tensor::from_f64(v, {48}, DType::kF16));
  }
  std::vector<Tensor> rs_expect = ring::reduce_scatter(flat, ReduceOp::kSum);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(rs[r].shape(), (Shape{6, 2}));
    for (int i = 0; i < 12; ++i) EXPECT_EQ(rs[r].at(i), rs_expect[r].at(i)) << r << " " << i;
  }
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(ledgers[r].size(), 2u);
    EXPECT_EQ(ledgers[r][0].kind, CommKind::kAllReduce);
    EXPECT_EQ(ledgers[r][0].rank, r);
    EXPECT_EQ(ledgers[r][0].elements, 48);
    EXPECT_EQ(ledgers[r][0].bytes, 96u);
    EXPECT_EQ(ledgers[r][0].algorithm, "nccl-ring host model (6 chunks, 1 channel)");
    EXPECT_EQ(ledgers[r][1].kind, CommKind::kReduceScatter);
    EXPECT_EQ(ledgers[r][1].dim, 1);
  }
}

TEST(CommOrder, ParsesNames) {
  EXPECT_EQ(parse_comm_order("rank"), CommOrder::kRank);
  EXPECT_EQ(parse_comm_order("nccl-ring"), CommOrder::kNcclRing);
  EXPECT_EQ(comm_order_name(CommOrder::kNcclRing), "nccl-ring");
  EXPECT_THROW(parse_comm_order("ring"), Error);
}

}  // namespace
}  // namespace tpcheck
