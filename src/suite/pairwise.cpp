// pairwise.cpp — pairwise_rows (see pairwise.h).
#include "suite/pairwise.h"

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// covered[i][j][a * |values j| + b]: whether values (a of factor i, b of factor j), i < j,
// are in some row already; pairs the rule rejects start as covered.
using PairTable = std::vector<std::vector<std::vector<bool>>>;

}  // namespace

std::vector<Row> pairwise_rows(const std::vector<Factor>& factors, const Admissible& admissible) {
  const int n = static_cast<int>(factors.size());
  for (const Factor& f : factors) {
    TPCHECK_CHECK(!f.values.empty(), "suite factor {} has no values", f.name);
  }
  auto size = [&](int i) { return static_cast<int>(factors[i].values.size()); };
  PairTable covered(n, std::vector<std::vector<bool>>(n));
  std::size_t uncovered = 0;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      covered[i][j].assign(size(i) * size(j), true);
      for (int a = 0; a < size(i); ++a) {
        for (int b = 0; b < size(j); ++b) {
          Row probe(n, kUnset);
          probe[i] = a;
          probe[j] = b;
          if (admissible(probe)) {
            covered[i][j][a * size(j) + b] = false;
            ++uncovered;
          }
        }
      }
    }
  }
  auto is_covered = [&](int i, int a, int j, int b) {
    return i < j ? covered[i][j][a * size(j) + b] : covered[j][i][b * size(i) + a];
  };
  auto cover = [&](int i, int a, int j, int b) {
    std::vector<bool>::reference c =
        i < j ? covered[i][j][a * size(j) + b] : covered[j][i][b * size(i) + a];
    if (!c) {
      c = true;
      --uncovered;
    }
  };

  std::vector<Row> rows;
  while (uncovered > 0) {
    // The first uncovered pair seeds the row.
    Row row(n, kUnset);
    int si = -1, sa = -1, sj = -1, sb = -1;
    for (int i = 0; i < n && si < 0; ++i) {
      for (int j = i + 1; j < n && si < 0; ++j) {
        for (int a = 0; a < size(i) && si < 0; ++a) {
          for (int b = 0; b < size(j) && si < 0; ++b) {
            if (!is_covered(i, a, j, b)) si = i, sa = a, sj = j, sb = b;
          }
        }
      }
    }
    row[si] = sa;
    row[sj] = sb;
    bool complete = true;
    for (int f = 0; f < n && complete; ++f) {
      if (row[f] != kUnset) continue;
      int best = kUnset, best_gain = -1;
      for (int v = 0; v < size(f); ++v) {
        row[f] = v;
        if (admissible(row)) {
          int gain = 0;
          for (int g = 0; g < n; ++g) {
            if (g != f && row[g] != kUnset && !is_covered(f, v, g, row[g])) ++gain;
          }
          if (gain > best_gain) best = v, best_gain = gain;
        }
        row[f] = kUnset;
      }
      row[f] = best;
      complete = best != kUnset;
    }
    if (!complete) {
      // No admissible row holds this pair (the rule rejects it only in combination with
      // a third factor): it cannot be run, so it is not owed.
      cover(si, sa, sj, sb);
      continue;
    }
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) cover(i, row[i], j, row[j]);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace tpcheck
