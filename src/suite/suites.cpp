// suites.cpp — suite_names and make_suite: the name → suite dispatch.
#include "suite/suites.h"

#include "tpcheck/error.h"

namespace tpcheck {

std::vector<std::string> suite_names() { return {"full", "te"}; }

namespace {

// The reference suite's sizes per recipe (run_numerics.py: SEQ_LEN, BATCH_SIZE,
// HIDDEN_SIZE; FFN_HIDDEN_SIZE 128 when quantized), then hidden and ffn raised so each
// rank's weight shard still fits the recipe's blocks at this TP size (noted). Sizes the
// user gave are kept (check_case rejects them, naming the size and the multiple, if they
// do not fit).
SuiteSizes recipe_sizes(Recipe recipe, int tp, SuiteSizes given,
                        std::vector<std::string>& notes) {
  if (recipe == Recipe::kNone) return given;
  std::int64_t seq = 32, batch = 32, hidden = 128, ffn = 128;
  if (recipe == Recipe::kFp8Current) {
    seq = 16;
    batch = 16;
    hidden = 64;
  } else if (recipe == Recipe::kFp8Block) {
    seq = 128;
    batch = 128;
    hidden = 512;
  }
  // The multiple each weight shard's dimensions need (quant_block / check_quantizable).
  const Shape block = quant_block(recipe, QuantRole::kWeight);
  const std::int64_t multiple = block.empty() ? 16 : block[1];
  const std::int64_t fits = multiple * tp;
  const std::int64_t hidden_fit = (hidden + fits - 1) / fits * fits;
  const std::int64_t ffn_fit = (ffn + fits - 1) / fits * fits;
  if ((!given.hidden && hidden_fit != hidden) || (!given.ffn && ffn_fit != ffn)) {
    notes.push_back(fmt::format(
        "recipe {}: hidden {} and ffn {} (the reference's {} and {} raised so each rank's "
        "weight shard is a multiple of {} at tp {})",
        recipe_name(recipe), hidden_fit, ffn_fit, hidden, ffn, multiple, tp));
  } else {
    notes.push_back(fmt::format("recipe {}: the reference's sizes seq {}, batch {}, hidden {}, "
                                "ffn {}",
                                recipe_name(recipe), seq, batch, hidden_fit, ffn_fit));
  }
  if (!given.seq) given.seq = seq;
  if (!given.batch) given.batch = batch;
  if (!given.hidden) given.hidden = hidden_fit;
  if (!given.ffn) given.ffn = ffn_fit;
  return given;
}

}  // namespace

Suite make_suite(const std::string& name, int tp, const SuiteSizes& sizes, Recipe recipe) {
  TPCHECK_CHECK_INPUT(name == "full" || name == "te",
                      "unknown suite '{}'; expected one of: full, te", name);
  TPCHECK_CHECK_INPUT(tp >= 1, "--tp must be at least 1, got {}", tp);
  std::vector<std::string> notes;
  const SuiteSizes z = recipe_sizes(recipe, tp, sizes, notes);
  Suite suite = name == "te" ? make_te_suite(tp, z, recipe) : make_full_suite(tp, z);
  suite.notes.insert(suite.notes.begin(), notes.begin(), notes.end());
  return suite;
}

}  // namespace tpcheck
