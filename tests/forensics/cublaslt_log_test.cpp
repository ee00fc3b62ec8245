// The cuBLASLt log parser on hand-written lines in the library's format (sources in
// include/tpcheck/cublaslt_log.h): every field, the defaults of omitted fields, the m n k
// derivation, malformed and truncated lines; the alignment of two call streams; the
// ledger JSON round trip; the diff of two run reports.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tpcheck/cublaslt_log.h"
#include "tpcheck/error.h"
#include "tpcheck/ledger_diff.h"

namespace tpcheck {
namespace {

// The mxfp8 example of vuiseng9/fp4-training's README (CUBLASLT_LOG_LEVEL=2), one line.
const std::string kReadmeLine =
    "[2025-11-03 19:02:38][cublasLt][557785][Trace][cublasLtMatmul] A=0X736CB315E800 "
    "Adesc=[type=R_8F_E4M3 rows=64 cols=1088 ld=64] B=0X736C9B644000 "
    "Bdesc=[type=R_8F_E4M3 rows=128 cols=1088 ld=128] C=0X0 "
    "Cdesc=[type=R_16BF rows=64 cols=128 ld=64] D=0X736CB30A4400 "
    "Ddesc=[type=R_16BF rows=64 cols=128 ld=64] "
    "computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transb=OP_T "
    "aScalePointer=0x736cb30b4c00 bScalePointer=0x736cb30ba200 "
    "aScaleMode=VEC32_UE8M0 bScaleMode=VEC32_UE8M0] "
    "algo=[algoId=66 tile=MATMUL_TILE_128x128 "
    "stages=MATMUL_STAGES_128xAUTO customOption=3 clusterShape=CLUSTER_SHAPE_1x1x1] "
    "workSpace=0X0 workSpaceSizeInBytes=0 beta=0 outOfPlace=1 stream=0X0";

// Every field the parser reads, none at its default.
const std::string kFullLine =
    "[2026-11-30 10:00:00][cublasLt][4242][Trace][cublasLtMatmul] A=0X1 "
    "Adesc=[type=R_32F rows=32 cols=64 ld=40 order=ORDER_ROW batchCount=4 stridedBatchOffset=2560] "
    "B=0X2 Bdesc=[type=R_32F rows=1024 cols=32 ld=1024 batchCount=4 stridedBatchOffset=32768] "
    "C=0X3 Cdesc=[type=R_32F rows=64 cols=1024 ld=64 batchCount=4 stridedBatchOffset=65536] "
    "D=0X3 Ddesc=[type=R_32F rows=64 cols=1024 ld=64 batchCount=4 stridedBatchOffset=65536] "
    "computeDesc=[computeType=COMPUTE_32F_FAST_TF32 scaleType=R_32F transa=OP_T transb=OP_T "
    "epilogue=EPILOGUE_GELU_AUX_BIAS biasPointer=0x7f00] "
    "algo=[algoId=21 tile=MATMUL_TILE_64x64 stages=MATMUL_STAGES_32x5 customOption=1 "
    "numSplitsK=3 reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE ctaSwizzling=1 "
    "clusterShape=CLUSTER_SHAPE_2x1x1] "
    "workSpace=0X7F00 workSpaceSizeInBytes=1048576 beta=1 outOfPlace=0 stream=0X5";

// A TF32-allowed f32 GEMM with nothing but the required fields (all defaults omitted).
std::string fp32_line(int pid, std::int64_t m, std::int64_t n, std::int64_t k, int algo,
                      const std::string& extra_algo = "") {
  return fmt::format(
      "[2026-11-30 10:00:00][cublasLt][{}][Trace][cublasLtMatmul] A=0X1 "
      "Adesc=[type=R_32F rows={} cols={} ld={}] B=0X2 Bdesc=[type=R_32F rows={} cols={} ld={}] "
      "C=0X3 Cdesc=[type=R_32F rows={} cols={} ld={}] D=0X3 Ddesc=[type=R_32F rows={} cols={} ld={}] "
      "computeDesc=[computeType=COMPUTE_32F_FAST_TF32 scaleType=R_32F] "
      "algo=[algoId={}{}] workSpace=0X0 workSpaceSizeInBytes=0 beta=0 outOfPlace=0 stream=0X0",
      pid, m, k, m, k, n, k, m, n, m, m, n, m, algo, extra_algo);
}

CublasLtCall parse_ok(const std::string& line) {
  auto r = parse_cublaslt_line(line, 7);
  EXPECT_TRUE(r.has_value());
  if (!r) return {};
  EXPECT_EQ(r->problem, "");
  EXPECT_TRUE(r->call.has_value());
  return r->call.value_or(CublasLtCall{});
}

std::string problem_of(const std::string& line) {
  auto r = parse_cublaslt_line(line, 3);
  EXPECT_TRUE(r.has_value()) << line;
  if (!r) return "";
  EXPECT_FALSE(r->call.has_value()) << line;
  return r->problem;
}

TEST(CublasLtLog, ReadmeLineWithDefaults) {
  const CublasLtCall c = parse_ok(kReadmeLine);
  EXPECT_EQ(c.line, 7);
  EXPECT_EQ(c.pid, 557785);
  EXPECT_EQ(c.function, "cublasLtMatmul");
  EXPECT_EQ(c.a.type, "8F_E4M3");
  EXPECT_EQ(c.a.rows, 64);
  EXPECT_EQ(c.a.cols, 1088);
  EXPECT_EQ(c.a.ld, 64);
  EXPECT_EQ(c.b.type, "8F_E4M3");
  EXPECT_EQ(c.c.type, "16BF");
  EXPECT_EQ(c.d.type, "16BF");
  EXPECT_EQ(c.compute_type, "32F");
  EXPECT_EQ(c.scale_type, "32F");
  EXPECT_FALSE(c.trans_a);  // omitted: OP_N
  EXPECT_TRUE(c.trans_b);
  EXPECT_EQ(c.algo_id, 66);
  EXPECT_EQ(c.tile, "128x128");
  EXPECT_EQ(c.stages, "128xAUTO");
  EXPECT_EQ(c.custom_option, 3);
  EXPECT_EQ(c.cluster_shape, "1x1x1");
  EXPECT_EQ(c.workspace_bytes, 0u);
  EXPECT_EQ(c.beta, "0");
  // Omitted: the library's defaults.
  EXPECT_EQ(c.epilogue, "DEFAULT");
  EXPECT_EQ(c.split_k, 1);
  EXPECT_EQ(c.reduction_scheme, "NONE");
  EXPECT_EQ(c.cta_swizzling, 0);
  EXPECT_EQ(c.a.order, "COL");
  EXPECT_EQ(c.a.batch_count, 1);
  EXPECT_EQ(c.a.batch_stride, 0);
  // op(A) = A (64x1088), op(B) = Bᵀ (1088x128), D 64x128.
  EXPECT_EQ(c.m, 64);
  EXPECT_EQ(c.n, 128);
  EXPECT_EQ(c.k, 1088);
}

TEST(CublasLtLog, EveryField) {
  const CublasLtCall c = parse_ok(kFullLine);
  EXPECT_EQ(c.pid, 4242);
  EXPECT_EQ(c.a.order, "ROW");
  EXPECT_EQ(c.b.order, "COL");
  EXPECT_EQ(c.a.batch_count, 4);
  EXPECT_EQ(c.a.batch_stride, 2560);
  EXPECT_EQ(c.d.batch_stride, 65536);
  EXPECT_EQ(c.compute_type, "32F_FAST_TF32");
  EXPECT_TRUE(c.trans_a);
  EXPECT_TRUE(c.trans_b);
  EXPECT_EQ(c.epilogue, "GELU_AUX_BIAS");
  EXPECT_EQ(c.algo_id, 21);
  EXPECT_EQ(c.tile, "64x64");
  EXPECT_EQ(c.stages, "32x5");
  EXPECT_EQ(c.custom_option, 1);
  EXPECT_EQ(c.split_k, 3);
  EXPECT_EQ(c.reduction_scheme, "COMPUTE_TYPE");
  EXPECT_EQ(c.cta_swizzling, 1);
  EXPECT_EQ(c.cluster_shape, "2x1x1");
  EXPECT_EQ(c.workspace_bytes, 1048576u);
  EXPECT_EQ(c.beta, "1");
  // op(A) = Aᵀ: 64x32; op(B) = Bᵀ: 32x1024.
  EXPECT_EQ(c.m, 64);
  EXPECT_EQ(c.n, 1024);
  EXPECT_EQ(c.k, 32);
  EXPECT_EQ(c.shape_text(), "m=64 n=1024 k=32 batch=4");
  EXPECT_EQ(c.algorithm_text(),
            "algoId=21 tile=64x64 stages=32x5 customOption=1 cluster=2x1x1 splitK=3 "
            "reduction=COMPUTE_TYPE swizzle=1");
}

TEST(CublasLtLog, LegacyEntryPointsAndMissingC) {
  std::string line = fp32_line(1, 64, 1024, 8, 6);
  const std::string name = "[cublasLtMatmul]";
  line.replace(line.find(name), name.size(), "[cublasLtSSSMatmul]");
  const std::size_t c0 = line.find("C=0X3 Cdesc=");
  line.erase(c0, line.find(" D=0X3") - c0);
  const CublasLtCall c = parse_ok(line);
  EXPECT_EQ(c.function, "cublasLtSSSMatmul");
  EXPECT_EQ(c.c, c.d);  // C not printed: D's layout
  EXPECT_EQ(c.m, 64);
  EXPECT_EQ(c.n, 1024);
  EXPECT_EQ(c.k, 8);
  EXPECT_EQ(c.tile, "UNDEFINED");
  EXPECT_EQ(c.stages, "UNDEFINED");
  EXPECT_EQ(c.cluster_shape, "AUTO");
}

TEST(CublasLtLog, OtherLinesAreNotCalls) {
  for (const std::string& line : {
           std::string(""),
           std::string("epoch 1 loss 0.25"),
           std::string("[2026-11-30 10:00:00][cublasLt][1][Api][cublasLtMatmul] lightHandle=0X1 "
                       "computeDesc=0X2 Adesc=0X3 algo=0X4"),
           std::string("[2026-11-30 10:00:00][cublasLt][1][Info][cublasLtMatmulAlgoGetHeuristic] "
                       "Adesc=[type=R_32F rows=2 cols=2 ld=2]"),
           std::string("[2026-11-30 10:00:00][cublasLt][1][Trace][cublasLtMatrixTransform] "
                       "A=0X1 Adesc=[type=R_32F rows=2 cols=2 ld=2]"),
           std::string("[2026-11-30 10:00:00][cublasLt][1][Trace][cublasLtMatmulAlgoGetHeuristic] "
                       "x=1"),
       }) {
    EXPECT_FALSE(parse_cublaslt_line(line, 1).has_value()) << line;
  }
}

TEST(CublasLtLog, MalformedAndTruncatedLines) {
  const std::string good = fp32_line(1, 64, 1024, 32, 21);
  // Truncated inside Adesc, inside algo, and before algo.
  EXPECT_EQ(problem_of(good.substr(0, good.find("rows=64") + 4)), "truncated: Adesc=[ is not closed");
  EXPECT_EQ(problem_of(good.substr(0, good.find("algoId") + 8)), "truncated: algo=[ is not closed");
  EXPECT_EQ(problem_of(good.substr(0, good.find(" algo="))), "truncated or malformed: algo missing");
  EXPECT_EQ(problem_of(good.substr(0, good.find(" computeDesc="))),
            "truncated or malformed: computeDesc missing");
  EXPECT_EQ(problem_of(good.substr(0, good.find(" Ddesc="))),
            "truncated or malformed: Ddesc missing");
  // Bad values.
  std::string bad = good;
  bad.replace(bad.find("rows=64"), 7, "rows=6x4");
  EXPECT_EQ(problem_of(bad), "Adesc rows='6x4' is not an integer");
  bad = good;
  bad.replace(bad.find("algoId=21"), 9, "algoId=");
  EXPECT_EQ(problem_of(bad), "algo algoId='' is not an integer");
  bad = good;
  bad.replace(bad.find("algoId=21"), 9, "tile=MATMUL_TILE_8x8");
  EXPECT_EQ(problem_of(bad), "algo has no algoId");
  bad = good;
  bad.replace(bad.find("type=R_32F rows=64"), 10, "rows=1");  // Adesc without type
  EXPECT_EQ(problem_of(bad), "Adesc has no type");
  bad = good;
  bad.replace(bad.find("workSpaceSizeInBytes=0"), 22, "workSpaceSizeInBytes=-5");
  EXPECT_EQ(problem_of(bad), "call workSpaceSizeInBytes='-5' is not an integer");
  bad = good;
  bad.replace(bad.find("computeType=COMPUTE_32F_FAST_TF32 "), 34, "");
  EXPECT_EQ(problem_of(bad), "computeDesc has no computeType");
  // Shapes that cannot be one GEMM (B's k differs from A's).
  bad = good;
  bad.replace(bad.find("Bdesc=[type=R_32F rows=32"), 25, "Bdesc=[type=R_32F rows=31");
  EXPECT_EQ(problem_of(bad), "shapes disagree: op(A) 64x32, op(B) 31x1024, D 64x1024");
}

TEST(CublasLtLog, WholeLogLineNumbersAndProblems) {
  const std::string good = fp32_line(9, 64, 1024, 32, 21);
  const std::string text = "program output\r\n" + good + "\r\n" +
                           "[2026-11-30][cublasLt][9][Api][cublasLtCreate] handle=0X1\n" +
                           good.substr(0, good.size() / 2) + "\n" + kReadmeLine;  // no final \n
  const CublasLtLog log = parse_cublaslt_log(text);
  EXPECT_EQ(log.lines, 5);
  ASSERT_EQ(log.calls.size(), 2u);
  EXPECT_EQ(log.calls[0].line, 2);
  EXPECT_EQ(log.calls[0].beta, "0");  // the \r is not part of the last value
  EXPECT_EQ(log.calls[1].line, 5);
  ASSERT_EQ(log.problems.size(), 1u);
  EXPECT_EQ(log.problems[0].line, 4);
}

TEST(CublasLtAlign, ShardedDimensionAndAlgorithms) {
  // Single: K=32 with algo 21; sharded (TP 4): K=8 with algo 6 (README.md, "Where it
  // came from"), then one shape the same in both with the same algorithm.
  std::vector<CublasLtCall> a, b;
  a.push_back(parse_ok(fp32_line(1, 64, 1024, 32, 21, " tile=MATMUL_TILE_64x64")));
  a.push_back(parse_ok(fp32_line(1, 64, 64, 64, 4)));
  b.push_back(parse_ok(fp32_line(2, 64, 1024, 8, 6, " numSplitsK=2")));
  b.push_back(parse_ok(fp32_line(2, 64, 64, 64, 4)));
  const auto pairs = align_cublaslt_calls(a, b);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].a, 0u);
  EXPECT_EQ(pairs[0].b, 0u);
  EXPECT_TRUE(pairs[0].shape_differs);
  EXPECT_TRUE(pairs[0].algorithm_differs);
  EXPECT_FALSE(pairs[0].compute_differs);
  EXPECT_FALSE(pairs[1].shape_differs);
  EXPECT_FALSE(pairs[1].algorithm_differs);

