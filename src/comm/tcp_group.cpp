// tcp_group.cpp — see tcp_group.h. POSIX sockets; every wait is a poll() with a deadline.
#include "comm/tcp_group.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[4] = {'T', 'P', 'C', 'K'};

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Reads exactly n bytes before the deadline; false on timeout or a closed connection.
bool recv_all(int fd, char* buf, std::size_t n, Clock::time_point deadline) {
  std::size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    ssize_t k = ::recv(fd, buf + got, n - got, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    got += static_cast<std::size_t>(k);
  }
  return true;
}

bool send_all(int fd, const char* buf, std::size_t n) {
  std::size_t sent = 0;
  while (sent < n) {
    ssize_t k = ::send(fd, buf + sent, n - sent, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    sent += static_cast<std::size_t>(k);
  }
  return true;
}

void put_u32(char* p, std::uint32_t v) {
  v = htonl(v);
  std::memcpy(p, &v, 4);
}
std::uint32_t get_u32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}

// One non-blocking connect attempt, bounded by the deadline. Returns the fd or -1.
int try_connect(const addrinfo* ai, Clock::time_point deadline) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  if (fd < 0) return -1;
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = ::poll(&p, 1, std::min(ms_left(deadline), 1000));
    int err = 0;
    socklen_t len = sizeof(err);
    if (rc == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
      rc = 0;
    } else {
      rc = -1;
    }
  }
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, flags);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

TcpGroup::TcpGroup(int rank, int world, const std::string& addr, int port, const Payload& payload,
                   std::chrono::milliseconds timeout)
    : rank_(rank), world_(world), port_(port), said_bye_(world, false) {
  TPCHECK_CHECK_INPUT(world >= 1 && rank >= 0 && rank < world,
                      "process group: rank {} out of range for a group of {}", rank, world);
  TPCHECK_CHECK_INPUT(port > 0 && port < 65536, "MASTER_PORT {} is not a TCP port (1..65535)", port);
  const Clock::time_point deadline = Clock::now() + timeout;
  if (rank == 0) {
    payload_ = payload;
    serve(deadline);
  } else {
    join(addr, deadline);
  }
  inbox_.assign(peers_.size(), std::string());
  thread_ = std::thread([this] { monitor(); });
}

void TcpGroup::serve(Clock::time_point deadline) {
  peers_.assign(world_, -1);
  if (world_ == 1) return;
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  TPCHECK_CHECK(listen_fd_ >= 0, "rank 0: socket() failed: {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons(static_cast<std::uint16_t>(port_));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(listen_fd_, world_) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listen_fd_);
    listen_fd_ = -1;
    throw Error(ErrorKind::kRuntime,
                fmt::format("rank 0 cannot listen on TCP port {} for the NCCL id: {}; set "
                            "MASTER_PORT to a free port",
                            port_, why),
                {}, 0);
  }
  int joined = 0;
  while (joined < world_ - 1) {
    pollfd p{listen_fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) {
      std::vector<int> missing;
      for (int r = 1; r < world_; ++r)
        if (peers_[r] < 0) missing.push_back(r);
      throw Error(ErrorKind::kRuntime,
                  fmt::format("rank 0: timed out waiting on port {} for rank(s) {} to connect "
                              "({} of {} did); are all {} processes started with the same "
                              "MASTER_ADDR/MASTER_PORT?",
                              port_, fmt::join(missing, ", "), joined, world_ - 1, world_),
                  {}, 0);
    }
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char hello[12];
    if (!recv_all(fd, hello, sizeof(hello), deadline) || std::memcmp(hello, kMagic, 4) != 0) {
      ::close(fd);  // not one of ours (a port scanner, a stale client): ignore it
      continue;
    }
    const int r = static_cast<int>(get_u32(hello + 4));
    const int w = static_cast<int>(get_u32(hello + 8));
    if (w != world_ || r <= 0 || r >= world_ || peers_[r] >= 0) {
      ::close(fd);
      throw Error(ErrorKind::kRuntime,
                  fmt::format("rank 0: a process connected as rank {} of {}, expected a rank "
                              "1..{} of {} not seen yet",
                              r, w, world_ - 1, world_),
                  {}, 0);
    }
    peers_[r] = fd;
    ++joined;
  }
  char reply[4 + 128];
  std::memcpy(reply, kMagic, 4);
  std::memcpy(reply + 4, payload_.data(), payload_.size());
  for (int r = 1; r < world_; ++r) {
    TPCHECK_CHECK(send_all(peers_[r], reply, sizeof(reply)), "rank 0: sending the NCCL id to rank {} failed: {}",
                  r, std::strerror(errno));
  }
}

