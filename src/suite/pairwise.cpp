// pairwise.cpp — pairwise_rows (see pairwise.h).
#include "suite/pairwise.h"

#include "tpcheck/error.h"

namespace tpcheck {
namespace {

// Which pairs of values of two factors some row holds already. Pairs the rule rejects
// start as covered (nothing owes them).
class PairCoverage {
 public:
  PairCoverage(const std::vector<Factor>& factors, const Admissible& admissible)
      : factors_(factors), n_(static_cast<int>(factors.size())) {
    covered_.assign(n_, std::vector<std::vector<bool>>(n_));
    for (int i = 0; i < n_; ++i) {
      for (int j = i + 1; j < n_; ++j) {
        covered_[i][j].assign(size(i) * size(j), true);
        for (int a = 0; a < size(i); ++a) {
          for (int b = 0; b < size(j); ++b) {
            Row probe(n_, kUnset);
            probe[i] = a;
            probe[j] = b;
            if (admissible(probe)) {
              covered_[i][j][a * size(j) + b] = false;
              ++uncovered_;
            }
          }
        }
      }
    }
  }

  int size(int i) const { return static_cast<int>(factors_[i].values.size()); }
  std::size_t uncovered() const { return uncovered_; }

  bool covered(int i, int a, int j, int b) const {
    return i < j ? covered_[i][j][a * size(j) + b] : covered_[j][i][b * size(i) + a];
  }

  void cover(int i, int a, int j, int b) {
    std::vector<bool>::reference c =
        i < j ? covered_[i][j][a * size(j) + b] : covered_[j][i][b * size(i) + a];
    if (!c) {
      c = true;
      --uncovered_;
    }
  }

  // A row holding only the first uncovered pair (in factor, value order); its factors in
  // *i and *j. REQUIRES: uncovered() > 0.
  Row seed(int* i_out, int* j_out) const {
    for (int i = 0; i < n_; ++i) {
      for (int j = i + 1; j < n_; ++j) {
        for (int a = 0; a < size(i); ++a) {
          for (int b = 0; b < size(j); ++b) {
            if (covered(i, a, j, b)) continue;
            Row row(n_, kUnset);
            row[i] = a;
            row[j] = b;
            *i_out = i;
            *j_out = j;
            return row;
          }
        }
      }
    }
    TPCHECK_CHECK(false, "pairwise: no uncovered pair left to seed a row");
    return {};
  }

 private:
  const std::vector<Factor>& factors_;
  int n_;
  // covered_[i][j][a * |values j| + b], i < j.
  std::vector<std::vector<std::vector<bool>>> covered_;
  std::size_t uncovered_ = 0;
};

// Gives each unset factor of `row`, in order, the admissible value that covers the most
// still-uncovered pairs with the factors set (ties: the earlier value). False when some
// factor has no admissible value.
bool complete_row(Row& row, const PairCoverage& coverage, const Admissible& admissible) {
  const int n = static_cast<int>(row.size());
  for (int f = 0; f < n; ++f) {
    if (row[f] != kUnset) continue;
    int best = kUnset, best_gain = -1;
    for (int v = 0; v < coverage.size(f); ++v) {
      row[f] = v;
      if (admissible(row)) {
        int gain = 0;
        for (int g = 0; g < n; ++g) {
          if (g != f && row[g] != kUnset && !coverage.covered(f, v, g, row[g])) ++gain;
        }
        if (gain > best_gain) best = v, best_gain = gain;
      }
      row[f] = kUnset;
    }
    row[f] = best;
    if (best == kUnset) return false;
  }
  return true;
}

}  // namespace

std::vector<Row> pairwise_rows(const std::vector<Factor>& factors, const Admissible& admissible) {
  const int n = static_cast<int>(factors.size());
  for (const Factor& f : factors) {
    TPCHECK_CHECK(!f.values.empty(), "suite factor {} has no values", f.name);
  }
  PairCoverage coverage(factors, admissible);
  std::vector<Row> rows;
  while (coverage.uncovered() > 0) {
    int si = -1, sj = -1;
    Row row = coverage.seed(&si, &sj);
    const int sa = row[si], sb = row[sj];
    if (!complete_row(row, coverage, admissible)) {
      // No admissible row holds this pair (the rule rejects it only in combination with
      // a third factor): it cannot be run, so it is not owed.
      coverage.cover(si, sa, sj, sb);
      continue;
    }
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) coverage.cover(i, row[i], j, row[j]);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace tpcheck
