// `tpcheck diff A B` where A or B is the ledger of `python -m tpcheck emulate --trace DIR`
// (DIR/ledger.json, schema tpcheck.emulate/1, written by python/tpcheck/emulate/ledger.py's
// write_ledger): per rank, the GEMM sites whose algorithm, compute type or numerical
// class changed (the same alignment and grouping as `tpcheck logdiff`:
// diff_cublaslt_calls), and the differences in the sequence of collectives, grouped.
// The other side may be a trace ledger (tpcheck.trace/1): its processes stand for ranks
// and it records no collectives.
//
// Ranks are lined up as the TP 1 vs TP N investigation needs: when one side has a single
// rank, every rank of the other side is compared with it; otherwise rank r with rank r.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "cli/log_tools.h"
#include "tpcheck/error.h"
#include "tpcheck/ledger_diff.h"

namespace tpcheck {
namespace {

using nlohmann::json;

// Groups of differing collectives shown per rank pair before "… N more".
constexpr std::size_t kGroupsShown = 12;

struct Collective {
  std::string kind, dtypes, op, algorithm, order, at;
  std::int64_t bytes = 0;
  std::size_t group_size = 0;

  // What the comparison looks at: the kind, dtype, per-rank bytes and
  // order/algorithm, with the reduction op and the group's size (a TP 2 all-reduce and a
  // TP 4 one of the same bytes are different collectives).
  // The same, field by field, for the per-field summary.
  std::vector<std::pair<const char*, std::string>> fields() const {
    return {{"kind", kind},
            {"dtype", dtypes},
            {"op", op.empty() ? "(none)" : op},
            {"bytes per rank", std::to_string(bytes)},
            {"algorithm", algorithm + (order.empty() ? "" : " (" + order + ")")},
            {"group size", std::to_string(group_size)}};
  }

  std::string key() const {
    std::string s = kind + " " + dtypes;
    if (!op.empty()) s += " op=" + op;
    s += fmt::format(", {} B per rank, {}", bytes, algorithm);
    if (!order.empty()) s += " (" + order + ")";
    return s + fmt::format(" over {} rank{}", group_size, group_size == 1 ? "" : "s");
  }
};

struct Rank {
  std::string label;                               // "rank 1" or "process 0 (pid 123)"
  std::optional<std::vector<CublasLtCall>> gemms;  // nullopt: no cuBLASLt log
  std::string log;                                 // the log the GEMMs came from
  std::vector<Collective> collectives;
};

struct Side {
  std::string path, description;
  bool records_collectives = true;  // false for a trace ledger
  std::vector<Rank> ranks;
};

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  TPCHECK_CHECK_INPUT(it != j.end(), "{}: key '{}' missing", where, key);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error(ErrorKind::kInput,
                fmt::format("{}: key '{}' has the wrong type ({})", where, key, it->dump()));
  }
}

Collective collective_from_json(const json& j, const std::string& where) {
  TPCHECK_CHECK_INPUT(j.is_object(), "{}: expected a collective record, got {}", where, j.dump());
  Collective c;
  c.kind = field<std::string>(j, "kind", where);
  const json sig = field<json>(j, "sig", where);
  TPCHECK_CHECK_INPUT(sig.is_object(), "{}: 'sig' is not an object ({})", where, sig.dump());
  // barrier has no tensors, hence no dtypes.
  const auto dtypes = sig.value("dtypes", std::vector<std::string>{});
  c.dtypes = dtypes.empty() ? "(no tensor)" : fmt::format("{}", fmt::join(dtypes, ","));
  if (auto op = sig.find("op"); op != sig.end() && !op->is_null()) {
    c.op = op->is_string() ? op->get<std::string>() : op->dump();
  }
  c.bytes = field<std::int64_t>(j, "bytes", where);
  c.algorithm = field<std::string>(j, "algorithm", where);
  if (auto order = j.find("order"); order != j.end() && order->is_string()) {
    c.order = order->get<std::string>();
  }
  c.group_size = field<std::vector<int>>(j, "group", where).size();
  c.at = j.value("at", "");
  return c;
}

