// explain/recorder.cpp — see recorder.h.
#include "explain/recorder.h"

#include <string>
#include <utility>

#include "tpcheck/error.h"

namespace tpcheck::explain {
namespace {

// The Recording the rank's communicator wrapper made on this thread; the backend factory
// (called next by run_rank, on the same thread) records into it.
thread_local std::shared_ptr<Recording> t_current;
thread_local const GemmForcing* t_forcing = nullptr;

// The name an output is recorded under (explain_trail aligns the runs by it and shows it),
// or "" for what the trail does not compare: a norm's saved statistics and a GEMM's gelu
// aux (state for the backward, not a result), the layout copy into heads, quantization,
// quantized GEMMs, fused attention, the fusions forwarded whole and the loss (the
// harness's arithmetic, through undecorated()).
std::string recorded_name(const OpCall& call, const OpOutput& out) {
  switch (call.op) {
    case Op::kGemm:
      return out.name == "c" ? "gemm" : "";
    case Op::kNormForward:
      return out.name == "y" ? "norm_forward" : "";
    case Op::kNormBackward:
      return "norm_backward " + std::string(out.name);
    case Op::kAccumulateBiasGrad:
      return "bias_grad";
    case Op::kAttentionSoftmaxForward:
      return "attention_probs";
    case Op::kAddBias:
    case Op::kActivationForward:
    case Op::kActivationBackward:
    case Op::kAdd:
    case Op::kAccumulate:
    case Op::kScale:
    case Op::kAttentionSoftmaxBackward:
    case Op::kAttentionHeadsOut:
      return std::string(op_name(call.op));
    default:
      return "";
  }
}

struct OwnedBackend {
  std::unique_ptr<Backend> inner_;
};

class RecordingBackend final : private OwnedBackend, public BackendWrapper {
 public:
  RecordingBackend(std::unique_ptr<Backend> inner, std::shared_ptr<Recording> recording,
                   const GemmForcing* forcing)
      : OwnedBackend{std::move(inner)},
        BackendWrapper(*inner_),
        recording_(std::move(recording)),
        forcing_(forcing) {}

 protected:
  // Forcing: the named sites run with the forced class (and algorithm) instead.
  void run_gemm(const GemmProblem& p, GemmRecord& record) override {
    const GemmForcing::Target* forced = nullptr;
    if (forcing_ != nullptr && p.math_class != MathClass::kFp64) {
      auto it = forcing_->sites.find(std::string(p.site));
      if (it != forcing_->sites.end()) forced = &it->second;
    }
    if (forced == nullptr) return BackendWrapper::run_gemm(p, record);
    GemmProblem q = p;
    q.math_class = forced->math_class;
    record.math_class = forced->math_class;
    if (forced->algorithm) q.pin = &*forced->algorithm;
    BackendWrapper::run_gemm(q, record);
  }

  // A host copy of each output (a copy: the op may write the tensor again later).
  void after_op(const OpCall& call) override {
    if (!recording_) return;
    for (const OpOutput& out : call.outputs) {
      std::string name = recorded_name(call, out);
      if (name.empty()) continue;
      const std::string site = call.op == Op::kGemm ? std::string(call.site) : std::string();
      recording_->ops.push_back({std::move(name), site, out.tensor->to_host().clone()});
    }
  }

 private:
  std::shared_ptr<Recording> recording_;
  const GemmForcing* forcing_;
};

class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(Communicator& inner, std::shared_ptr<Recording> recording)
      : inner_(inner), recording_(std::move(recording)) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Tensor all_gather(const Tensor& local, int dim) override {
    Tensor out = inner_.all_gather(local, dim);
    mirror(CommKind::kAllGather, local, dim, ReduceOp::kSum, 0);
    keep("all_gather", out);
    return out;
  }
  Tensor reduce_scatter(const Tensor& full, int dim) override {
    Tensor out = inner_.reduce_scatter(full, dim);
    mirror(CommKind::kReduceScatter, full, dim, ReduceOp::kSum, 0);
    keep("reduce_scatter", out);
    return out;
  }
  void all_reduce(Tensor& t, ReduceOp op) override {
    inner_.all_reduce(t, op);
    mirror(CommKind::kAllReduce, t, 0, op, 0);
    keep("all_reduce", t);
  }
  void broadcast(Tensor& t, int root) override {
    inner_.broadcast(t, root);
    mirror(CommKind::kBroadcast, t, 0, ReduceOp::kSum, root);
    keep("broadcast", t);
  }
  void barrier() override { inner_.barrier(); }
  void abort(const std::string& reason) override { inner_.abort(reason); }