  const CublasLtDiff d = diff_cublaslt_calls(a, b);
  EXPECT_EQ(d.paired, 2u);
  EXPECT_EQ(d.paired_shape_differs, 1u);
  ASSERT_EQ(d.groups.size(), 1u);
  EXPECT_EQ(d.groups[0].count, 1u);
  EXPECT_EQ(d.groups[0].a.algorithm_text(), "algoId=21 tile=64x64");
  EXPECT_EQ(d.groups[0].b.algorithm_text(), "algoId=6 splitK=2");
  const std::string text = format_cublaslt_diff(d, "single.log", "sharded.log");
  EXPECT_NE(text.find("A m=64 n=1024 k=32"), std::string::npos) << text;
  EXPECT_NE(text.find("B m=64 n=1024 k=8"), std::string::npos) << text;
}

TEST(CublasLtAlign, SeveralDimensionsPairInOrderNonMultiplesNever) {
  std::vector<CublasLtCall> a = {parse_ok(fp32_line(1, 64, 1024, 32, 21))};
  std::vector<CublasLtCall> b = {parse_ok(fp32_line(1, 32, 512, 32, 21))};  // m and n halved
  auto pairs = align_cublaslt_calls(a, b);
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_TRUE(pairs[0].a && pairs[0].b);
  EXPECT_TRUE(pairs[0].shape_differs);
  b = {parse_ok(fp32_line(1, 64, 1024, 24, 21))};  // 32 is not a multiple of 24
  pairs = align_cublaslt_calls(a, b);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_FALSE(pairs[0].b.has_value());
  EXPECT_FALSE(pairs[1].a.has_value());
  // A one-dimension partner two calls ahead beats the several-dimension pair in place.
  a = {parse_ok(fp32_line(1, 64, 1024, 32, 21))};
  b = {parse_ok(fp32_line(1, 32, 512, 32, 5)), parse_ok(fp32_line(1, 32, 512, 16, 5)),
       parse_ok(fp32_line(1, 64, 1024, 8, 6))};
  pairs = align_cublaslt_calls(a, b);
  ASSERT_EQ(pairs.size(), 3u);
  EXPECT_EQ(pairs[2].a, 0u);
  EXPECT_EQ(pairs[2].b, 2u);
  EXPECT_TRUE(pairs[2].algorithm_differs);
}

