"""tests/python/test_probe_golden.py — the suite's JSON on the CPU, byte for byte, against a
golden written before the rounding probe moved from the CPU backend's stores into the
backend decorator (issue 31).

The rounding probe multiplies every f64 value the truth run stores by (1 + u·r), r from one
fixed stream; its noise reaches the JSON (each tensor's `rounding_noise`, the truth floor,
the truth verdict's limits). The CPU backend used to perturb inside its own store routine,
in store order; the decorator (make_rounding_probe_backend) perturbs each op's outputs at
the op's boundary. Any difference in which values are perturbed, or in which order they take
the stream's numbers, changes these figures. The golden is the JSON the older code (main at
a109c31, the thread-local probe) wrote for the runs in RUNS.

What is left out of the comparison, and why: the wall-clock fields (each case's `seconds`,
the environment's `date`), the environment's `devices` (what the build and machine offer:
a CUDA build writes another sentence) and its `cpu_gemm_library` (the CPU core OpenBLAS
detected: the same build names SkylakeX on one VM of this kind and Cooperlake on another,
with every figure equal bit for bit, 2026-12-05). Everything else, the environment's
compiler included, is compared as written: the bits are those of this machine's OpenBLAS
kernels, so the golden fails, and must be regenerated from the older code, on a machine
whose OpenBLAS kernels round differently (the first mismatching line says where).

Regenerate (from a build of the older code):
    TPCHECK_CLI=path/to/old/tpcheck python tests/python/test_probe_golden.py --write
The program is found through TPCHECK_CLI, which ctest sets.
Runtime: about 20 s on the shared 2-core machine.
"""

import difflib
import json
import lzma
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "probe_golden.json.xz"

# name → arguments of `tpcheck run` (always --backend cpu). The full suite at TP 2 has every
# layer and option that changes the code; the te subset adds the reference's own matrix
# (RMSNorm and TransformerLayer, sequence parallel); two training steps carry the stream
# across an SGD update (one LayerNorm and one RMSNorm layer, GQA, fused QKV); the recipe
# case runs quantized GEMMs beside the f64 truth. About 300 KB compressed: sizes are kept
# small on purpose (the full suite alone is most of it).
RUNS = {
    "full_tp2": ["--suite", "full", "--tp", "2"],
    "te_tp2_rmsnorm_layer": ["--suite", "te", "--tp", "2", "--filter",
                             r"^(RMSNorm|TransformerLayer)\.sp1\."],
    "full_tp2_steps2_layer": ["--suite", "full", "--tp", "2", "--steps", "2", "--filter",
                              r"^TransformerLayer\.sp1\.f32\.(default|activation=relu\+qkv.*)$"],
    "te_tp2_fp8_steps2": ["--suite", "te", "--tp", "2", "--recipe", "fp8", "--steps", "2",
                          "--filter", r"^LayerNormMLP\.sp1\.default$"],
}


def stripped(report):
    """The report without its wall-clock and machine-description fields (see above)."""
    env = report.get("environment", {})
    env.pop("date", None)
    env.pop("devices", None)
    env.pop("cpu_gemm_library", None)
    for case in report.get("cases", []):
        case.pop("seconds", None)
    return report


def canonical(report):
    """One text per report: sorted keys, one value per line. Python writes the shortest
    text that reads back as the same double, so equal text is equal bits."""
    return json.dumps(report, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def run_json(cli, args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        r = subprocess.run([cli, "run", "--backend", "cpu", *args, "--json", out, "--quiet"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode in (0, 1), f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        with open(out, encoding="utf-8") as f:
            return stripped(json.load(f))


@pytest.fixture(scope="module")
def golden():
    with lzma.open(GOLDEN, "rt", encoding="utf-8") as f:
        return json.load(f)


def test_golden_covers_every_run(golden):
    assert sorted(golden) == sorted(RUNS)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_json_is_the_golden(cli, golden, name):
    want = canonical(stripped(golden[name]))
    got = canonical(run_json(cli, RUNS[name]))
    if got != want:
        diff = difflib.unified_diff(want.splitlines(), got.splitlines(), "golden", "now",
                                    lineterm="", n=8)
        lines = list(diff)
        pytest.fail(f"{name}: the JSON differs from the golden ({len(lines)} diff lines); "
                    "the first:\n" + "\n".join(lines[:80]))


def write_golden(cli):
    reports = {name: run_json(cli, args) for name, args in RUNS.items()}
    with lzma.open(GOLDEN, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        json.dump(reports, f, sort_keys=True, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    write_golden(os.environ["TPCHECK_CLI"])
