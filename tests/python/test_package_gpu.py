"""tests/python/test_package_gpu.py — the Python package on a GPU (skipped without one).

Needs PyTorch with CUDA and a tpcheck built with CUDA (TPCHECK_CUDA=ON). Checks:
zero-copy CUDA tensors (every dtype; the statistics computed on the GPU equal the host
loop's on the same values: counts, maxima and positions exactly, sums to 1e-12), the
caller's current device left alone, the example at two ranks (gloo on the CPU and NCCL
when there are two GPUs), and a torchrun launch of the suite with one rank (two with two
GPUs). The lead runs it on the GPU machine:

    PYTHONPATH=build-cuda/python TPCHECK_CLI=build-cuda/tpcheck \
        python -m pytest -q tests/python/test_package_gpu.py
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tpcheck  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and tpcheck._tpcheck.built_with_cuda()),
    reason="needs a GPU, PyTorch with CUDA and tpcheck built with CUDA")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXACT = ("argmax", "argmax_index", "max_abs_diff", "sharded_value", "single_value",
         "count_over_allclose", "count_bits_differ", "sharded_nan", "single_nan",
         "sharded_inf", "single_inf", "bitwise_equal", "truth_max_abs", "truth_nonfinite")


def _same(a, b):
    # Exactly equal, or NaN on both sides (the f32 case plants a NaN: its max |diff| and
    # norm-wise difference are NaN in both, and NaN != NaN).
    nan = lambda v: isinstance(v, float) and v != v  # noqa: E731
    return a == b or (nan(a) and nan(b))


def _agree(gpu, cpu):
    g, c = gpu.statistics, cpu.statistics
    for k in EXACT:
        assert _same(g.get(k), c.get(k)), (k, g.get(k), c.get(k))
    for k in ("norm_rel_diff", "rel_at_max", "truth_rms"):
        if k in c:
            assert g[k] == pytest.approx(c[k], rel=1e-12, abs=0, nan_ok=True), k
    for run in ("single_vs_truth", "sharded_vs_truth"):
        if run in c:
            assert _same(g[run]["max_abs"], c[run]["max_abs"]) and g[run]["argmax"] == c[run]["argmax"]
            assert g[run]["rms"] == pytest.approx(c[run]["rms"], rel=1e-12, nan_ok=True)
    assert (gpu.passed, gpu.reason) == (cpu.passed, cpu.reason) or gpu.passed == cpu.passed


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16",
                                   "float8_e4m3fn", "float8_e5m2"])
def test_cuda_tensors_statistics_on_the_gpu(dtype):
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(1)
    n = (1 << 22) + 77  # several GPU blocks, a ragged tail
    base = torch.randn(n, generator=g, device="cuda", dtype=torch.float64)
    single = base.to(dt)
    sharded = (base * (1 + 1e-3 * torch.randn(n, generator=g, device="cuda", dtype=torch.float64))).to(dt)
    sharded[12345] = float("nan") if dtype == "float32" else sharded[12345]
    truth = base.contiguous()
    for policy in ("te", "allclose", "bitwise", "truth"):
        if policy == "te" and dtype in ("float64", "float8_e4m3fn", "float8_e5m2"):
            continue  # no reference tolerance: same failing verdict on both sides
        gpu = tpcheck.compare(single, sharded, truth, policy=policy, reduction_length=64,
                              tp_size=1)
        cpu = tpcheck.compare(single.cpu(), sharded.cpu(), truth.cpu(), policy=policy,
                              reduction_length=64, tp_size=1)
        _agree(gpu, cpu)


def test_current_device_and_default_stream_respected():
    torch.cuda.set_device(torch.cuda.device_count() - 1)
    before = torch.cuda.current_device()
    a = torch.randn(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        b = a * 2  # produced on a side stream; DLPack hands it over synchronized
    torch.cuda.current_stream().wait_stream(s)
    v = tpcheck.compare(a, b, policy="allclose", rtol=0, atol=0)
    assert torch.cuda.current_device() == before
    assert v.max_abs_diff == float((b - a).abs().max())


def test_truth_from_cuda_state_dict():
    opts = {"hidden_size": 32, "ffn_hidden_size": 64}
    specs = tpcheck.layer_parameters("LayerNormMLP", opts)
    sd = {k: torch.randn(s, device="cuda") for k, s in specs.items()}
    x = torch.randn(8, 32, device="cuda")
    dy = torch.randn(8, 32, device="cuda")
    on_gpu = tpcheck.layer_truth("LayerNormMLP", opts, sd, x, grad_output=dy)
    on_cpu = tpcheck.layer_truth("LayerNormMLP", opts, {k: v.cpu() for k, v in sd.items()},
                                 x.cpu(), grad_output=dy.cpu())
    np.testing.assert_array_equal(on_gpu.output, on_cpu.output)
    f64_gpu = tpcheck.layer_truth("LayerNormMLP", opts, sd, x, grad_output=dy, device="cuda")
    assert np.linalg.norm(f64_gpu.output - on_cpu.output) <= 1e-12 * np.linalg.norm(on_cpu.output)


def _torchrun(args, nproc):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def test_example_two_ranks():
    r = _torchrun(["examples/tp_layernorm_mlp.py"], 2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "8 passed, 0 failed"
    r = _torchrun(["examples/tp_layernorm_mlp.py", "--bug"], 2)
    assert r.returncode == 1 and "FAIL input grad" in r.stdout, r.stdout + r.stderr
    if torch.cuda.device_count() >= 2:
        r = _torchrun(["examples/tp_layernorm_mlp.py", "--device", "cuda", "--tf32"], 2)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("nproc", [1, 2])
def test_torchrun_launch_of_the_suite(nproc, tmp_path):
    if nproc > torch.cuda.device_count():
        pytest.skip(f"{nproc} ranks need {nproc} GPUs")
    out = tmp_path / "report.json"
    r = _torchrun(["-m", "tpcheck", "run", "--suite", "te", "--tp", str(nproc), "--backend", "cuda",
                   "--filter", "^Linear.column.sp0.default$", "--json", str(out)], nproc)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "1 passed, 0 failed"
    report = json.loads(out.read_text())
    assert report["environment"]["communicator"] == "nccl (one process per GPU, torchrun)"
