// cuBLASLt API-trace log parsing and the alignment of two call streams
// (include/tpcheck/cublaslt_log.h states the format and its sources).
//
// The parser works on string_views over the file's bytes: no regex, no copies except the
// few short names a call keeps, so a log parses at several hundred MB/s
// (bench/cublaslt_log_bench.cpp).
#include "tpcheck/cublaslt_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <sstream>

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

std::string_view strip_prefix(std::string_view v, std::string_view prefix) {
  if (v.substr(0, prefix.size()) == prefix) v.remove_prefix(prefix.size());
  return v;
}

template <typename Int>
bool parse_integer(std::string_view s, Int& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && ptr == end;
}

// key=value pairs of one bracket group ("type=R_32F rows=64 ...") or of the line's body.
// A value that starts with '[' runs to its matching ']'.
class PairReader {
 public:
  explicit PairReader(std::string_view text) : text_(text) {}

  // Next pair; false at the end. `error` is set (and false returned) on a bracket that
  // is never closed.
  bool next(std::string_view& key, std::string_view& value, std::string& error) {
    while (true) {
      while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                     text_[pos_] == '\r' || text_[pos_] == '\n')) {
        ++pos_;
      }
      if (pos_ >= text_.size()) return false;
      const std::size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] != '=' && text_[pos_] != ' ') ++pos_;
      if (pos_ >= text_.size() || text_[pos_] == ' ') continue;  // a word without '=': skip
      key = text_.substr(start, pos_ - start);
      ++pos_;  // '='
      if (pos_ < text_.size() && text_[pos_] == '[') {
        int depth = 0;
        const std::size_t open = pos_;
        for (; pos_ < text_.size(); ++pos_) {
          if (text_[pos_] == '[') ++depth;
          if (text_[pos_] == ']' && --depth == 0) break;
        }
        if (pos_ >= text_.size()) {
          error = fmt::format("truncated: {}=[ is not closed", key);
          return false;
        }
        value = text_.substr(open + 1, pos_ - open - 1);
        ++pos_;
        return true;
      }
      const std::size_t value_start = pos_;
      while (pos_ < text_.size() && text_[pos_] != ' ' && text_[pos_] != '\t' &&
             text_[pos_] != '\r' && text_[pos_] != '\n') {
        ++pos_;
      }
      value = text_.substr(value_start, pos_ - value_start);
      return true;
    }
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

std::string bad_integer(std::string_view group, std::string_view key, std::string_view value) {
  return fmt::format("{} {}='{}' is not an integer", group, key, value);
}

// Fills `out` from "type=R_32F rows=64 cols=32 ld=64 [order=ORDER_ROW] [batchCount=8
// stridedBatchOffset=2048]"; returns the problem or "".
std::string parse_layout(std::string_view group, std::string_view text, CublasLtLayout& out) {
  PairReader reader(text);
  std::string_view key, value;
  std::string error;
  bool has_type = false, has_rows = false, has_cols = false, has_ld = false;
  while (reader.next(key, value, error)) {
    if (key == "type") {
      out.type = strip_prefix(value, "R_");
      has_type = true;
    } else if (key == "rows") {
      if (!parse_integer(value, out.rows)) return bad_integer(group, key, value);
      has_rows = true;
    } else if (key == "cols") {
      if (!parse_integer(value, out.cols)) return bad_integer(group, key, value);
      has_cols = true;
    } else if (key == "ld") {
      if (!parse_integer(value, out.ld)) return bad_integer(group, key, value);
      has_ld = true;
    } else if (key == "order") {
      out.order = strip_prefix(value, "ORDER_");
    } else if (key == "batchCount" || key == "batch") {
      if (!parse_integer(value, out.batch_count)) return bad_integer(group, key, value);
    } else if (key == "stridedBatchOffset") {
      if (!parse_integer(value, out.batch_stride)) return bad_integer(group, key, value);
    }
  }
  if (!error.empty()) return fmt::format("{} in {}", error, group);
  if (!has_type) return fmt::format("{} has no type", group);
  if (!has_rows || !has_cols || !has_ld) return fmt::format("{} lacks rows, cols or ld", group);
  if (out.rows < 0 || out.cols < 0 || out.batch_count < 1) {
    return fmt::format("{} has rows={} cols={} batchCount={} (expected rows, cols >= 0, "
                       "batchCount >= 1)", group, out.rows, out.cols, out.batch_count);
  }
  return {};
}

