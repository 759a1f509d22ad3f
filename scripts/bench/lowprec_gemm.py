"""Low-precision GEMM rates at the model's shapes: bf16 vs fp8 and int8, torch's products vs ours (cuBLASLt).

For each model (124M: d=768; 1.5B: d=1600) and each linear layer of a block (qkv d->3d,
attention out d->d, MLP up d->4d, MLP down 4d->d) at M tokens per batch (default 16384), one
forward product y = x W^T is timed as (operands already quantised unless said otherwise)
  bf16              x @ W^T in bf16 (cuBLAS)
  scaled_mm         torch._scaled_mm, e4m3, one scale each
  scaled_mm_rowwise torch._scaled_mm, e4m3, per-token x per-channel scales
  fp8_lt            ours (tscale::fp8_gemm, cuBLASLt, autotuned), e4m3, one scale each, scales in the epilogue
  fp8_lt_rowwise    ours, per-token x per-channel scales (outer-vector scale mode)
  fp8_lt_fastacc    ours, one scale each, fp8 fast accumulation
  int_mm            torch._int_mm, int8 -> int32 (no scales)
  int8_lt_i32       ours (tscale::int8_gemm_i32), int8 -> int32 (no scales)
  int8_lt           ours (tscale::int8_gemm), per-token x per-channel scales, bf16 out
  int8_cutlass      ours (tscale::int8_scaled_mm_sm90 / _sm80, CUTLASS), the same with the scales in the epilogue
  int8_cutlass_cN   the Hopper kernel's candidate configuration N (built with TSCALE_CUTLASS_CANDIDATES=1;
                    csrc/cutlass/int8_gemm_sm90_candidates.cu), to choose the configuration by measurement
  fp8_percall       what LowPrecLinear does per call: quantize x and W (one scale each) + fp8_mm
  int8_percall      quantize x and W per row + int8_mm (bf16 out)
and the training step of a whole layer (forward + backward) as
  layer_bf16        nn.Linear under bf16 autocast
  layer_RECIPE      LowPrecLinear for each recipe (products through tscale.ops: ours where built)
  layer_RECIPE_torchpath  the same with TSCALE_LOWPREC_GEMM=torch (torch._scaled_mm / torch._int_mm)
Every product is checked once against a float64 reference before it is timed (a failing one is
left out and named in the notes). TFLOP/s counts 2 M N K per product (6 M N K per layer step).
Times come from CUDA events after warm-up (wall time on the CPU, for a smoke run with small --tokens).

Run: python scripts/bench/lowprec_gemm.py [--tokens 16384] [--repeats 20] [--no-write] [--input-grad-shapes]
Merges into docs/bench/lowprec.json (its other parts stay): int8_vs_bf16_gemm_rate_1p5b and
fp8_vs_bf16_gemm_rate_1p5b (bf16 time over the time of OUR raw product on pre-quantised operands,
the faster of int8_cutlass and int8_lt for int8 and fp8_lt for fp8, summed over the four products
of a 1.5B block), the same for 124M, every column's *_vs_bf16_rate_*, layer fwd+bwd ratios, and
every per-shape TFLOP/s.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics, time_per_call  # noqa: E402

from tscale.ops import backend, lowprec  # noqa: E402
from tscale.ops.lowprec import fp8_mm, int8_mm, quantize  # noqa: E402
from tscale.precision import LowPrecLinear, get_recipe  # noqa: E402

MODELS = {"124m": 768, "1p5b": 1600}
LAYERS = {"qkv": (1, 3), "attn_out": (1, 1), "mlp_up": (1, 4), "mlp_down": (4, 1)}  # (K, N) in units of d
# --input-grad-shapes: the one input-gradient product whose shape no forward product has (qkv's dx = dy W,
# contracting 3d into d; attn_out's, mlp_up's and mlp_down's are attn_out's, mlp_down's and mlp_up's forward
# shapes); timed as products only and left out of the block totals
INPUT_GRAD_LAYERS = {"qkv_dgrad": (3, 1)}
TRAIN_RECIPES = ("fp8_tensorwise", "fp8_rowwise", "int8_rowwise")
E4M3 = torch.float8_e4m3fn
CUTLASS_CANDIDATES = (1, 2, 3)  # configs of tscale::int8_scaled_mm_sm90_candidate


def ops_candidate(a, b, scale_a, scale_b, config: int) -> torch.Tensor:
    return torch.ops.tscale.int8_scaled_mm_sm90_candidate(a, b, scale_a, scale_b, config)


def product_fns(M: int, K: int, N: int, device: torch.device) -> tuple[dict, dict]:
    """{column: fn} for one product shape, and {column: fn giving the float64 value it must match}."""
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)  # (M, K)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16) * K ** -0.5  # (N, K)
    xq8, sx8 = quantize(x, E4M3)  # (M, K), ()
    wq8, sw8 = quantize(w, E4M3)  # (N, K), ()
    xr8, sxr8 = quantize(x, E4M3, -1)  # (M, K), (M, 1)
    wr8, swr8 = quantize(w, E4M3, -1)  # (N, K), (N, 1)
    xi8, sxi = quantize(x, torch.int8, -1)
    wi8, swi = quantize(w, torch.int8, -1)
    swr8_t, swi_t = swr8.t().contiguous(), swi.t().contiguous()  # (1, N)

    def exact(a, b_nk, sa=None, sb=None):
        out = a.double() @ b_nk.double().t()
        return out if sa is None else out * sa.double() * sb.double()

    def fp8_percall():
        xq, sx = quantize(x, E4M3)
        wq, sw = quantize(w, E4M3)
        return fp8_mm(xq, wq.t(), sx, sw, torch.bfloat16)

    def int8_percall():
        xq, sx = quantize(x, torch.int8, -1)
        wq, sw = quantize(w, torch.int8, -1)
        return int8_mm(xq, wq.t(), sx, sw.t(), torch.bfloat16)

    fns = {"bf16": lambda: x @ w.t(), "fp8_percall": fp8_percall, "int8_percall": int8_percall,
           "int_mm": lambda: torch._int_mm(xi8, wi8.t())}
    refs = {"bf16": lambda: exact(x, w), "fp8_percall": lambda: exact(xq8, wq8, sx8, sw8),
            "int8_percall": lambda: exact(xi8, wi8, sxi, swi_t), "int_mm": lambda: exact(xi8, wi8)}
    if device.type == "cuda":
        fns["scaled_mm"] = lambda: torch._scaled_mm(xq8, wq8.t(), scale_a=sx8, scale_b=sw8, out_dtype=torch.bfloat16)
        fns["scaled_mm_rowwise"] = lambda: torch._scaled_mm(xr8, wr8.t(), scale_a=sxr8, scale_b=swr8_t,
                                                            out_dtype=torch.bfloat16)
        refs["scaled_mm"] = lambda: exact(xq8, wq8, sx8, sw8)
        refs["scaled_mm_rowwise"] = lambda: exact(xr8, wr8, sxr8, swr8_t)
    if lowprec._gemm_kernel_on(device.type):
        ops = torch.ops.tscale
        fns["fp8_lt"] = lambda: ops.fp8_gemm(xq8, wq8.t(), sx8, sw8, torch.bfloat16)
        fns["fp8_lt_rowwise"] = lambda: ops.fp8_gemm(xr8, wr8.t(), sxr8, swr8_t, torch.bfloat16)
        fns["fp8_lt_fastacc"] = lambda: ops.fp8_gemm(xq8, wq8.t(), sx8, sw8, torch.bfloat16, True, True)
        fns["int8_lt_i32"] = lambda: ops.int8_gemm_i32(xi8, wi8.t())
        fns["int8_lt"] = lambda: ops.int8_gemm(xi8, wi8.t(), sxi, swi_t, torch.bfloat16)
        refs["fp8_lt"] = refs["fp8_lt_fastacc"] = lambda: exact(xq8, wq8, sx8, sw8)
        refs["fp8_lt_rowwise"] = lambda: exact(xr8, wr8, sxr8, swr8_t)
        refs["int8_lt_i32"] = lambda: exact(xi8, wi8)
        refs["int8_lt"] = lambda: exact(xi8, wi8, sxi, swi_t)
    if device.type == "cuda" and lowprec._cutlass_ok("int8", xi8, wi8.t(), torch.bfloat16):
        sxi_v, swi_v = sxi.reshape(-1).contiguous(), swi.reshape(-1).contiguous()  # (M,), (N,)
        cutlass_mm = lowprec._cutlass_op(xi8.device.index)
        fns["int8_cutlass"] = lambda: cutlass_mm(xi8, wi8.t(), sxi_v, swi_v)
        refs["int8_cutlass"] = lambda: exact(xi8, wi8, sxi, swi_t)
        if backend.op_defined("int8_scaled_mm_sm90_candidate") and torch.cuda.get_device_capability() == (9, 0):
            for n in CUTLASS_CANDIDATES:
                fns[f"int8_cutlass_c{n}"] = lambda n=n: ops_candidate(xi8, wi8.t(), sxi_v, swi_v, n)
                refs[f"int8_cutlass_c{n}"] = refs["int8_cutlass"]
    return fns, refs


def check(kind: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when the product matches its float64 reference, else what is wrong."""
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    if got.dtype == torch.int32:
        return None if torch.equal(got.double(), want) else "int32 sums differ from the exact ones"
    rel = ((got.double() - want).norm() / want.norm()).item()
    limit = 1e-2 if kind.startswith("fp8") or kind.startswith("scaled_mm") else 5e-3
    return None if rel < limit else f"relative error {rel:.3g} >= {limit}"


