// Tests of the CUDA-free parts of the process group and the rank-thread rendezvous: the
// TCP rendezvous shares rank 0's payload, relays a failure to every rank and sees a peer
// that vanished; launch detection from mpirun's and torchrun's environment; Rendezvous
// names a rank that never arrives, within its timeout.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous.h"
#include "comm/tcp_group.h"
#include "tpcheck/cuda_comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int test_port(int salt) { return 20000 + static_cast<int>((::getpid() * 7 + salt * 13) % 20000); }

bool wait_for_failure(TcpGroup& g, milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (g.failure()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return false;
}

TEST(TcpGroup, SharesPayloadAndRelaysFailures) {
  const int world = 4;
  const int port = test_port(1);
  TcpGroup::Payload id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 3 + 1);
  std::vector<std::unique_ptr<TcpGroup>> groups(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      // Non-zero ranks may start before rank 0 listens: they retry.
      groups[r] = std::make_unique<TcpGroup>(r, world, "127.0.0.1", port,
                                             r == 0 ? id : TcpGroup::Payload{}, milliseconds(10000));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(groups[r]);
    EXPECT_EQ(groups[r]->payload(), id) << "rank " << r;
    EXPECT_FALSE(groups[r]->failure());
  }
  groups[2]->report("boom on rank 2");
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(wait_for_failure(*groups[r], milliseconds(5000))) << "rank " << r;
    EXPECT_EQ(groups[r]->failure()->rank, 2);
    EXPECT_EQ(groups[r]->failure()->reason, "boom on rank 2");
  }
}

TEST(TcpGroup, PeerThatVanishesIsNamed) {
  const int port = test_port(2);
  std::unique_ptr<TcpGroup> g0;
  std::thread t0([&] { g0 = std::make_unique<TcpGroup>(0, 3, "127.0.0.1", port, TcpGroup::Payload{}, milliseconds(10000)); });
  std::unique_ptr<TcpGroup> g1;
  std::thread t1([&] { g1 = std::make_unique<TcpGroup>(1, 3, "127.0.0.1", port, TcpGroup::Payload{}, milliseconds(10000)); });
  // Rank 2 by hand: a hello, the id, then the connection closes without a goodbye.
  std::thread t2([&] {
    int fd = -1;
    for (int i = 0; i < 100 && fd < 0; ++i) {
      fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(static_cast<uint16_t>(port));
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
        ::close(fd);
        fd = -1;
        std::this_thread::sleep_for(milliseconds(50));
      }
    }
    ASSERT_GE(fd, 0);
    char hello[12] = {'T', 'P', 'C', 'K'};
    uint32_t r = htonl(2), w = htonl(3);
    std::memcpy(hello + 4, &r, 4);
    std::memcpy(hello + 8, &w, 4);
    ASSERT_EQ(::send(fd, hello, 12, 0), 12);
    char reply[132];
    std::size_t got = 0;
    while (got < sizeof(reply)) {
      ssize_t k = ::recv(fd, reply + got, sizeof(reply) - got, 0);
      ASSERT_GT(k, 0);
      got += static_cast<std::size_t>(k);
    }
    ::close(fd);
  });
  t0.join();
  t1.join();
  t2.join();
  ASSERT_TRUE(wait_for_failure(*g0, milliseconds(5000)));
  ASSERT_TRUE(wait_for_failure(*g1, milliseconds(5000)));
  EXPECT_EQ(g0->failure()->rank, 2);
  EXPECT_EQ(g1->failure()->rank, 2);
  EXPECT_NE(g1->failure()->reason.find("exited"), std::string::npos) << g1->failure()->reason;
}

TEST(TcpGroup, RankZeroTimesOutNamingMissingRanks) {
  const auto start = Clock::now();
  try {
    TcpGroup g(0, 3, "127.0.0.1", test_port(3), TcpGroup::Payload{}, milliseconds(300));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
}

struct EnvGuard {
  std::vector<std::string> names;
  void set(const char* n, const char* v) {
    ::setenv(n, v, 1);
    names.push_back(n);
  }
  ~EnvGuard() {
    for (auto& n : names) ::unsetenv(n.c_str());
  }
};

TEST(ProcessLaunch, ReadsMpirunAndTorchrunEnvironments) {
  for (const char* n : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    ::unsetenv(n);
  EXPECT_FALSE(nccl_process_launch_from_env());
  {
    EnvGuard g;
    g.set("OMPI_COMM_WORLD_RANK", "3");
    g.set("OMPI_COMM_WORLD_SIZE", "4");
    g.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
    auto l = nccl_process_launch_from_env();
    ASSERT_TRUE(l);
    EXPECT_EQ(l->launcher, "mpirun");
    EXPECT_EQ(l->rank, 3);
    EXPECT_EQ(l->world, 4);
    EXPECT_EQ(l->local_rank, 1);
    EXPECT_EQ(l->master_addr, "127.0.0.1");
    EXPECT_EQ(l->master_port, 29533);
  }
  {
    EnvGuard g;
    g.set("RANK", "1");
    g.set("WORLD_SIZE", "2");
    g.set("LOCAL_RANK", "0");
    g.set("MASTER_ADDR", "10.0.0.7");
    g.set("MASTER_PORT", "12345");
    auto l = nccl_process_launch_from_env();
    ASSERT_TRUE(l);
    EXPECT_EQ(l->launcher, "torchrun");
    EXPECT_EQ(l->rank, 1);
    EXPECT_EQ(l->master_addr, "10.0.0.7");
    EXPECT_EQ(l->master_port, 12345);
  }
  {
    EnvGuard g;
    g.set("RANK", "2");
    g.set("WORLD_SIZE", "2");
    EXPECT_THROW(nccl_process_launch_from_env(), Error);  // rank out of range
  }
}

TEST(Rendezvous, NamesTheRankThatNeverArrives) {
  Rendezvous rv(3, milliseconds(300));
  const auto start = Clock::now();
  try {
    run_rank_threads(3, rv, [&](int r) {
      if (r == 2) {
        std::this_thread::sleep_for(milliseconds(1500));  // stops answering
        rv.arrive(r, "late");
        return;
      }
      rv.arrive(r, "all_reduce");
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 2 never arrived"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
}

TEST(Rendezvous, ThrowingRankAbortsTheOthers) {
  Rendezvous rv(2, milliseconds(10000));
  const auto start = Clock::now();
  try {
    run_rank_threads(2, rv, [&](int r) {
      if (r == 1) throw std::runtime_error("boom");
      rv.arrive(r, "all_gather");
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_STREQ(e.what(), "boom");
  }
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
}

}  // namespace
}  // namespace tpcheck
