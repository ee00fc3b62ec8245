"""Stand-ins for TransformerEngine 2.20's Linear and LayerNormMLP, for the CPU tests of the
TE reference (judge/_te_reference.py): real nn.Modules under TE's class names and module
paths, with the attributes TE's __init__ sets (the mapping reads them) and parameters
marked as TE's set_tensor_model_parallel_attributes marks them. Their forward is written
here from TE's documented math in plain torch ops (LayerNorm/RMSNorm over the last dim;
x Wᵀ + b; GELU with tanh; swiglu = silu(a)·b of fc1's two halves), with TE's collectives
(the row-parallel all-reduce) over `tp_group`. TE itself is never imported.

`BUG` = "drop-reduction" makes the row-parallel all-reduce return this rank's partial sum.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

BUG = "none"
_GATED = ("swiglu", "geglu")


class _Store:
    def __init__(self):
        self.delay = False

    def delay_wgrad_compute(self):
        return self.delay


def _mark(p, dim):
    p.tensor_model_parallel, p.partition_dim, p.partition_stride = True, dim, 1
    return p


def _common(m, tp_group, tp_size, bias):
    m.tp_group, m.tp_size, m.sequence_parallel, m.use_bias = tp_group, tp_size, False, bias
    m.return_bias, m.fuse_wgrad_accumulation, m.wgrad_store = False, False, _Store()
    m.symmetric_ar_type, m.primary_weights_in_fp8 = None, False
    for flag in ("ub_overlap_ag_fprop", "ub_overlap_rs_fprop", "ub_overlap_ag_dgrad",
                 "ub_overlap_rs_dgrad", "ub_bulk_dgrad", "ub_bulk_wgrad"):
        setattr(m, flag, False)


def _reduce(y, m):
    if m.tp_size > 1 and BUG != "drop-reduction":
        dist.all_reduce(y, group=m.tp_group)  # TE's row-parallel forward (no autograd: the
    return y                                  # input gradient of a row-parallel GEMM is local)


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, m):
        return _reduce(y.clone(), m)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _CopyToParallel(torch.autograd.Function):
    """Column-parallel input: identity forward, all-reduce of the input gradient backward
    (TE's column-parallel dgrad)."""

    @staticmethod
    def forward(ctx, x, m):
        ctx.m = m
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        if ctx.m.tp_size > 1:
            dist.all_reduce(g, group=ctx.m.tp_group)
        return g, None


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=True, tp_group=None, tp_size=1,
                 parallel_mode=None, params_dtype=torch.float32):
        super().__init__()
        _common(self, tp_group, tp_size, bias)
        self.parallel_mode, self.save_original_input = parallel_mode, False
        self.weight_names, self.bias_names = ["weight"], ["bias"]
        self.in_features = in_features // tp_size if parallel_mode == "row" else in_features
        self.out_features = out_features // tp_size if parallel_mode == "column" else out_features
        self.weight = _mark(torch.nn.Parameter(torch.empty(self.out_features, self.in_features,
                                                           dtype=params_dtype)),
                            1 if parallel_mode == "row" else 0)
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(self.out_features, dtype=params_dtype))
            if parallel_mode == "column":
                _mark(self.bias, 0)

    def forward(self, x, is_first_microbatch=None):
        if self.parallel_mode == "column":
            x = _CopyToParallel.apply(x, self)
        y = x @ self.weight.t()
        if self.parallel_mode == "row":
            y = _AllReduce.apply(y, self)
        return y + self.bias if self.use_bias else y