def layer_fns(M: int, K: int, N: int, device: torch.device) -> dict:
    """{column: one training step of a layer}; layer_RECIPE_torchpath forces torch's products (TSCALE_LOWPREC_GEMM)."""
    x = torch.randn(M, K, device=device, requires_grad=True)  # (M, K)
    g = torch.randn(M, N, device=device, dtype=torch.bfloat16)  # (M, N)
    base = nn.Linear(K, N, bias=False, device=device)
    layers = {"layer_bf16": (base, None)}
    for name in TRAIN_RECIPES:
        layer = LowPrecLinear(nn.Linear(K, N, bias=False, device=device), get_recipe(name))
        layers[f"layer_{name}"] = (layer, None)
        if lowprec._gemm_kernel_on(device.type):
            layers[f"layer_{name}_torchpath"] = (layer, "torch")

    def step(layer, path):
        def run():
            saved = os.environ.get("TSCALE_LOWPREC_GEMM")
            if path:
                os.environ["TSCALE_LOWPREC_GEMM"] = path
            try:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    y = layer(x)
                y.backward(g)
            finally:
                if path and saved is None:
                    del os.environ["TSCALE_LOWPREC_GEMM"]
                elif path:
                    os.environ["TSCALE_LOWPREC_GEMM"] = saved
        return run

    return {name: step(layer, path) for name, (layer, path) in layers.items()}


