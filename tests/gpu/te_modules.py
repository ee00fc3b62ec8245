"""TransformerEngine's own modules against tpcheck's layers on the same parameters and
inputs (issue 43 items 2 and 3; tests/gpu/run.sh's `te` stage runs it as part `modules`).

  python3 tests/gpu/te_modules.py [--out FILE.json] [--tokens 32] [--seed 7]

For each configuration below, one TE module on one GPU (no tensor parallelism), in float32
(TF32 GEMMs, TE's default) and, for some, bfloat16, and with the quantized recipes TE
runs on Hopper (RECIPES: one step under `te.autocast`; tpcheck's layer with the same
recipe, `layer_run(recipe=...)`); forward and backward with a random output gradient. Beside it, on the same parameters (its state dict under the mapping's
names, `tpcheck.judge._te_mapping.te_layer_spec`), input and output gradient:
  - tpcheck's layer as the suite runs it (`tpcheck.layer_run`, CUDA backend, the same
    dtype, TF32 for float32): the layer docs/LAYERS.md says follows TE;
  - the float64 truth of the TE module (`module_truth`, tpcheck's layer standing in for
    TE's kernels in float64, with its rounding probe: the truth and its noise).
Every tensor TE computed (output, input gradient, each parameter's gradient) is then:
  - bitwise compared with tpcheck's (equal where both ran the same kernels);
  - judged under the truth policy both ways (TE's error against the truth within the
    policy's bound of tpcheck's, and tpcheck's within TE's): the fidelity verdict;
  - measured as the relative RMS error of each against the truth.
What fails: a mapping that reads an option wrongly, or a tpcheck layer whose math is not
TE's, moves a tensor by far more than the policy's multiplier; rounding does not.
Exit status 0 when every tensor of every configuration passes both ways.

Needs TE importable (tests/gpu/run.sh sources the bundle's env.sh) and the tpcheck wheel.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional

import torch

# (name, TE class, constructor keywords). hidden 64, out / ffn 96 or 128. Each runs in
# float32; those in BF16 also in bfloat16.
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
BF16 = ("Linear, bias", "LayerNormLinear, LayerNorm", "LayerNormMLP, LayerNorm, gelu",
        "LayerNormMLP, RMSNorm, swiglu", "LayerNorm", "MultiheadAttention, LayerNorm, GQA, causal",
        "TransformerLayer, LayerNorm, gelu, GQA")
# The quantized recipes TE runs on Hopper, one step (float32 parameters; every Linear GEMM
# quantized): (recipe, name, TE class, keywords, tokens). Block scaling quantizes in blocks
# of 128 along the features and, for the weight gradient, the tokens: sizes of 128.
RECIPES = [
    (r, name, cls, kw, tokens)
    for r in ("fp8", "fp8_cs")
    for name, cls, kw, tokens in (
        ("Linear, bias", "Linear", dict(in_features=64, out_features=96, bias=True), 32),
        ("LayerNormLinear, LayerNorm", "LayerNormLinear",
         dict(in_features=64, out_features=96, normalization="LayerNorm"), 32),
        ("LayerNormMLP, LayerNorm, gelu", "LayerNormMLP",
         dict(hidden_size=64, ffn_hidden_size=128, normalization="LayerNorm", activation="gelu"), 32))
] + [
    ("fp8_block_scaling", "Linear, bias", "Linear", dict(in_features=128, out_features=128), 128),
    ("fp8_block_scaling", "LayerNormMLP, LayerNorm, gelu", "LayerNormMLP",
     dict(hidden_size=128, ffn_hidden_size=256, normalization="LayerNorm", activation="gelu"), 128),
]


def te_recipe(name):
    """TE's recipe object of tpcheck's recipe name (TE's defaults: the HYBRID format)."""
    from transformer_engine.common import recipe as r
    return {"fp8": r.DelayedScaling, "fp8_cs": r.Float8CurrentScaling,
            "fp8_block_scaling": r.Float8BlockScaling}[name]()


def rel_rms(a, truth: torch.Tensor) -> float:
    a = torch.as_tensor(a).detach().double().cpu()
    truth = torch.as_tensor(truth).double().cpu()
    if a.shape != truth.shape:
        raise ValueError(f"shape {tuple(a.shape)} vs the truth's {tuple(truth.shape)}")
    denom = truth.norm().item()
    return (a - truth).norm().item() / (denom if denom > 0 else 1.0)


def rms(a) -> float:
    t = torch.as_tensor(a).detach().double().cpu()
    return t.norm().item() / max(1, t.numel()) ** 0.5


def run_config(name: str, te_class: str, kwargs: dict, dtype: torch.dtype, tokens: int,
               seed: int, recipe: Optional[str] = None) -> dict:
    import tpcheck
    import transformer_engine.pytorch as te
    from tpcheck.judge import module_truth
    from tpcheck.judge._te_mapping import te_layer_spec

    torch.manual_seed(seed)
    module = getattr(te, te_class)(**kwargs, params_dtype=dtype, device="cuda")
    with torch.no_grad():  # move every parameter off TE's initial 1s and 0s
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 0.5))
    hidden = kwargs.get("in_features", kwargs.get("hidden_size"))
    # [s, b, hidden]: the attention's layout (sbhd); the other layers treat tokens alike
    x = torch.randn(tokens // 2, 2, hidden, device="cuda", dtype=dtype, requires_grad=True)
    start = time.perf_counter()
    with te.autocast(enabled=recipe is not None,
                     recipe=te_recipe(recipe) if recipe is not None else None):
        y = module(x)
    y = y[0] if isinstance(y, tuple) else y
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.cuda.synchronize()
    te_seconds = time.perf_counter() - start
    te_out = {"output": y.detach(), "input": x.grad.detach(),
              **{k: p.grad.detach() for k, p in module.named_parameters()}}

    spec = te_layer_spec(module)
    state = {k: v.detach() for k, v in module.state_dict().items() if not k.endswith("_extra_state")}
    start = time.perf_counter()
    run = tpcheck.layer_run(spec.kind, spec.options, spec.to_tpcheck(state), x.detach(),
                            grad_output=dy.detach(), dtype=dtype, device="cuda", tf32=True,
                            recipe=recipe)
    ours_seconds = time.perf_counter() - start
    ours = spec.to_te({"output": run.output, **run.input_grads, **run.grads})
    module.zero_grad(set_to_none=True)
    start = time.perf_counter()
    truth = module_truth(module, x.detach(), grad_output=dy.detach())
    truth_seconds = time.perf_counter() - start
    # quantized runs: the floor models the float32 accumulation, the quantization error is
    # in each run's own error (docs/QUANTIZATION.md, "Judging quantized runs")
    math = "tf32" if dtype == torch.float32 and recipe is None else None

    tensors = {}
    for k, t_te in te_out.items():
        if k not in ours:
            raise KeyError(f"tpcheck's layer has no {k!r} (it has {sorted(ours)})")
        # tpcheck's values are its run's dtype's, held in float64: exact in the dtype again
        mine = torch.as_tensor(ours[k]).to(device=t_te.device, dtype=t_te.dtype)
        t = truth.truth_for(k, tp_size=1)
        te_vs_ours = tpcheck.compare(mine, t_te, t, policy="truth", math=math, name=k)
        ours_vs_te = tpcheck.compare(t_te, mine, t, policy="truth", math=math, name=k)
        tensors[k] = {"bitwise_equal": bool(torch.equal(t_te, mine)),
                      "te_within_tpcheck": te_vs_ours.passed, "tpcheck_within_te": ours_vs_te.passed,
                      "reasons": [v.reason for v in (te_vs_ours, ours_vs_te) if not v.passed],
                      "rel_rms_te": rel_rms(t_te, t.value), "rel_rms_tpcheck": rel_rms(mine, t.value)}
    # A tensor that is zero in exact arithmetic (the attention's key-bias gradient: softmax
    # ignores a shift of every score in a row) has a truth of rounding size, so its relative
    # error says nothing; the truth policy judges it by its noise floor. Left out of the
    # worst relative RMS, counted apart.
    truth_rms = {k: rms(truth.truth_for(k).value) for k in tensors}
    zero = sorted(k for k, v in truth_rms.items() if v < 1e-9 * max(truth_rms.values()))
    ok = all(v["te_within_tpcheck"] and v["tpcheck_within_te"] for v in tensors.values())
    sized = {k: v for k, v in tensors.items() if k not in zero}
    return {"name": name, "te_class": te_class, "recipe": recipe or "none",
            "dtype": str(dtype).replace("torch.", ""),
            "kwargs": kwargs, "tpcheck_layer": spec.kind, "tpcheck_options": spec.options,
            "tensors": tensors, "ok": ok, "reduction_length": truth.reduction_length,
            "bitwise_equal": sum(v["bitwise_equal"] for v in tensors.values()),
            "zero_in_exact_arithmetic": zero,
            "worst_rel_rms_te": max(v["rel_rms_te"] for v in sized.values()),
            "worst_rel_rms_tpcheck": max(v["rel_rms_tpcheck"] for v in sized.values()),
            "te_seconds": te_seconds, "tpcheck_seconds": ours_seconds,
            "truth_seconds": truth_seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="JSON file for every figure")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    import transformer_engine

    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, te_class, kwargs in CONFIGS:
            if dtype == torch.bfloat16 and name not in BF16:
                continue
            try:
                r = run_config(name, te_class, kwargs, dtype, args.tokens, args.seed)
            except Exception as e:  # one configuration's error is its row, not the end of the run
                r = {"name": name, "te_class": te_class, "dtype": str(dtype), "kwargs": kwargs,
                     "ok": False, "error": f"{type(e).__name__}: {e}"}
            results.append(r)
    for recipe, name, te_class, kwargs, tokens in RECIPES:
        try:
            r = run_config(name, te_class, kwargs, torch.float32, tokens, args.seed, recipe)
        except Exception as e:  # one configuration's error is its row, not the end of the run
            r = {"name": name, "te_class": te_class, "dtype": "float32", "recipe": recipe,
                 "kwargs": kwargs, "ok": False, "error": f"{type(e).__name__}: {e}"}
        results.append(r)
    print("| TE module | dtype | recipe | tensors | bitwise equal | truth policy both ways | "
          "worst rel. RMS vs truth, TE / tpcheck | K |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['name']} | {r['dtype']} | {r.get('recipe', 'none')} | "
                  f"ERROR {r['error'][:300]} | | | | |")
            continue
        n = len(r["tensors"])
        both = sum(v["te_within_tpcheck"] and v["tpcheck_within_te"] for v in r["tensors"].values())
        bad = [k for k, v in r["tensors"].items() if not (v["te_within_tpcheck"] and v["tpcheck_within_te"])]
        print(f"| {r['name']} | {r['dtype']} | {r['recipe']} | {n} | {r['bitwise_equal']} | {both}/{n}"
              f"{' FAIL ' + str(bad[:4]) if bad else ''} | {r['worst_rel_rms_te']:.2e} / "
              f"{r['worst_rel_rms_tpcheck']:.2e}"
              f"{' (not ' + ', '.join(r['zero_in_exact_arithmetic']) + ': zero truth)' if r['zero_in_exact_arithmetic'] else ''}"
              f" | {r['reduction_length']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"transformer_engine": transformer_engine.__version__,
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                       "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                       "results": results}, f, indent=1)
    n_ok = sum(r["ok"] for r in results)
    print(f"TE modules vs tpcheck's layers: {n_ok} of {len(results)} configurations pass the "
          "truth policy both ways")
    return 0 if n_ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