std::string parse_compute(std::string_view text, CublasLtCall& call) {
  PairReader reader(text);
  std::string_view key, value;
  std::string error;
  bool has_compute = false;
  while (reader.next(key, value, error)) {
    if (key == "computeType") {
      call.compute_type = strip_prefix(value, "COMPUTE_");
      has_compute = true;
    } else if (key == "scaleType") {
      call.scale_type = strip_prefix(value, "R_");
    } else if (key == "transa" || key == "transA") {
      call.trans_a = value != "OP_N";
    } else if (key == "transb" || key == "transB") {
      call.trans_b = value != "OP_N";
    } else if (key == "epilogue") {
      call.epilogue = strip_prefix(value, "EPILOGUE_");
    }
  }
  if (!error.empty()) return fmt::format("{} in computeDesc", error);
  if (!has_compute) return "computeDesc has no computeType";
  return {};
}

std::string parse_algo(std::string_view text, CublasLtCall& call) {
  PairReader reader(text);
  std::string_view key, value;
  std::string error;
  bool has_id = false;
  while (reader.next(key, value, error)) {
    if (key == "algoId") {
      if (!parse_integer(value, call.algo_id)) return bad_integer("algo", key, value);
      has_id = true;
    } else if (key == "tile") {
      call.tile = strip_prefix(value, "MATMUL_TILE_");
    } else if (key == "stages") {
      call.stages = strip_prefix(value, "MATMUL_STAGES_");
    } else if (key == "customOption") {
      if (!parse_integer(value, call.custom_option)) return bad_integer("algo", key, value);
    } else if (key == "clusterShape") {
      call.cluster_shape = strip_prefix(value, "CLUSTER_SHAPE_");
    } else if (key == "reductionScheme") {
      call.reduction_scheme = strip_prefix(value, "REDUCTION_SCHEME_");
    } else if (key == "numSplitsK") {
      if (!parse_integer(value, call.split_k)) return bad_integer("algo", key, value);
      if (call.split_k == 0) call.split_k = 1;  // 0 and 1 both mean "no split"
    } else if (key == "ctaSwizzling") {
      if (!parse_integer(value, call.cta_swizzling)) return bad_integer("algo", key, value);
    }
  }
  if (!error.empty()) return fmt::format("{} in algo", error);
  if (!has_id) return "algo has no algoId";
  return {};
}

// The bracket groups before the body: "[date][cublasLt][pid][Trace][function] ".
// Returns false when this is not a cuBLASLt Trace line of a matmul function.
bool parse_header(std::string_view line, CublasLtCall& call, std::string_view& body) {
  const std::size_t tag = line.find("[cublasLt]");
  if (tag == std::string_view::npos) return false;
  std::size_t pos = tag + 10;
  std::string_view groups[3];
  int count = 0;
  while (count < 3 && pos < line.size() && line[pos] == '[') {
    const std::size_t close = line.find(']', pos);
    if (close == std::string_view::npos) return false;
    groups[count++] = line.substr(pos + 1, close - pos - 1);
    pos = close + 1;
  }
  // [pid][Level][function] or, from a logger callback without pid, [Level][function].
  std::string_view level, function;
  if (count == 3) {
    if (!parse_integer(groups[0], call.pid)) return false;
    level = groups[1];
    function = groups[2];
  } else if (count == 2) {
    level = groups[0];
    function = groups[1];
  } else {
    return false;
  }
  if (level != "Trace") return false;
  if (function.substr(0, 8) != "cublasLt" || function.size() < 14 ||
      function.substr(function.size() - 6) != "Matmul") {
    return false;
  }
  call.function = function;
  body = line.substr(pos);
  return true;
}

}  // namespace

