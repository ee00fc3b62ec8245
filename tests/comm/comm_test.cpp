// Tests of the communicators (tpcheck/comm.h): every collective of the thread group
// against a serial reference written here element by element (no Tensor::cat/slice), for
// group sizes 1..8, several dims and f32/f16/f64; the documented summation order checked
// bit for bit; and the failure paths (a rank that throws, one that never arrives, one that
// passes a mismatched shape) end promptly with an error naming the rank.
#include "tpcheck/comm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A deterministic value for (rank, flat index) with widely varying magnitudes (2^-8 ..
// 2^7), so sums in different orders round differently.
double value_for(int rank, std::int64_t flat) {
  std::uint64_t h = static_cast<std::uint64_t>(rank) * 0x9E3779B97F4A7C15ull +
                    static_cast<std::uint64_t>(flat) * 0xBF58476D1CE4E5B9ull + 12345;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  double mantissa = (static_cast<double>(h % 2001) - 1000.0) / 1000.0;
  int exponent = static_cast<int>((h >> 20) % 16) - 8;
  return std::ldexp(mantissa, exponent) + 1.0 / 3.0;
}

Tensor make_input(int rank, const Shape& shape, DType dtype) {
  std::vector<double> v(shape_numel(shape));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = value_for(rank, static_cast<std::int64_t>(i));
  return Tensor::from_f64(v, shape, dtype);  // rounded to dtype
}

std::vector<std::int64_t> unflatten(std::int64_t flat, const Shape& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

std::int64_t flatten(const std::vector<std::int64_t>& idx, const Shape& shape) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// The documented sum: rank order, f64 accumulator for f64 tensors, f32 otherwise, one
// rounding to the dtype at the end.
double serial_sum(const std::vector<Tensor>& ins, std::int64_t flat, DType dtype) {
  if (dtype == DType::kF64) {
    double acc = ins[0].at(flat);
    for (std::size_t r = 1; r < ins.size(); ++r) acc += ins[r].at(flat);
    return acc;
  }
  float acc = static_cast<float>(ins[0].at(flat));
  for (std::size_t r = 1; r < ins.size(); ++r) acc += static_cast<float>(ins[r].at(flat));
  return round_to(dtype, acc);
}

// Runs `body` on a thread group and collects each rank's result tensor.
std::vector<Tensor> run_collect(int world, const std::function<Tensor(Communicator&)>& body) {
  std::vector<Tensor> out(world);
  run_thread_group(world, [&](Communicator& comm) { out[comm.rank()] = body(comm); });
  return out;
}

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kF64};

TEST(ThreadGroup, AllGatherMatchesSerialConcatenation) {
  const Shape local = {3, 2, 5};
  for (int world = 1; world <= 8; ++world) {
    for (DType dtype : kDtypes) {
      for (int dim : {0, 1, 2, -1}) {
        const int d = dim < 0 ? dim + 3 : dim;
        std::vector<Tensor> outs = run_collect(world, [&](Communicator& comm) {
          return comm.all_gather(make_input(comm.rank(), local, dtype), dim);
        });
        Shape full = local;
        full[d] *= world;
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(outs[r].shape(), full);
          ASSERT_EQ(outs[r].dtype(), dtype);
          for (std::int64_t i = 0; i < outs[r].numel(); ++i) {
            std::vector<std::int64_t> idx = unflatten(i, full);
            int src = static_cast<int>(idx[d] / local[d]);
            idx[d] %= local[d];
            double expected = make_input(src, local, dtype).at(flatten(idx, local));
            ASSERT_EQ(outs[r].at(i), expected)
                << "world " << world << " dim " << dim << " rank " << r;
          }
        }
        // Every rank owns its result: writing one must not change another.
        if (world > 1) {
          outs[0].set(0, 99.0);
          EXPECT_NE(outs[1].at(0), 99.0);
        }
      }
    }
  }
}

TEST(ThreadGroup, ReduceScatterIsRankOrderSumThenSlice) {
  for (int world = 1; world <= 8; ++world) {
    for (DType dtype : kDtypes) {
      for (int dim : {0, 1, 2}) {
        Shape full = {2, 3, 2};
        full[dim] = 2 * world;
        std::vector<Tensor> ins;
        for (int r = 0; r < world; ++r) ins.push_back(make_input(r, full, dtype));
        std::vector<Tensor> outs = run_collect(world, [&](Communicator& comm) {
          return comm.reduce_scatter(make_input(comm.rank(), full, dtype), dim);
        });
        Shape piece = full;
        piece[dim] = 2;
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(outs[r].shape(), piece);
          for (std::int64_t i = 0; i < outs[r].numel(); ++i) {
            std::vector<std::int64_t> idx = unflatten(i, piece);
            idx[dim] += 2 * r;
            double expected = serial_sum(ins, flatten(idx, full), dtype);
            ASSERT_EQ(outs[r].at(i), expected) << "world " << world << " dim " << dim;
          }
        }
      }
    }
  }
}