void TcpGroup::join(const std::string& addr, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(port_);
  int rc = ::getaddrinfo(addr.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    throw Error(ErrorKind::kInput,
                fmt::format("rank {}: MASTER_ADDR '{}' does not resolve: {}", rank_, addr, gai_strerror(rc)),
                {}, rank_);
  }
  int fd = -1;
  while (fd < 0 && Clock::now() < deadline) {
    for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) fd = try_connect(ai, deadline);
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    throw Error(ErrorKind::kRuntime,
                fmt::format("rank {}: could not connect to rank 0 at {}:{} before the deadline; "
                            "is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same everywhere?",
                            rank_, addr, port_),
                {}, rank_);
  }
  peers_ = {fd};
  char hello[12];
  std::memcpy(hello, kMagic, 4);
  put_u32(hello + 4, static_cast<std::uint32_t>(rank_));
  put_u32(hello + 8, static_cast<std::uint32_t>(world_));
  char reply[4 + 128];
  if (!send_all(fd, hello, sizeof(hello)) || !recv_all(fd, reply, sizeof(reply), deadline) ||
      std::memcmp(reply, kMagic, 4) != 0) {
    ::close(fd);
    peers_.clear();
    throw Error(ErrorKind::kRuntime,
                fmt::format("rank {}: rank 0 at {}:{} did not send the NCCL id before the deadline "
                            "(another rank may have failed to connect; see rank 0's message)",
                            rank_, addr, port_),
                {}, rank_);
  }
  std::memcpy(payload_.data(), reply + 4, payload_.size());
}

TcpGroup::~TcpGroup() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (int fd : peers_) {
    if (fd < 0) continue;
    send_line(fd, "B");
    ::shutdown(fd, SHUT_WR);
    ::close(fd);
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::optional<GroupFailure> TcpGroup::failure() {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

void TcpGroup::report(const std::string& reason) { note_failure(rank_, reason, -1); }

void TcpGroup::send_line(int fd, const std::string& line) {
  std::string l = line + "\n";
  (void)send_all(fd, l.data(), l.size());
}

// Records the first failure and spreads it: rank 0 relays to every peer but `from_fd`,
// others send their own failure to rank 0.
void TcpGroup::note_failure(int rank, const std::string& reason, int from_fd) {
  std::lock_guard<std::mutex> lk(mu_);
  if (failure_) return;
  failure_ = GroupFailure{rank, one_line(reason)};
  const std::string line = fmt::format("F {} {}", rank, failure_->reason);
  if (rank_ == 0) {
    for (int fd : peers_)
      if (fd >= 0 && fd != from_fd) send_line(fd, line);
  } else if (rank == rank_ && !peers_.empty()) {
    send_line(peers_[0], line);
  }
}

void TcpGroup::monitor() {
  std::vector<pollfd> fds;
  std::vector<int> who;  // rank of each polled fd
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i] < 0) continue;
    fds.push_back(pollfd{peers_[i], POLLIN, 0});
    who.push_back(rank_ == 0 ? static_cast<int>(i) : 0);
  }
  std::vector<bool> open(fds.size(), true);
  while (!stop_) {
    for (std::size_t i = 0; i < fds.size(); ++i) fds[i].fd = open[i] ? peers_[rank_ == 0 ? who[i] : 0] : -1;
    int rc = ::poll(fds.data(), fds.size(), 100);
    if (rc <= 0) continue;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (!open[i] || fds[i].revents == 0) continue;
      char buf[512];
      ssize_t k = ::recv(fds[i].fd, buf, sizeof(buf), 0);
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      const int peer = who[i];
      if (k <= 0) {
        open[i] = false;
        if (!said_bye_[peer] && !stop_) {
          note_failure(peer, fmt::format("its process exited or lost its connection to rank {} "
                                         "(no goodbye)", rank_),
                       fds[i].fd);
        }
        continue;
      }
      std::string& in = inbox_[i];
      in.append(buf, static_cast<std::size_t>(k));
      std::size_t nl;
      while ((nl = in.find('\n')) != std::string::npos) {
        std::string line = in.substr(0, nl);
        in.erase(0, nl + 1);
        if (line == "B") {
          said_bye_[peer] = true;
        } else if (line.size() > 2 && line[0] == 'F') {
          int failed = std::atoi(line.c_str() + 2);
          std::size_t sp = line.find(' ', 2);
          note_failure(failed, sp == std::string::npos ? "" : line.substr(sp + 1), fds[i].fd);
        }
      }
    }
  }
}

}  // namespace tpcheck
