"""tpcheck.trace() on a machine without a GPU.

cuBLASLt only logs a matmul that runs, which needs a GPU; here a stand-in library is
compiled that exports the two logger entry points trace() uses
(cublasLtLoggerSetFile, cublasLtLoggerSetLevel) and a fake_matmul() that writes a line
recorded from the real cuBLASLt 13.1 on an H200 (tests/data/cublaslt) to the logger's
file when the level allows it, as cuBLASLt does. It is named libcublasLt.so.* so that
trace() finds it in /proc/self/maps like PyTorch's copy. In a CUDA build the real
libcublasLt (linked by tpcheck's module) is mapped too, so trace() also sets and resets
the real library's logger here (host-side calls; no matmul runs). The GPU machine's
script traces a real PyTorch matmul (tests/gpu/run.sh, stage python).
"""

import json
import os
import shutil
import subprocess

import pytest

import tpcheck
from tpcheck import _trace

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "cublaslt")

STUB_C = r"""
#include <stdio.h>
static FILE* log_file = 0;
static int log_level = 0;
int cublasLtLoggerSetFile(FILE* file) { log_file = file; return 0; }
int cublasLtLoggerSetLevel(int level) {
  if (level < 0 || level > 5) return 7; /* CUBLAS_STATUS_INVALID_VALUE */
  log_level = level;
  return 0;
}
int current_level(void) { return log_level; }
void fake_matmul(const char* line) {
  if (log_level >= 2 && log_file) { fputs(line, log_file); fputc('\n', log_file); }
}
"""


def recorded_matmul_line(algo_id=None):
    """The first cublasLtMatmul line of tpcheck's TP 1 log (algo 21, TF32 HMMA at 64x64)."""
    with open(os.path.join(DATA, "tpcheck_tp1_level2.log"), encoding="utf-8") as f:
        line = next(l.rstrip("\n") for l in f if "[Trace][cublasLtMatmul]" in l)
    assert "algoId=21 " in line
    return line if algo_id is None else line.replace("algoId=21 ", f"algoId={algo_id} ")


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in cuBLASLt")
    d = tmp_path_factory.mktemp("stub")
    (d / "stub.c").write_text(STUB_C)
    lib = d / "libcublasLt.so.99"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(d / "stub.c")], check=True)
    import ctypes
    handle = ctypes.CDLL(str(lib))
    handle.fake_matmul.argtypes = [ctypes.c_char_p]
    return handle, str(lib)


def test_finds_the_loaded_copy_and_records_its_matmuls(stub, tmp_path):
    lib, path = stub
    assert path in tpcheck.loaded_cublaslt()
    lib.fake_matmul(b"before the block: not recorded")
    with tpcheck.trace(directory=str(tmp_path)) as t:
        assert lib.current_level() == 2
        lib.fake_matmul(recorded_matmul_line().encode())
        lib.fake_matmul(recorded_matmul_line().encode())
    assert lib.current_level() == 0  # logging off again
    lib.fake_matmul(recorded_matmul_line().encode())  # after the block: not recorded

    assert len(t.calls) == 2, t.ledger
    call = t.calls[0]
    # The recorded line: row-major x [256, 64] · W [192, 64]ᵀ, f32 with TF32 compute, bias.
    assert (call["m"], call["n"], call["k"]) == (192, 256, 64)
    assert call["cublaslt"]["algo_id"] == 21
    assert call["cublaslt"]["compute_type"] == "32F_FAST_TF32"
    assert call["cublaslt"]["tile"] == "64x64"
    assert t.problems == []
    assert "21" in t.summary() and "2" in t.summary()
    # The ledger is the one `tpcheck trace` writes: `tpcheck diff` reads it.
    assert t.ledger["schema"] == "tpcheck.trace/1"
    assert any(p["log"].startswith(str(tmp_path)) for p in t.ledger["processes"])


def test_diff_names_the_changed_algorithm(stub, tmp_path):
    lib, _ = stub
    with tpcheck.trace(directory=str(tmp_path / "a")) as a:
        lib.fake_matmul(recorded_matmul_line().encode())
    with tpcheck.trace(directory=str(tmp_path / "b")) as b:
        lib.fake_matmul(recorded_matmul_line(algo_id=55).encode())
    text = a.diff(b, "tp1", "tp2")
    assert "21" in text and "55" in text, text
    assert "no difference" not in text.lower()
    same = a.diff(a)
    assert "55" not in same

    a.save(str(tmp_path / "a.json"))
    b.save(str(tmp_path / "b.json"))
    cli = os.environ.get("TPCHECK_CLI")
    if cli:
        out = subprocess.run([cli, "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                             capture_output=True, text=True)
        assert out.returncode == 1, out.stdout + out.stderr  # 1: something changed
        assert "55" in out.stdout


def test_malformed_lines_are_reported_not_fatal(stub, tmp_path):
    lib, _ = stub
    with tpcheck.trace(directory=str(tmp_path)) as t:
        lib.fake_matmul(recorded_matmul_line().encode())
        lib.fake_matmul(recorded_matmul_line()[:120].encode())  # cut mid-line
    assert len(t.calls) == 1
    assert len(t.problems) == 1 and t.problems[0]["line"] == 2


def test_the_block_raising_still_resets_the_logger(stub, tmp_path):
    lib, _ = stub
    with pytest.raises(KeyError):
        with tpcheck.trace(directory=str(tmp_path)) as t:
            lib.fake_matmul(recorded_matmul_line().encode())
            raise KeyError("user code failed")
    assert lib.current_level() == 0
    assert len(t.calls) == 1


def test_errors(monkeypatch, stub):
    with pytest.raises(ValueError, match="level must be 2"):
        tpcheck.trace(level=3)
    if not tpcheck._tpcheck.built_with_cuda():
        with pytest.raises(ValueError, match="built with CUDA"):
            with tpcheck.trace(query=True):
                pass
    with tpcheck.trace():
        with pytest.raises(RuntimeError, match="cannot be nested"):
            with tpcheck.trace():
                pass
    monkeypatch.setattr(_trace, "loaded_cublaslt", lambda: [])
    with pytest.raises(RuntimeError, match="no libcublasLt is loaded"):
        with tpcheck.trace():
            pass


def test_a_real_pytorch_matmul_on_a_gpu(tmp_path):
    """On a machine with a GPU and PyTorch: the real cuBLASLt's logger, PyTorch's copy."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    x = torch.randn(256, 64, device="cuda")
    w = torch.randn(192, 64, device="cuda")
    b = torch.randn(192, device="cuda")
    # With a bias PyTorch calls cublasLtMatmul itself (its bias epilogue); a plain matmul
    # goes through cuBLAS, which does not log to cuBLASLt's logger (tests/data/cublaslt).
    torch.nn.functional.linear(x, w, b)  # loads cuBLASLt
    torch.cuda.synchronize()
    with tpcheck.trace(directory=str(tmp_path)) as t:
        torch.nn.functional.linear(x, w, b)
        torch.cuda.synchronize()
    assert any(os.path.basename(p).startswith("libcublasLt.so") for p in tpcheck.loaded_cublaslt())
    shapes = {(c["m"], c["n"], c["k"]) for c in t.calls}
    assert (192, 256, 64) in shapes, t.summary()
    assert all(c["cublaslt"]["algo_id"] >= 0 for c in t.calls)