class LayerNormMLP(torch.nn.Module):
    def __init__(self, hidden_size, ffn_hidden_size, bias=True, normalization="LayerNorm",
                 activation="gelu", eps=1e-5, tp_group=None, tp_size=1, set_parallel_mode=False,
                 params_dtype=torch.float32):
        super().__init__()
        _common(self, tp_group, tp_size, bias)
        self.ub_overlap_ag = self.ub_overlap_rs = False
        self.set_parallel_mode = set_parallel_mode
        self.size_per_partition = ffn_hidden_size // tp_size
        self.activation, self.activation_params = activation, None
        self.normalization, self.eps, self.zero_centered_gamma = normalization, eps, False
        self.return_layernorm_output = self.return_layernorm_output_gathered = False
        self.checkpoint = False
        rows = self.size_per_partition * (2 if activation in _GATED else 1)
        self.hidden = hidden_size
        self.layer_norm_weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=params_dtype))
        if normalization == "LayerNorm":
            self.layer_norm_bias = torch.nn.Parameter(torch.empty(hidden_size, dtype=params_dtype))
        self.fc1_weight = _mark(torch.nn.Parameter(torch.empty(rows, hidden_size, dtype=params_dtype)), 0)
        self.fc2_weight = _mark(torch.nn.Parameter(torch.empty(hidden_size, self.size_per_partition,
                                                               dtype=params_dtype)), 1)
        if bias:
            self.fc1_bias = _mark(torch.nn.Parameter(torch.empty(rows, dtype=params_dtype)), 0)
            self.fc2_bias = torch.nn.Parameter(torch.empty(hidden_size, dtype=params_dtype))

    def forward(self, x, is_first_microbatch=None):
        if self.normalization == "LayerNorm":
            ln = F.layer_norm(x, (self.hidden,), self.layer_norm_weight, self.layer_norm_bias, self.eps)
        else:
            ln = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.layer_norm_weight
        h = _CopyToParallel.apply(ln, self) @ self.fc1_weight.t()
        if self.use_bias:
            h = h + self.fc1_bias
        if self.activation in _GATED:
            a, b = h.chunk(2, dim=-1)
            act = (F.silu(a) if self.activation == "swiglu" else F.gelu(a, approximate="tanh")) * b
        else:
            act = F.gelu(h, approximate="tanh")
        y = _AllReduce.apply(act @ self.fc2_weight.t(), self)
        return y + self.fc2_bias if self.use_bias else y


for _cls, _path in ((Linear, "transformer_engine.pytorch.module.linear"),
                    (LayerNormMLP, "transformer_engine.pytorch.module.layernorm_mlp")):
    _cls.__module__ = _path


def shard_like_te(single, sharded, rank, n):
    """Copies `single`'s full parameters into `sharded`'s local ones the way TE's layout
    holds them: dim-0/1 slices; gated fc1's rank r holds [a_r; b_r]."""
    with torch.no_grad():
        for name, p in sharded.named_parameters():
            full = getattr(single, name)
            if not getattr(p, "tensor_model_parallel", False):
                p.copy_(full)
                continue
            dim = p.partition_dim
            if name.startswith("fc1") and getattr(single, "activation", "") in _GATED:
                a, b = full.chunk(2, dim=0)
                p.copy_(torch.cat([a.chunk(n, 0)[rank], b.chunk(n, 0)[rank]], 0))
            else:
                p.copy_(full.chunk(n, dim=dim)[rank])


class _QKV(torch.nn.Module):
    """MultiheadAttention's QKV projection as TE builds it: a Linear (or, with
    input_layernorm, a LayerNormLinear) with parameters_split query/key/value unless fused."""

    def __init__(self, hidden, rows_q, rows_kv, layernorm, normalization, fused, bias):
        super().__init__()
        _common(self, None, 1, bias)
        self.parallel_mode, self.in_features, self.out_features = None, hidden, rows_q + 2 * rows_kv
        self.normalization, self.eps, self.zero_centered_gamma = normalization, 1e-5, False
        self.return_layernorm_output = self.return_layernorm_output_gathered = False
        e = lambda *s: torch.nn.Parameter(torch.empty(*s))  # noqa: E731
        if layernorm:
            self.layer_norm_weight = e(hidden)
            if normalization == "LayerNorm":
                self.layer_norm_bias = e(hidden)
        if fused:
            self.weight_names = ["weight"]
            self.weight = e(rows_q + 2 * rows_kv, hidden)
            if bias:
                self.bias = e(rows_q + 2 * rows_kv)
        else:
            self.weight_names = ["query_weight", "key_weight", "value_weight"]
            self.query_weight, self.key_weight, self.value_weight = e(rows_q, hidden), e(rows_kv, hidden), e(rows_kv, hidden)
            if bias:
                self.query_bias, self.key_bias, self.value_bias = e(rows_q), e(rows_kv), e(rows_kv)


