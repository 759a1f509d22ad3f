"""Forward + backward time of the head's loss at a training step's shape: the logits path against the loss kernel.

    python scripts/bench/head_loss_speed.py [--tokens 32768] [--dim 768] [--vocab 50257] [--softcaps 0 30]
                                            [--repeats 20] [--out-dir docs/bench]

For each soft-cap (0: gpt2's head, 30: tscale's), the same hidden states (N, d), head weight
(V padded to a multiple of 64, d) and targets, bf16 autocast, each path torch.compile'd alone:
  logits   the models' plain path: logits = hidden @ W^T, soft-cap, F.cross_entropy in float32
           (tscale.ops.fused_loss.head_loss_reference, as Inductor fuses it inside a training step)
  kernel   tscale.ops.head_loss.head_loss: one product, then the loss and its gradient in one pass
  chunked  tscale.ops.fused_loss.chunked_head_loss (train.fused_loss), 2,048 tokens at a time
timed as loss.backward() calls (CUDA events, after warm-up), plus the kernel pass alone on the
logits with its bytes per second (one read and one write of the bf16 logits). Every path's loss
and gradients are checked against the logits path's before timing. Record: docs/bench/head_loss.json.
"""

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, time_per_call, write_record  # noqa: E402

import torch  # noqa: E402

from tscale.ops.backend import backend  # noqa: E402
from tscale.ops.fused_loss import chunked_head_loss, head_loss_reference  # noqa: E402
from tscale.ops.head_loss import head_loss, softcap_xent_grad  # noqa: E402

PATHS = {"logits": head_loss_reference, "kernel": head_loss, "chunked": chunked_head_loss}


def _step(fn, hidden, weight, targets, vocab, softcap):
    """A function running one forward + backward of `fn`, gradients left in hidden.grad / weight.grad."""
    def run():
        hidden.grad = weight.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(hidden, weight, targets, vocab, softcap)
        loss.backward()
        return loss
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32_768)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50_257)
    ap.add_argument("--softcaps", type=float, nargs="+", default=[0.0, 30.0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("head_loss_speed.py: needs a CUDA GPU")
    print(backend())
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    N, d, V = args.tokens, args.dim, args.vocab
    V_pad = -(-V // 64) * 64
    hidden = torch.randn(N, d, generator=g).to(dev).requires_grad_()
    weight = (torch.randn(V_pad, d, generator=g) * 0.05).to(dev).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=g).to(dev)
    metrics = {}
    for softcap in args.softcaps:
        tag = f"cap{softcap:g}"
        want = None
        for name, fn in PATHS.items():
            run = _step(torch.compile(fn), hidden, weight, targets, V, softcap)
            loss = run().detach()
            grads = hidden.grad.clone(), weight.grad.clone()
            if want is None:
                want = loss, grads
            else:  # the same loss and gradients as the logits path, within bf16 rounding
                assert abs(loss.item() - want[0].item()) <= 2e-3 * abs(want[0].item()), (name, loss, want[0])
                for a, b in zip(grads, want[1]):
                    assert (a - b).abs().max() <= 0.02 * b.abs().max(), name
            ms = time_per_call(run, dev, args.repeats) * 1e3
            metrics[f"{tag}_{name}_ms"] = round(ms, 3)
            print(f"softcap {softcap:g}: {name:8s} {ms:7.3f} ms forward + backward", flush=True)
        metrics[f"{tag}_kernel_speedup"] = round(metrics[f"{tag}_logits_ms"] / metrics[f"{tag}_kernel_ms"], 3)
        logits = (hidden.detach().bfloat16() @ weight.detach().bfloat16().t()).contiguous()  # (N, V_pad)
        ms = time_per_call(functools.partial(softcap_xent_grad, logits, targets, V, softcap, 1.0 / N), dev,
                           args.repeats) * 1e3
        metrics[f"{tag}_pass_ms"] = round(ms, 3)
        metrics[f"{tag}_pass_gb_per_s"] = round(2 * logits.numel() * 2 / (ms / 1e3) / 1e9, 1)
        print(f"softcap {softcap:g}: the kernel pass alone {ms:.3f} ms, "
              f"{metrics[f'{tag}_pass_gb_per_s']:,.0f} GB/s (one read and one write of the logits)", flush=True)
        del logits
    notes = (f"head loss (head_loss_speed.py): N = {N} tokens, d = {d}, vocabulary {V} padded to {V_pad}, bf16 "
             f"autocast, each path torch.compile'd alone, forward + backward (loss.backward()) timed with CUDA events "
             f"over {args.repeats} calls after 3; logits = the models' plain path (product, soft-cap, float32 "
             f"cross-entropy, fused by Inductor), kernel = tscale.ops.head_loss, chunked = train.fused_loss; "
             f"pass = softcap_xent_grad alone on bf16 logits; every path checked against the logits path first")
    print(f"-> {write_record('head_loss', metrics, notes, args.out_dir)}")


if __name__ == "__main__":
    main()
