// tests/suite/pairwise_test.cpp — the pairwise generator behind the `full` suite: every
// pair of values of two factors that the rule admits is in some row, no row breaks the
// rule, the rows are the same every time (stable case ids), and far fewer rows than the
// product. Checked by brute force over every pair here, not by the generator's own books.
#include "suite/pairwise.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "tpcheck/error.h"

namespace tpcheck::testing {
namespace {

using Pair = std::tuple<int, int, int, int>;  // factor i, value a, factor j, value b

std::set<Pair> pairs_in(const std::vector<Row>& rows) {
  std::set<Pair> out;
  for (const Row& r : rows) {
    for (int i = 0; i < static_cast<int>(r.size()); ++i)
      for (int j = i + 1; j < static_cast<int>(r.size()); ++j) out.insert({i, r[i], j, r[j]});
  }
  return out;
}

std::vector<Factor> factors(const std::vector<int>& sizes) {
  std::vector<Factor> out;
  for (std::size_t f = 0; f < sizes.size(); ++f) {
    Factor x{"f" + std::to_string(f), {}};
    for (int v = 0; v < sizes[f]; ++v) x.values.push_back(std::to_string(v));
    out.push_back(x);
  }
  return out;
}

TEST(Pairwise, EveryPairOfEveryTwoFactorsIsCovered) {
  const std::vector<int> sizes = {6, 3, 4, 2, 2, 5, 2, 3};
  const auto rows = pairwise_rows(factors(sizes), [](const Row&) { return true; });
  const std::set<Pair> seen = pairs_in(rows);
  int expected = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (std::size_t j = i + 1; j < sizes.size(); ++j) {
      for (int a = 0; a < sizes[i]; ++a) {
        for (int b = 0; b < sizes[j]; ++b) {
          ++expected;
          EXPECT_TRUE(seen.count({static_cast<int>(i), a, static_cast<int>(j), b}))
              << "pair f" << i << "=" << a << ", f" << j << "=" << b << " not covered";
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), expected);
  // At least the largest pair product (6·5), and far below the full product (8640).
  EXPECT_GE(rows.size(), 30u);
  EXPECT_LE(rows.size(), 45u) << "the greedy cover grew: check the generator";
}

TEST(Pairwise, TheRuleIsObeyedAndOnlyItsPairsAreMissing) {
  // Rule: f0 = 1 excludes f1 = 2 (like return_bias without bias), f2 = 0 needs f3 = 1.
  const auto rejects = [](const Row& r) {
    return (r[0] == 1 && r[1] == 2) || (r[2] == 0 && r[3] == 0);
  };
  const std::vector<int> sizes = {3, 3, 2, 2, 3};
  const auto rows = pairwise_rows(factors(sizes), [&](const Row& r) { return !rejects(r); });
  for (const Row& r : rows) {
    EXPECT_FALSE(rejects(r));
    for (int v : r) EXPECT_NE(v, kUnset);
  }
  const std::set<Pair> seen = pairs_in(rows);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (std::size_t j = i + 1; j < sizes.size(); ++j) {
      for (int a = 0; a < sizes[i]; ++a) {
        for (int b = 0; b < sizes[j]; ++b) {
          Row probe(sizes.size(), kUnset);
          probe[i] = a;
          probe[j] = b;
          EXPECT_EQ(seen.count({static_cast<int>(i), a, static_cast<int>(j), b}) == 1,
                    !rejects(probe))
              << "f" << i << "=" << a << ", f" << j << "=" << b;
        }
      }
    }
  }
}

TEST(Pairwise, SameFactorsGiveTheSameRows) {
  const auto f = factors({4, 3, 3, 2, 2});
  const auto ok = [](const Row& r) { return !(r[0] == 3 && r[4] == 1); };
  EXPECT_EQ(pairwise_rows(f, ok), pairwise_rows(f, ok));
}

TEST(Pairwise, AFactorWithoutValuesIsAnError) {
  std::vector<Factor> f = factors({2, 2});
  f.push_back({"empty", {}});
  EXPECT_THROW(pairwise_rows(f, [](const Row&) { return true; }), Error);
}

}  // namespace
}  // namespace tpcheck::testing
