"""tpcheck.torch.truth on the code real models are made of, against references written
here without tpcheck:

- precision casts (a Llama-style RMSNorm computing in float32, RoPE's `.float()` of its
  frequencies and positions, a softmax with dtype=float32, a bf16 round trip, an autocast
  region): the truth keeps float64 through them and equals the same math written as a
  plain float64 module, its gradients float64 central differences; each lift is listed
  with its op, dtype, module and line of this file;
- the module is run, not copied: one that cannot be deep-copied (it holds an object that
  refuses to be, as a process group does) has a truth, and its parameters, their .grad and
  requires_grad, its buffers (BatchNorm's running statistics, an int counter its forward
  bumps), its forward and torch's RNG state are bit for bit what they were;
- kernels without float64 (a torch.library custom op, an autograd.Function, a module
  type): a TruthRunError naming the kernel, the module and the fix; with a registered
  reference, the truth of the plain float64 module; the shipped references (apex's norms,
  flash-attn's attention) against torch's own LayerNorm, RMSNorm and
  scaled_dot_product_attention, and wired through stand-in packages.
"""

from __future__ import annotations

import copy
import math
import sys
import types

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from tpcheck.judge import register_reference, unregister_reference  # noqa: E402
from tpcheck.judge._reference_kernels import apex_layer_norm, apex_rms_norm, flash_attention  # noqa: E402
from tpcheck.torch import TruthRunError, truth  # noqa: E402

HERE = __file__


def _line(marker: str) -> int:
    """The line of this file that carries `marker` (where a lift must point)."""
    with open(HERE, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith(marker):
                return i
    raise AssertionError(marker)


def _finite_difference_check(m64, x, dy, t, samples=3):
    """t's input and parameter gradients against central differences of Σ m64(x)·dy, m64
    a float64 module with no cast (forward calls only, no autograd)."""
    x64 = x.double()
    gen = torch.Generator().manual_seed(0)

    def loss():
        with torch.no_grad():
            return float((m64(x64) * dy.double()).sum())
    targets = [("input", x64, t.input_grads["input"])]
    targets += [(k, p, t.grads[k]) for k, p in m64.named_parameters() if p.requires_grad]
    for name, tensor, grad in targets:
        flat = tensor.data.view(-1)
        for i in torch.randint(flat.numel(), (samples,), generator=gen).tolist():
            old, h = float(flat[i]), 1e-6
            flat[i] = old + h
            up = loss()
            flat[i] = old - h
            down = loss()
            flat[i] = old
            fd = (up - down) / (2 * h)
            assert abs(fd - float(grad.view(-1)[i])) <= 1e-6 * max(1.0, abs(fd)), (name, i, fd)


# --- 1. a truth through precision casts ------------------------------------------------

class CastingRMSNorm(torch.nn.Module):
    """Llama's RMSNorm: computes in float32 whatever its input's dtype."""

    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(h))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)  # lift: norm
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class CastingBlock(torch.nn.Module):
    """RMSNorm → rotary-style scaling (frequencies and positions cast to float32) → one
    attention head with a float32 softmax → a bf16 round trip of the output projection's
    input → residual, plus a float32-accumulated mean."""

    def __init__(self, h=8):
        super().__init__()
        self.norm = CastingRMSNorm(h)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(h, h) for _ in range(4))
        self.register_buffer("inv_freq", 1.0 / 100 ** (torch.arange(0, h, 2).float() / h),
                             persistent=False)

    def forward(self, x):
        s, h = x.shape
        pos = torch.arange(s)
        freqs = self.inv_freq[:, None].float() @ pos[None, :].float()  # lift: rope
        rot = torch.cat([freqs.t(), freqs.t()], dim=-1).cos().to(x.dtype)
        n = self.norm(x)
        q, k, v = self.q(n) * rot, self.k(n) * rot, self.v(n)
        p = torch.softmax(q @ k.t() / math.sqrt(h), dim=-1, dtype=torch.float32)  # lift: softmax
        a = (p.to(x.dtype) @ v).to(torch.bfloat16).to(x.dtype)  # lift: bf16
        return x + self.o(a) + x.mean(-1, keepdim=True, dtype=torch.float32).to(x.dtype)  # lift: mean


