// tests/suite/suite_test.cpp — the `te` case matrix as issue 3 specifies it: 118 cases with
// unique ids and the reference suite's per-module counts, the default sizes' adjustment
// at a large TP (announced in the notes), and bad sizes rejected as input errors that name
// the offending size. No case is run here (make_suite only), so this binary is instant.
#include "tpcheck/suite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "tpcheck/error.h"

namespace tpcheck::testing {
namespace {

// Runs make_suite expecting Error(kInput); returns its message ("" if none was thrown).
std::string input_error_of(int tp, const SuiteSizes& sizes, const std::string& name = "te") {
  try {
    make_suite(name, tp, sizes);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "make_suite('" << name << "', tp " << tp << ") accepted the sizes";
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(TeSuite, IsOneOfTheSuites) {
  const std::vector<std::string> names = suite_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "te"), names.end());
}

TEST(TeSuite, Has118CasesWithUniqueIds) {
  for (int tp : {1, 2, 4, 8}) {
    const Suite suite = make_suite("te", tp, SuiteSizes{});
    EXPECT_EQ(suite.name, "te");
    EXPECT_EQ(suite.cases.size(), 118u) << "tp " << tp;
    std::set<std::string> ids;
    for (const SuiteCase& c : suite.cases) {
      EXPECT_TRUE(ids.insert(c.id).second) << "duplicate id " << c.id << " at tp " << tp;
      EXPECT_FALSE(c.id.empty());
    }
  }
}

TEST(TeSuite, ModuleCountsMatchTheReference) {
  // Linear: {column,row} × SP × 8; norms: 2 variants × SP each; LayerNormLinear: SP × 9;
  // LayerNormMLP: SP × 13; TransformerLayer: SP × 17 (fuse_qkv_params listed twice).
  const std::map<std::string, int> expected{{"Linear", 32},       {"LayerNorm", 4},
                                            {"RMSNorm", 4},       {"LayerNormLinear", 18},
                                            {"LayerNormMLP", 26}, {"TransformerLayer", 34}};
  std::map<std::string, int> counts;
  std::map<bool, int> by_sp;
  const Suite suite = make_suite("te", 4, SuiteSizes{});
  for (const SuiteCase& c : suite.cases) {
    ++counts[c.module];
    ++by_sp[c.sequence_parallel];
    // The id carries what distinguishes the case, so a --filter regex can select it.
    EXPECT_EQ(c.id.rfind(c.module, 0), 0u) << c.id;
    EXPECT_TRUE(contains(c.id, c.sequence_parallel ? ".sp1." : ".sp0.")) << c.id;
    EXPECT_TRUE(contains(c.id, c.variant)) << c.id;
    EXPECT_EQ(c.options.value("sequence_parallel", !c.sequence_parallel), c.sequence_parallel)
        << c.id;
    // params f16 cases store f16; all others f32, as the reference's unquantized recipe.
    EXPECT_EQ(c.dtype, contains(c.variant, "params_dtype=f16") ? DType::kF16 : DType::kF32) << c.id;
  }
  EXPECT_EQ(counts, expected);
  EXPECT_EQ(by_sp[false], 59);  // every configuration with SP off and on
  EXPECT_EQ(by_sp[true], 59);
}

TEST(TeSuite, DefaultSizesGiveTheReferenceShapes) {
  // seq 16, batch 16, hidden 64: [batch, hidden] for Linear/norms, [seq, hidden] for
  // LayerNormLinear/LayerNormMLP, [tp·seq, batch, hidden] for TransformerLayer; under SP
  // the single run gets every rank's token slice.
  const int tp = 4;
  for (const SuiteCase& c : make_suite("te", tp, SuiteSizes{}).cases) {
    const bool sp = c.sequence_parallel;
    if (c.module == "TransformerLayer") {
      EXPECT_EQ(c.input_shape, (Shape{tp * 16, 16, 64})) << c.id;
      EXPECT_EQ(c.options.at("num_attention_heads"), 4) << c.id;
    } else if (c.module == "LayerNormLinear" || c.module == "LayerNormMLP") {
      EXPECT_EQ(c.input_shape, (Shape{sp ? tp * 16 : 16, 64})) << c.id;
    } else if (c.module == "Linear" && c.options.at("parallel_mode") == "row") {
      EXPECT_EQ(c.input_shape, (Shape{16, 64})) << c.id;  // row splits features, not tokens
    } else {
      EXPECT_EQ(c.input_shape, (Shape{sp ? tp * 16 : 16, 64})) << c.id;
    }
  }
}

TEST(TeSuite, DefaultHeadsAreRaisedAtTp8AndTheNoteSaysSo) {
  const Suite at4 = make_suite("te", 4, SuiteSizes{});
  EXPECT_TRUE(at4.notes.empty()) << at4.notes.front();

  const Suite at8 = make_suite("te", 8, SuiteSizes{});
  bool heads_note = false;
  for (const std::string& note : at8.notes)
    heads_note |= contains(note, "heads") && contains(note, "8");
  EXPECT_TRUE(heads_note) << "tp 8 with default heads 4 must raise heads to 8 and say so";
  int transformer_cases = 0;
  for (const SuiteCase& c : at8.cases) {
    if (c.module != "TransformerLayer") continue;
    ++transformer_cases;
    EXPECT_EQ(c.options.at("num_attention_heads"), 8) << c.id;
    if (c.options.contains("num_gqa_groups")) {
      EXPECT_EQ(c.options.at("num_gqa_groups").get<int>() % 8, 0) << c.id;
    }
  }
  EXPECT_EQ(transformer_cases, 34);
}

TEST(TeSuite, ExplicitSizesAreNeverChanged) {
  SuiteSizes sizes;
  sizes.heads = 8;
  sizes.hidden = 128;
  const Suite suite = make_suite("te", 8, sizes);
  for (const std::string& note : suite.notes) EXPECT_FALSE(contains(note, "raised")) << note;
  for (const SuiteCase& c : suite.cases) {
    if (c.module == "TransformerLayer") {
      EXPECT_EQ(c.options.at("num_attention_heads"), 8) << c.id;
    }
  }
}

TEST(TeSuite, ExplicitHeadsNotDivisibleByTpIsAnInputError) {
  SuiteSizes sizes;
  sizes.heads = 6;
  const std::string message = input_error_of(4, sizes);
  EXPECT_TRUE(contains(message, "heads")) << message;
  EXPECT_TRUE(contains(message, "6")) << message;

  // An explicit value is not raised even where the default would be.
  sizes.heads = 4;
  EXPECT_TRUE(contains(input_error_of(8, sizes), "heads"));
}

TEST(TeSuite, TpNotDividingAnExplicitSizeIsAnInputError) {
  struct Bad {
    const char* flag;
    SuiteSizes sizes;
    std::int64_t value;
  };
  SuiteSizes hidden, ffn, batch;
  hidden.hidden = 66;  // divisible by the default heads? no matter: tp 4 must reject it
  ffn.ffn = 30;
  batch.batch = 10;
  for (const Bad& bad : {Bad{"hidden", hidden, 66}, Bad{"ffn", ffn, 30}, Bad{"batch", batch, 10}}) {
    const std::string message = input_error_of(4, bad.sizes);
    EXPECT_TRUE(contains(message, bad.flag)) << message;
    EXPECT_TRUE(contains(message, std::to_string(bad.value))) << message;
  }
}

TEST(TeSuite, UnknownSuiteIsAnInputError) {
  const std::string message = input_error_of(4, SuiteSizes{}, "megatron");
  EXPECT_TRUE(contains(message, "megatron")) << message;
}

}  // namespace
}  // namespace tpcheck::testing