std::optional<CublasLtLineResult> parse_cublaslt_line(std::string_view line,
                                                      std::int64_t line_number) {
  // Cheap rejection of the many lines that are not traces.
  if (line.find("[Trace][cublasLt") == std::string_view::npos) return std::nullopt;
  CublasLtCall call;
  call.line = line_number;
  std::string_view body;
  if (!parse_header(line, call, body)) return std::nullopt;

  CublasLtLineResult result;
  auto fail = [&](std::string reason) {
    result.problem = std::move(reason);
    return result;
  };
  PairReader reader(body);
  std::string_view key, value;
  std::string error;
  bool has[4] = {false, false, false, false};
  bool has_compute = false, has_algo = false;
  while (reader.next(key, value, error)) {
    if (key.size() == 5 && key.substr(1) == "desc" && key[0] >= 'A' && key[0] <= 'D') {
      const int which = key[0] - 'A';
      CublasLtLayout* layouts[4] = {&call.a, &call.b, &call.c, &call.d};
      std::string problem = parse_layout(key, value, *layouts[which]);
      if (!problem.empty()) return fail(std::move(problem));
      has[which] = true;
    } else if (key == "computeDesc") {
      std::string problem = parse_compute(value, call);
      if (!problem.empty()) return fail(std::move(problem));
      has_compute = true;
    } else if (key == "algo") {
      std::string problem = parse_algo(value, call);
      if (!problem.empty()) return fail(std::move(problem));
      has_algo = true;
    } else if (key == "workSpaceSizeInBytes") {
      if (!parse_integer(value, call.workspace_bytes)) {
        return fail(bad_integer("call", key, value));
      }
    } else if (key == "beta") {
      call.beta = value;
    }
  }
  if (!error.empty()) return fail(std::move(error));
  if (!has[0] || !has[1] || !has[3]) {
    return fail(fmt::format("truncated or malformed: {}{}{}missing", has[0] ? "" : "Adesc ",
                            has[1] ? "" : "Bdesc ", has[3] ? "" : "Ddesc "));
  }
  if (!has_compute) return fail("truncated or malformed: computeDesc missing");
  if (!has_algo) return fail("truncated or malformed: algo missing");
  if (!has[2]) call.c = call.d;  // C not printed: it takes D's layout

  // D[m, n] = op(A)[m, k] · op(B)[k, n]; the three must agree.
  const std::int64_t a_rows = call.trans_a ? call.a.cols : call.a.rows;
  const std::int64_t a_cols = call.trans_a ? call.a.rows : call.a.cols;
  const std::int64_t b_rows = call.trans_b ? call.b.cols : call.b.rows;
  const std::int64_t b_cols = call.trans_b ? call.b.rows : call.b.cols;
  if (a_rows != call.d.rows || b_cols != call.d.cols || a_cols != b_rows) {
    return fail(fmt::format("shapes disagree: op(A) {}x{}, op(B) {}x{}, D {}x{}", a_rows, a_cols,
                            b_rows, b_cols, call.d.rows, call.d.cols));
  }
  call.m = a_rows;
  call.n = b_cols;
  call.k = a_cols;
  result.call = std::move(call);
  return result;
}

CublasLtLog parse_cublaslt_log(std::string_view text) {
  CublasLtLog log;
  std::size_t pos = 0;
  std::int64_t number = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    ++number;
    if (auto parsed = parse_cublaslt_line(line, number)) {
      if (parsed->call) {
        log.calls.push_back(std::move(*parsed->call));
      } else {
        log.problems.push_back({number, std::move(parsed->problem)});
      }
    }
    pos = end + 1;
  }
  log.lines = number;
  return log;
}

CublasLtLog read_cublaslt_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TPCHECK_CHECK_INPUT(in.good(), "cannot read cuBLASLt log '{}'", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  TPCHECK_CHECK_INPUT(!in.bad(), "error while reading cuBLASLt log '{}'", path);
  CublasLtLog log = parse_cublaslt_log(buffer.str());
  log.path = path;
  return log;
}

