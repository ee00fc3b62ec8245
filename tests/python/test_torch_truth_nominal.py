"""The rounding probe at each op's real precision (tpcheck.judge._nominal): the nominal
dtype rule op by op, and why it matters — a bf16 block with a float32 island (a LayerNorm
computed as E[x²] − E[x]² in float32 on activations with a large common offset, cast back)
followed by a row-parallel projection whose reduction a planted bug drops. The uniform
probe counted the island's cancelling float32 ops as bf16 roundings: its floor is ~10× the
bug's error and the bug passes; the nominal probe counts them at float32, and the bug
fails while correct sharded code (the same two halves, summed) passes. The truth itself is
checked against float64 written out here.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tpcheck  # noqa: E402
from tpcheck.judge._dispatch import F64TruthMode  # noqa: E402
from tpcheck.judge._nominal import Nominal, coarsest, unit_roundoff  # noqa: E402
from tpcheck.torch import truth  # noqa: E402

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64


# --- the rule, op by op ------------------------------------------------------------------

def _nominal_run(fn, *leaves):
    """fn(*float64 copies of leaves) under a probed truth mode; returns (fn's results, the
    Nominal that tracked them)."""
    nominal = Nominal(real_default=F32)
    wide = [nominal.leaf(t.to(F64), t.dtype) if t.is_floating_point() else t for t in leaves]
    before = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        with F64TruthMode(probe_u=2.0 ** -30, strict=False, nominal=nominal):
            out = fn(*wide)
    finally:
        torch.set_default_dtype(before)
    return out, nominal


def test_unit_roundoff_and_coarsest():
    assert unit_roundoff(F32) == 2.0 ** -24 and unit_roundoff(BF16) == 2.0 ** -8
    assert unit_roundoff(torch.float16) == 2.0 ** -11 and unit_roundoff(F64) == 2.0 ** -53
    assert coarsest([F32, None, BF16, torch.float16]) == BF16
    assert coarsest([]) is None


def test_nominal_rule_op_by_op():
    x = torch.randn(4, 8, dtype=BF16)
    w = torch.randn(8, dtype=BF16)
    ids = torch.arange(8)

    def fn(x, w, ids):
        h = x.float()                                    # a lifted cast: float32
        sq = h * h                                       # f32 inputs: float32
        back = w * sq                                    # bf16 · f32 (a region's end): bf16
        s = x.sum(-1, dtype=torch.float32)               # a lifted dtype=: float32
        sm = torch.softmax(x, -1, dtype=torch.float32)   # float32
        pos = ids.float()                                # an int cast up: float32
        z = torch.zeros(3)                               # default dtype: the real one
        scaled = h * x[0, 0]                             # a 0-dim bf16 operand: f32
        acc = torch.zeros(4, 8, dtype=torch.bfloat16)    # a lifted factory: bf16
        acc.add_(h)                                      # in place: the written one's, bf16
        view = h.t()                                     # a view: its base's
        return dict(h=h, sq=sq, back=back, s=s, sm=sm, pos=pos, z=z, scaled=scaled, acc=acc,
                    view=view, x=x)

    out, nominal = _nominal_run(fn, x, w, ids)
    want = dict(h=F32, sq=F32, back=BF16, s=F32, sm=F32, pos=F32, z=F32, scaled=F32,
                acc=BF16, view=F32, x=BF16)
    assert {k: nominal.of(v) for k, v in out.items()} == want
    assert all(v.dtype == F64 for v in out.values())
    assert nominal.run_dtype == BF16
    assert nominal.scale(F32) == 2.0 ** -16 and nominal.scale(BF16) == 1.0
    assert nominal.scale(torch.float8_e4m3fn) == 1.0   # coarser than the run: one rounding
    assert nominal.of(torch.ones(2, dtype=F64)) == BF16  # unseen: the run dtype


# --- a bf16 block with a float32 island ----------------------------------------------------

H, OFFSET = 64, 12.0


class IslandBlock(torch.nn.Module):
    """y = w · layernorm(x) (float32, E[x²] − E[x]², cast back), out = y + proj(y)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(H, generator=g))
        self.proj = torch.nn.Linear(H, H, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(0.02 * torch.randn(H, H, generator=g))

    def island(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        mean = h.mean(-1, keepdim=True)
        var = (h * h).mean(-1, keepdim=True) - mean * mean
        n = (h - mean) * torch.rsqrt(var + 1e-5)
        return self.w * n.to(dtype)

    def forward(self, x):
        y = self.island(x)
        return y + self.proj(y)


def _reference(m: IslandBlock, x: torch.Tensor) -> torch.Tensor:
    """The block's math in float64, written out."""
    x, w, p = x.double(), m.w.detach().double(), m.proj.weight.detach().double()
    mean = x.mean(-1, keepdim=True)
    var = (x * x).mean(-1, keepdim=True) - mean * mean
    y = w * (x - mean) / torch.sqrt(var + 1e-5)
    return y + y @ p.T


def _sharded(m: IslandBlock, x: torch.Tensor, drop: bool) -> torch.Tensor:
    """The block at TP 2 in bf16: proj row-parallel (each rank half of the input features,
    its partial sum rounded to bf16, then summed); with drop, rank 0 keeps its partial."""
    with torch.no_grad():
        y = m.island(x)
        half = H // 2
        parts = [y[:, r * half:(r + 1) * half] @ m.proj.weight[:, r * half:(r + 1) * half].T
                 for r in range(2)]
        return y + (parts[0] if drop else parts[0] + parts[1])


def _floor_rms(v) -> float:
    s, em = v.statistics, v.error_model
    return em["unit_roundoff"] * em["reduction_length"] ** 0.5 * \
        (s["truth_rms"] + s["rounding_noise_rms"])


@pytest.fixture(scope="module")
def block():
    m = IslandBlock().to(BF16)
    g = torch.Generator().manual_seed(11)
    x = (OFFSET + torch.randn(16, H, generator=g)).to(BF16)
    return m, x


def test_island_truth_is_the_float64_math(block):
    m, x = block
    t = truth(m, x, backward=False)
    torch.testing.assert_close(t.output, _reference(m, x), rtol=1e-12, atol=1e-12)
    assert t.probe_dtype == "bfloat16"
    assert t.probed["float32"] >= 6 and t.probed["bfloat16"] >= 3   # island ops / the rest


def test_island_probe_catches_the_dropped_reduction(block, monkeypatch):
    m, x = block
    with torch.no_grad():
        single = m(x)
    correct, dropped = _sharded(m, x, False), _sharded(m, x, True)
    t = truth(m, x, backward=False).truth_for("output", tp_size=2)
    good = tpcheck.compare(single, correct, t)
    bug = tpcheck.compare(single, dropped, t)
    assert good.passed, good.reason
    assert not bug.passed, bug.reason

    monkeypatch.setattr(Nominal, "scale", lambda self, dtype: 1.0)  # the uniform probe
    uniform = truth(m, x, backward=False).truth_for("output", tp_size=2)
    old = tpcheck.compare(single, dropped, uniform)
    assert old.passed, "the uniform probe's floor was meant to hide this bug"
    bug_err = bug.statistics["sharded_vs_truth"]["rms"]
    assert _floor_rms(old) > 5 * bug_err > 5 * _floor_rms(bug)


def test_float32_model_probe_unchanged(monkeypatch):
    """In a model run in one dtype every op's scale is 1: the noise is bit for bit the
    uniform probe's."""
    torch.manual_seed(3)
    m = IslandBlock()
    x = OFFSET + torch.randn(8, H)
    dy = torch.randn(8, H)
    a = truth(m, x, grad_output=dy)
    assert set(a.probed) == {"float32"}
    monkeypatch.setattr(Nominal, "scale", lambda self, dtype: 1.0)
    b = truth(m, x, grad_output=dy)
    for k, (_, v) in a.noise.tensors().items():
        assert torch.equal(v, b.noise.tensors()[k][1]), k