 private:
  // The run's communication ledger is this object's: repeat the inner record here.
  void mirror(CommKind kind, const Tensor& t, int dim, ReduceOp op, int root) {
    const auto& ledger = inner_.comm_ledger();
    record(kind, t, dim < 0 ? dim + t.rank() : dim, op, root,
           ledger.empty() ? std::string() : ledger.back().algorithm);
  }
  void keep(const char* op, const Tensor& t) {
    if (recording_) recording_->ops.push_back({op, "", t.to_host().clone()});
  }
  Communicator& inner_;
  std::shared_ptr<Recording> recording_;
};

}  // namespace

bool Recording::is_f64() const {
  for (const RecordedOp& op : ops) {
    if (op.op == "gemm") return op.value.dtype() == DType::kF64;
  }
  return !ops.empty() && ops.front().value.dtype() == DType::kF64;
}

ExplainRecorders::ExplainRecorders(bool record, GemmForcing single, GemmForcing sharded)
    : record_(record), single_forcing_(std::move(single)), sharded_forcing_(std::move(sharded)) {}

Execution ExplainRecorders::wrap(const Execution& base) {
  TPCHECK_CHECK_INPUT(!base.one_process_per_rank,
                      "tpcheck explain runs every rank in this process; under mpirun / torchrun "
                      "use --comm emulated on one GPU (same algorithms, same shapes)");
  Execution e = base;
  // The recordings are told apart by their order (truth before its probe, both f64 groups
  // of one): one run at a time.
  e.concurrent_unsharded_runs = false;
  e.wrap_communicator = [this](Communicator& comm) -> std::unique_ptr<Communicator> {
    auto recording = std::make_shared<Recording>();
    recording->rank = comm.rank();
    recording->world = comm.size();
    {
      std::lock_guard<std::mutex> lock(mu_);
      all_.push_back(recording);
    }
    t_current = record_ ? recording : nullptr;
    // A group of one is the single or the truth run (truth GEMMs are fp64: never forced).
    t_forcing = comm.size() > 1 ? &sharded_forcing_ : &single_forcing_;
    if (t_forcing->sites.empty()) t_forcing = nullptr;
    return std::make_unique<RecordingCommunicator>(comm, t_current);
  };
  const BackendFactory make = base.make_backend;
  e.make_backend = [make](int rank) -> std::unique_ptr<Backend> {
    std::unique_ptr<Backend> inner = make(rank);
    std::shared_ptr<Recording> recording = std::exchange(t_current, nullptr);
    const GemmForcing* forcing = std::exchange(t_forcing, nullptr);
    if (!recording && forcing == nullptr) return inner;
    return std::make_unique<RecordingBackend>(std::move(inner), std::move(recording), forcing);
  };
  return e;
}

std::shared_ptr<Recording> ExplainRecorders::single() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : all_) {
    if (r->world == 1 && !r->is_f64()) return r;
  }
  return nullptr;
}

std::shared_ptr<Recording> ExplainRecorders::truth() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : all_) {
    if (r->world == 1 && r->is_f64()) return r;
  }
  return nullptr;
}

std::vector<std::shared_ptr<Recording>> ExplainRecorders::sharded() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Recording>> out;
  for (const auto& r : all_) {
    if (r->world > 1) {
      if (out.size() < static_cast<std::size_t>(r->world)) out.resize(r->world);
      out[r->rank] = r;
    }
  }
  return out;
}

}  // namespace tpcheck::explain