bool CublasLtCall::same_algorithm(const CublasLtCall& o) const {
  return algo_id == o.algo_id && tile == o.tile && stages == o.stages &&
         custom_option == o.custom_option && cluster_shape == o.cluster_shape &&
         reduction_scheme == o.reduction_scheme && split_k == o.split_k &&
         cta_swizzling == o.cta_swizzling;
}

std::string CublasLtCall::algorithm_text() const {
  std::string s = fmt::format("algoId={}", algo_id);
  if (tile != "UNDEFINED") s += fmt::format(" tile={}", tile);
  if (stages != "UNDEFINED") s += fmt::format(" stages={}", stages);
  if (custom_option != 0) s += fmt::format(" customOption={}", custom_option);
  if (cluster_shape != "AUTO") s += fmt::format(" cluster={}", cluster_shape);
  if (split_k != 1) s += fmt::format(" splitK={}", split_k);
  if (reduction_scheme != "NONE") s += fmt::format(" reduction={}", reduction_scheme);
  if (cta_swizzling != 0) s += fmt::format(" swizzle={}", cta_swizzling);
  return s;
}

std::string CublasLtCall::shape_text() const {
  std::string s = fmt::format("m={} n={} k={}", m, n, k);
  if (d.batch_count > 1) s += fmt::format(" batch={}", d.batch_count);
  return s;
}

std::string CublasLtCall::kind_text() const {
  std::string s = fmt::format("{}·{}→{} compute {}", a.type, b.type, d.type, compute_type);
  if (trans_a) s += ", transa";
  if (trans_b) s += ", transb";
  if (epilogue != "DEFAULT") s += fmt::format(", epilogue {}", epilogue);
  return s;
}