TEST(ThreadGroup, AllReduceSumIsBitwiseRankOrder) {
  const Shape shape = {4, 33};
  for (int world = 1; world <= 8; ++world) {
    for (DType dtype : kDtypes) {
      std::vector<Tensor> ins;
      for (int r = 0; r < world; ++r) ins.push_back(make_input(r, shape, dtype));
      std::vector<Tensor> outs = run_collect(world, [&](Communicator& comm) {
        Tensor t = make_input(comm.rank(), shape, dtype);
        comm.all_reduce(t, ReduceOp::kSum);
        return t;
      });
      Tensor expected(shape, dtype);
      for (std::int64_t i = 0; i < expected.numel(); ++i)
        expected.set(i, serial_sum(ins, i, dtype));
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(bitwise_equal(outs[r], expected))
            << "world " << world << " " << dtype_name(dtype) << " rank " << r;
      }
    }
  }
}

// The order is observable: summing f32 values of mixed magnitude in reverse rank order
// gives a different result for some elements, so the bitwise test above pins the order.
TEST(ThreadGroup, SummationOrderIsObservable) {
  const int world = 8;
  const Shape shape = {256};
  std::vector<Tensor> ins;
  for (int r = 0; r < world; ++r) ins.push_back(make_input(r, shape, DType::kF32));
  int differing = 0;
  for (std::int64_t i = 0; i < 256; ++i) {
    float reverse = static_cast<float>(ins[world - 1].at(i));
    for (int r = world - 2; r >= 0; --r) reverse += static_cast<float>(ins[r].at(i));
    if (reverse != serial_sum(ins, i, DType::kF32)) ++differing;
  }
  EXPECT_GT(differing, 0);
}

TEST(ThreadGroup, AllReduceMaxAndNaN) {
  for (int world = 1; world <= 8; ++world) {
    for (DType dtype : kDtypes) {
      const Shape shape = {5, 7};
      std::vector<Tensor> outs = run_collect(world, [&](Communicator& comm) {
        Tensor t = make_input(comm.rank(), shape, dtype);
        if (comm.rank() == world - 1) t.set(3, std::nan(""));
        comm.all_reduce(t, ReduceOp::kMax);
        return t;
      });
      for (std::int64_t i = 0; i < shape_numel(shape); ++i) {
        double expected = -INFINITY;
        for (int r = 0; r < world; ++r)
          expected = std::max(expected, make_input(r, shape, dtype).at(i));
        for (int r = 0; r < world; ++r) {
          if (i == 3) {
            EXPECT_TRUE(std::isnan(outs[r].at(i)));
          } else {
            ASSERT_EQ(outs[r].at(i), expected);
          }
        }
      }
    }
  }
}

TEST(ThreadGroup, BroadcastCopiesRootToAll) {
  for (int world = 1; world <= 8; ++world) {
    for (int root = 0; root < world; root += 3) {
      std::vector<Tensor> outs = run_collect(world, [&](Communicator& comm) {
        Tensor t = make_input(comm.rank(), {6, 2}, DType::kF16);
        comm.broadcast(t, root);
        return t;
      });
      Tensor expected = make_input(root, {6, 2}, DType::kF16);
      for (int r = 0; r < world; ++r) EXPECT_TRUE(bitwise_equal(outs[r], expected));
    }
  }
}

