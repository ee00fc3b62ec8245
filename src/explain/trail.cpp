// explain/trail.cpp — see trail.h.
#include "explain/trail.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "tpcheck/shard.h"

namespace tpcheck::explain {
namespace {

bool is_collective(const std::string& op) {
  return op == "all_gather" || op == "reduce_scatter" || op == "all_reduce" || op == "broadcast";
}

struct Labeled {
  std::string key;   // alignment key
  std::string name;  // shown
  int occurrence = 0;
};

std::vector<Labeled> label_ops(const Recording& r) {
  std::vector<Labeled> out;
  std::map<std::string, int> seen;
  std::string prev;
  for (const RecordedOp& op : r.ops) {
    Labeled l;
    if (op.op == "gemm") {
      l.key = "gemm|" + op.site;
      l.name = op.site;
      prev = op.site;
    } else {
      const std::string where = prev.empty() ? "input" : prev;
      l.key = where + "|" + (is_collective(op.op) ? "collective" : op.op);
      l.name = where + " → " + op.op;
    }
    l.occurrence = seen[l.key]++;
    out.push_back(std::move(l));
  }
  return out;
}

double rms(const std::vector<double>& a, const std::vector<double>* b) {
  if (a.empty()) return 0;
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = b ? a[i] - (*b)[i] : a[i];
    s += d * d;
  }
  return std::sqrt(s / a.size());
}

double norm_rel(const std::vector<double>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

struct Candidate {
  std::string layout;
  std::vector<double> values;  // the sharded tensor as single's (global) tensor
  double diff = 0;             // norm-wise relative difference to single
};

// The interpretations of the ranks' tensors as single's tensor (see the header).
std::vector<Candidate> candidates(const std::vector<Tensor>& ranks, const Tensor& single) {
  std::vector<Candidate> out;
  const int n = static_cast<int>(ranks.size());
  const Shape& s = single.shape();
  const Shape& l = ranks[0].shape();
  for (const Tensor& t : ranks) {
    if (t.shape() != l) return out;
  }
  if (l == s) {
    // Replicated: every rank should hold single's tensor; the worst rank speaks.
    const std::vector<double> ref = single.to_f64();
    Candidate worst;
    worst.diff = -1;
    for (int r = 0; r < n; ++r) {
      std::vector<double> v = ranks[r].to_f64();
      const double d = norm_rel(v, ref);
      if (d > worst.diff || std::isnan(d)) {
        worst =
            Candidate{n > 1 ? "replicated (worst: rank " + std::to_string(r) + ")" : "replicated",
                      std::move(v), d};
      }
    }
    out.push_back(std::move(worst));
    std::vector<double> sum(ref.size(), 0.0);
    for (const Tensor& t : ranks) {
      const std::vector<double> v = t.to_f64();
      for (std::size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
    }
    out.push_back(Candidate{"sum over ranks", std::move(sum), 0});
    return out;
  }
  if (static_cast<int>(l.size()) != static_cast<int>(s.size())) return out;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    bool fits = l[d] * n == s[d];
    for (int e = 0; e < static_cast<int>(s.size()) && fits; ++e) fits = e == d || l[e] == s[e];
    if (!fits) continue;
    for (std::int64_t q = 1; q <= std::min<std::int64_t>(s[d], 64); ++q) {
      if (s[d] % q != 0 || (s[d] / q) % n != 0) continue;
      std::vector<std::int64_t> blocks(q, s[d] / q);
      const Tensor global = assemble_shards(
          ranks, ShardSpec::along(d, q == 1 ? std::vector<std::int64_t>{} : blocks));
      out.push_back(Candidate{
          q == 1 ? "split dim " + std::to_string(d)
                 : "split dim " + std::to_string(d) + " (" + std::to_string(q) + " blocks)",
          global.to_f64(), 0});
    }
    // A fused GQA/MQA projection: [Q | K | V] blocks of unequal size, Q = k·KV (k query
    // heads per key/value head), each block split over the ranks.
    for (std::int64_t k = 2; k <= 64; ++k) {
      if (s[d] % (k + 2) != 0) continue;
      const std::int64_t kv = s[d] / (k + 2);
      if (kv % n != 0) continue;
      const Tensor global = assemble_shards(ranks, ShardSpec::along(d, {k * kv, kv, kv}));
      out.push_back(Candidate{"split dim " + std::to_string(d) + " ([Q | K | V] blocks " +
                                  std::to_string(k * kv) + ", " + std::to_string(kv) + ", " +
                                  std::to_string(kv) + ")",
                              global.to_f64(), 0});
    }
  }
  return out;
}

void compare(TrailEntry& e, const Tensor& single, const Tensor* truth,
             const std::vector<Tensor>& ranks, const TruthPolicyParams& bound) {
  e.single_shape = single.shape();
  e.sharded_shape = ranks[0].shape();
  std::vector<Candidate> cs = candidates(ranks, single);
  if (cs.empty()) {
    e.note = "layout not derivable from the shapes (single " + shape_str(single.shape()) +
             ", rank 0 " + shape_str(ranks[0].shape()) + ")";
    return;
  }
  const std::vector<double> ref = single.to_f64();
  for (Candidate& c : cs) {
    if (c.layout != "replicated" && c.layout.rfind("replicated", 0) != 0)
      c.diff = norm_rel(c.values, ref);
  }
  auto best = std::min_element(cs.begin(), cs.end(), [](const Candidate& a, const Candidate& b) {
    if (std::isnan(a.diff)) return false;
    if (std::isnan(b.diff)) return true;
    return a.diff < b.diff;
  });
  e.comparable = true;
  e.layout = best->layout;
  e.norm_rel_diff = best->diff;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(best->values[i] - ref[i]);
    if (d > e.max_abs_diff || std::isnan(d)) e.max_abs_diff = d;
  }
  if (truth != nullptr && truth->shape() == single.shape()) {
    const std::vector<double> t = truth->to_f64();
    e.has_truth = true;
    e.single_err = rms(ref, &t);
    e.sharded_err = rms(best->values, &t);
    e.truth_rms = rms(t, nullptr);
    const double u = bound.unit_roundoff.value_or(0);
    const double allowed =
        bound.multiplier * std::sqrt(static_cast<double>(bound.tp_size)) * e.single_err +
        bound.floor_factor * u * std::sqrt(static_cast<double>(bound.reduction_length)) *
            e.truth_rms;
    e.diverges = !(e.sharded_err <= allowed);
  }
}

}  // namespace

