"""tests/python/test_emulate_devices.py — what a rank of `tpcheck emulate` sees of the GPUs
(the start-up hook's device_count mapping) and the `tpcheck` backend per device type
(c10d's _get_backend, _coalescing_manager(device=cuda)), on the CPU: what
TransformerEngine's run_numerics.py asks of the launch before its first collective.

In process (~1 s): the mapping's rule, the hook's torch.cuda patches applied to a stand-in
module (device_count, set_device, get_device_properties, torch.cuda.device), the group's
answers. Three launches of emulate_workers/devices.py (~6 s each): CPU ranks (device_id
dropped), stand-in GPUs (TPCHECK_EMULATE_PHYSICAL_GPUS, the GPUs the hook takes as
present), and a failing check that fails every rank the way run_numerics.py does on N GPUs.
"""

import datetime
import importlib.util
import os
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

import tpcheck  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "emulate_workers", "devices.py")


def load_hook():
    path = os.path.join(os.path.dirname(tpcheck.__file__), "emulate", "_hook", "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("tpcheck_emulate_hook_devices", path)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


def test_the_mapping_rule():
    hook = load_hook()
    # (G GPUs present, N local ranks) -> device_count() in a rank
    assert [hook.logical_count(g, n) for g, n in [(1, 4), (2, 4), (1, 2), (3, 8)]] == [4, 4, 2, 8]
    assert [hook.logical_count(g, n) for g, n in [(4, 4), (8, 4), (8, 1)]] == [4, 8, 8]  # off
    assert hook.logical_count(0, 4) == 0  # CPU ranks: no GPU
    assert [hook.physical_index(i, 1) for i in range(4)] == [0, 0, 0, 0]
    assert [hook.physical_index(i, 2) for i in range(4)] == [0, 1, 0, 1]
    assert [hook.physical_index(i, 8) for i in range(4)] == [0, 1, 2, 3]


def stand_in_cuda(gpus):
    """A stand-in for torch.cuda with `gpus` GPUs: records what reaches it."""
    calls = []

    class device:
        def __init__(self, d):
            self.idx = d if isinstance(d, int) else torch.device(d).index

    m = types.SimpleNamespace(
        device_count=lambda: gpus, device=device, calls=calls,
        set_device=lambda d: calls.append(("set_device", d)),
        get_device_properties=lambda d=None: calls.append(("properties", d)) or f"gpu {d}")
    return m


@pytest.mark.parametrize("gpus,n", [(1, 4), (2, 4), (8, 4)])
def test_hook_patches_torch_cuda_consistently(gpus, n, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(n))
    monkeypatch.delenv("TPCHECK_EMULATE_PHYSICAL_GPUS", raising=False)
    hook = load_hook()
    m = stand_in_cuda(gpus)
    hook._patch_cuda(m)
    assert m.device_count() == max(gpus, n)
    for i in range(m.device_count()):
        m.set_device(i)
        m.set_device(f"cuda:{i}")
        assert m.get_device_properties(i) == f"gpu {i % gpus}"
        assert m.get_device_properties(torch.device("cuda", i)) == f"gpu {i % gpus}"
        assert m.get_device_properties(f"cuda:{i}") == f"gpu {i % gpus}"
        assert m.device(i).idx == i % gpus and m.device(f"cuda:{i}").idx == i % gpus
        assert hook._map_device(torch.device("cuda", i)) == torch.device("cuda", i % gpus)
    sets = [d for what, d in m.calls if what == "set_device"]
    assert sets == [torch.device("cuda", i % gpus) for i in range(m.device_count()) for _ in range(2)]
    assert m.get_device_properties() == "gpu None"  # the current GPU: torch's own answer


def test_hook_without_gpus_keeps_torch_answers(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.delenv("TPCHECK_EMULATE_PHYSICAL_GPUS", raising=False)
    hook = load_hook()
    m = stand_in_cuda(0)
    hook._patch_cuda(m)
    assert m.device_count() == 0
    assert m.set_device(3) is None and m.calls == []  # a no-op: CPU scripts that call it run
    assert hook._map_device(torch.device("cuda", 3)) is None  # device_id= dropped
    monkeypatch.setenv("TPCHECK_EMULATE_PHYSICAL_GPUS", "two")
    with pytest.raises(ValueError, match="TPCHECK_EMULATE_PHYSICAL_GPUS='two': expected a number"):
        m.device_count()


def test_group_is_its_own_backend_for_cpu_and_cuda():
    import torch.distributed as dist

    from tpcheck.emulate import register_backend
    from tpcheck.emulate.group import TpcheckProcessGroup

    register_backend()
    assert dist.Backend.backend_capability["tpcheck"] == ["cpu", "cuda"]
    pg = TpcheckProcessGroup(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5))
    for d in (torch.device("cpu"), torch.device("cuda"), torch.device("cuda", 3), "cuda", "cpu", 1):
        assert pg._get_backend(d) is pg
    assert pg._get_backend("cuda").supports_splitting is False
    assert pg._get_backend("cuda").supports_tensor_alloc(torch.device("cuda")) is False
    assert pg._device_types == [torch.device("cpu"), torch.device("cuda")]
    with pytest.raises(RuntimeError, match="no backend for device type 'meta'.*serves cpu, cuda"):
        pg._get_backend(torch.device("meta"))
    pg._start_coalescing(torch.device("cuda"))
    with pytest.raises(RuntimeError, match="do not nest"):
        pg._start_coalescing(torch.device("cuda"))
    work = pg._end_coalescing(torch.device("cuda"))
    assert work.wait() and work.is_completed()
    with pytest.raises(RuntimeError, match="device type 'meta'"):
        pg._start_coalescing(torch.device("meta"))


def launch(n, env, *args):
    p = subprocess.run([sys.executable, "-m", "tpcheck", "emulate", "-n", str(n), "--", WORKER, *args],
                       capture_output=True, text=True, timeout=240, env=dict(os.environ, **env))
    return p.returncode, p.stdout, p.stderr


def test_cpu_ranks_see_no_gpu_and_drop_device_id():
    env = {"EXPECT_DEVICE_COUNT": "0", "TPCHECK_EMULATE_PHYSICAL_GPUS": ""}
    rc, out, err = launch(2, env)
    assert rc == 0, out[-3000:] + err[-3000:]
    for r in range(2):
        for what in ("device_count 0", "init_process_group and new_group", "_get_backend cpu and cuda",
                     "_coalescing_manager device=cuda", "_coalescing_manager isend/irecv"):
            assert f"[rank{r}]: OK {what}" in out, out
        assert f"[rank{r}]: ALL OK" in out


def test_ranks_on_fewer_gpus_see_one_per_local_rank():
    """3 ranks on 2 (stand-in) GPUs: device_count() is 3, run_numerics.py's assert holds, and
    new_group(device_id=cuda:r) reaches c10d as cuda:(r mod 2)."""
    env = {"EXPECT_DEVICE_COUNT": "3", "TPCHECK_EMULATE_PHYSICAL_GPUS": "2"}
    rc, out, err = launch(3, env)
    assert rc == 0, out[-3000:] + err[-3000:]
    for r in range(3):
        assert f"[rank{r}]: OK device_count 3" in out and f"[rank{r}]: OK new_group with device_id" in out
        assert f"[rank{r}]: ALL OK" in out


def test_a_failing_check_fails_like_it_does_on_n_gpus():
    """run_numerics.py's _check_outputs: one rank's check fails, the flags are max-reduced,
    every rank's assert fails. On N GPUs under torchrun: the message on the failing rank,
    an AssertionError traceback on every rank, exit status 1."""
    env = {"EXPECT_DEVICE_COUNT": "2", "TPCHECK_EMULATE_PHYSICAL_GPUS": "1"}
    rc, out, err = launch(2, env, "--fail-rank", "1")
    assert rc == 1, out[-3000:] + err[-3000:]
    assert "[rank1]: NUMERICAL CHECK FAILED: outputs not close enough" in err
    assert "[rank1]: AssertionError" in err
    assert "ALL OK" not in out
    assert "tpcheck emulate: rank" in err and "exited with status 1" in err