Side side_from_emulate(const json& j, const std::string& path) {
  Side s;
  s.path = path;
  const json ranks = field<json>(j, "ranks", path);
  TPCHECK_CHECK_INPUT(ranks.is_array(), "'{}': 'ranks' is not an array ({})", path, ranks.dump());
  TPCHECK_CHECK_INPUT(!ranks.empty(),
                      "'{}': an emulate ledger (tpcheck.emulate/1) with no ranks: nothing to "
                      "compare; expected one record per rank, as `python -m tpcheck emulate -n N "
                      "--trace DIR` writes",
                      path);
  const int world = field<int>(j, "world_size", path);
  TPCHECK_CHECK_INPUT(world == static_cast<int>(ranks.size()),
                      "'{}': world_size is {} but {} rank records follow; expected one per rank",
                      path, world, ranks.size());
  s.description = fmt::format("emulate ledger, {} rank{}, comm order {}", world,
                              world == 1 ? "" : "s", j.value("comm_order", "?"));
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::string where = fmt::format("'{}': ranks[{}]", path, r);
    const json& rec = ranks[r];
    TPCHECK_CHECK_INPUT(rec.is_object(), "{}: expected a rank record, got {}", where, rec.dump());
    const int rank = field<int>(rec, "rank", where);
    TPCHECK_CHECK_INPUT(rank == static_cast<int>(r),
                        "{}: is rank {}; expected rank {} (records in rank order)", where, rank, r);
    const std::string rw = fmt::format("'{}': rank {}", path, r);
    // The launcher keeps going when a rank's log cannot be parsed and records why: its
    // GEMMs are unknown, and comparing them as "none" would report every call as gone.
    if (auto err = rec.find("gemms_error"); err != rec.end() && !err->is_null()) {
      throw Error(ErrorKind::kInput,
                  fmt::format("{}: its cuBLASLt log could not be parsed when the ledger was "
                              "written ({}); the GEMMs of this rank cannot be compared (the log "
                              "is cublaslt.rank{}.log beside the ledger)",
                              rw, err->is_string() ? err->get<std::string>() : err->dump(), r));
    }
    Rank out;
    out.label = fmt::format("rank {}", r);
    const json gemms = rec.value("gemms", json());
    if (!gemms.is_null()) {
      const TraceLedger t = trace_from_json(gemms, rw + ": gemms");
      std::vector<CublasLtCall> calls;
      std::vector<std::string> logs;
      for (const TraceProcess& p : t.processes) {
        calls.insert(calls.end(), p.calls.begin(), p.calls.end());
        logs.push_back(p.log);
      }
      out.gemms = std::move(calls);
      out.log = fmt::format("{}", fmt::join(logs, ", "));
    }
    const json colls = rec.value("collectives", json::array());
    TPCHECK_CHECK_INPUT(colls.is_array(), "{}: 'collectives' is not an array", rw);
    for (std::size_t i = 0; i < colls.size(); ++i) {
      out.collectives.push_back(
          collective_from_json(colls[i], fmt::format("{}: collectives[{}]", rw, i)));
    }
    s.ranks.push_back(std::move(out));
  }
  return s;
}

Side side_from_trace(const json& j, const std::string& path) {
  const TraceLedger t = trace_from_json(j, "'" + path + "'");
  TPCHECK_CHECK_INPUT(!t.processes.empty(),
                      "'{}': a trace ledger with no process: nothing to compare with the ranks "
                      "of the emulate ledger",
                      path);
  Side s;
  s.path = path;
  s.records_collectives = false;
  s.description = fmt::format("trace ledger, {} process{} (standing for ranks, in pid order)",
                              t.processes.size(), t.processes.size() == 1 ? "" : "es");
  for (std::size_t p = 0; p < t.processes.size(); ++p) {
    Rank r;
    r.label = fmt::format("process {} (pid {})", p, t.processes[p].pid);
    r.gemms = t.processes[p].calls;
    r.log = t.processes[p].log;
    s.ranks.push_back(std::move(r));
  }
  return s;
}