TEST(CublasLtAlign, ResynchronizesAfterExtraCalls) {
  std::vector<CublasLtCall> a, b;
  for (int i = 0; i < 5; ++i) a.push_back(parse_ok(fp32_line(1, 64, 128 * (i + 1), 32, 21)));
  b = a;
  // Two extra calls in B after the second, of a type nothing in A has.
  std::string extra = fp32_line(1, 64, 64, 64, 4);
  const std::string ct = "COMPUTE_32F_FAST_TF32";
  extra.replace(extra.find(ct), ct.size(), "COMPUTE_64F");
  for (const char* t : {"Adesc=[type=R_32F", "Bdesc=[type=R_32F", "Cdesc=[type=R_32F", "Ddesc=[type=R_32F"}) {
    const std::string from(t);
    extra.replace(extra.find(from), from.size(), from.substr(0, from.size() - 3) + "64F");
  }
  b.insert(b.begin() + 2, 2, parse_ok(extra));
  const CublasLtDiff d = diff_cublaslt_calls(a, b);
  EXPECT_EQ(d.paired, 5u);
  EXPECT_EQ(d.only_a, 0u);
  EXPECT_EQ(d.only_b, 2u);
  EXPECT_TRUE(d.groups.empty());
}

TEST(CublasLtLedger, JsonRoundTrip) {
  CublasLtCall c = parse_ok(kFullLine);
  c.numerical_impl_flags = 0x21;
  c.numerical_impl = "FMA, input 32F, accumulator 32F";
  c.math_class = "fp32";
  const nlohmann::json j = cublaslt_call_to_json(c);
  EXPECT_EQ(j["dtypes"], nlohmann::json({"f32", "f32", "f32"}));
  EXPECT_EQ(j["cublaslt"]["tile"], "64x64");
  const CublasLtCall back = cublaslt_call_from_json(j, "test");
  EXPECT_EQ(back.a, c.a);
  EXPECT_EQ(back.d, c.d);
  EXPECT_TRUE(back.same_algorithm(c));
  EXPECT_EQ(back.numerical_impl_flags, c.numerical_impl_flags);
  EXPECT_EQ(back.m, c.m);
  EXPECT_EQ(back.k, c.k);
  EXPECT_EQ(back.math_class, "fp32");
  nlohmann::json broken = j;
  broken["cublaslt"].erase("algo_id");
  EXPECT_THROW(cublaslt_call_from_json(broken, "test"), Error);
}

