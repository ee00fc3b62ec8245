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

What is left out of the comparison, and why: each case's `replicated_state` (the ranks'
quantizer state compared, which the older program did not report; the probe does not
touch it); the wall-clock fields (each case's `seconds`,
the environment's `date`), the environment's `devices` (what the build and machine offer:
a CUDA build writes another sentence), its `cpu_gemm_library` (the CPU core OpenBLAS
detected, a name: the same build names SkylakeX on one VM of this kind and Cooperlake on
another with every figure equal bit for bit) and its `cpu_gemm_fingerprint` (checked first,
below).

The figures are those of the OpenBLAS kernels that ran, and OpenBLAS picks its kernels by
CPU at run time: on a machine whose sgemm rounds differently, every figure differs in its
last bits although the probe is right. So the golden carries the fingerprint of the
kernels that wrote it (`tpcheck run`'s environment.cpu_gemm_fingerprint: a hash of
sgemm/dgemm results at the suite's shapes), and a machine with another fingerprint skips
the comparison with a message naming both, never decided by the CPU's name. Where the
fingerprints agree, every figure must agree.

Regenerate (the reports from a build of the older code, the fingerprint from a current
build on the same machine):
    TPCHECK_CLI=path/to/old/tpcheck python tests/python/test_probe_golden.py --write \
        build/tpcheck
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


# A tiny run whose environment gives this machine's GEMM fingerprint.
FINGERPRINT_RUN = ["--suite", "te", "--tp", "2", "--filter", r"^Linear\.row\.sp0\.default$"]


def stripped(report):
    """The report without its wall-clock and machine-description fields (see above)."""
    env = report.get("environment", {})
    for key in ("date", "devices", "cpu_gemm_library", "cpu_gemm_fingerprint"):
        env.pop(key, None)
    for case in report.get("cases", []):
        case.pop("seconds", None)
        case.pop("replicated_state", None)
    return report


def canonical(report):
    """One text per report: sorted keys, one value per line. Python writes the shortest
    text that reads back as the same double, so equal text is equal bits."""
    return json.dumps(report, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def run_report(cli, args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        r = subprocess.run([cli, "run", "--backend", "cpu", *args, "--json", out, "--quiet"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode in (0, 1), f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def run_json(cli, args):
    return stripped(run_report(cli, args))


def gemm_kernels(cli):
    """(fingerprint, library) of this machine's CPU GEMMs, as the program reports them."""
    env = run_report(cli, FINGERPRINT_RUN)["environment"]
    return env["cpu_gemm_fingerprint"], env["cpu_gemm_library"]


@pytest.fixture(scope="module")
def golden():
    with lzma.open(GOLDEN, "rt", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def same_kernels(cli, golden):
    """Skips (with both fingerprints) where this machine's sgemm/dgemm round differently
    from those that wrote the golden."""
    here, library = gemm_kernels(cli)
    if here != golden["cpu_gemm_fingerprint"]:
        pytest.skip(f"this machine's OpenBLAS kernels round differently from the golden's "
                    f"(fingerprint {here}, {library}; the golden's "
                    f"{golden['cpu_gemm_fingerprint']}, {golden['cpu_gemm_library']}): its "
                    "figures cannot match bit for bit; regenerate the golden on this machine "
                    "(see the module's docstring) to check the probe here")


def test_golden_covers_every_run(golden):
    assert sorted(golden["reports"]) == sorted(RUNS)


def test_fingerprint_is_deterministic(cli):
    """Two processes on one machine give one fingerprint (else the check above means
    nothing), and it is 16 hex digits."""
    a, b = gemm_kernels(cli)[0], gemm_kernels(cli)[0]
    assert a == b
    assert len(a) == 16 and int(a, 16) >= 0


@pytest.mark.parametrize("name", sorted(RUNS))
def test_json_is_the_golden(cli, golden, same_kernels, name):
    want = canonical(stripped(golden["reports"][name]))
    got = canonical(run_json(cli, RUNS[name]))
    if got != want:
        diff = difflib.unified_diff(want.splitlines(), got.splitlines(), "golden", "now",
                                    lineterm="", n=8)
        lines = list(diff)
        pytest.fail(f"{name}: the JSON differs from the golden ({len(lines)} diff lines); "
                    "the first:\n" + "\n".join(lines[:80]))


def write_golden(old_cli, current_cli):
    """The older program's reports, with the fingerprint of the kernels they ran on (the
    older program does not report it; the current one, on the same machine, does)."""
    fingerprint, library = gemm_kernels(current_cli)
    reports = {name: run_json(old_cli, args) for name, args in RUNS.items()}
    golden = {"cpu_gemm_fingerprint": fingerprint, "cpu_gemm_library": library,
              "reports": reports}
    with lzma.open(GOLDEN, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        json.dump(golden, f, sort_keys=True, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes), fingerprint {fingerprint}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--write":
        sys.exit(__doc__)
    write_golden(os.environ["TPCHECK_CLI"], sys.argv[2])