bool is_backward(const TrailEntry& e) {
  static const char* kBackwardOps[] = {"norm_backward", "activation_backward",
                                       "attention_softmax_backward", "bias_grad"};
  for (const char* op : kBackwardOps) {
    if (e.op.rfind(op, 0) == 0) return true;
  }
  // The pass of the GEMM site the entry is named after: "<module>/<pass>[ → op]".
  const std::size_t slash = e.name.find('/');
  if (slash == std::string::npos) return false;
  const std::size_t end = e.name.find(' ', slash);
  return e.name.substr(slash + 1, end == std::string::npos ? std::string::npos : end - slash - 1) !=
         "fwd";
}

namespace {

using LabelIndex = std::map<std::pair<std::string, int>, std::size_t>;

// Each label's (key, occurrence) → its position in the recording.
LabelIndex index_labels(const std::vector<Labeled>& labels) {
  LabelIndex at;
  for (std::size_t i = 0; i < labels.size(); ++i) at[{labels[i].key, labels[i].occurrence}] = i;
  return at;
}

// The truth run's value of the op labelled (key, occurrence); nullptr when it has none.
const Tensor* truth_value(const Recording* truth, const LabelIndex& truth_at,
                          const std::string& key, int occurrence) {
  auto tt = truth_at.find({key, occurrence});
  return tt == truth_at.end() ? nullptr : &truth->ops[tt->second].value;
}

// Every rank's value of sharded op i.
std::vector<Tensor> rank_values(const std::vector<std::shared_ptr<Recording>>& sharded,
                                std::size_t i) {
  std::vector<Tensor> ranks;
  for (const auto& r : sharded) ranks.push_back(r->ops[i].value);
  return ranks;
}

// A trail row: its position (a sharded op's index; a single-only op just after the
// single op before it that was matched) and its entry.
using Row = std::pair<double, TrailEntry>;

// The rows of the single ops no sharded op matched (single_matched[j] < 0).
void add_single_only(const Recording& single, const std::vector<Labeled>& single_labels,
                     const std::vector<int>& single_matched, std::vector<Row>& rows) {
  double anchor = -1;
  for (std::size_t j = 0; j < single_labels.size(); ++j) {
    if (single_matched[j] >= 0) {
      anchor = single_matched[j];
      continue;
    }
    TrailEntry e;
    e.name = single_labels[j].name;
    e.op = single.ops[j].op;
    e.occurrence = single_labels[j].occurrence;
    e.single_shape = single.ops[j].value.shape();
    e.note = "only in the single run";
    rows.emplace_back(anchor + 0.5 + 1e-6 * static_cast<double>(j), std::move(e));
  }
}

// The rows in trail order, each entry numbered.
std::vector<TrailEntry> in_order(std::vector<Row> rows) {
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<TrailEntry> trail;
  for (auto& [pos, e] : rows) {
    e.order = static_cast<int>(trail.size());
    trail.push_back(std::move(e));
  }
  return trail;
}

}  // namespace

