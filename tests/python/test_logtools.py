"""tests/python/test_logtools.py — the cuBLASLt log tools end to end, on the CPU.

`tpcheck logdiff A.log B.log` on hand-written logs in cuBLASLt's Trace format (the
format's sources are in include/tpcheck/cublaslt_log.h), `tpcheck trace -- CMD` around a
fake program that writes log lines into the CUBLASLT_LOG_FILE it is given (with %i
replaced by its pid, as cuBLASLt does) from two processes, and `tpcheck diff` on two
ledgers and on two run reports (tpcheck.run/1). Exit codes: 0 nothing differs (trace:
traced), 1 something differs, 2 input error.

The program is found through TPCHECK_CLI (ctest sets it); a missing variable is a failure.
Runtime: about 10 s on the shared 2-core machine (each trace starts two Python processes).
"""

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest


def tpcheck(cli, *args, cwd=None, timeout=120):
    return subprocess.run([cli, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def trace_line(pid, m, n, k, algo, extra_algo="", compute="COMPUTE_32F_FAST_TF32", transa=False):
    """One [Trace][cublasLtMatmul] line, defaults omitted as cuBLASLt omits them.
    A is m x k (k x m with transa), B k x n, D m x n."""
    a_rows, a_cols = (k, m) if transa else (m, k)
    desc = f"computeType={compute} scaleType=R_32F" + (" transa=OP_T" if transa else "")
    return (f"[2026-11-30 10:00:00][cublasLt][{pid}][Trace][cublasLtMatmul] A=0X7F00 "
            f"Adesc=[type=R_32F rows={a_rows} cols={a_cols} ld={a_rows}] B=0X7F01 "
            f"Bdesc=[type=R_32F rows={k} cols={n} ld={k}] C=0X7F02 "
            f"Cdesc=[type=R_32F rows={m} cols={n} ld={m}] D=0X7F02 "
            f"Ddesc=[type=R_32F rows={m} cols={n} ld={m}] computeDesc=[{desc}] "
            f"algo=[algoId={algo}{extra_algo}] workSpace=0X0 workSpaceSizeInBytes=0 beta=0 "
            f"outOfPlace=0 stream=0X0\n")


def write_logs(tmp_path):
    """The story in README.md, "Where it came from": K=32 unsharded (algo 21) vs K=8 sharded at TP 4 (algo 6)."""
    single = tmp_path / "single.log"
    sharded = tmp_path / "sharded.log"
    single.write_text("program says hello\n"
                      + trace_line(1, 64, 1024, 32, 21, " tile=MATMUL_TILE_64x64") * 3
                      + trace_line(1, 64, 64, 64, 4, transa=True))
    good = trace_line(2, 64, 64, 64, 4, transa=True)
    sharded.write_text(trace_line(2, 64, 1024, 8, 6, " numSplitsK=2") * 3 + good
                       + good[: len(good) // 2] + "\n")  # a truncated last line: line 5
    return single, sharded


def test_logdiff_finds_the_algorithm_change(cli, tmp_path):
    single, sharded = write_logs(tmp_path)
    out_json = tmp_path / "logdiff.json"
    r = tpcheck(cli, "logdiff", str(single), str(sharded), "--json", str(out_json))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "aligned 4 pairs (3 with shapes different by whole factors" in r.stdout
    assert "3 calls: algorithm differs" in r.stdout
    assert re.search(r"A m=64 n=1024 k=32 +B m=64 n=1024 k=8", r.stdout), r.stdout
    assert "A: algoId=21 tile=64x64  (lines 2,3,4)" in r.stdout
    assert "B: algoId=6 splitK=2  (lines 1,2,3)" in r.stdout
    assert f"{sharded}:5: truncated" in r.stderr, r.stderr
    report = json.loads(out_json.read_text())
    assert report["schema"] == "tpcheck.logdiff/1"
    assert [g["count"] for g in report["groups"]] == [3]
    group = report["groups"][0]
    assert (group["a"]["k"], group["b"]["k"]) == (32, 8)
    assert (group["a"]["cublaslt"]["algo_id"], group["b"]["cublaslt"]["split_k"]) == (21, 2)
    assert report["b_log"]["malformed_lines"] == 1


def test_logdiff_same_algorithms(cli, tmp_path):
    single, _ = write_logs(tmp_path)
    r = tpcheck(cli, "logdiff", str(single), str(single))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every aligned call ran the same algorithm" in r.stdout


def test_logdiff_input_errors(cli, tmp_path):
    single, _ = write_logs(tmp_path)
    r = tpcheck(cli, "logdiff", str(single), str(tmp_path / "missing.log"))
    assert r.returncode == 2
    assert "missing.log" in r.stderr
    # --query: exit 2 in a build without CUDA, 3 on a machine without a GPU; either way
    # a message that says what it needs, never a crash.
    r = tpcheck(cli, "logdiff", str(single), str(single), "--query")
    assert r.returncode in (2, 3), r.stdout + r.stderr
    assert "--query" in r.stderr and ("CUDA" in r.stderr or "GPU" in r.stderr), r.stderr


def test_logdiff_log_without_matmul_lines(cli, tmp_path):
    # A log with no [Trace][cublasLt*Matmul] line (written at the wrong level, or by a
    # program that ran no GEMM) has nothing to compare: an input error that names the
    # file, not "every aligned call ran the same algorithm".
    single, _ = write_logs(tmp_path)
    empty = tmp_path / "no_matmuls.log"
    empty.write_text("[2026-11-30][cublasLt][1][Api][cublasLtCreate] handle=0x1\nhello\n")
    out_json = tmp_path / "logdiff.json"
    for a, b in ((single, empty), (empty, single), (empty, empty)):
        r = tpcheck(cli, "logdiff", str(a), str(b), "--json", str(out_json))
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{empty}: no cuBLASLt matmul call" in r.stderr, r.stderr
        assert "CUBLASLT_LOG_LEVEL" in r.stderr, r.stderr
        assert "same algorithm" not in r.stdout, r.stdout
        assert not out_json.exists(), "a JSON comparison was written for an input error"


FAKE_PROGRAM = textwrap.dedent("""
    # A stand-in for a CUDA program: writes cuBLASLt-style lines into the log file the
    # CUBLASLT_LOG_FILE pattern names (%i = its pid), from itself and one child process.
    import os, subprocess, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fake_lines import trace_line
    assert os.environ["CUBLASLT_LOG_LEVEL"] == "2", os.environ.get("CUBLASLT_LOG_LEVEL")
    assert "CUBLASLT_LOG_MASK" not in os.environ
    role, k, algo = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    path = os.environ["CUBLASLT_LOG_FILE"].replace("%i", str(os.getpid()))
    with open(path, "w") as f:
        f.write(trace_line(os.getpid(), 64, 1024, k, algo) * 2)
        if role == "parent":
            f.write("[2026-11-30][cublasLt][1][Trace][cublasLtMatmul] A=0X1 Adesc=[type=R_32F\\n")
    print(f"{role} pid {os.getpid()}", flush=True)
    if role == "parent":
        subprocess.run([sys.executable, __file__, "child", str(k), str(algo)], check=True)
        sys.exit(3)
""")


def run_trace(cli, tmp_path, name, k, algo):
    (tmp_path / "fake_lines.py").write_text(inspect.getsource(trace_line))
    (tmp_path / "fake_program.py").write_text(FAKE_PROGRAM)
    out = tmp_path / name
    r = tpcheck(cli, "trace", "--out", str(out), "--", sys.executable,
                str(tmp_path / "fake_program.py"), "parent", str(k), str(algo), cwd=tmp_path)
    return r, out


def test_trace_writes_one_log_per_process_and_a_ledger(cli, tmp_path):
    r, out = run_trace(cli, tmp_path, "tp1", 32, 21)
    assert r.returncode == 0, r.stdout + r.stderr
    pids = sorted(int(p) for p in re.findall(r"(?:parent|child) pid (\d+)", r.stdout))
    assert len(pids) == 2, r.stdout
    assert "the program exited with status 3" in r.stdout
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["schema"] == "tpcheck.trace/1"
    assert ledger["exit_status"] == 3
    assert ledger["command"][-3:] == ["parent", "32", "21"]
    assert ledger["environment"]["variables"]["CUBLASLT_LOG_LEVEL"] == "2"
    assert [p["pid"] for p in ledger["processes"]] == pids
    assert [p["gemm_count"] for p in ledger["processes"]] == [2, 2]
    assert ledger["gemm_count"] == 4
    gemm = ledger["processes"][0]["gemms"][0]
    assert (gemm["m"], gemm["n"], gemm["k"], gemm["dtypes"]) == (64, 1024, 32, ["f32"] * 3)
    assert gemm["cublaslt"]["algo_id"] == 21
    assert gemm["cublaslt"]["compute_type"] == "32F_FAST_TF32"
    # The parent's truncated third line: reported with its line number, skipped.
    malformed = [p["malformed_lines"] for p in ledger["processes"]]
    assert sorted(len(m) for m in malformed) == [0, 1]
    assert [m[0]["line"] for m in malformed if m] == [3]
    assert re.search(r"process \d+: 2 GEMMs", r.stdout)
    assert re.search(r"2 × m=64 n=1024 k=32", r.stdout), r.stdout
    assert "class unknown (--query on the GPU)" in r.stdout


def test_trace_input_errors(cli, tmp_path):
    r = tpcheck(cli, "trace", "--out", str(tmp_path / "t"), "--", "/no/such/program")
    assert r.returncode == 2
    assert "/no/such/program" in r.stderr
    r = tpcheck(cli, "trace", "--level", "3", "--", "true")
    assert r.returncode == 2
    assert "--level" in r.stderr


def test_diff_two_traces(cli, tmp_path):
    r1, tp1 = run_trace(cli, tmp_path, "tp1", 32, 21)
    r2, tp4 = run_trace(cli, tmp_path, "tp4", 8, 6)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    same = tpcheck(cli, "diff", str(tp1 / "ledger.json"), str(tp1 / "ledger.json"))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "no change" in same.stdout
    d = tpcheck(cli, "diff", str(tp1 / "ledger.json"), str(tp4 / "ledger.json"))
    assert d.returncode == 1, d.stdout + d.stderr
    assert "command: " in d.stdout
    assert "2 calls: algorithm differs" in d.stdout
    assert re.search(r"A m=64 n=1024 k=32 +B m=64 n=1024 k=8", d.stdout), d.stdout


def test_diff_run_reports(cli, tmp_path):
    a = tmp_path / "a.json"
    r = tpcheck(cli, "run", "--suite", "te", "--tp", "2", "--filter", r"^Linear\.row\.sp1\.default$", "--json", str(a))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(a.read_text())
    same = tpcheck(cli, "diff", str(a), str(a))
    assert same.returncode == 0 and "no change" in same.stdout, same.stdout
    # Another machine, another verdict: both reported.
    case_id = report["cases"][0]["id"]
    report["environment"]["devices"] = "1 x NVIDIA H200"
    report["cases"][0]["verdicts"]["truth"] = {"status": "fail", "reason": "made up"}
    b = tmp_path / "b.json"
    b.write_text(json.dumps(report))
    d = tpcheck(cli, "diff", str(a), str(b))
    assert d.returncode == 1, d.stdout + d.stderr
    assert "environment devices: " in d.stdout and "→ 1 x NVIDIA H200" in d.stdout
    assert f"case {case_id}: truth verdict pass → fail (made up)" in d.stdout, d.stdout
    # A run report against a trace ledger, or not JSON: input errors.
    _, tp1 = run_trace(cli, tmp_path, "tp1", 32, 21)
    mixed = tpcheck(cli, "diff", str(a), str(tp1 / "ledger.json"))
    assert mixed.returncode == 2 and "cannot compare" in mixed.stderr, mixed.stderr
    (tmp_path / "bad.json").write_text("{not json")
    bad = tpcheck(cli, "diff", str(a), str(tmp_path / "bad.json"))
    assert bad.returncode == 2 and "is not JSON" in bad.stderr, bad.stderr


# Real logs recorded on the H200 (tests/data/cublaslt/README.md says how).
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "cublaslt")


def data(name):
    path = os.path.join(DATA, name)
    assert os.path.exists(path), f"{path} is missing"
    return path


@pytest.mark.parametrize("tp,calls", [(1, 72), (2, 90)])
def test_real_logs_level5_and_level2_hold_the_same_calls(cli, tp, calls):
    # Level 5 adds an Api line per call; the matmul lines (and cuBLASLt's choices for the
    # same run) are the same, though two rank threads interleave differently per run.
    r = tpcheck(cli, "logdiff", data(f"tpcheck_tp{tp}_level5.log"), data(f"tpcheck_tp{tp}_level2.log"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{calls} matmul calls\nB = " in r.stdout
    assert f"aligned {calls} pairs (0 with shapes different by whole factors" in r.stdout
    assert "warning" not in r.stderr, r.stderr  # every line of a real log parses


def test_real_logs_tpcheck_tp1_vs_tp2(cli):
    # TP 2 doubles the tokens (--seq is per rank) and shards: the attention products at
    # TP 2 (16 x 32 x 32, 64 batches) run TF32 HMMA algo 21 where TP 1 (16 x 16 x 16) ran
    # algo 55, and split-K choices change on the projections.
    r = tpcheck(cli, "logdiff", data("tpcheck_tp1_level2.log"), data("tpcheck_tp2_level2.log"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "A = " in r.stdout and ": 72 matmul calls" in r.stdout and ": 90 matmul calls" in r.stdout
    assert re.search(r"A m=16 n=16 k=16 batch=64 +B m=16 n=32 k=32 batch=64\n"
                     r" +A: algoId=55 tile=32x32 stages=8x3  \(lines 3,15\)\n"
                     r" +B: algoId=21 tile=64x64 stages=32x6  \(lines 3,15\)", r.stdout), r.stdout
    assert re.search(r"A m=192 n=256 k=64 +B m=192 n=512 k=64\n"
                     r" +A: algoId=21 tile=64x64 stages=16x6 splitK=5 reduction=COMPUTE_TYPE", r.stdout)
    assert "warning" not in r.stderr, r.stderr


@pytest.mark.parametrize("dtype,a_algo,b_algo", [
    ("f32", "algoId=55 tile=256x64 stages=8x3", "algoId=55 tile=64x128 stages=8x3"),
    ("tf32", "algoId=43 tile=256x128 stages=32xAUTO cluster=1x1x1 splitK=-1 reduction=COMPUTE_TYPE",
     "algoId=43 tile=128x128 stages=32xAUTO cluster=1x2x1 splitK=-1 reduction=COMPUTE_TYPE"),
    ("bf16", "algoId=66 tile=256x128 stages=64xAUTO customOption=7 cluster=1x2x1",
     "algoId=66 tile=128x128 stages=64xAUTO customOption=1 cluster=2x1x1"),
])
def test_real_logs_pytorch_column_split(cli, dtype, a_algo, b_algo):
    # F.linear (bias epilogue) and x @ w.t() at the fc1 shape and one rank's half of it.
    r = tpcheck(cli, "logdiff", data(f"torch_{dtype}_tp1.log"), data(f"torch_{dtype}_tp2.log"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "aligned 2 pairs (2 with shapes different by whole factors" in r.stdout
    assert re.search(r"A m=4096 n=1024 k=1024 +B m=2048 n=1024 k=1024", r.stdout), r.stdout
    assert f"A: {a_algo}  (lines 29)" in r.stdout, r.stdout
    assert f"B: {b_algo}  (lines 29)" in r.stdout, r.stdout