namespace {

// How two calls relate: kSame problem; kOneDim: one of (m, n, k, batch) differs by a
// whole factor (the dimension a tensor-parallel run shards); kManyDims: several differ,
// each by a whole factor (e.g. tokens per rank changed too); kOther: not the same GEMM
// (types, transposes, epilogue or layout orders differ).
enum class Match { kSame, kOneDim, kManyDims, kOther };

Match match_kind(const CublasLtCall& x, const CublasLtCall& y) {
  if (x.a.type != y.a.type || x.b.type != y.b.type || x.d.type != y.d.type ||
      x.trans_a != y.trans_a || x.trans_b != y.trans_b || x.epilogue != y.epilogue ||
      x.a.order != y.a.order || x.b.order != y.b.order || x.d.order != y.d.order) {
    return Match::kOther;
  }
  const std::int64_t dx[4] = {x.m, x.n, x.k, x.d.batch_count};
  const std::int64_t dy[4] = {y.m, y.n, y.k, y.d.batch_count};
  int differing = 0;
  for (int i = 0; i < 4; ++i) {
    if (dx[i] == dy[i]) continue;
    const std::int64_t lo = std::min(dx[i], dy[i]), hi = std::max(dx[i], dy[i]);
    if (lo <= 0 || hi % lo != 0) return Match::kOther;
    ++differing;
  }
  return differing == 0 ? Match::kSame : (differing == 1 ? Match::kOneDim : Match::kManyDims);
}

bool close_match(Match m) { return m == Match::kSame || m == Match::kOneDim; }
bool loose_match(Match m) { return m != Match::kOther; }

// How far ahead to look for the partner of a call when the streams have drifted apart
// (calls added or dropped in one run, e.g. every call twice from two ranks).
constexpr std::size_t kLookahead = 256;
// How far a close match may lie ahead and still be preferred to a several-dimension pair
// in place (two ranks' copies of a call are adjacent).
constexpr std::size_t kNearby = 4;

// Calls a[i] and b[j] paired; shape_differs when they were paired with some dimension
// different.
CublasLtPair paired(const std::vector<CublasLtCall>& a, const std::vector<CublasLtCall>& b,
                    std::size_t i, std::size_t j, bool shape_differs) {
  CublasLtPair p;
  p.a = i;
  p.b = j;
  p.shape_differs = shape_differs;
  p.algorithm_differs = !a[i].same_algorithm(b[j]);
  p.compute_differs = a[i].compute_type != b[j].compute_type || a[i].scale_type != b[j].scale_type;
  return p;
}

// First pass: the two streams in order; a close match (same shape or one dimension) just
// ahead beats pairing two calls here whose shapes differ in several dimensions.
std::vector<CublasLtPair> align_in_order(const std::vector<CublasLtCall>& a,
                                         const std::vector<CublasLtCall>& b) {
  std::vector<CublasLtPair> pairs;
  pairs.reserve(std::max(a.size(), b.size()));
  auto only_a = [&](std::size_t i) { pairs.push_back({i, std::nullopt}); };
  auto only_b = [&](std::size_t j) { pairs.push_back({std::nullopt, j}); };
  // The nearest resynchronization under `accept`: skips d calls of one stream.
  std::size_t i = 0, j = 0;
  auto resync = [&](bool (*accept)(Match), std::size_t window) {
    for (std::size_t d = 1; d <= window; ++d) {
      if (j + d < b.size() && accept(match_kind(a[i], b[j + d]))) {
        for (std::size_t s = 0; s < d; ++s) only_b(j++);
        return true;
      }
      if (i + d < a.size() && accept(match_kind(a[i + d], b[j]))) {
        for (std::size_t s = 0; s < d; ++s) only_a(i++);
        return true;
      }
    }
    return false;
  };
  while (i < a.size() && j < b.size()) {
    const Match here = match_kind(a[i], b[j]);
    if (close_match(here)) {
      pairs.push_back(paired(a, b, i, j, here != Match::kSame));
      ++i, ++j;
      continue;
    }
    if (resync(close_match, here == Match::kManyDims ? kNearby : kLookahead)) continue;
    if (here == Match::kManyDims) {
      pairs.push_back(paired(a, b, i, j, here != Match::kSame));
      ++i, ++j;
      continue;
    }
    if (resync(loose_match, kLookahead)) continue;
    only_a(i++);
    only_b(j++);
  }
  while (i < a.size()) only_a(i++);
  while (j < b.size()) only_b(j++);
  return pairs;
}

// Second pass: calls left over on both sides with the same problem pair up in order
// (ranks that run as threads of one process interleave differently in each run).
std::vector<CublasLtPair> pair_leftovers(const std::vector<CublasLtCall>& a,
                                         const std::vector<CublasLtCall>& b,
                                         std::vector<CublasLtPair> pairs) {
  std::map<std::string, std::vector<std::size_t>> waiting_b;  // problem → only-B entries
  auto problem_key = [](const CublasLtCall& c) {
    return c.shape_text() + "|" + c.kind_text() + "|" + c.a.order + c.b.order + c.d.order;
  };
  for (std::size_t e = 0; e < pairs.size(); ++e) {
    if (!pairs[e].a) waiting_b[problem_key(b[*pairs[e].b])].push_back(e);
  }
  std::map<std::string, std::size_t> taken;  // how many of each problem's entries are used
  std::vector<bool> drop(pairs.size(), false);
  for (std::size_t e = 0; e < pairs.size(); ++e) {
    if (pairs[e].b) continue;
    const std::string key = problem_key(a[*pairs[e].a]);
    auto it = waiting_b.find(key);
    if (it == waiting_b.end() || taken[key] >= it->second.size()) continue;
    const std::size_t entry = it->second[taken[key]++];
    pairs[e] = paired(a, b, *pairs[e].a, *pairs[entry].b, false);
    drop[entry] = true;
  }
  std::vector<CublasLtPair> kept;
  kept.reserve(pairs.size());
  for (std::size_t e = 0; e < pairs.size(); ++e) {
    if (!drop[e]) kept.push_back(pairs[e]);
  }
  return kept;
}

}  // namespace

std::vector<CublasLtPair> align_cublaslt_calls(const std::vector<CublasLtCall>& a,
                                               const std::vector<CublasLtCall>& b) {
  return pair_leftovers(a, b, align_in_order(a, b));
}

}  // namespace tpcheck
