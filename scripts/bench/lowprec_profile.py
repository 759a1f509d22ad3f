"""Where the time of a low-precision layer step goes: CUDA kernel times of one linear layer, forward + backward.

    python scripts/bench/lowprec_profile.py [--shape 1p5b_qkv] [--tokens 16384] [--steps 5]

For bf16 (nn.Linear under autocast) and each training recipe (LowPrecLinear; also fp8_tensorwise
with fast accumulation and int8_rowwise with int8 backward products), at one of the
layer shapes of scripts/bench/lowprec_gemm.py, torch.profiler records `--steps` steps after a
warm-up and prints the kernels by total CUDA time, per step, so quantize, products and copies
can be told apart. Beside the kernel time it prints each step's wall time and the host's time to
launch it (the Python and dispatch work): a wall time well above the kernel time with a launch
time near the wall time means the layer waits on the CPU, not on its kernels. Prints only; the
findings go into docs/lowprec.md by hand.
"""

import argparse
import sys
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

from tscale.precision import RECIPES, LowPrecLinear, get_recipe

SHAPES = {"1p5b_qkv": (1600, 4800), "1p5b_attn_out": (1600, 1600), "1p5b_mlp_up": (1600, 6400),
          "1p5b_mlp_down": (6400, 1600), "124m_qkv": (768, 2304), "124m_mlp_down": (3072, 768)}


def layer_step(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x)  # (M, N)
        y.backward(dy)
    return step


def wall_and_launch(step, steps: int) -> tuple[float, float]:
    """Seconds per step: wall (launch + run, synchronised) and the host's launch time alone."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps, (t1 - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="1p5b_qkv")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=12, help="kernels shown per recipe")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("lowprec_profile: needs a CUDA GPU")
    K, N = SHAPES[args.shape]
    x = torch.randn(args.tokens, K, device="cuda", requires_grad=True)  # (M, K) fp32, as the residual stream
    dy = torch.randn(args.tokens, N, device="cuda", dtype=torch.bfloat16)  # (M, N)
    base = nn.Linear(K, N, bias=False, device="cuda")
    recipes = {**RECIPES, "fp8_tensorwise+fast_accum": get_recipe("fp8_tensorwise", fp8_fast_accum=True),
               "int8_rowwise+int8_backward": get_recipe("int8_rowwise", int8_backward=True)}
    layers = {"bf16": base, **{name: LowPrecLinear(base, recipe) for name, recipe in recipes.items()}}
    for name, layer in layers.items():
        step = layer_step(layer, x, dy)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_time_total > 0]
        events.sort(key=lambda e: e.device_time_total, reverse=True)
        total = sum(e.device_time_total for e in events) / args.steps
        wall, launch = wall_and_launch(step, max(args.steps, 10))
        print(f"\n{args.shape} M={args.tokens} K={K} N={N} {name}: {total / 1000:.3f} ms of kernels per step, "
              f"wall {wall * 1e3:.3f} ms, launch {launch * 1e3:.3f} ms")
        for e in events[:args.rows]:
            print(f"  {e.device_time_total / args.steps / 1000:8.3f} ms  {e.count // args.steps:3d}x  {e.key[:90]}")


if __name__ == "__main__":
    main()