TEST(ThreadGroup, BarrierSeparatesPhases) {
  const int world = 6;
  std::atomic<int> before{0};
  std::atomic<int> wrong{0};
  run_thread_group(world, [&](Communicator& comm) {
    for (int round = 1; round <= 20; ++round) {
      before.fetch_add(1);
      comm.barrier();
      if (before.load() < round * world) wrong.fetch_add(1);
      comm.barrier();
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

// Many back-to-back collectives of mixed kinds: fast ranks must not mix generations.
TEST(ThreadGroup, ManyCollectivesInARow) {
  const int world = 8;
  std::vector<double> result(world);
  run_thread_group(world, [&](Communicator& comm) {
    Tensor acc = Tensor::full({1}, DType::kF64, 0.0);
    for (int i = 0; i < 300; ++i) {
      Tensor t = Tensor::full({1}, DType::kF64, comm.rank() + i);
      comm.all_reduce(t);
      Tensor g = comm.all_gather(Tensor::full({1}, DType::kF64, comm.rank()), 0);
      acc.set(0, acc.at(0) + t.at(0) + g.at(world - 1));
    }
    result[comm.rank()] = acc.at(0);
  });
  // sum_i (sum_r (r + i) + (world - 1)) = sum_i (world(world-1)/2 + world*i + world - 1)
  double expected = 0;
  for (int i = 0; i < 300; ++i) expected += world * (world - 1) / 2.0 + world * i + world - 1;
  for (double r : result) EXPECT_EQ(r, expected);
}

TEST(SingleCommunicator, CollectivesAreIdentity) {
  auto comm = make_single_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  Tensor t = make_input(0, {4, 3}, DType::kF32);
  Tensor before = t.clone();
  EXPECT_TRUE(bitwise_equal(comm->all_gather(t, 1), before));
  EXPECT_TRUE(bitwise_equal(comm->reduce_scatter(t, 0), before));
  comm->all_reduce(t, ReduceOp::kSum);
  comm->broadcast(t, 0);
  comm->barrier();
  EXPECT_TRUE(bitwise_equal(t, before));
  comm->abort("stop");
  try {
    comm->barrier();
    FAIL() << "barrier after abort returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kAborted);
    EXPECT_NE(std::string(e.what()).find("stop"), std::string::npos);
  }
}

// ---- failure handling -------------------------------------------------------------

enum class Coll { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
const Coll kColls[] = {Coll::kAllGather, Coll::kReduceScatter, Coll::kAllReduce, Coll::kBroadcast,
                       Coll::kBarrier};

void call(Communicator& comm, Coll c) {
  Tensor t = make_input(comm.rank(), {8, 2}, DType::kF32);
  switch (c) {
    case Coll::kAllGather:
      comm.all_gather(t, 0);
      break;
    case Coll::kReduceScatter:
      comm.reduce_scatter(t, 0);
      break;
    case Coll::kAllReduce:
      comm.all_reduce(t);
      break;
    case Coll::kBroadcast:
      comm.broadcast(t, 0);
      break;
    case Coll::kBarrier:
      comm.barrier();
      break;
  }
}

struct RankOutcome {
  std::string message;
  ErrorKind kind = ErrorKind::kRuntime;
  bool threw = false;
  double seconds = 0;
};

// Rank `failing` throws "injected fault" (after `delay`, or at once), before the
// collective `c`, which every other rank calls (after one successful `c` when `after_one`).
// Returns each rank's outcome; `root` receives run_thread_group's exception.
std::vector<RankOutcome> inject(int world, int failing, Coll c, milliseconds delay, bool after_one,
                                Error* root, double* total_seconds) {
  std::vector<RankOutcome> out(world);
  auto start = Clock::now();
  try {
    run_thread_group(world, [&](Communicator& comm) {
      int r = comm.rank();
      try {
        if (after_one) call(comm, c);
        if (r == failing) {
          std::this_thread::sleep_for(delay);
          throw std::runtime_error("injected fault");
        }
        call(comm, c);
        call(comm, c);
      } catch (const Error& e) {
        out[r] = {e.what(), e.kind(), true,
                  std::chrono::duration<double>(Clock::now() - start).count()};
        throw;
      }
    });
    ADD_FAILURE() << "run_thread_group returned although rank " << failing << " threw";
  } catch (const Error& e) {
    *root = e;
  }
  *total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

TEST(ThreadGroupFailure, ThrowingRankAbortsEveryCollectivePromptly) {
  const int world = 4;
  const int failing = 2;
  for (Coll c : kColls) {
    for (bool after_one : {false, true}) {
      // delay 0: fails before the peers arrive; 50 ms: the peers are already blocked.
      for (int delay_ms : {0, 50}) {
        Error root(ErrorKind::kInput, "none");
        double total = 0;
        // The default 10 s timeout: finishing in < 5 s shows abort, not timeout, ended it.
        std::vector<RankOutcome> out =
            inject(world, failing, c, milliseconds(delay_ms), after_one, &root, &total);
        SCOPED_TRACE(testing::Message() << "collective " << static_cast<int>(c) << " after_one "
                                        << after_one << " delay " << delay_ms);
        EXPECT_LT(total, 5.0);
        EXPECT_EQ(root.rank(), failing);
        EXPECT_EQ(root.kind(), ErrorKind::kRuntime);
        EXPECT_STREQ(root.what(), "injected fault");
        for (int r = 0; r < world; ++r) {
          if (r == failing) continue;
          ASSERT_TRUE(out[r].threw) << "rank " << r;
          EXPECT_EQ(out[r].kind, ErrorKind::kAborted);
          EXPECT_EQ(out[r].message, "rank 2 failed: injected fault");
          EXPECT_LT(out[r].seconds, 5.0);
        }
      }
    }
  }
}

TEST(ThreadGroupFailure, ExplicitAbortReachesPeers) {
  std::atomic<int> aborted{0};
  try {
    run_thread_group(3, [&](Communicator& comm) {
      if (comm.rank() == 1) {
        comm.abort("gave up");
        return;
      }
      try {
        comm.barrier();
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kAborted && std::string(e.what()) == "rank 1 failed: gave up")
          aborted.fetch_add(1);
        throw;
      }
    });
    FAIL() << "no error after abort";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_NE(std::string(e.what()).find("gave up"), std::string::npos);
  }
  EXPECT_EQ(aborted.load(), 2);
}

TEST(ThreadGroupFailure, RankThatNeverArrivesTimesOut) {
  ThreadGroupOptions options;
  options.timeout = milliseconds(100);
  auto start = Clock::now();
  std::vector<double> seconds(4, -1.0);
  try {
    run_thread_group(
        4,
        [&](Communicator& comm) {
          // Rank 3 is stuck (e.g. in a long computation) past the peers' timeout.
          if (comm.rank() == 3) std::this_thread::sleep_for(milliseconds(1000));
          try {
            Tensor t = make_input(comm.rank(), {2}, DType::kF32);
            comm.all_reduce(t);
          } catch (const Error&) {
            seconds[comm.rank()] = std::chrono::duration<double>(Clock::now() - start).count();
            throw;
          }
        },
        options);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("timed out after 100 ms in all_reduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank(s) 3 never arrived"), std::string::npos) << msg;
    EXPECT_NE(e.rank(), 3);
  }
  // The waiting ranks gave up near their timeout, long before rank 3 woke up.
  for (int r = 0; r < 3; ++r) {
    EXPECT_GE(seconds[r], 0.0);
    EXPECT_LT(seconds[r], 0.9) << "rank " << r;
  }
}

TEST(ThreadGroupFailure, RankThatReturnsEarlyIsReportedAtOnce) {
  auto start = Clock::now();
  try {
    run_thread_group(4, [&](Communicator& comm) {
      if (comm.rank() == 1) return;  // forgets the collective
      comm.barrier();
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("rank(s) 1 returned without calling barrier"), std::string::npos) << msg;
  }
  // Default 10 s timeout: this must not wait for it.
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
}

TEST(ThreadGroupFailure, MismatchedShapesNameRanksAndShapes) {
  try {
    run_thread_group(3, [&](Communicator& comm) {
      Shape shape = comm.rank() == 1 ? Shape{2, 4} : Shape{2, 3};
      comm.all_gather(Tensor::zeros(shape, DType::kF32), 0);
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("mismatched collective"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[2, 4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[2, 3]"), std::string::npos) << msg;
  }
}

TEST(ThreadGroupFailure, MismatchedKindOrDtypeIsAnError) {
  EXPECT_THROW(run_thread_group(2,
                                [&](Communicator& comm) {
                                  Tensor t = Tensor::zeros({2}, DType::kF32);
                                  if (comm.rank() == 0)
                                    comm.all_reduce(t);
                                  else
                                    comm.broadcast(t, 0);
                                }),
               Error);
  EXPECT_THROW(run_thread_group(2,
                                [&](Communicator& comm) {
                                  Tensor t = Tensor::zeros(
                                      {2}, comm.rank() == 0 ? DType::kF32 : DType::kF16);
                                  comm.all_reduce(t);
                                }),
               Error);
}

TEST(ThreadGroupFailure, NonErrorExceptionKeepsRank) {
  try {
    run_thread_group(3, [&](Communicator& comm) {
      if (comm.rank() == 0) throw std::logic_error("boom");
      comm.barrier();
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 0);
    EXPECT_STREQ(e.what(), "boom");
  }
}

TEST(ThreadGroupFailure, BadArguments) {
  EXPECT_THROW(run_thread_group(0, [](Communicator&) {}), Error);
  // reduce_scatter along a dim not divisible by the group size.
  EXPECT_THROW(
      run_thread_group(
          3, [](Communicator& comm) { comm.reduce_scatter(Tensor::zeros({4}, DType::kF32), 0); }),
      Error);
}

}  // namespace
}  // namespace tpcheck