// (A index, B index) pairs, and the ranks of either side left without a partner.
struct Pairing {
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  std::string rule;
  std::vector<std::size_t> only_a, only_b;
};

Pairing pair_ranks(const Side& a, const Side& b) {
  Pairing p;
  const std::size_t na = a.ranks.size(), nb = b.ranks.size();
  if (na == 1) {
    for (std::size_t r = 0; r < nb; ++r) p.pairs.emplace_back(0, r);
    p.rule = nb == 1 ? "A's single rank against B's" : "every rank of B against A's single rank";
  } else if (nb == 1) {
    for (std::size_t r = 0; r < na; ++r) p.pairs.emplace_back(r, 0);
    p.rule = "every rank of A against B's single rank";
  } else {
    for (std::size_t r = 0; r < std::min(na, nb); ++r) p.pairs.emplace_back(r, r);
    for (std::size_t r = nb; r < na; ++r) p.only_a.push_back(r);
    for (std::size_t r = na; r < nb; ++r) p.only_b.push_back(r);
    p.rule = "each rank of B against the same rank of A";
  }
  return p;
}

std::string pair_label(const Side& a, const Side& b, std::pair<std::size_t, std::size_t> p) {
  return fmt::format("B {} against A {}", b.ranks[p.second].label, a.ranks[p.first].label);
}

// ---- GEMMs ----------------------------------------------------------------------------

bool diff_gemms(const Side& a, const Side& b, const Pairing& pairing) {
  fmt::print("\n== GEMMs (cuBLASLt) ==\n");
  bool changed = false;
  std::vector<std::string> neither;  // pairs with no GEMM on either side
  std::vector<std::string> changed_pairs;
  for (const auto& p : pairing.pairs) {
    const Rank& ra = a.ranks[p.first];
    const Rank& rb = b.ranks[p.second];
    const bool none_a = !ra.gemms || ra.gemms->empty(), none_b = !rb.gemms || rb.gemms->empty();
    if (none_a && none_b) {
      neither.push_back(pair_label(a, b, p));
      continue;
    }
    static const std::vector<CublasLtCall> kNone;
    const CublasLtDiff d =
        diff_cublaslt_calls(ra.gemms ? *ra.gemms : kNone, rb.gemms ? *rb.gemms : kNone);
    auto label = [](const Side& s, const Rank& r) {
      return r.gemms ? fmt::format("{} {} ({})", s.path, r.label, r.log)
                     : fmt::format("{} {} (no cuBLASLt log)", s.path, r.label);
    };
    fmt::print("\n{}:\n{}", pair_label(a, b, p),
               format_cublaslt_diff(d, label(a, ra), label(b, rb)));
    if (d.any()) {
      changed = true;
      std::size_t calls = 0;
      for (const CublasLtDiffGroup& g : d.groups) calls += g.count;
      changed_pairs.push_back(fmt::format(
          "B {}: {} call{} in {} group{}{}", rb.label, calls, calls == 1 ? "" : "s",
          d.groups.size(), d.groups.size() == 1 ? "" : "s",
          d.only_a + d.only_b > 0 ? fmt::format(", {} only in A, {} only in B", d.only_a, d.only_b)
                                  : ""));
    }
  }
  if (!neither.empty()) {
    if (neither.size() == pairing.pairs.size()) {
      fmt::print(
          "no GEMM recorded on either side (no cuBLASLt matmul was logged: the ranks "
          "ran on the CPU, or ran no cuBLASLt GEMM)\n");
    } else {
      fmt::print("\nno GEMM recorded on either side for: {}\n", fmt::join(neither, "; "));
    }
  }
  if (!changed_pairs.empty()) {
    fmt::print("\nGEMMs whose algorithm, compute type or numerical class changed: {}\n",
               fmt::join(changed_pairs, "; "));
  }
  return changed;
}

// ---- collectives ------------------------------------------------------------------------

