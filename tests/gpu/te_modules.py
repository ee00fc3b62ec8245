"""TransformerEngine's own modules against tpcheck's float64 truth of the mapped layer
(issue 43 items 2 and 3, their first slice; tests/gpu/run.sh's `te` stage runs it as part
`modules`).

  python3 tests/gpu/te_modules.py [--out FILE.json] [--tokens 32] [--seed 7]

For each configuration below, one TE module on one GPU (no tensor parallelism), float32
parameters and input, forward and backward with a random output gradient:
`tpcheck.judge._te_mapping.te_layer_spec` reads the module, `tpcheck.layer_truth` runs
tpcheck's layer in float64 on the module's own parameters (its state dict under the
mapping's names), and every tensor TE computed (output, input gradient, each parameter's
gradient) is compared with that truth: the relative RMS error ‖te − truth‖ / ‖truth‖.

What can fail: a mapping that reads an option wrongly (a norm's zero-centred gamma, an
activation, a missing bias) or a parameter name it does not know moves a tensor by O(1)
relative to its size; rounding does not. The bound, 1e-2, is above what float32 with TF32
GEMMs (u = 2^-11) can reach at these sizes, √K·u ≈ 5.5e-3 for the longest reduction
(K = 128, the MLP's fc2; the weight gradients sum over 32 tokens; the attention's over
16 keys). An eps read wrongly
(1e-5 for 1e-6 on unit-variance rows moves a norm by about 4.5e-6) is below it and is not
what this catches. Exit status 0 when every tensor of every configuration is within it.

Needs TE importable (tests/gpu/run.sh sources the bundle's env.sh) and the tpcheck wheel.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

BOUND = 1e-2

# (name, TE class, constructor keywords). hidden 64, out / ffn 96 or 128.
CONFIGS = [
    ("Linear, bias", "Linear", dict(in_features=64, out_features=96, bias=True)),
    ("Linear, no bias", "Linear", dict(in_features=64, out_features=96, bias=False)),
    ("LayerNormLinear, LayerNorm", "LayerNormLinear",
     dict(in_features=64, out_features=96, normalization="LayerNorm")),
    ("LayerNormLinear, RMSNorm, zero-centred gamma", "LayerNormLinear",
     dict(in_features=64, out_features=96, normalization="RMSNorm", zero_centered_gamma=True)),
    ("LayerNormMLP, LayerNorm, gelu", "LayerNormMLP",
     dict(hidden_size=64, ffn_hidden_size=128, normalization="LayerNorm", activation="gelu")),
    ("LayerNormMLP, RMSNorm, swiglu", "LayerNormMLP",
     dict(hidden_size=64, ffn_hidden_size=128, normalization="RMSNorm", activation="swiglu")),
    ("LayerNorm", "LayerNorm", dict(hidden_size=64)),
    ("RMSNorm, zero-centred gamma", "RMSNorm", dict(hidden_size=64, zero_centered_gamma=True)),
    ("MultiheadAttention, LayerNorm, GQA, causal", "MultiheadAttention",
     dict(hidden_size=64, num_attention_heads=4, num_gqa_groups=2, input_layernorm=True,
          attention_dropout=0.0)),
    ("MultiheadAttention, fused interleaved QKV, no mask", "MultiheadAttention",
     dict(hidden_size=64, num_attention_heads=4, fuse_qkv_params=True, attn_mask_type="no_mask",
          attention_dropout=0.0)),
    ("TransformerLayer, LayerNorm, gelu, GQA", "TransformerLayer",
     dict(hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_gqa_groups=2,
          hidden_dropout=0.0, attention_dropout=0.0)),
]


def rel_rms(a: torch.Tensor, truth: torch.Tensor) -> float:
    a = a.detach().double().cpu()
    truth = torch.as_tensor(truth).double().cpu()
    if a.shape != truth.shape:
        raise ValueError(f"shape {tuple(a.shape)} vs the truth's {tuple(truth.shape)}")
    denom = truth.norm().item()
    return (a - truth).norm().item() / (denom if denom > 0 else 1.0)


def run_config(name: str, te_class: str, kwargs: dict, tokens: int, seed: int) -> dict:
    import tpcheck
    import transformer_engine.pytorch as te
    from tpcheck.judge._te_mapping import te_layer_spec

    torch.manual_seed(seed)
    module = getattr(te, te_class)(**kwargs, params_dtype=torch.float32, device="cuda")
    with torch.no_grad():  # move every parameter off TE's initial 1s and 0s
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.5))
    hidden = kwargs.get("in_features", kwargs.get("hidden_size"))
    # [s, b, hidden]: the attention's layout (sbhd); the other layers treat tokens alike
    x = torch.randn(tokens // 2, 2, hidden, device="cuda", requires_grad=True)
    start = time.perf_counter()
    y = module(x)
    y = y[0] if isinstance(y, tuple) else y
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.cuda.synchronize()
    te_seconds = time.perf_counter() - start

    spec = te_layer_spec(module)
    state = {k: v.detach().double().cpu() for k, v in module.state_dict().items()
             if not k.endswith("_extra_state")}
    start = time.perf_counter()
    truth = tpcheck.layer_truth(spec.kind, spec.options, spec.to_tpcheck(state),
                                x.detach().double().cpu(), grad_output=dy.detach().double().cpu())
    truth_seconds = time.perf_counter() - start
    errors = {"output": rel_rms(y, truth.output),
              "input gradient": rel_rms(x.grad, truth.input_grads["input"])}
    truth_grads = spec.to_te(truth.grads)
    for pname, p in module.named_parameters():
        if pname not in truth_grads:
            raise KeyError(f"the truth has no gradient for TE's parameter {pname!r} "
                           f"(it has {sorted(truth_grads)})")
        errors[f"grad {pname}"] = rel_rms(p.grad, truth_grads[pname])
    worst = max(errors.values())
    return {"name": name, "te_class": te_class, "kwargs": kwargs, "tpcheck_layer": spec.kind,
            "tpcheck_options": spec.options, "rel_rms": errors, "worst": worst,
            "ok": worst <= BOUND, "te_seconds": te_seconds, "truth_seconds": truth_seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON file for every figure")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    import transformer_engine

    results = []
    for name, te_class, kwargs in CONFIGS:
        try:
            r = run_config(name, te_class, kwargs, args.tokens, args.seed)
        except Exception as e:  # one configuration's error is its row, not the end of the run
            r = {"name": name, "te_class": te_class, "kwargs": kwargs, "ok": False,
                 "error": f"{type(e).__name__}: {e}"}
        results.append(r)
        if "error" in r:
            print(f"{name}: ERROR {r['error']}")
        else:
            figures = ", ".join(f"{k} {v:.2e}" for k, v in r["rel_rms"].items())
            print(f"{name} -> tpcheck {r['tpcheck_layer']}: {'ok' if r['ok'] else 'OVER'} "
                  f"(worst {r['worst']:.2e} vs bound {BOUND:g}; {figures}; truth "
                  f"{r['truth_seconds']:.2f} s)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"transformer_engine": transformer_engine.__version__,
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                       "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "bound": BOUND,
                       "results": results}, f, indent=1)
    n_ok = sum(r["ok"] for r in results)
    print(f"TE modules vs tpcheck's float64 truth: {n_ok} of {len(results)} configurations "
          f"within {BOUND:g}")
    return 0 if n_ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
