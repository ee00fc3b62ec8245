"""tests/python/test_emulate.py — `python -m tpcheck emulate` and the `tpcheck`
torch.distributed backend (tpcheck.emulate), on the CPU (shared memory).

Launches (each costs ~2 s of torch import per rank, so they are few): every collective of
the issue at TP 4 (nccl-ring order) and TP 3 (rank order) against plain references and an
independent numpy ring (emulate_workers/collectives.py); a Megatron-style column/row
parallel MLP and attention block with and without sequence parallel at TP 1/2/4/8 and DTensor's
parallelize_module at TP 2/4 (emulate_workers/mlp.py); faults (a rank raises, exits,
exits 0 early, is SIGKILLed, calls another collective or size); bad input. The package is
the build tree's (ctest sets PYTHONPATH=build/python).
"""

import json
import os
import re
import subprocess
import shutil
import sys
import time

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "emulate_workers")


def emulate(args, timeout=240, cwd=None):
    cmd = [sys.executable, "-m", "tpcheck", "emulate", *args]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return p.returncode, p.stdout, p.stderr, time.time()


def ok_lines(out, rank):
    return [line.split("OK ", 1)[1] for line in out.splitlines() if line.startswith(f"[rank{rank}]: OK ")]


def assert_all_ok(rc, out, err, n):
    assert rc == 0, f"rc {rc}\n{out[-3000:]}\n{err[-3000:]}"
    for r in range(n):
        assert f"[rank{r}]: ALL OK" in out, f"rank {r} did not finish\n{out[-2000:]}\n{err[-2000:]}"


@pytest.mark.parametrize("n,order", [(4, "nccl-ring"), (3, "rank")])
def test_every_collective(n, order, tmp_path):
    trace = ["--trace", str(tmp_path)] if order == "rank" else []
    rc, out, err, _ = emulate(["-n", str(n), "--comm-order", order, *trace, "--",
                               os.path.join(WORKERS, "collectives.py")])
    assert_all_ok(rc, out, err, n)
    if trace:  # the per-rank ledger of collectives
        for r in range(n):
            recs = [json.loads(line) for line in (tmp_path / f"comm.rank{r}.jsonl").read_text().splitlines()]
            first = recs[0]
            assert first["kind"] == "all_reduce" and first["sig"]["dtypes"] == ["f32"]
            assert first["sig"]["shapes"] == [[17, 61]] and first["bytes"] == 1037 * 4
            assert first["order"] == "rank" and first["algorithm"] == "rank-order"
            assert "collectives.py:" in first["at"]
            assert {"all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier"} <= {x["kind"] for x in recs}
        ledger = json.loads((tmp_path / "ledger.json").read_text())
        assert ledger["schema"] == "tpcheck.emulate/1" and ledger["comm_order"] == "rank"
        assert [len(r["collectives"]) for r in ledger["ranks"]] == [len(recs)] * n
    names = ok_lines(out, 0)
    for want in ("all_reduce sum bf16", "all_reduce avg f16", "all_reduce max f32", "all_reduce min f32",
                 "all_reduce prod bf16", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                 "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all", "all_to_all_single",
                 "barrier", "isend/irecv", "batch_isend_irecv", "coalesced all_reduce [1]",
                 "coalesced all_gather_into_tensor", "funcol.all_reduce", "funcol.all_gather_tensor",
                 "funcol.reduce_scatter_tensor", "funcol.all_to_all_single", "all_reduce async non-contiguous",
                 "DDP"):
        assert want in names, f"{want} not checked: {names}"
    if n % 2 == 0:
        assert "new_group all_reduce" in names
    assert any(s.startswith("refuses sparse") for s in names)
    assert any(s.startswith("refuses fp8") for s in names)
    assert any(s.startswith("refuses bool avg") for s in names)
    assert "send/recv" in ok_lines(out, n - 1)


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp")
    rc, out, err, _ = emulate(["-n", "1", "--", os.path.join(WORKERS, "mlp.py"), str(d)])
    assert_all_ok(rc, out, err, 1)
    return d


