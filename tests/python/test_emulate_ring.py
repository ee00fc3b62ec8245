"""tests/python/test_emulate_ring.py — the reductions the `tpcheck` torch.distributed
backend uses (tpcheck.emulate.reduce): `_tpcheck.ring_reduce` over raw buffers, bit for bit
against an independent numpy ring (emulate_ring_ref.py, simulated step by step from NCCL's
algorithm) and against the C++ host model itself (`_tpcheck.ring_model`,
comm/ring_reference); rank order against the numpy formula, with the C++ thread group
(`tpcheck run`'s ranks) held to the same reference. In-process, no launch: fast.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import emulate_ring_ref as ref  # noqa: E402
from tpcheck import _tpcheck  # noqa: E402

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}


def inputs(n, count, fmt, seed):
    g = np.random.default_rng(seed)
    # Mixed magnitudes so that the order of additions shows in the rounding.
    xs = [(g.standard_normal(count) * 10.0 ** g.integers(-3, 3, count)).astype(np.float32)
          for _ in range(n)]
    return [ref.Fmt(fmt).rnd(x) for x in xs]


def as_torch(x, fmt):
    return torch.from_numpy(np.asarray(x, np.float32 if fmt != "f64" else np.float64)).to(TORCH[fmt])


def bits(t):
    t = t.contiguous()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]).numpy()


def ref_bits(x, fmt):
    return bits(as_torch(x, fmt))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("fmt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
def test_all_reduce_matches_numpy_ring(n, fmt, op):
    # Small chunks (64 bytes) so that several full loops and a partial one are exercised.
    for count, chunk in ((1000, 64), (37, 64), (5, 2 << 20)):
        xs = inputs(n, count, fmt, seed=n * 100 + count)
        if op == "prod":
            xs = [ref.Fmt(fmt).rnd(1 + 0.1 * np.tanh(x.astype(np.float32))) for x in xs]
        want = ref.all_reduce(xs, fmt, op, chunk_bytes=chunk)
        ts = [as_torch(x, fmt) for x in xs]
        for r in range(n):
            out = torch.empty_like(ts[0])
            _tpcheck.ring_reduce(ts, out, "all_reduce", op, "nccl-ring", r, 0, chunk)
            np.testing.assert_array_equal(bits(out), ref_bits(want[r], fmt), err_msg=f"rank {r}")
        out = torch.empty_like(ts[0])
        _tpcheck.ring_reduce(ts, out, "all_reduce", op, "rank", 0, 0, chunk)
        np.testing.assert_array_equal(bits(out), ref_bits(ref.rank_order(xs, fmt, op), fmt))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("fmt", ["f64", "f32", "f16", "bf16"])
def test_rank_order_is_f32_accumulation_rounded_once(n, fmt):
    """One meaning of rank order (docs/RUNNING.md): ranks 0, 1, ..., N-1 added in f32 (f64
    for f64), rounded once to the dtype. The backend's CPU reduction (ring_reduce: all_reduce,
    reduce, reduce_scatter) and the C++ thread group that runs `tpcheck run`'s ranks
    (all_reduce, reduce_scatter) against the numpy reference written from that formula."""
    count = 40 * n
    xs = inputs(n, count, fmt, seed=900 + n)
    ts = [as_torch(x, fmt) for x in xs]
    want = ref.rank_order(xs, fmt)
    if fmt in ("f16", "bf16") and n > 2:  # the inputs tell one rounding from one per step
        assert not np.array_equal(ref_bits(want, fmt), ref_bits(ref.rank_order_per_step(xs, fmt), fmt))
    for kind, root in (("all_reduce", 0), ("reduce", n - 1)):
        out = torch.empty_like(ts[0])
        _tpcheck.ring_reduce(ts, out, kind, "sum", "rank", 0, root)
        np.testing.assert_array_equal(bits(out), ref_bits(want, fmt), err_msg=kind)
    for r in range(n):
        out = torch.empty(40, dtype=TORCH[fmt])
        _tpcheck.ring_reduce(ts, out, "reduce_scatter", "sum", "rank", r)
        np.testing.assert_array_equal(bits(out), ref_bits(want[r * 40:(r + 1) * 40], fmt))
    wide = as_torch(want, fmt).double().numpy()
    for r, got in enumerate(_tpcheck.thread_group_reduce("all_reduce", ts, "sum", "rank")):
        np.testing.assert_array_equal(got, wide, err_msg=f"thread group all_reduce, rank {r}")
    for r, got in enumerate(_tpcheck.thread_group_reduce("reduce_scatter", ts, "sum", "rank")):
        np.testing.assert_array_equal(got, wide[r * 40:(r + 1) * 40],
                                      err_msg=f"thread group reduce_scatter, rank {r}")


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("fmt", ["f32", "bf16"])
def test_reduce_scatter_and_reduce_match_numpy_ring(n, fmt):
    xs = inputs(n, 24 * n, fmt, seed=n)
    ts = [as_torch(x, fmt) for x in xs]
    for op in ("sum", "avg", "max"):
        want = ref.reduce_scatter(xs, fmt, op)
        for r in range(n):
            out = torch.empty(24, dtype=TORCH[fmt])
            _tpcheck.ring_reduce(ts, out, "reduce_scatter", op, "nccl-ring", r)
            np.testing.assert_array_equal(bits(out), ref_bits(want[r], fmt))
        for root in range(n):
            out = torch.empty_like(ts[0])
            _tpcheck.ring_reduce(ts, out, "reduce", op, "nccl-ring", 0, root)
            np.testing.assert_array_equal(bits(out), ref_bits(ref.reduce(xs, fmt, op, root), fmt))


@pytest.mark.parametrize("n", [2, 3, 8])
def test_ring_reduce_is_the_host_model(n):
    """The C++ host model (comm/ring_reference, 2 MiB chunks) gives the same bits: one
    definition. At n = 2, 2M + 17 bf16 elements span two loops of 2 x 1M."""
    for fmt, count in (("bf16", (1 << 21) + 17 if n == 2 else 3001), ("f32", 4099)):
        xs = inputs(n, count, fmt, seed=7 + n)
        ts = [as_torch(x, fmt) for x in xs]
        for op in ("sum", "max"):
            model = _tpcheck.ring_model("all_reduce", ts, op)
            out = torch.empty_like(ts[0])
            _tpcheck.ring_reduce(ts, out, "all_reduce", op, "nccl-ring", 0)
            np.testing.assert_array_equal(out.double().numpy(), model[0])
    ts = [as_torch(x, "bf16") for x in inputs(n, 40 * n, "bf16", 3)]
    model = _tpcheck.ring_model("reduce_scatter", ts, "sum")
    for r in range(n):
        out = torch.empty(40, dtype=torch.bfloat16)
        _tpcheck.ring_reduce(ts, out, "reduce_scatter", "sum", "nccl-ring", r)
        np.testing.assert_array_equal(out.double().numpy(), model[r])


def test_ring_segments_follow_the_chunking():
    segs = _tpcheck.ring_segments(1000, 4, "f32", 64)  # C = 16, loop 64
    assert segs[0] == (0, 16, 1) and segs[3] == (48, 64, 0)
    assert segs[-1][1] == 1000
    # Partial last loop: rem = 1000 - 960 = 40, chunk = alignUp(10, 4) = 12.
    assert [s for s in segs if s[0] >= 960] == [(960, 972, 1), (972, 984, 2), (984, 996, 3),
                                               (996, 1000, 0)]


def test_ring_reduce_rejects_bad_input():
    a = torch.zeros(4)
    with pytest.raises(ValueError, match="inputs\\[1\\]"):
        _tpcheck.ring_reduce([a, torch.zeros(5)], torch.zeros(4), "all_reduce", "sum", "nccl-ring", 0)
    with pytest.raises(ValueError, match="reduce op 'xor'"):
        _tpcheck.ring_reduce([a, a], torch.zeros(4), "all_reduce", "xor", "nccl-ring", 0)
    with pytest.raises(ValueError, match="order 'tree'"):
        _tpcheck.ring_reduce([a, a], torch.zeros(4), "all_reduce", "sum", "tree", 0)
    with pytest.raises(ValueError, match="order 'tree'"):
        _tpcheck.thread_group_reduce("all_reduce", [a, a], "sum", "tree")
    with pytest.raises(ValueError, match="op 'prod'"):
        _tpcheck.thread_group_reduce("all_reduce", [a, a], "prod", "rank")


def test_launcher_hook_mappings():
    """What the launcher's start-up hook maps (docs/EMULATE.md's table)."""
    import importlib.util
    import os

    import tpcheck

    path = os.path.join(os.path.dirname(tpcheck.__file__), "emulate", "_hook", "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("tpcheck_emulate_hook", path)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert hook._map_backend(None) == "tpcheck"
    assert hook._map_backend("nccl") == "tpcheck"
    assert hook._map_backend("NCCL") == "tpcheck"
    assert hook._map_backend("gloo") == "gloo"
    assert hook._map_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:tpcheck"
    assert hook._map_device(torch.device("cpu")) == torch.device("cpu")
    gpus = torch.cuda.device_count()
    want = None if gpus == 0 else torch.device("cuda", 5 % gpus)
    assert hook._map_device(torch.device("cuda", 5)) == want
    assert hook._map_device(5) == want


@pytest.mark.parametrize("n", [2, 3, 8])
def test_torch_fold_of_the_cuda_path_is_ring_reduce(n):
    """The CUDA path's torch-op reductions (max, min, product over _tpcheck.ring_segments;
    tpcheck.emulate.reduce.torch_fold) run here on CPU tensors: the same bits as
    ring_reduce, every kind and order. (Sum and average run the device group's kernel:
    tests/gpu.)"""
    from tpcheck.emulate.reduce import torch_fold

    for fmt in ("f32", "bf16", "f16"):
        count = 24 * n + 8 * n  # a multiple of n for reduce_scatter
        xs = inputs(n, count, fmt, seed=40 + n)
        ts = [as_torch(x, fmt) for x in xs]
        for op in ("max", "min", "prod"):
            for order in ("nccl-ring", "rank"):
                for kind, m in (("all_reduce", count), ("reduce_scatter", count // n), ("reduce", count)):
                    rank, root = n - 1, 1 % n
                    want = torch.empty(m, dtype=TORCH[fmt])
                    _tpcheck.ring_reduce(ts, want, kind, op, order, rank, root)
                    got = torch.empty(m, dtype=TORCH[fmt])
                    torch_fold(got, ts, kind, op, order, rank, root)
                    np.testing.assert_array_equal(bits(got), bits(want), err_msg=f"{fmt} {op} {order} {kind}")
    if n == 2:  # two loops of N x 512K f32 elements (2 MiB chunks) and a partial one
        ts = [as_torch(x, "f32") for x in inputs(n, (1 << 20) * 2 + 1000, "f32", seed=5)]
        want = torch.empty_like(ts[0])
        _tpcheck.ring_reduce(ts, want, "all_reduce", "prod", "nccl-ring", 0)
        got = torch.empty_like(ts[0])
        torch_fold(got, ts, "all_reduce", "prod", "nccl-ring", 0, 0)
        np.testing.assert_array_equal(bits(got), bits(want))


def test_split_all_reduce_shares_cover_the_buffer():
    from tpcheck.emulate.reduce import share

    for count in (0, 1, 255, 256, 1000, 1 << 20, 3 * (1 << 20) + 17):
        for n in (1, 2, 3, 8):
            runs = [share(count, n, r) for r in range(n)]
            assert runs[0][0] == 0 and runs[-1][1] == count
            assert all(a[1] == b[0] for a, b in zip(runs, runs[1:])), (count, n, runs)
            assert all(lo % 256 == 0 for lo, _ in runs if lo < count)


def test_ring_fold_cuda_checks_its_arguments():
    with pytest.raises(ValueError, match="ring_fold_cuda: order 'tree' is not nccl-ring or rank"):
        _tpcheck.ring_fold_cuda([0, 0], 0, 4, "f32", 0, 0, 4, 0, 0, order="tree")
    if not _tpcheck.built_with_cuda():
        with pytest.raises(RuntimeError, match="without CUDA"):
            _tpcheck.ring_fold_cuda([0, 0], 0, 4, "f32", 0, 0, 4, 0, 0)
        return
    with pytest.raises(ValueError, match="first rank 2"):
        _tpcheck.ring_fold_cuda([0, 0], 0, 4, "f32", 2, 0, 4, 0, 0)
    with pytest.raises(ValueError, match=r"elements \[2, 6\) are outside the inputs' 4"):
        _tpcheck.ring_fold_cuda([0, 0], 0, 4, "f32", 0, 2, 4, 0, 0)
    with pytest.raises(TypeError, match="dtype f8e4m3"):
        _tpcheck.ring_fold_cuda([0, 0], 0, 4, "f8e4m3", 0, 0, 4, 0, 0)


def test_ipc_buffers_check_their_arguments():
    """The CUDA exchange's own IPC buffers (cuda_ipc.cpp): bad arguments are refused before
    any CUDA call, naming the value."""
    if not _tpcheck.built_with_cuda():
        for call in (lambda: _tpcheck.ipc_open(bytes(64), 0), lambda: _tpcheck.ipc_close(1, 0),
                     lambda: _tpcheck.ipc_free(1, 0), lambda: _tpcheck.cuda_bytes(1, 8, 0)):
            with pytest.raises(RuntimeError, match="without CUDA"):
                call()
        return
    with pytest.raises(ValueError, match="nbytes 0 on GPU 0"):
        _tpcheck.ipc_alloc(0, 0)
    with pytest.raises(ValueError, match="device -1"):
        _tpcheck.ipc_alloc(16, -1)
    with pytest.raises(ValueError, match="a handle of 3 bytes for GPU 0"):
        _tpcheck.ipc_open(b"abc", 0)
    with pytest.raises(ValueError, match="address 0"):
        _tpcheck.ipc_close(0, 0)
    with pytest.raises(ValueError, match="address 0"):
        _tpcheck.ipc_free(0, 0)
    with pytest.raises(ValueError, match="nbytes -1"):
        _tpcheck.cuda_bytes(1, -1, 0)


def test_ipc_alloc_without_a_gpu_names_the_device():
    """No GPU visible: the CUDA error comes back as an exception naming the call and the GPU
    (the CUDA exchange turns it into EmulateError)."""
    if not _tpcheck.built_with_cuda():
        pytest.skip("built without CUDA (test_ipc_buffers_check_their_arguments covers it)")
    if torch.cuda.is_available() or _tpcheck.cuda_devices() > 0:
        pytest.skip("a GPU is visible: ipc_alloc would succeed")
    with pytest.raises(RuntimeError, match=r"ipc_alloc: cuda\w+ failed on GPU 3: "):
        _tpcheck.ipc_alloc(1 << 20, 3)
