// pairwise.h — a deterministic pairwise (strength-2) covering-array generator for suites.
//
// A module's options are factors, each with a list of values. Running every combination
// is a product (a TransformerLayer has ~10^5); running every *pair* of values of two
// options together is what finds the bugs that come from two options interacting, at a
// few dozen rows. `pairwise_rows` returns rows (one value index per factor) such that
// every admissible pair of values of two different factors occurs in some row.
//
// Greedy, AETG-style, with no randomness: while a pair is uncovered, start a row from the
// first uncovered pair (in factor, value order), then give each other factor, in order,
// the value that covers the most still-uncovered pairs with the factors already set
// (ties: the earlier value). The same factors and rule always give the same rows, so
// the case ids built from them are stable.
// Thread safety: pure functions.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tpcheck {

struct Factor {
  std::string name;                 // an option as it appears in case ids: "activation"
  std::vector<std::string> values;  // the first is the default (left out of case ids)
};

// A row: the value index of every factor; kUnset where not chosen yet.
using Row = std::vector<int>;
inline constexpr int kUnset = -1;

// The combination rule: false when the factors set in `row` (others kUnset) already
// break a rule (e.g. return_bias without bias). It must never reject a row for a factor
// that is unset, so a rule is checked as soon as its factors are set.
using Admissible = std::function<bool(const Row& row)>;

// Rows covering every pair that the rule admits and that some admissible row completes.
// Throws Error(kRuntime) when a factor has no values.
std::vector<Row> pairwise_rows(const std::vector<Factor>& factors, const Admissible& admissible);

}  // namespace tpcheck