class _Core(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_dropout = 0.0


class MultiheadAttention(torch.nn.Module):
    """TE 2.20's MultiheadAttention's attributes and parameters (self-attention, sbhd, one
    rank). No forward: only the truth, where the reference stands in, runs it."""

    def __init__(self, hidden, heads, groups=None, input_layernorm=True, normalization="LayerNorm",
                 fuse_qkv_params=False, qkv_weight_interleaved=True, bias=True,
                 attn_mask_type="causal"):
        super().__init__()
        self.attention_type, self.qkv_format, self.softmax_type, self.softcap = "self", "sbhd", "vanilla", 0.0
        self.q_norm = self.k_norm = None
        self.attn_mask_type, self.window_size = attn_mask_type, None
        self.num_attention_heads, self.num_gqa_groups = heads, groups or heads
        self.hidden_size_per_attention_head = hidden // heads
        self.input_layernorm, self.tp_size, self.sequence_parallel = input_layernorm, 1, False
        self.return_bias = self.return_layernorm_output = False
        self.qkv_weight_interleaved = fuse_qkv_params and qkv_weight_interleaved
        d = hidden // heads
        qkv = _QKV(hidden, heads * d, self.num_gqa_groups * d, input_layernorm, normalization,
                   fuse_qkv_params, bias)
        setattr(self, "layernorm_qkv" if input_layernorm else "qkv", qkv)
        self.core_attention = _Core()
        self.proj = Linear(heads * d, hidden, bias=bias)


MultiheadAttention.__module__ = "transformer_engine.pytorch.attention.multi_head_attention"
_QKV.__module__ = "transformer_engine.pytorch.module.layernorm_linear"


class _Norm(torch.nn.Module):
    """TE's LayerNorm / RMSNorm parameters (TransformerLayer's output_layernorm)."""

    def __init__(self, hidden, normalization):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(hidden))
        if normalization == "LayerNorm":
            self.bias = torch.nn.Parameter(torch.empty(hidden))


class TransformerLayer(torch.nn.Module):
    """TE 2.20's TransformerLayer's attributes and parameters (encoder, one rank); no
    forward, as MultiheadAttention's stand-in."""

    def __init__(self, hidden, ffn, heads, groups=None, normalization="LayerNorm",
                 activation="gelu", output_layernorm=False, parallel_attention_mlp=False,
                 apply_residual_connection_post_layernorm=False, fuse_qkv_params=False):
        super().__init__()
        self.layer_type, self.attn_input_format, self.softmax_type = "encoder", "sbhd", "vanilla"
        self.hidden_dropout, self.drop_path = 0.0, None
        self.output_layernorm, self.parallel_attention_mlp = output_layernorm, parallel_attention_mlp
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.self_attn_mask_type, self.window_size = "causal", None
        self.self_attention = MultiheadAttention(
            hidden, heads, groups, input_layernorm=not output_layernorm,
            normalization=normalization, fuse_qkv_params=fuse_qkv_params)
        self.layernorm_mlp = LayerNormMLP(hidden, ffn, normalization=normalization,
                                          activation=activation)
        if output_layernorm:
            self.layernorm = _Norm(hidden, normalization)


TransformerLayer.__module__ = "transformer_engine.pytorch.transformer"
