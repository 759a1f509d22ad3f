"""Low-precision GEMM rates at the model's shapes: bf16 vs fp8 (torch._scaled_mm, our path) vs int8 (torch._int_mm, our path).

For each model (124M: d=768; 1.5B: d=1600) and each linear layer of a block (qkv d->3d,
attention out d->d, MLP up d->4d, MLP down 4d->d) at M tokens per batch (default 16384), one
forward product y = x W^T is timed as
  bf16           x @ W^T in bf16 (cuBLAS)
  scaled_mm      torch._scaled_mm on operands already in e4m3, one scale each (the raw GEMM)
  fp8_path       what LowPrecLinear does per call: quantize x and W (tscale.ops) + fp8_mm
  int_mm         torch._int_mm on operands already in int8 (raw GEMM, int32 out)
  int8_path      quantize x and W per row + int8_mm (int32 sums scaled to bf16)
and the training step of a whole layer (forward + backward) as
  layer_bf16     nn.Linear under bf16 autocast
  layer_RECIPE   LowPrecLinear for each recipe
TFLOP/s counts 2 M N K per product (6 M N K per layer step). Times come from CUDA events
after warm-up (wall time on the CPU, for a smoke run with small --tokens).

Run: python scripts/bench/lowprec_gemm.py [--tokens 16384] [--repeats 20] [--no-write]
Writes docs/bench/lowprec.json: int8_vs_bf16_gemm_rate_1p5b and fp8_vs_bf16_gemm_rate_1p5b (our
path's rate over bf16's, summed over the four products of a 1.5B block), the same for 124M,
raw-GEMM ratios, layer fwd+bwd ratios, and every per-shape TFLOP/s.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, time_per_call, write_record  # noqa: E402

from tscale.ops import backend  # noqa: E402
from tscale.ops.lowprec import fp8_mm, int8_mm, quantize  # noqa: E402
from tscale.precision import LowPrecLinear, get_recipe  # noqa: E402

MODELS = {"124m": 768, "1p5b": 1600}
LAYERS = {"qkv": (1, 3), "attn_out": (1, 1), "mlp_up": (1, 4), "mlp_down": (4, 1)}  # (K, N) in units of d
TRAIN_RECIPES = ("fp8_tensorwise", "fp8_rowwise", "int8_rowwise")


def product_fns(M: int, K: int, N: int, device: torch.device) -> dict:
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)  # (M, K)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16) * K ** -0.5  # (N, K)
    one = torch.ones((), device=device)
    xq8, _ = quantize(x, torch.float8_e4m3fn)
    wq8, _ = quantize(w, torch.float8_e4m3fn)
    xi8, _ = quantize(x, torch.int8, -1)
    wi8, _ = quantize(w, torch.int8, -1)

    def fp8_path():
        xq, sx = quantize(x, torch.float8_e4m3fn)
        wq, sw = quantize(w, torch.float8_e4m3fn)
        return fp8_mm(xq, wq.t(), sx, sw, torch.bfloat16)

    def int8_path():
        xq, sx = quantize(x, torch.int8, -1)
        wq, sw = quantize(w, torch.int8, -1)
        return int8_mm(xq, wq.t(), sx, sw.t(), torch.bfloat16)

    fns = {"bf16": lambda: x @ w.t(), "fp8_path": fp8_path, "int_mm": lambda: torch._int_mm(xi8, wi8.t()),
           "int8_path": int8_path}
    if device.type == "cuda":
        fns["scaled_mm"] = lambda: torch._scaled_mm(xq8, wq8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return fns


def layer_fns(M: int, K: int, N: int, device: torch.device) -> dict:
    x = torch.randn(M, K, device=device, requires_grad=True)  # (M, K)
    g = torch.randn(M, N, device=device, dtype=torch.bfloat16)  # (M, N)
    base = nn.Linear(K, N, bias=False, device=device)
    layers = {"layer_bf16": base}
    for name in TRAIN_RECIPES:
        layers[f"layer_{name}"] = LowPrecLinear(nn.Linear(K, N, bias=False, device=device), get_recipe(name))

    def step(layer):
        def run():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                y = layer(x)
            y.backward(g)
        return run

    return {name: step(layer) for name, layer in layers.items()}


def measure(tokens: int, repeats: int, device: torch.device) -> tuple[dict, list[str]]:
    metrics, lines = {}, []
    for model, d in MODELS.items():
        totals: dict[str, float] = {}
        flops = 0.0
        for layer, (k_mult, n_mult) in LAYERS.items():
            K, N = k_mult * d, n_mult * d
            f = 2.0 * tokens * N * K
            flops += f
            for kind, fn in {**product_fns(tokens, K, N, device), **layer_fns(tokens, K, N, device)}.items():
                t = time_per_call(fn, device, repeats)
                work = 3 * f if kind.startswith("layer_") else f
                metrics[f"{model}_{layer}_{kind}_tflops"] = work / t / 1e12
                totals[kind] = totals.get(kind, 0.0) + t
                lines.append(f"{model:5s} {layer:9s} M={tokens} K={K} N={N} {kind:20s} {work / t / 1e12:8.2f} TFLOP/s")
        bf16 = totals["bf16"]
        metrics[f"fp8_vs_bf16_gemm_rate_{model}"] = bf16 / totals["fp8_path"]
        metrics[f"int8_vs_bf16_gemm_rate_{model}"] = bf16 / totals["int8_path"]
        metrics[f"int_mm_vs_bf16_rate_{model}"] = bf16 / totals["int_mm"]
        if "scaled_mm" in totals:
            metrics[f"scaled_mm_vs_bf16_rate_{model}"] = bf16 / totals["scaled_mm"]
            metrics[f"fp8_path_vs_scaled_mm_rate_{model}"] = totals["scaled_mm"] / totals["fp8_path"]
        for name in TRAIN_RECIPES:
            metrics[f"{name}_layer_fwdbwd_vs_bf16_{model}"] = totals["layer_bf16"] / totals[f"layer_{name}"]
        metrics[f"bf16_gemm_tflops_{model}"] = flops / bf16 / 1e12
    return metrics, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384, help="M: tokens per batch")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/bench/lowprec.json alone")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"ops: {backend()}")
    metrics, lines = measure(args.tokens, args.repeats, device)
    print("\n".join(lines))
    for key in sorted(k for k in metrics if not k.endswith("_tflops") or k.startswith("bf16")):
        print(f"{key:45s} {metrics[key]:.3f}")
    if not args.no_write:
        notes = (f"M={args.tokens} tokens; forward products of one block's four linear layers (d, 3d, 4d); "
                 f"*_gemm_rate_* = bf16 time / our path's time (quantize + product); "
                 f"*_layer_fwdbwd_* = nn.Linear bf16 autocast step time / LowPrecLinear step time; ops: {backend()}")
        path = write_record("lowprec", metrics, notes, args.out_dir)
        print(f"-> {path}")


if __name__ == "__main__":
    main()