// One rank pair's differences: the two sequences lined up by position (the backend makes
// the ranks of a group call the same collectives in the same order, so a TP 1 → TP N
// change shows as the same positions with other bytes or group sizes, and an added or
// dropped collective as a tail or a run of kind changes), grouped by what changed.
std::string diff_collective_sequences(const std::vector<Collective>& a,
                                      const std::vector<Collective>& b) {
  struct Group {
    std::size_t count = 0, first = 0;  // first: 1-based position
    std::string at_a, at_b;
  };
  std::map<std::pair<std::string, std::string>, std::size_t> index;  // (A key, B key) → group
  std::vector<std::pair<std::pair<std::string, std::string>, Group>> groups;
  const std::size_t common = std::min(a.size(), b.size());
  std::size_t same = 0;
  auto add = [&](const std::string& ka, const std::string& kb, std::size_t i,
                 const std::string& at_a, const std::string& at_b) {
    auto [it, inserted] = index.try_emplace({ka, kb}, groups.size());
    if (inserted) groups.push_back({{ka, kb}, Group{0, i + 1, at_a, at_b}});
    ++groups[it->second].second.count;
  };
  // Per field, the (A value, B value) changes among the aligned pairs, in order of first
  // appearance: "group size 2 → 4 ×40" says in one line what 40 groups would.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::size_t>>>> by_field;
  for (std::size_t i = 0; i < common; ++i) {
    const std::string ka = a[i].key(), kb = b[i].key();
    if (ka == kb) {
      ++same;
      continue;
    }
    add(ka, kb, i, a[i].at, b[i].at);
    const auto fa = a[i].fields(), fb = b[i].fields();
    for (std::size_t f = 0; f < fa.size(); ++f) {
      if (fa[f].second == fb[f].second) continue;
      auto fit = std::find_if(by_field.begin(), by_field.end(),
                              [&](const auto& x) { return x.first == fa[f].first; });
      if (fit == by_field.end()) fit = by_field.insert(by_field.end(), {fa[f].first, {}});
      const std::string change = fa[f].second + " → " + fb[f].second;
      auto cit = std::find_if(fit->second.begin(), fit->second.end(),
                              [&](const auto& x) { return x.first == change; });
      if (cit == fit->second.end()) {
        fit->second.push_back({change, 1});
      } else {
        ++cit->second;
      }
    }
  }
  for (std::size_t i = common; i < a.size(); ++i) add(a[i].key(), "", i, a[i].at, "");
  for (std::size_t i = common; i < b.size(); ++i) add("", b[i].key(), i, "", b[i].at);
  std::string out = fmt::format("  {} → {} collectives; {} the same at the same position", a.size(),
                                b.size(), same);
  if (groups.empty()) return out + " (kind, dtype, bytes per rank, order/algorithm)\n";
  std::size_t differing = 0;
  for (const auto& g : groups) differing += g.second.count;
  out += fmt::format(", {} differ or are unmatched, in {} group{}:\n", differing, groups.size(),
                     groups.size() == 1 ? "" : "s");
  if (!by_field.empty()) {
    out += fmt::format("    of the {} aligned pairs that differ:\n", common - same);
    for (const auto& [name, changes] : by_field) {
      std::size_t pairs = 0;
      std::vector<std::string> shown;
      for (const auto& [change, count] : changes) {
        pairs += count;
        if (shown.size() < 3) shown.push_back(fmt::format("{} ×{}", change, count));
      }
      out += fmt::format("      {} in {}: {}{}\n", name, pairs, fmt::join(shown, ", "),
                         changes.size() > shown.size()
                             ? fmt::format(", … {} more", changes.size() - shown.size())
                             : "");
    }
    out += "    by signature:\n";
  }
  for (std::size_t g = 0; g < groups.size() && g < kGroupsShown; ++g) {
    const auto& [keys, grp] = groups[g];
    const auto& [ka, kb] = keys;
    const std::string at = grp.at_b.empty() ? grp.at_a : grp.at_b;
    const std::string where = fmt::format("first #{}{}", grp.first, at.empty() ? "" : ", at " + at);
    if (ka.empty()) {
      out += fmt::format("    {:>5} × only in B: {}  ({})\n", grp.count, kb, where);
    } else if (kb.empty()) {
      out += fmt::format("    {:>5} × only in A: {}  ({})\n", grp.count, ka, where);
    } else {
      out += fmt::format("    {:>5} × A: {}\n            B: {}  ({})\n", grp.count, ka, kb, where);
    }
  }
  if (groups.size() > kGroupsShown) {
    out += fmt::format("    … {} more groups\n", groups.size() - kGroupsShown);
  }
  return out;
}