def measure(tokens: int, repeats: int, device: torch.device,
            input_grad_shapes: bool = False) -> tuple[dict, list[str], list[str]]:
    metrics, lines, failures = {}, [], []
    layers = {**LAYERS, **(INPUT_GRAD_LAYERS if input_grad_shapes else {})}
    for model, d in MODELS.items():
        totals: dict[str, float] = {}
        left_out: set[str] = set()
        flops = 0.0
        for layer, (k_mult, n_mult) in layers.items():
            in_block = layer in LAYERS
            K, N = k_mult * d, n_mult * d
            f = 2.0 * tokens * N * K
            flops += f if in_block else 0.0
            fns, refs = product_fns(tokens, K, N, device)
            for kind in list(fns):
                try:
                    problem = check(kind, fns[kind](), refs[kind]())
                except RuntimeError as e:
                    problem = f"raised {str(e).splitlines()[0]}"
                if problem is not None:
                    failures.append(f"{model} {layer} {kind}: {problem}")
                    if in_block:
                        left_out.add(kind)
                    del fns[kind]
            del refs
            for kind, fn in {**fns, **(layer_fns(tokens, K, N, device) if in_block else {})}.items():
                t = time_per_call(fn, device, repeats)
                work = 3 * f if kind.startswith("layer_") else f
                metrics[f"{model}_{layer}_{kind}_tflops"] = work / t / 1e12
                if in_block:
                    totals[kind] = totals.get(kind, 0.0) + t
                lines.append(f"{model:5s} {layer:9s} M={tokens} K={K} N={N} {kind:20s} {work / t / 1e12:8.2f} TFLOP/s")
        totals = {k: v for k, v in totals.items() if k not in left_out}  # ratios only over whole blocks
        bf16 = totals["bf16"]
        for kind, t in totals.items():
            if kind != "bf16" and not kind.startswith("layer_"):
                metrics[f"{kind}_vs_bf16_rate_{model}"] = bf16 / t
        ours_int8 = [totals[k] for k in ("int8_cutlass", "int8_lt") if k in totals]
        if ours_int8:
            metrics[f"int8_vs_bf16_gemm_rate_{model}"] = bf16 / min(ours_int8)
        if "fp8_lt" in totals:
            metrics[f"fp8_vs_bf16_gemm_rate_{model}"] = bf16 / totals["fp8_lt"]
        if "fp8_lt" in totals and "scaled_mm" in totals:
            metrics[f"fp8_lt_vs_scaled_mm_rate_{model}"] = totals["scaled_mm"] / totals["fp8_lt"]
        if "int8_lt_i32" in totals and "int_mm" in totals:
            metrics[f"int8_lt_i32_vs_int_mm_rate_{model}"] = totals["int_mm"] / totals["int8_lt_i32"]
        for name in TRAIN_RECIPES:
            metrics[f"{name}_layer_fwdbwd_vs_bf16_{model}"] = totals["layer_bf16"] / totals[f"layer_{name}"]
            if f"layer_{name}_torchpath" in totals:
                metrics[f"{name}_layer_torchpath_fwdbwd_vs_bf16_{model}"] = (totals["layer_bf16"]
                                                                              / totals[f"layer_{name}_torchpath"])
        metrics[f"bf16_gemm_tflops_{model}"] = flops / bf16 / 1e12
    return metrics, lines, failures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384, help="M: tokens per batch")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/bench/lowprec.json alone")
    ap.add_argument("--input-grad-shapes", action="store_true",
                    help="also time the products at qkv's input-gradient shape (3d -> d), outside the block totals")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"ops: {backend()}")
    metrics, lines, failures = measure(args.tokens, args.repeats, device, args.input_grad_shapes)
    print("\n".join(lines))
    for key in sorted(k for k in metrics if not k.endswith("_tflops") or k.startswith("bf16")):
        print(f"{key:45s} {metrics[key]:.3f}")
    for failure in failures:
        print(f"CHECK FAILED (left out): {failure}")
    stats = ""
    if lowprec._gemm_kernel_on(device.type):
        names = ("cached_choices", "autotuning_runs", "cache_hits", "untimed_picks", "fp8_scaling_pass_fallbacks")
        stats = ", ".join(f"{n}={v}" for n, v in zip(names, torch.ops.tscale.lowprec_gemm_stats()))
        print(f"lowprec_gemm_stats: {stats}")
    if not args.no_write:
        notes = (f"gemm (lowprec_gemm.py): M={args.tokens} tokens; forward products of one block's four linear layers (d, 3d, 4d); "
                 f"*_vs_bf16_rate_* = bf16 time / that column's time, summed over the block; "
                 f"int8_vs_bf16_gemm_rate / fp8_vs_bf16_gemm_rate use our products (int8: the faster of int8_cutlass, "
                 f"CUTLASS with the scales in the epilogue, and int8_lt, cuBLASLt int8 x int8 -> int32 + one scaling "
                 f"pass to bf16; fp8_lt: cuBLASLt e4m3, scales in the epilogue) on pre-quantised "
                 f"operands; *_percall_* include quantizing x and W; *_layer_fwdbwd_* = nn.Linear bf16 autocast "
                 f"step time / LowPrecLinear step time; ops: {backend()}"
                 + (f"; cuBLASLt GEMM stats: {stats}" if stats else "")
                 + (f"; checks failed (columns left out): {'; '.join(failures)}" if failures else ""))
        path = merge_metrics("lowprec", metrics, notes, args.out_dir)  # the training parts stay
        print(f"-> {path}")


if __name__ == "__main__":
    main()
