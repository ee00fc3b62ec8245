// tcp_group.h — the process group's TCP side: shares the NCCL id from rank 0 with every
// rank, then keeps the connections as a failure channel. No CUDA, no MPI.
//
// Rendezvous: rank 0 listens on `port` (all interfaces, SO_REUSEADDR); ranks 1..N-1 connect
// to addr:port, retrying every 100 ms until the deadline, and send a 12-byte hello
// ("TPCK", rank, world in network order); rank 0 checks every hello (world agrees, rank in
// range, no rank twice) and answers each with "TPCK" + the 128-byte payload (the NCCL id).
// Failure channel, afterwards: one line per message, "F <rank> <reason>" (rank failed) or
// "B" (clean goodbye). Rank 0 relays every failure to all ranks; a connection that closes
// without "B" is a failure of that rank ("its process exited ..."), seen by rank 0 and
// relayed; the others see rank 0's connection close without "B" as rank 0's failure.
// Thread safety: failure() and report() may be called from any thread; a background
// thread reads the connections until destruction (which says goodbye).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tpcheck {

// A failure somebody in the group saw first: the rank that failed and why.
struct GroupFailure {
  int rank = -1;
  std::string reason;
};

class TcpGroup {
 public:
  using Payload = std::array<char, 128>;
  // Rank 0 passes the payload to share; the others receive it (payload()).
  // Throws Error(kRuntime) naming the rank, address and port on any failure or timeout.
  TcpGroup(int rank, int world, const std::string& addr, int port, const Payload& payload,
           std::chrono::milliseconds timeout);
  ~TcpGroup();
  TcpGroup(const TcpGroup&) = delete;
  TcpGroup& operator=(const TcpGroup&) = delete;

  const Payload& payload() const { return payload_; }
  std::optional<GroupFailure> failure();
  // This rank failed: tell everybody (no-op once a failure is known).
  void report(const std::string& reason);

 private:
  void serve(std::chrono::steady_clock::time_point deadline);
  void join(const std::string& addr, std::chrono::steady_clock::time_point deadline);
  void monitor();
  void note_failure(int rank, const std::string& reason, int from_fd);
  void send_line(int fd, const std::string& line);

  const int rank_;
  const int world_;
  const int port_;
  Payload payload_{};
  int listen_fd_ = -1;
  std::vector<int> peers_;  // rank 0: fd of rank r (index r; -1 for itself); others: [fd to 0]
  std::vector<std::string> inbox_;  // partial lines per peer
  std::vector<bool> said_bye_;
  std::mutex mu_;
  std::optional<GroupFailure> failure_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tpcheck
