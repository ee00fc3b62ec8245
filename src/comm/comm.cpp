// comm.cpp — names of the communication enums and the ledger every Communicator keeps.
#include <string>

#include "tpcheck/comm.h"
#include "tpcheck/error.h"

namespace tpcheck {

std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

std::string_view comm_order_name(CommOrder order) {
  return order == CommOrder::kRank ? "rank" : "nccl-ring";
}

CommOrder parse_comm_order(std::string_view name) {
  if (name == "rank") return CommOrder::kRank;
  if (name == "nccl-ring") return CommOrder::kNcclRing;
  TPCHECK_CHECK_INPUT(false, "--comm-order: unknown order '{}' (expected nccl-ring or rank)", name);
  return CommOrder::kRank;
}

std::string_view comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::kAllGather:
      return "all_gather";
    case CommKind::kReduceScatter:
      return "reduce_scatter";
    case CommKind::kAllReduce:
      return "all_reduce";
    case CommKind::kBroadcast:
      return "broadcast";
  }
  return "?";
}

void Communicator::record(CommKind kind, const Tensor& t, int dim, ReduceOp op, int root,
                          std::string algorithm) {
  CommRecord r;
  r.rank = rank();
  r.world = size();
  r.kind = kind;
  if (t.defined()) {
    r.dtype = t.dtype();
    r.elements = t.numel();
    r.bytes = t.nbytes();
    r.shape = t.shape();
  }
  r.dim = dim;
  r.op = op;
  r.root = root;
  r.algorithm = std::move(algorithm);
  ledger_.push_back(std::move(r));
}

}  // namespace tpcheck