std::vector<TrailEntry> build_trail(const Recording& single, const Recording* truth,
                                    const std::vector<std::shared_ptr<Recording>>& sharded,
                                    const TruthPolicyParams& bound) {
  const std::vector<Labeled> single_labels = label_ops(single);
  const std::vector<Labeled> sharded_labels = label_ops(*sharded.at(0));
  const LabelIndex single_at = index_labels(single_labels);
  const LabelIndex truth_at = truth != nullptr ? index_labels(label_ops(*truth)) : LabelIndex{};
  // Every rank runs the same ops; a rank that did not is reported, not compared.
  bool ranks_agree = true;
  for (const auto& r : sharded) {
    ranks_agree = ranks_agree && r && r->ops.size() == sharded[0]->ops.size();
  }

  std::vector<Row> rows;
  std::vector<int> single_matched(single_labels.size(), -1);
  std::pair<int, int> last_match{-1, -1};  // (single index, sharded index) of the last match
  for (std::size_t i = 0; i < sharded_labels.size(); ++i) {
    const Labeled& l = sharded_labels[i];
    TrailEntry e;
    e.name = l.name;
    e.op = sharded[0]->ops[i].op;
    e.occurrence = l.occurrence;
    auto it = single_at.find({l.key, l.occurrence});
    if (it == single_at.end() && ranks_agree && e.op == "all_gather" && i > 0 &&
        last_match.first >= 0 && last_match.second == static_cast<int>(i) - 1) {
      // A sharded-only gather (sequence parallel gathers what single holds whole): in
      // single, the tensor it gathers is the output of the op before it.
      const Labeled& before = single_labels[last_match.first];
      compare(e, single.ops[last_match.first].value,
              truth_value(truth, truth_at, before.key, before.occurrence), rank_values(sharded, i),
              bound);
      e.note = "only in the sharded run; compared with single's `" + before.name + "`";
    } else if (it == single_at.end()) {
      e.note = "only in the sharded run";
      e.sharded_shape = sharded[0]->ops[i].value.shape();
    } else if (!ranks_agree) {
      single_matched[it->second] = static_cast<int>(i);
      e.note = "the ranks ran different op sequences";
    } else {
      single_matched[it->second] = static_cast<int>(i);
      last_match = {static_cast<int>(it->second), static_cast<int>(i)};
      compare(e, single.ops[it->second].value, truth_value(truth, truth_at, l.key, l.occurrence),
              rank_values(sharded, i), bound);
    }
    rows.emplace_back(static_cast<double>(i), std::move(e));
  }
  add_single_only(single, single_labels, single_matched, rows);
  return in_order(std::move(rows));
}

}  // namespace tpcheck::explain