bool diff_collectives(const Side& a, const Side& b, const Pairing& pairing) {
  fmt::print("\n== collectives ==\n");
  for (const Side* s : {&a, &b}) {
    if (!s->records_collectives) {
      fmt::print(
          "{} is a trace ledger: it records GEMMs only, so the collectives are not "
          "compared\n",
          s->path);
      return false;
    }
  }
  auto none = [](const Side& s) {
    return std::all_of(s.ranks.begin(), s.ranks.end(),
                       [](const Rank& r) { return r.collectives.empty(); });
  };
  const bool none_a = none(a), none_b = none(b);
  if (none_a && none_b) {
    fmt::print("none on either side\n");
    return false;
  }
  // Said once rather than as every collective of the other side "only in": the usual
  // comparison is a TP 1 run (Megatron-style code skips its collectives at TP 1) with TP N.
  if (none_a) fmt::print("A issued none on any rank (as a TP 1 run does); B's, per rank:\n");
  if (none_b) fmt::print("B issued none on any rank (as a TP 1 run does); A's, per rank:\n");
  // Rank pairs with the same text are printed once: the ranks of a TP group call the same
  // collectives, so a TP 8 run reads as one block, not eight.
  std::vector<std::pair<std::string, std::vector<std::string>>> blocks;
  bool changed = false;
  for (const auto& p : pairing.pairs) {
    const auto& ca = a.ranks[p.first].collectives;
    const auto& cb = b.ranks[p.second].collectives;
    const std::string text = diff_collective_sequences(ca, cb);
    bool differs = ca.size() != cb.size();
    for (std::size_t i = 0; !differs && i < ca.size(); ++i) differs = ca[i].key() != cb[i].key();
    changed = changed || differs;
    auto it = std::find_if(blocks.begin(), blocks.end(),
                           [&](const auto& blk) { return blk.first == text; });
    if (it == blocks.end()) {
      blocks.push_back({text, {pair_label(a, b, p)}});
    } else {
      it->second.push_back(pair_label(a, b, p));
    }
  }
  for (const auto& [text, labels] : blocks) {
    fmt::print("{}:\n{}", fmt::join(labels, "; "), text);
  }
  return changed;
}

}  // namespace

int diff_emulate_ledgers(const std::string& path_a, const json& ja, const std::string& path_b,
                         const json& jb) {
  auto side = [](const json& j, const std::string& path) {
    return j.value("schema", "") == kEmulateSchema ? side_from_emulate(j, path)
                                                   : side_from_trace(j, path);
  };
  const Side a = side(ja, path_a), b = side(jb, path_b);
  const Pairing pairing = pair_ranks(a, b);
  fmt::print("A = {}: {}\nB = {}: {}\nranks compared: {}\n", a.path, a.description, b.path,
             b.description, pairing.rule);
  for (std::size_t r : pairing.only_a) {
    fmt::print("A {}: no such rank in B (B has {}), not compared\n", a.ranks[r].label,
               b.ranks.size());
  }
  for (std::size_t r : pairing.only_b) {
    fmt::print("B {}: no such rank in A (A has {}), not compared\n", b.ranks[r].label,
               a.ranks.size());
  }
  bool changed = !pairing.only_a.empty() || !pairing.only_b.empty();
  changed = diff_gemms(a, b, pairing) || changed;
  changed = diff_collectives(a, b, pairing) || changed;
  if (!changed) fmt::print("\nno change\n");
  return changed ? 1 : 0;
}

}  // namespace tpcheck