TEST(RunReportDiff, VerdictsAlgorithmsEnvironment) {
  auto report = [](const char* status, int algo, const char* klass, const char* devices) {
    const std::string gemm = fmt::format(
        R"({{"math_class": "{}", "cublaslt": {{"algo_id": {}, "tile": "64x64", "stages": "32x5",
            "split_k": 1}}}})", klass, algo);
    return nlohmann::json::parse(fmt::format(R"({{
      "schema": "tpcheck.run/1",
      "environment": {{"devices": "{}", "date": "x"}},
      "cases": [{{"id": "linear/col",
                  "verdicts": {{"truth": {{"status": "{}", "reason": "r"}}}},
                  "gemm_class_diffs": [{{"site": "mlp.fc1/dgrad", "occurrence": 0,
                                         "single": {}, "sharded": {}}}]}}],
      "summary": {{"passed": 1, "failed": 0}}}})", devices, status, gemm, gemm));
  };
  const nlohmann::json a = report("pass", 21, "tf32", "1 x H200");
  EXPECT_TRUE(diff_run_reports(a, a).empty());
  nlohmann::json b = report("fail", 6, "fp32", "1 x H100");
  b["environment"]["date"] = "y";  // the date is not a change
  const std::vector<std::string> lines = diff_run_reports(a, b);
  const std::string all = fmt::format("{}", fmt::join(lines, "\n"));
  EXPECT_NE(all.find("environment devices: 1 x H200 → 1 x H100"), std::string::npos) << all;
  EXPECT_NE(all.find("case linear/col: truth verdict pass → fail"), std::string::npos) << all;
  EXPECT_NE(all.find("mlp.fc1/dgrad#0 sharded: tf32 algo 21 64x64 32x5 splitK 1 → fp32 algo 6"),
            std::string::npos) << all;
  EXPECT_EQ(all.find("date"), std::string::npos) << all;
  EXPECT_THROW(diff_run_reports(a, nlohmann::json{{"schema", "other"}}), Error);
  nlohmann::json odd = a;
  odd["cases"][0]["verdicts"] = 3;  // no verdict object: reported, not a crash
  EXPECT_EQ(diff_run_reports(a, odd).at(0), "case linear/col: truth verdict pass → absent");
  odd["cases"] = "x";  // not a list of cases: an input error
  EXPECT_THROW(diff_run_reports(a, odd), Error);
}

}  // namespace
}  // namespace tpcheck
