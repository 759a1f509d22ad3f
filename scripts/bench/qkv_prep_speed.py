"""The fused attention-input kernel (tscale.ops.qkv_prep) against the model's own path under torch.compile.

    python scripts/bench/qkv_prep_speed.py [--shapes 8x4096 32x1024] [--heads 6] [--head-dim 128]
                                           [--repeats 50] [--rounds 2] [--out-dir docs/bench]

At each batch x length, one layer's step between the qkv product and attention: forward and backward of
(a) the model's path as a training step compiles it (tscale_lm's QK norm and RoPE in float32 under bf16
autocast, the cast back, v made contiguous as the cuDNN path needs, then dq, dk and dv stacked into the
product's gradient), through torch.compile, and (b) the kernel's autograd function (one pass each way,
csrc/qkv). Both are checked against each other first, then timed with CUDA events over REPEATS steps
after 3, interleaved for ROUNDS rounds, the fastest kept. GB/s counts what the passes must move at least:
forward 3 D values in and out a row and head, backward 3 out and 5 in (the gradients and q, k again), bf16.
Record: qkv_prep.json (ms per layer and step, both ways; the ratio).

The compiled side here is a graph of this one layer's ops: inside the model inductor fuses them into other
kernels, which ran 2x faster than here on an H200 (docs/BENCHMARKS.md, "QK normalisation and RoPE in one
pass"). What the kernel does for training is what `arch_profile.py --archs tscale_cudnn tscale_cudnn_qkv`
and the training rates (arch_speed.py --also tscale_qkv tscale_cudnn_qkv) measure.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, round_orders, time_per_call, write_record  # noqa: E402

import torch  # noqa: E402

from tscale.config import ModelConfig  # noqa: E402
from tscale.model.tscale_lm import _plain_norm, apply_rope, rope_tables  # noqa: E402
from tscale.ops.qkv_prep import kernel_serves, qkv_prep  # noqa: E402


CFG = ModelConfig(arch="tscale", norm="rms")  # what _plain_norm reads: RMS


def model_path(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """tscale_lm.Attention's steps from the product to attention's inputs (bf16 autocast, as in training)."""
    q, k, v = qkv.unbind(2)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        q, k = _plain_norm(CFG, q), _plain_norm(CFG, k)
        q, k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None])
    return q.to(v.dtype), k.to(v.dtype), v.contiguous()


def kernel_path(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return qkv_prep(qkv, cos, sin)


def step(path, qkv: torch.Tensor, cos, sin, grads) -> torch.Tensor:
    """Forward, then backward with fixed upstream gradients -> the product's gradient."""
    x = qkv.detach().requires_grad_(True)
    outs = path(x, cos, sin)
    torch.autograd.backward(outs, grads)
    return x.grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["8x4096", "32x1024"], help="BATCHxLENGTH")
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=12, help="layers a training step runs it in (for ms per step)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("qkv_prep_speed.py: needs a CUDA GPU")
    dev = torch.device("cuda")
    H, D = args.heads, args.head_dim
    compiled = torch.compile(model_path)
    metrics = {}
    for shape in args.shapes:
        B, T = (int(n) for n in shape.split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        qkv = torch.randn(B, T, 3, H, D, device=dev, generator=g).to(torch.bfloat16)  # (B, T, 3, H, D)
        cos, sin = (t.to(dev) for t in rope_tables(T, D, 10000.0))  # 2 x (T, D)
        grads = [torch.randn(B, T, H, D, device=dev, generator=g).to(torch.bfloat16) for _ in range(3)]
        if not kernel_serves(qkv, cos):
            raise SystemExit("qkv_prep_speed.py: the kernel does not serve here (tscale._C built without CUDA?)")
        want, got = step(compiled, qkv, cos, sin, grads), step(kernel_path, qkv, cos, sin, grads)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        paths = {"compiled": compiled, "kernel": kernel_path}
        forward = {name: [] for name in paths}
        both = {name: [] for name in paths}
        for order in round_orders(list(paths), args.rounds):
            for name in order:
                fn = paths[name]
                with torch.no_grad():
                    forward[name].append(time_per_call(lambda: fn(qkv, cos, sin), dev, args.repeats) * 1e3)
                both[name].append(time_per_call(lambda: step(fn, qkv, cos, sin, grads), dev, args.repeats) * 1e3)
        row_bytes = B * T * H * D * 2  # one (B, T, H, D) bf16 tensor
        floor = {"forward": 6 * row_bytes, "step": 6 * row_bytes + 8 * row_bytes}
        for name in paths:
            fwd, total = min(forward[name]), min(both[name])
            tag = f"T{T}_{name}"
            metrics.update({f"{tag}_forward_ms": round(fwd, 4), f"{tag}_step_ms": round(total, 4),
                            f"{tag}_step_ms_per_training_step": round(total * args.layers, 3),
                            f"{tag}_step_gb_per_s": round(floor["step"] / total / 1e6, 1)})
            print(f"B {B} T {T} {name:9s} forward {' '.join(f'{t:.4f}' for t in forward[name])} ms, forward + "
                  f"backward {' '.join(f'{t:.4f}' for t in both[name])} ms ({floor['step'] / total / 1e6:,.0f} GB/s "
                  f"at least; x {args.layers} layers = {total * args.layers:.2f} ms a step)", flush=True)
        metrics[f"T{T}_step_speedup"] = round(min(both["compiled"]) / min(both["kernel"]), 3)
    notes = (f"one layer's attention inputs (H {H}, D {D}, bf16, random values): the model's path compiled "
             f"(torch.compile default mode, autocast bf16) against the fused kernel (csrc/qkv), forward and forward + "
             f"backward with fixed upstream gradients, CUDA events over {args.repeats} calls after 3, {args.rounds} "
             f"interleaved rounds, the fastest kept; *_step_ms_per_training_step = x {args.layers} layers; GB/s = the "
             f"least bytes the passes move (forward 6, backward 8 tensors of (B, T, H, D) bf16) over the time; both "
             f"paths checked against each other first")
    print(f"-> {write_record('qkv_prep', metrics, notes, args.out_dir)}")


if __name__ == "__main__":
    main()
