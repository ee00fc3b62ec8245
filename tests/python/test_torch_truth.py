"""tpcheck.torch.truth against independent references.

- the probe stream: factors equal the C++ random_math::probe_factor (values printed by a
  program compiled from src/core/random_math.h, 2026-12-04);
- outputs and gradients: float64 central differences of the module's loss Σ out·dy, for
  sampled elements of every input and parameter;
- the rounding noise: deterministic, seed-dependent, and the floor that keeps the truth
  policy fair on a gradient that cancels to ~0 (attention's key bias) where
  torch.testing.assert_close with its defaults fails;
- refusals: a random op without a seed, an FP8 cast and a float32 cast under strict=True,
  an op without a float64 kernel — each naming the op.

tests/python/test_torch_truth_casts.py has the truth through precision casts, the module
left untouched, and the float64 references.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import tpcheck  # noqa: E402
from tpcheck._names import PROBE_U  # noqa: E402
from tpcheck.judge._probe import probe_factor_reference, probe_factors  # noqa: E402
from tpcheck.torch import TruthRunError, truth  # noqa: E402

# random_math::probe_factor(2^-30, seed, counter) as the C++ code computes it
CXX_FACTORS = {(1234, 1): 1.0000000004296499, (1234, 2): 1.0000000001730209,
               (1234, 3): 0.99999999944517926, (1234, 1000): 1.0000000006577243,
               (1234, 123456789): 0.99999999971961107, (7, 5): 0.99999999991141608}


def test_probe_factors_are_the_cxx_stream():
    for (seed, counter), expected in CXX_FACTORS.items():
        assert float(probe_factors(PROBE_U, seed, counter, 1)[0]) == expected
        assert probe_factor_reference(PROBE_U, seed, counter) == expected
    many = probe_factors(PROBE_U, 99, 1, 4096)
    ref = torch.tensor([probe_factor_reference(PROBE_U, 99, c) for c in range(1, 4097)],
                       dtype=torch.float64)
    assert torch.equal(many, ref)
    r = (many - 1) / PROBE_U
    assert r.min() >= -1 and r.max() < 1 and abs(float(r.mean())) < 0.05


def test_the_torch_factors_of_the_gpu_path_equal_the_cxx_ones():
    """_compute_torch (what a GPU runs) against the C++ function (what the CPU runs) and the
    formula in Python integers, with a seed past 2^63 (the int64 wrap and masked shifts)."""
    from tpcheck.judge._probe import _compute, _compute_torch

    for seed, first in ((99, 1), ((1 << 64) - 5, 123456789), (1 << 63, 1 << 40)):
        cxx = _compute(PROBE_U, seed, first, 3000, "cpu")
        assert torch.equal(_compute_torch(PROBE_U, seed, first, 3000, "cpu"), cxx)
        for i in (0, 1, 1234, 2999):
            assert float(cxx[i]) == probe_factor_reference(PROBE_U, seed, first + i)


def test_the_factor_cache_grows_by_its_missing_tail(monkeypatch):
    from tpcheck.judge import _probe as jp

    monkeypatch.setattr(jp, "_cache", {})
    small = jp.probe_factors(PROBE_U, 5, 1, 10).clone()  # fills 1 << 16 positions
    grown = jp.probe_factors(PROBE_U, 5, 70000, 100000)    # past them: appended
    assert jp._cache[(PROBE_U, 5, "cpu")].numel() >= 169999
    assert torch.equal(small, jp._compute(PROBE_U, 5, 1, 10, "cpu"))
    assert torch.equal(grown, jp._compute(PROBE_U, 5, 70000, 100000, "cpu"))


class Block(torch.nn.Module):
    """LayerNorm → Linear → GELU → Linear, with a residual: enough op kinds to matter."""

    def __init__(self, h=6, f=10):
        super().__init__()
        self.norm = torch.nn.LayerNorm(h)
        self.fc1 = torch.nn.Linear(h, f)
        self.fc2 = torch.nn.Linear(f, h)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def _loss_f64(module, x, dy):
    with torch.no_grad():
        return float((module(x) * dy).sum())


def test_gradients_match_central_differences():
    torch.manual_seed(3)
    m = Block()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    x, dy = torch.randn(5, 6), torch.randn(5, 6)
    t = truth(m, x, grad_output=dy, probe=False)
    m64, x64, dy64 = Block().double(), x.double(), dy.double()
    m64.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
    assert torch.equal(t.output, m64(x64).detach())
    h = 1e-6
    gen = torch.Generator().manual_seed(0)
    targets = [("input", x64, t.input_grads["input"])]
    targets += [(k, p, t.grads[k]) for k, p in m64.named_parameters()]
    for name, tensor, grad in targets:
        flat = tensor.data.view(-1)
        for i in torch.randint(flat.numel(), (4,), generator=gen).tolist():
            old = float(flat[i])
            flat[i] = old + h
            up = _loss_f64(m64, x64, dy64)
            flat[i] = old - h
            down = _loss_f64(m64, x64, dy64)
            flat[i] = old
            fd = (up - down) / (2 * h)
            assert abs(fd - float(grad.view(-1)[i])) <= 1e-7 * max(1.0, abs(fd)), (name, i, fd)
    assert t.grads["fc1.weight"].dtype == torch.float64
    assert t.reduction_length == 10 and t.gemm_calls > 0  # the fc2 reduction over f = 10


def test_noise_is_deterministic_seeded_and_first_order():
    torch.manual_seed(0)
    m, x, dy = Block(), torch.randn(5, 6), torch.randn(5, 6)
    a = truth(m, x, grad_output=dy)
    b = truth(m, x, grad_output=dy)
    c = truth(m, x, grad_output=dy, probe_seed=99)
    for k, (_, n) in a.noise.tensors().items():
        assert torch.equal(n, b.noise.tensors()[k][1]), k
        assert not torch.equal(n, c.noise.tensors()[k][1]), k
        scale = a.tensors()[k][1].abs().max()
        # one rounding of every intermediate moves an element by a few times its size
        assert 0 < n.abs().max() < 100 * scale + 1e-12, k


def test_loss_function_and_kwargs():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x, *, scale):
            return self.lin(x) * scale
    torch.manual_seed(0)
    m, x, s = Scaled(), torch.randn(2, 3), torch.randn(2, 3)
    t = truth(m, x, scale=s, loss=lambda y: (y ** 2).sum())
    assert set(t.input_grads) == {"input.0", "input.scale"}
    y = m.double()(x.double(), scale=s.double())
    assert torch.allclose(t.output, y, rtol=0, atol=1e-15)


class KeyBiasAttention(torch.nn.Module):
    """Single-head self-attention with a key bias: softmax ignores a shift of a query's
    scores, so the exact key-bias gradient is zero and its computed value is rounding."""

    def __init__(self, h, heads=2):
        super().__init__()
        self.heads = heads
        self.q = torch.nn.Linear(h, h)
        self.k = torch.nn.Linear(h, h)
        self.v = torch.nn.Linear(h, h)

    def forward(self, x):
        s, h = x.shape
        d = h // self.heads
        q, k, v = (f(x).view(s, self.heads, d).transpose(0, 1) for f in (self.q, self.k, self.v))
        p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1)
        return (p @ v).transpose(0, 1).reshape(s, h)


def _row_parallel_key_run(m, x, dy):
    """The "sharded" f32 run: the key projection computed as two ranks of a row-parallel
    linear would (each half of the hidden dim on its own, partial products summed), the
    rest as the module does; returns the key-bias gradient."""
    s, h = x.shape
    half, d = h // 2, h // m.heads
    w, b = m.k.weight, m.k.bias
    k = (torch.nn.functional.linear(x[:, :half], w[:, :half])
         + torch.nn.functional.linear(x[:, half:], w[:, half:])) + b
    q, v = m.q(x), m.v(x)
    q, k, v = (t.view(s, m.heads, d).transpose(0, 1) for t in (q, k, v))
    p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1)
    y = (p @ v).transpose(0, 1).reshape(s, h)
    return torch.autograd.grad(y, b, dy)[0]


def test_key_bias_gradient_is_judged_fairly():
    torch.manual_seed(5)
    h, s = 16, 256
    m = KeyBiasAttention(h)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0)
    x, dy = torch.randn(s, h) * 3, torch.randn(s, h) * 30
    t = truth(m, x, grad_output=dy)
    kb_truth = t.grads["k.bias"]
    single = torch.autograd.grad(m(x), m.k.bias, dy)[0]
    sharded = _row_parallel_key_run(m, x, dy)
    assert kb_truth.abs().max() < 1e-9 * single.abs().max() * 1e6  # truth cancels (f64 noise)
    assert single.abs().max() > 1e-5  # f32 rounding left a visible value
    with pytest.raises(AssertionError):
        torch.testing.assert_close(sharded, single)  # the reference-style false alarm
    v = tpcheck.compare(single, sharded, kb_truth, reduction_length=t.reduction_length, tp_size=2,
                        rounding_noise=t.noise.grads["k.bias"].contiguous(), name="k.bias")
    assert v.passed, v.reason
    # the floor follows what was summed: it covers single's own rounding error there
    floor = 2.0 ** -24 * math.sqrt(t.reduction_length) * t.noise.grads["k.bias"].abs().max()
    assert floor >= (single.double() - kb_truth).abs().max()
    # and a real bug on the same tensor is still caught: the query-bias gradient wired in
    q_grad = torch.autograd.grad(m(x), m.q.bias, dy)[0]
    bad = tpcheck.compare(single, q_grad.contiguous(), kb_truth, reduction_length=t.reduction_length,
                          tp_size=2, rounding_noise=t.noise.grads["k.bias"].contiguous())
    assert not bad.passed


def test_random_ops_are_refused_by_name_unless_seeded():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.2))
    x = torch.randn(3, 4)
    with pytest.raises(TruthRunError, match=r"random op aten\.\w*(dropout|bernoulli).*rng_seed"):
        truth(m, x, grad_output=torch.randn(3, 4))
    a = truth(m, x, grad_output=torch.ones(3, 4), rng_seed=11)
    b = truth(m, x, grad_output=torch.ones(3, 4), rng_seed=11)
    assert torch.equal(a.output, b.output)
    truth(m.eval(), x, grad_output=torch.ones(3, 4))  # eval: no random op


class _Attention(torch.nn.Module):
    def __init__(self, dropout_p):
        super().__init__()
        self.dropout_p = dropout_p
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 4, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p,
                                                                is_causal=True)


def test_attention_with_dropout_p_zero_is_not_a_random_op():
    """SDPA's kernels are tagged as seeded (they take a dropout_p) but draw nothing at 0."""
    torch.manual_seed(2)
    m, x = _Attention(0.0), torch.randn(2, 4, 8)
    t = truth(m, x, grad_output=torch.ones(2, 2, 4, 4))
    qkv = torch.nn.functional.linear(x.double(), m.qkv.weight.double(), m.qkv.bias.double())
    q, k, v = qkv.view(2, 4, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(t.output, want, rtol=1e-14, atol=1e-15)
    with pytest.raises(TruthRunError, match=r"random op aten\.\w+"):
        truth(_Attention(0.25), x, probe=False)


class Fp8(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.float8_e4m3fn).to(x.dtype) * 2


class F32(torch.nn.Module):
    def forward(self, x):
        return x.float() * 2


def test_strict_refuses_fp8_and_float32_casts_by_name():
    x = torch.randn(4, 4)
    with pytest.raises(TruthRunError, match=r"aten\._to_copy produced an FP8 cast .*in module <Fp8>"):
        truth(Fp8(), x, probe=False, strict=True)
    with pytest.raises(TruthRunError, match=r"aten\._to_copy produced a torch.float32 result"):
        truth(F32(), x, probe=False, strict=True)
    # without strict the casts keep float64: x·2 exactly, the FP8 round trip an identity
    x64 = x.double()
    assert torch.equal(truth(Fp8(), x, probe=False).output, x64 * 2)
    assert torch.equal(truth(F32(), x, probe=False).output, x64 * 2)


@torch.library.custom_op("tpcheck_judge_test::f32_only", mutates_args=())
def _f32_only(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float64:
        raise NotImplementedError("\"f32_only\" not implemented for 'Double'")
    return x * 2


def test_op_without_float64_kernel_is_named():
    class Uses(torch.nn.Module):
        def forward(self, x):
            return _f32_only(x)
    with pytest.raises(TruthRunError, match=r"tpcheck_judge_test\.f32_only failed in the float64 run"):
        truth(Uses(), torch.randn(3), probe=False)


def test_inputs_on_two_devices_are_refused():
    with pytest.raises(tpcheck.InputError, match=r"module and its inputs are on different devices"):
        truth(torch.nn.Linear(2, 2), torch.randn(2, 2, device="meta"))


def test_importing_the_judge_registers_no_backend_and_tpcheck_imports_no_torch():
    import subprocess
    import sys
    code = ("import sys, tpcheck, tpcheck.judge; t = 'torch' in sys.modules; "
            "import tpcheck.torch, torch.distributed as dist; "
            "from tpcheck.judge import compare_tp, module_truth; "
            "print(t, 'tpcheck' in dist.Backend.backend_list, 'tpcheck.emulate' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"], out.stdout + out.stderr
