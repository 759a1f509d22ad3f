"""Benchmark: one scale per tensor, dynamic (amax pass, then cast) against delayed (one cast), at a 1.5B step's shapes.

For each operand a gpt2 1.5B layer quantises per step (batch 8 x 1024 tokens: the inputs x of the qkv,
attention-output, MLP-up and MLP-down products in bf16, their output gradients dy in bf16, the fp32 master
weights W), GPU time per call by CUDA events of tscale.ops.lowprec.quantize(..., axis=None, transpose=True)
and quantize_delayed(..., transpose=True) with a seeded history, in alternating rounds. The per-step sum
weighs each shape by how often a step quantises it (48 layers). Merges its part into OUT/lowprec.json.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics, round_orders, time_per_call  # noqa: E402

import torch  # noqa: E402

from tscale.ops.lowprec import quantize, quantize_delayed  # noqa: E402

M, D, LAYERS = 8192, 1600, 48
# name: (rows, cols, dtype of the operand, fp8 format, quantisations of this shape per layer and step)
OPERANDS = {
    "x_d": (M, D, torch.bfloat16, torch.float8_e4m3fn, 3),  # qkv, attention output and MLP-up inputs
    "x_4d": (M, 4 * D, torch.bfloat16, torch.float8_e4m3fn, 1),  # MLP-down input
    "dy_3d": (M, 3 * D, torch.bfloat16, torch.float8_e5m2, 1),  # qkv output gradient
    "dy_d": (M, D, torch.bfloat16, torch.float8_e5m2, 2),  # attention-output and MLP-down output gradients
    "dy_4d": (M, 4 * D, torch.bfloat16, torch.float8_e5m2, 1),  # MLP-up output gradient
    "w_3d": (3 * D, D, torch.float32, torch.float8_e4m3fn, 1),
    "w_d": (D, D, torch.float32, torch.float8_e4m3fn, 1),
    "w_4d": (4 * D, D, torch.float32, torch.float8_e4m3fn, 2),  # MLP up and down (transposed shapes, same size)
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--history", type=int, default=16)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("quantize_delayed_speed.py: needs a CUDA GPU")
    dev = torch.device("cuda")
    times: dict[str, dict[str, list[float]]] = {name: {"dynamic": [], "delayed": []} for name in OPERANDS}
    for name, (rows, cols, dtype, fmt, _) in OPERANDS.items():
        x = torch.randn(rows, cols, device=dev, dtype=dtype)
        state = torch.zeros(args.history + 2, dtype=torch.int32, device=dev)
        quantize_delayed(x, fmt, state, transpose=True)  # the seeding call
        calls = {"dynamic": lambda: quantize(x, fmt, None, transpose=True),
                 "delayed": lambda: quantize_delayed(x, fmt, state, transpose=True)}
        for order in round_orders(list(calls), args.rounds):
            for way in order:
                times[name][way].append(time_per_call(calls[way], dev, args.repeats))
    metrics, lines = {}, []
    step = {"dynamic": 0.0, "delayed": 0.0}
    for name, (rows, cols, dtype, fmt, per_layer) in OPERANDS.items():
        best = {way: min(ts) for way, ts in times[name].items()}
        for way, t in best.items():
            metrics[f"quantize_{way}_us_{name}"] = round(t * 1e6, 2)
            step[way] += t * per_layer * LAYERS
        read = rows * cols * (2 if dtype == torch.bfloat16 else 4)
        lines.append(f"{name} ({rows} x {cols} {str(dtype).split('.')[-1]}): dynamic {best['dynamic'] * 1e6:.1f} us, "
                     f"delayed {best['delayed'] * 1e6:.1f} us ({best['dynamic'] / best['delayed']:.2f}x; "
                     f"one read of x at 4.8 TB/s: {read / 4.8e12 * 1e6:.1f} us)")
    metrics["quantize_dynamic_ms_per_step_1p5b"] = round(step["dynamic"] * 1e3, 2)
    metrics["quantize_delayed_ms_per_step_1p5b"] = round(step["delayed"] * 1e3, 2)
    summary = (f"per 1.5B step (48 layers, batch 8 x 1024): dynamic {step['dynamic'] * 1e3:.2f} ms, "
               f"delayed {step['delayed'] * 1e3:.2f} ms")
    print("\n".join([*lines, summary]))
    merge_metrics("lowprec", metrics, "quantize, dynamic against delayed (quantize_delayed_speed.py): GPU time per "
                  f"call, best of {args.rounds} alternating rounds of {args.repeats} calls, with the transposed copy, "
                  f"history {args.history}; {summary}", args.out)


if __name__ == "__main__":
    main()
