"""Benchmark: one decode step's linear layers with weight-only int8, in each form, against the weights as trained.

    python scripts/bench/weight_only_forms.py [--d-model 768] [--tokens 1] [--rounds 30] [--device auto]
                                              [--label NAME] [--out-dir docs/bench]

A block's four products at --tokens rows (qkv d x 3d, attention out d x d, MLP d x 4d and 4d x d), timed together,
the forms alternating for --rounds rounds (minimum and median per form):
  as_trained     the layers as trained (fp32 on the CPU, bf16 on a GPU)
  shipped        QuantizedLinear of int8-w: the int8 weight cast to the compute dtype, the product, then the scales
  scale_first    the weight dequantised first (int8 -> fp32, times its scales, cast), then the product: the form
                 QuantizedLinear had before its scales moved after the product
  int8pack       torch's _weight_int8pack_mm, where this torch has a kernel for the device
Merges into docs/bench/lowprec.json (part "weight-only forms <label>"): wo_<label>_us_<form> and wo_<label>_us_min_<form>
(median and minimum, per block).
"""

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics, time_per_call  # noqa: E402

from tscale.devices import resolve_device  # noqa: E402
from tscale.precision import quantize_for_inference  # noqa: E402


def block_layers(d: int, device, dtype) -> list[nn.Linear]:
    shapes = ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d))  # (in, out)
    return [nn.Linear(i, o, bias=False).to(device, dtype) for i, o in shapes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--tokens", type=int, default=1, help="rows of each product (1: one sequence decoding)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=20, help="block calls per timing")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--label", default="cpu")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    trained = block_layers(args.d_model, device, dtype)
    quantized = nn.Sequential(*[copy.deepcopy(layer) for layer in trained])
    quantize_for_inference(quantized, "int8-w", exclude=())
    xs = {n: torch.randn(args.tokens, n, device=device, dtype=dtype) for n in (args.d_model, 4 * args.d_model)}

    def as_trained():
        for layer in trained:
            F.linear(xs[layer.in_features], layer.weight)

    def shipped():
        for layer in quantized:
            layer(xs[layer.in_features])

    def scale_first():
        for layer in quantized:
            F.linear(xs[layer.in_features], (layer.qweight.float() * layer.w_scale).to(dtype))

    scales = [layer.w_scale.view(-1).to(dtype).contiguous() for layer in quantized]

    def int8pack():
        for layer, s in zip(quantized, scales):
            torch.ops.aten._weight_int8pack_mm(xs[layer.in_features], layer.qweight, s)

    forms = {"as_trained": as_trained, "shipped": shipped, "scale_first": scale_first, "int8pack": int8pack}
    try:
        int8pack()
    except (RuntimeError, NotImplementedError) as e:
        print(f"int8pack: not run ({str(e).splitlines()[0][:100]})")
        del forms["int8pack"]
    times: dict[str, list[float]] = {name: [] for name in forms}
    for name, f in forms.items():  # warm-up
        f()
    for _ in range(args.rounds):
        for name, f in forms.items():
            times[name].append(time_per_call(f, device, args.calls, warmup=0) * 1e6)
    metrics = {}
    for name, ts in times.items():
        metrics[f"wo_{args.label}_us_{name}"] = round(statistics.median(ts), 1)
        metrics[f"wo_{args.label}_us_min_{name}"] = round(min(ts), 1)
        print(f"{name:12s} min {min(ts):9.1f} us  median {statistics.median(ts):9.1f} us per block")
    note = (f"weight-only forms {args.label} (weight_only_forms.py): device {device}, d_model {args.d_model}, "
            f"{args.tokens} row(s), one block's four products per call, {args.rounds} alternating rounds of "
            f"{args.calls} calls; us = median time per block, us_min = the fastest round's")
    print(f"-> {merge_metrics('lowprec', metrics, note, args.out_dir)}")


if __name__ == "__main__":
    main()
