// SingleCommunicator: the group of one rank. Every collective is the identity (results
// are fresh copies, so callers may write them as they would a real collective's output).
// After abort(), every later collective throws Error(kAborted), as in a real group.
// Each collective is recorded in the ledger as "identity (group of 1)".
// Thread safety: one thread uses the object (see comm.h).
#include <string>

#include "comm/rendezvous.h"
#include "tpcheck/comm.h"
#include "tpcheck/error.h"

namespace tpcheck {
namespace {

constexpr const char* kIdentity = "identity (group of 1)";

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

  Tensor all_gather(const Tensor& local, int dim) override {
    enter("all_gather");
    record(CommKind::kAllGather, local, normalize_collective_dim(local, dim, "all_gather"),
           ReduceOp::kSum, 0, kIdentity);
    return local.clone();
  }
  Tensor reduce_scatter(const Tensor& full, int dim) override {
    enter("reduce_scatter");
    record(CommKind::kReduceScatter, full, normalize_collective_dim(full, dim, "reduce_scatter"),
           ReduceOp::kSum, 0, kIdentity);
    return full.clone();
  }
  void all_reduce(Tensor& t, ReduceOp op) override {
    enter("all_reduce");
    record(CommKind::kAllReduce, t, 0, op, 0, kIdentity);
  }
  void broadcast(Tensor& t, int root) override {
    enter("broadcast");
    TPCHECK_CHECK(root == 0, "broadcast: root {} out of range for a group of 1", root);
    record(CommKind::kBroadcast, t, 0, ReduceOp::kSum, root, kIdentity);
  }
  void barrier() override { enter("barrier"); }
  void abort(const std::string& reason) override {
    if (!aborted_) reason_ = reason;
    aborted_ = true;
  }

 private:
  void enter(const char* what) {
    if (aborted_) {
      throw Error(ErrorKind::kAborted, "rank 0 failed: " + reason_, what, 0);
    }
  }

  bool aborted_ = false;
  std::string reason_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

}  // namespace tpcheck