@pytest.mark.parametrize("n", [2, 4, 8])
def test_megatron_mlp_and_dtensor(tp1, n):
    args = ["-n", str(n), "--", os.path.join(WORKERS, "mlp.py"), str(tp1)]
    if n in (2, 4):
        args.append("--dtensor")
    rc, out, err, _ = emulate(args)
    assert_all_ok(rc, out, err, n)
    names = ok_lines(out, 0)
    for sp in ("", " SP"):
        for k in ("y", "dx", "dw1", "dw2", "db2"):
            assert f"megatron TP {n}{sp} {k} vs TP 1" in names
    assert f"megatron TP {n} forward bits = ring model" in names
    for sp in ("", " SP"):
        for k in ("y", "dx", "dwq", "dwk", "dwo"):
            assert f"megatron attention TP {n}{sp} {k} vs TP 1" in names
    if n in (2, 4):
        assert f"DTensor TP {n} dw2 vs TP 1" in names


def fault_run(mode, tmp_path):
    rc, out, err, end = emulate(["-n", "2", "--", os.path.join(WORKERS, "faults.py"), mode, str(tmp_path)],
                                timeout=120)
    m = re.search(r"\[rank1\]: FAULT ([0-9.]+)", out)
    assert m, f"no fault marker\n{out}\n{err}"
    assert end - float(m.group(1)) < 10.0, f"took {end - float(m.group(1)):.1f} s to end after the fault"
    for r in range(2):  # no process left
        pid = int((tmp_path / f"pid{r}").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    return rc, out, err


def test_rank_raises(tmp_path):
    rc, out, err = fault_run("raise", tmp_path)
    assert rc == 1
    assert "injected failure in rank 1" in err
    assert "rank 1 exited with status 1" in err
    # rank 0, blocked in all_reduce, names rank 1
    assert re.search(r"\[rank0\]: .*rank 1 exited with status 1 while rank 0 waits in all_reduce", err), err


def test_rank_exits(tmp_path):
    rc, out, err = fault_run("exit", tmp_path)
    assert rc == 3 and "rank 1 exited with status 3" in err


def test_rank_exits_zero_early(tmp_path):
    rc, out, err = fault_run("exit0", tmp_path)
    assert rc == 1
    assert re.search(r"\[rank0\]: .*rank 1 exited \(status 0\) while rank 0 waits in all_reduce", err), err


def test_rank_killed(tmp_path):
    rc, out, err = fault_run("kill", tmp_path)
    assert rc == 128 + 9 and "rank 1 was killed by SIGKILL" in err


def test_mismatched_collectives(tmp_path):
    rc, out, err = fault_run("kind", tmp_path)
    assert rc != 0
    m = re.search(r"mismatched collectives at call #1 .*called (all_reduce|all_gather_into_tensor)\(.*"
                  r"but rank \d called (all_reduce|all_gather_into_tensor)\(", err)
    assert m and m.group(1) != m.group(2), err
    assert "faults.py:" in err  # the call sites


def test_mismatched_sizes(tmp_path):
    rc, out, err = fault_run("size", tmp_path)
    assert rc != 0
    assert "all_reduce(f32[4], op=sum)" in err and "all_reduce(f32[5], op=sum)" in err, err


def test_bad_input(tmp_path):
    rc, out, err, _ = emulate(["-n", "0", "--", "true"])
    assert rc != 0 and "-n 0" in err
    rc, out, err, _ = emulate(["-n", "2"])
    assert rc != 0 and "no command" in err
    rc, out, err, _ = emulate(["-n", "2", "--", "no-such-command-tpcheck"])
    assert rc == 127 and "command not found: no-such-command-tpcheck" in err
    rc, out, err, _ = emulate(["-n", "2", "--", sys.executable, "-c", "print('hello')"])
    assert rc == 1 and "[rank1]: hello" in out
    assert "ranks 0, 1 never initialized the process group" in err
    if shutil.which("nvidia-cuda-mps-control") is None:
        rc, out, err, _ = emulate(["-n", "2", "--mps", "--", sys.executable, "-c", "print('hello')"])
        assert rc == 2 and "--mps: nvidia-cuda-mps-control is not on PATH" in err and out == ""


def test_example_runs():
    """examples/emulate_megatron_mlp.py, as a user runs it (TP 2, sequence parallel, bf16)."""
    ex = os.path.join(HERE, "..", "..", "examples", "emulate_megatron_mlp.py")
    rc, out, err, _ = emulate(["-n", "2", "--", ex, "--sp", "--dtype", "bf16", "--hidden", "64",
                               "--ffn", "256", "--seq", "32"])
    assert rc == 0, out + err
    for name in ("output", "dx", "dw1", "db1", "dw2", "db2"):
        assert re.search(rf"\[rank0\]: {name} +pass", out), out


def test_tf32_investigation_example_runs_on_the_cpu():
    """examples/tf32_investigation.py at TP 2 with --small: on the CPU it must say that TF32
    needs a GPU, still print every section (the worst element under the reference rule,
    the skipped trace, counterfactuals that remove 0 % because there is no TF32 to turn
    off, compare_tp's verdict) and exit 0 (the truth verdict passes)."""
    ex = os.path.join(HERE, "..", "..", "examples", "tf32_investigation.py")
    rc, out, err, _ = emulate(["-n", "2", "--", ex, "--small"])
    assert rc == 0, out + err
    assert "[rank0]: NOTE: TF32 needs a GPU" in out, out
    for section in ("== 1. worst element under the reference rule", "== 2. GEMM sites",
                    "== 3. counterfactuals", "== 4. compare_tp verdict"):
        assert f"[rank0]: {section}" in out, out
    assert re.search(r"\[rank0\]: \w[\w.]*\[\d+(, \d+)?\]: TP 1 \S+, TP 2 \S+", out), out
    assert "skipped: tpcheck.trace() records cuBLASLt" in out
    removed = re.findall(r"\[rank0\]: TF32 off for (.+?): .*: (\d+) % removed", out)
    assert [w for w, _ in removed] == [f"{s} only" for s in (
        "fc1.fwd", "fc2.fwd", "fc2.dgrad", "fc2.wgrad", "fc1.dgrad", "fc1.wgrad")] + ["every GEMM"], out
    assert all(p == "0" for _, p in removed), out
    assert "[rank0]: verdict: PASS" in out, out


def test_program_hands_emulate_to_the_package():
    """`tpcheck emulate ...` (the C++ program) runs `$TPCHECK_PYTHON -m tpcheck emulate ...`
    with the same arguments; an interpreter that cannot start is named."""
    cli = os.environ.get("TPCHECK_CLI")
    if not cli:
        pytest.skip("TPCHECK_CLI (the built tpcheck program) is not set")
    env = dict(os.environ, TPCHECK_PYTHON=sys.executable)
    p = subprocess.run([cli, "emulate", "-n", "2", "--", sys.executable, "-c", "print('hello')"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 1 and "[rank1]: hello" in p.stdout, p.stdout + p.stderr
    assert "ranks 0, 1 never initialized the process group" in p.stderr
    env["TPCHECK_PYTHON"] = "/no/such/python"
    p = subprocess.run([cli, "emulate", "-n", "2", "--", "true"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 2 and "'/no/such/python' could not be started" in p.stderr, p.stderr


def test_refuses_more_ranks_than_memory_allows(tmp_path):
    """Bad input "-n larger than memory allows": refused before any process starts (the
    command would leave a file), exit 2, the figures named. Forced cheaply through the
    per-rank figures' variables; nvidia-smi is a stand-in script printing what the real one
    prints for --query-gpu=index,uuid,memory.free --format=csv,noheader,nounits."""
    marker = tmp_path / "started"
    cmd = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    env = dict(os.environ, TPCHECK_EMULATE_RANK_MEMORY="1T")

    def run(args, env):
        p = subprocess.run([sys.executable, "-m", "tpcheck", "emulate", *args, *cmd],
                           capture_output=True, text=True, timeout=60, env=env)
        assert not marker.exists(), "a rank was started"
        return p.returncode, p.stderr

    rc, err = run(["-n", "4"], env)
    m = re.search(r"-n 4: each rank needs about 1024\.00 GiB of host memory \(a Python process with "
                  r"torch imported.*\); 4 ranks need ([0-9.]+) GiB .*the machine has ([0-9.]+) GiB "
                  r"available \(MemAvailable\)", err)
    assert rc == 2 and m, err
    assert float(m.group(1)) >= 4 * 1024 and float(m.group(2)) < float(m.group(1))

    rc, err = run(["-n", "2"], dict(env, TPCHECK_EMULATE_RANK_MEMORY="lots"))
    assert rc == 2 and "TPCHECK_EMULATE_RANK_MEMORY='lots': expected a size in bytes" in err, err

    # GPUs: 0 has room, 1 has 1000 MiB free; only GPU 1 is visible, so it holds both ranks
    # (rank r → visible GPU r mod 1) at the default 618 MiB of CUDA context each.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-aaaa, 100000'\necho '1, GPU-bbbb, 1000'\n")
    smi.chmod(0o755)
    gpu_env = dict(os.environ, TPCHECK_EMULATE_RANK_MEMORY="0", CUDA_VISIBLE_DEVICES="1",
                   PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    rc, err = run(["-n", "2"], gpu_env)
    assert rc == 2, err
    assert ("-n 2: each rank that uses CUDA needs about 0.60 GiB of GPU memory for its CUDA context "
            "(an estimate;") in err, err
    assert ("rank r runs on GPU r mod 1, so GPU 1 (GPU-bbbb) would hold 2 ranks: 1.21 GiB, it has "
            "0.98 GiB free (nvidia-smi memory.free)") in err, err
    # Both visible (by UUID): ranks 0 and 2 go to GPU 0, rank 1 to GPU 1, which has no room
    # for one rank of 1 GiB.
    rc, err = run(["-n", "3"], dict(gpu_env, CUDA_VISIBLE_DEVICES="GPU-aaaa,GPU-bbbb",
                                    TPCHECK_EMULATE_RANK_GPU_MEMORY="1G"))
    assert rc == 2 and "so GPU 1 (GPU-bbbb) would hold 1 rank: 1.00 GiB" in err, err


PLAIN_TORCHRUN = """
import os
import torch, torch.distributed as dist
import tpcheck.torch  # the judging side: registers no backend
said = []
try:
    dist.init_process_group("tpcheck")
except Exception as e:  # noqa: BLE001
    said.append("not registered")
import tpcheck.emulate
tpcheck.emulate.register_backend()
dist.init_process_group("tpcheck")
t = torch.full((5,), float(dist.get_rank() + 1), dtype=torch.bfloat16)
dist.all_reduce(t)
said.append(f"{dist.get_backend()} {t.tolist()}")
with open(f"rank{os.environ['RANK']}", "w") as f:
    f.write("; ".join(said))
dist.destroy_process_group()
"""


def test_plain_torchrun_registers_the_backend_explicitly(tmp_path):
    """docs/EMULATE.md's use without the launcher: importing tpcheck.torch registers nothing;
    tpcheck.emulate.register_backend() does, and each rank removes its files at exit."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_TORCHRUN)
    before = {f for f in os.listdir("/dev/shm") if f.startswith("tpcheck-nojob-")} \
        if os.path.isdir("/dev/shm") else set()
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(script)], capture_output=True, text=True,
                       timeout=240, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(2):
        said = (tmp_path / f"rank{r}").read_text()
        assert said == "not registered; tpcheck [3.0, 3.0, 3.0, 3.0, 3.0]", said
    if os.path.isdir("/dev/shm"):
        assert {f for f in os.listdir("/dev/shm") if f.startswith("tpcheck-nojob-")} <= before