class PlainBlock(torch.nn.Module):
    """CastingBlock's math with no cast: in its parameters' dtype throughout."""

    def __init__(self, h=8):
        super().__init__()
        self.norm = torch.nn.Module()
        self.norm.weight = torch.nn.Parameter(torch.ones(h))
        self.q, self.k, self.v, self.o = (torch.nn.Linear(h, h) for _ in range(4))
        self.register_buffer("inv_freq", 1.0 / 100 ** (torch.arange(0, h, 2).float() / h),
                             persistent=False)

    def forward(self, x):
        s, h = x.shape
        freqs = self.inv_freq[:, None] * torch.arange(s, dtype=x.dtype)[None, :]
        rot = torch.cat([freqs.t(), freqs.t()], dim=-1).cos()
        n = self.norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        q, k, v = self.q(n) * rot, self.k(n) * rot, self.v(n)
        p = torch.softmax(q @ k.t() / math.sqrt(h), dim=-1)
        return x + self.o(p @ v) + x.mean(-1, keepdim=True)


def _plain_twin(m: CastingBlock) -> PlainBlock:
    plain = PlainBlock()
    plain.load_state_dict(m.state_dict())
    plain.inv_freq = m.inv_freq.clone()
    return plain.double()


def test_the_truth_keeps_float64_through_casts_and_lists_them():
    torch.manual_seed(11)
    m = CastingBlock()
    x, dy = torch.randn(6, 8), torch.randn(6, 8)
    t = truth(m, x, grad_output=dy)
    plain = _plain_twin(m)
    x64 = x.double().requires_grad_(True)
    y = plain(x64)
    y.backward(dy.double())
    assert t.output.dtype == torch.float64
    torch.testing.assert_close(t.output, y.detach(), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(t.input_grads["input"], x64.grad, rtol=1e-12, atol=1e-13)
    for k, p in plain.named_parameters():
        torch.testing.assert_close(t.grads[k], p.grad, rtol=1e-12, atol=1e-13, msg=k)
    _finite_difference_check(_plain_twin(m), x, dy, t)
    where = {(r["module"], r["where"]) for r in t.lifted}
    for marker, module in (("# lift: norm", "norm"), ("# lift: rope", "<CastingBlock>"),
                           ("# lift: softmax", "<CastingBlock>"), ("# lift: bf16", "<CastingBlock>"),
                           ("# lift: mean", "<CastingBlock>")):
        assert (module, f"{HERE}:{_line(marker)} in forward") in where, (marker, t.lifted)
    assert {r["dtype"] for r in t.lifted} == {"float32", "bfloat16"}
    assert all(r["op"].startswith("aten.") and r["count"] >= 1 for r in t.lifted)
    # the single (float32) run is untouched: its softmax and bf16 round trip do round
    with torch.no_grad():
        assert not torch.equal(m(x).double(), t.output)


def test_strict_keeps_the_refusal_with_the_place():
    torch.manual_seed(11)
    rope = f"test_torch_truth_casts.py:{_line('# lift: rope')} in forward"
    with pytest.raises(TruthRunError, match=r"aten\._to_copy produced a torch.float32 result .*"
                                            r"in module <CastingBlock> \(.*" + rope):
        truth(CastingBlock(), torch.randn(6, 8), strict=True, probe=False)


class Autocast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.tanh(self.lin(x)).float()


def test_an_autocast_region_runs_in_float64():
    torch.manual_seed(3)
    m, x = Autocast(), torch.randn(4, 8)
    t = truth(m, x, grad_output=torch.ones(4, 8), probe=False)
    lin64 = copy.deepcopy(m.lin).double()
    assert torch.equal(t.output, torch.tanh(lin64(x.double())).detach())
    assert m(x).dtype == torch.float32 and not torch.equal(m(x), torch.tanh(m.lin(x)))  # bf16 GEMM


# --- 2. a truth that does not copy the module ------------------------------------------

class Unpicklable:
    """Stands for what a Megatron module holds: a process group, a stream, an RNG tracker."""

    def __deepcopy__(self, memo):
        raise TypeError("cannot pickle 'TpcheckProcessGroup' object")

    def __reduce__(self):
        raise TypeError("cannot pickle 'TpcheckProcessGroup' object")


class Held(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.group = Unpicklable()
        self.fc1 = torch.nn.Linear(6, 10)
        self.bn = torch.nn.BatchNorm1d(10)
        self.drop = torch.nn.Dropout(0.25)
        self.fc2 = torch.nn.Linear(10, 6)
        self.fc2.bias.requires_grad_(False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls += 1
        return self.fc2(self.drop(torch.tanh(self.bn(self.fc1(x)))))


def _state(m: torch.nn.Module) -> dict:
    out = {}
    for k, p in m.named_parameters():
        out[k] = (p.detach().clone(), p.dtype, p.requires_grad, type(p),
                  None if p.grad is None else p.grad.clone())
    for k, b in m.named_buffers():
        out["buffer " + k] = b.clone()
    out["rng"] = torch.get_rng_state()
    out["dict"] = sorted(m.__dict__)
    out["training"] = [s.training for s in m.modules()]
    out["hooks"] = [(len(s._forward_hooks), len(s._forward_pre_hooks)) for s in m.modules()]
    return out


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_module_that_cannot_be_copied_has_a_truth_and_is_left_as_it_was():
    torch.manual_seed(4)
    m = Held()
    with pytest.raises(TypeError, match="cannot pickle"):
        copy.deepcopy(m)
    m.fc1.weight.grad = torch.full_like(m.fc1.weight, 7.0)  # a gradient from before
    m.register_forward_hook(lambda mod, inp, out: None)
    x, dy = torch.randn(5, 6), torch.randn(5, 6)
    before = _state(m)
    t = truth(m, x, grad_output=dy, rng_seed=9)  # training mode: dropout and batch statistics
    after = _state(m)
    assert before.keys() == after.keys()
    for k in before:
        assert _same(before[k], after[k]), k
    assert t.output.dtype == torch.float64 and set(t.grads) == {"fc1.weight", "fc1.bias",
                                                                 "bn.weight", "bn.bias", "fc2.weight"}
    again = truth(m, x, grad_output=dy, rng_seed=9)  # the same seed draws the same masks
    assert torch.equal(again.output, t.output)
    last = _state(m)
    assert all(_same(before[k], last[k]) for k in before)


def test_the_truth_without_a_copy_is_the_plain_float64_computation():
    torch.manual_seed(5)
    m = Held().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    x, dy = torch.randn(5, 6), torch.randn(5, 6)
    t = truth(m, x, grad_output=dy)
    w = {k: v.detach().double().requires_grad_(True) for k, v in m.state_dict().items()
         if v.is_floating_point()}
    x64 = x.double().requires_grad_(True)
    h = F.linear(x64, w["fc1.weight"], w["fc1.bias"])
    h = (h - w["bn.running_mean"]) / torch.sqrt(w["bn.running_var"] + m.bn.eps) * w["bn.weight"] + w["bn.bias"]
    y = F.linear(torch.tanh(h), w["fc2.weight"], w["fc2.bias"])
    y.backward(dy.double())
    torch.testing.assert_close(t.output, y.detach(), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(t.input_grads["input"], x64.grad, rtol=1e-12, atol=1e-13)
    for k in t.grads:
        torch.testing.assert_close(t.grads[k], w[k].grad, rtol=1e-12, atol=1e-13, msg=k)


# --- 3. kernels without float64 --------------------------------------------------------

@torch.library.custom_op("tpcheck_judge_cast_test::double_f32_only", mutates_args=())
def _double_f32_only(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float64:
        raise NotImplementedError("\"double_f32_only\" not implemented for 'Double'")
    return x * 2


class Kernel(torch.nn.Module):
    def forward(self, x):
        return _double_f32_only(x)


class FusedScale(torch.autograd.Function):
    """A fused kernel's autograd.Function: its 'kernel' refuses float64, as pybind's do."""

    @staticmethod
    def forward(ctx, x, w):
        if x.dtype == torch.float64:
            raise TypeError("fused_scale_fwd(): incompatible function arguments")
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).sum(0)


class FusedNorm(torch.nn.Module):
    """A module whose kernel refuses float64 (TransformerEngine's, apex's)."""

    def __init__(self, h):
        super().__init__()
        self.shape = (h,)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(h))
        self.bias = torch.nn.Parameter(0.1 * torch.randn(h))

    def forward(self, x):
        if x.dtype == torch.float64:
            raise TypeError("layernorm_fwd(): incompatible function arguments")
        return F.layer_norm(x, self.shape, self.weight, self.bias, 1e-5)


class Kernels(torch.nn.Module):
    def __init__(self, h=4):
        super().__init__()
        self.lin = torch.nn.Linear(h, h)
        self.kernel = Kernel()
        self.scale = torch.nn.Parameter(torch.randn(h))
        self.norm = FusedNorm(h)

    def forward(self, x):
        return self.norm(FusedScale.apply(self.kernel(self.lin(x)), self.scale))


def _plain_kernels(p: dict, shape: tuple, x: torch.Tensor) -> torch.Tensor:
    """Kernels' math in plain torch ops on the parameters `p`."""
    h = F.linear(x, p["lin.weight"], p["lin.bias"]) * 2 * p["scale"]
    return F.layer_norm(h, shape, p["norm.weight"], p["norm.bias"], 1e-5)


@pytest.fixture
def references():
    """Registers the three references for a test, and removes them after it."""
    targets = []

    def add(target, fn):
        register_reference(target, fn)
        targets.append(target)
    yield add
    for target in targets:
        unregister_reference(target)


def test_each_kernel_without_float64_is_named_with_its_module_and_the_fix(references):
    torch.manual_seed(6)
    m, x = Kernels(), torch.randn(3, 4)
    with pytest.raises(TruthRunError, match=r"tpcheck_judge_cast_test\.double_f32_only failed in the "
                                            r"float64 run .*in module kernel .*register_reference"):
        truth(m, x, probe=False)
    references(torch.ops.tpcheck_judge_cast_test.double_f32_only, lambda x: x * 2)
    with pytest.raises(TruthRunError, match=r"failed in module <Kernels>, in autograd.Function "
                                            r".*FusedScale: TypeError: fused_scale_fwd.*register_reference"):
        truth(m, x, probe=False)
    references(FusedScale, lambda x, w: x * w)
    with pytest.raises(TruthRunError, match=r"failed in module norm: TypeError: layernorm_fwd\(\).*"
                                            r"register_reference"):
        truth(m, x, probe=False)
    references(FusedNorm, lambda mod, x: F.layer_norm(x, mod.shape, mod.weight, mod.bias, 1e-5))
    dy = torch.randn(3, 4)
    t = truth(m, x, grad_output=dy)
    params = {k: p.detach().double().requires_grad_(True) for k, p in m.named_parameters()}
    x64 = x.double()
    y = _plain_kernels(params, m.norm.shape, x64)
    y.backward(dy.double())
    torch.testing.assert_close(t.output, y.detach(), rtol=1e-13, atol=1e-13)
    for k, p in params.items():
        torch.testing.assert_close(t.grads[k], p.grad, rtol=1e-12, atol=1e-13, msg=k)
    used = {(r["kind"], r["target"].split(".")[-1].split("::")[-1]) for r in t.references}
    assert used == {("op", "double_f32_only"), ("autograd.Function", "FusedScale"),
                    ("module", "FusedNorm")}
    assert "forward" not in m.norm.__dict__ and "apply" not in FusedScale.__dict__


def test_the_shipped_references_against_torch():
    """apex's norms against torch's LayerNorm / RMSNorm, flash-attn's attention against
    scaled_dot_product_attention, all in float64 (masks for SDPA built element by element
    from flash-attn's documented convention: query i sits at key position i + sk - sq)."""
    torch.manual_seed(7)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    ln = torch.nn.LayerNorm(8, dtype=torch.float64)
    fused_ln = types.SimpleNamespace(normalized_shape=(8,), eps=ln.eps, weight=ln.weight,
                                     bias=ln.bias, elementwise_affine=True)
    assert torch.equal(apex_layer_norm(fused_ln, x), ln(x))
    rms = torch.nn.RMSNorm(8, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        rms.weight.uniform_(0.5, 1.5)
    fused_rms = types.SimpleNamespace(normalized_shape=(8,), eps=1e-6, weight=rms.weight)
    torch.testing.assert_close(apex_rms_norm(fused_rms, x), rms(x), rtol=1e-14, atol=1e-15)

    def sdpa(q, k, v, keep=None, scale=None):  # flash layout (b, s, h, d) <-> SDPA's (b, h, s, d)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(1, 2)

    def keep(sq, sk, left, right):
        m = torch.zeros(sq, sk, dtype=torch.bool)
        for i in range(sq):
            for j in range(sk):
                pos = i + sk - sq
                m[i, j] = (right < 0 or j <= pos + right) and (left < 0 or j >= pos - left)
        return m
    q = torch.randn(2, 6, 4, 16, dtype=torch.float64)
    k, v = torch.randn(2, 9, 2, 16, dtype=torch.float64), torch.randn(2, 9, 2, 16, dtype=torch.float64)
    cases = [dict(), dict(causal=True), dict(softmax_scale=0.3),
             dict(window_size=(3, 1)), dict(causal=True, window_size=(2, -1))]
    for kw in cases:
        left, right = kw.get("window_size", (-1, -1))
        if kw.get("causal"):
            right = 0
        mask = keep(6, 9, left, right) if (left >= 0 or right >= 0) else None
        torch.testing.assert_close(flash_attention(q, k, v, **kw),
                                   sdpa(q, k, v, mask, kw.get("softmax_scale")),
                                   rtol=1e-12, atol=1e-13, msg=str(kw))


class _FakeFlashAttnFunc(torch.autograd.Function):
    """flash-attn 2.7's FlashAttnFunc as far as its arguments go; its kernel takes fp16/bf16."""

    @staticmethod
    def forward(ctx, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                alibi_slopes, deterministic, return_softmax, is_grad_enabled):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")


class _FakeFusedLayerNorm(torch.nn.Module):
    """apex's FusedLayerNorm as far as its attributes go; its kernel refuses float64."""

    def __init__(self, h):
        super().__init__()
        self.normalized_shape, self.eps, self.elementwise_affine = (h,), 1e-5, True
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(h))
        self.bias = torch.nn.Parameter(0.1 * torch.randn(h))

    def forward(self, x):
        raise RuntimeError("fused_layer_norm_cuda: expected a CUDA tensor of float or half")


class FlashBlock(torch.nn.Module):
    def __init__(self, h=16, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = _FakeFusedLayerNorm(h)
        self.qkv = torch.nn.Linear(h, 3 * h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        out = _FakeFlashAttnFunc.apply(q, k, v, 0.0, None, True, (-1, -1), 0.0, None, False,
                                       False, True)
        return out.reshape(b, s, h)


def test_the_shipped_references_stand_in_when_their_package_is_imported(monkeypatch):
    torch.manual_seed(8)
    m, x, dy = FlashBlock(), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    with pytest.raises(TruthRunError, match=r"in module norm: RuntimeError: fused_layer_norm_cuda"):
        truth(m, x, probe=False)
    apex = types.ModuleType("apex.normalization.fused_layer_norm")
    apex.FusedLayerNorm = _FakeFusedLayerNorm
    flash = types.ModuleType("flash_attn.flash_attn_interface")
    flash.FlashAttnFunc = _FakeFlashAttnFunc
    monkeypatch.setitem(sys.modules, apex.__name__, apex)
    monkeypatch.setitem(sys.modules, flash.__name__, flash)
    t = truth(m, x, grad_output=dy)
    p = {k: v.detach().double().requires_grad_(True) for k, v in m.named_parameters()}
    x64 = x.double()
    n = F.layer_norm(x64, (16,), p["norm.weight"], p["norm.bias"], 1e-5)
    q, k, v = F.linear(n, p["qkv.weight"], p["qkv.bias"]).view(2, 5, 3, 4, 4).unbind(2)
    y = F.scaled_dot_product_attention(*(a.transpose(1, 2) for a in (q, k, v)),
                                       is_causal=True).transpose(1, 2).reshape(2, 5, 16)
    y.backward(dy.double())
    torch.testing.assert_close(t.output, y.detach(), rtol=1e-12, atol=1e-13)
    for name, param in p.items():
        torch.testing.assert_close(t.grads[name], param.grad, rtol=1e-11, atol=1e-12, msg=name)
    assert {r["target"].rsplit(".", 1)[-1] for r in t.references} == {"_FakeFusedLayerNorm",
                                                                     "_FakeFlashAttnFunc"}
