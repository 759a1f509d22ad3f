"""Benchmark: the head's loss on a CPU, whole logits against chunks of them, for training and for evaluation.

    python scripts/bench/cpu_loss_speed.py [--tokens 2048] [--dim 128] [--rounds 5] [--out-dir docs/bench]

Training (forward + backward of the mean loss, soft-cap 30): the logits path (`train.loss_kernel = false`),
the kernel's torch reference (tscale.ops.head_loss on a CPU) and tscale.ops.fused_loss's chunked loss at several
chunk sizes, among them `default_chunk`'s, for a GPT-2 (50,257) and a small (4,096) vocabulary. Evaluation
(per-token losses, no gradient): token_losses over the whole logits against tscale.model.loss.token_losses_in_chunks;
and a training step of a tiny tscale model with the token index's mixer, its per-token losses in one chunk or many.
Every path is checked against the logits path first; the timings interleave the paths, `--rounds` times, and
the median is recorded. Merges part "cpu loss (cpu_loss_speed.py)" into OUT/cpu_loss.json.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics, round_orders  # noqa: E402

from tscale.model.loss import token_losses, token_losses_in_chunks  # noqa: E402
from tscale.ops.fused_loss import CPU_CHUNK_ELEMENTS, chunked_head_loss, default_chunk, head_loss_reference  # noqa: E402
from tscale.ops.head_loss import head_loss  # noqa: E402
from tscale.train.cpu_allocator import reuse_freed_blocks  # noqa: E402

SOFTCAP = 30.0


def run_interleaved(paths: dict, rounds: int) -> dict[str, float]:
    """Median ms of each path's call, the paths taking turns `rounds` times in common.round_orders' orders (after
    one warm-up call each)."""
    times = {name: [] for name in paths}
    for fn in paths.values():
        fn()
    for order in round_orders(list(paths), rounds):
        for name in order:
            t0 = time.perf_counter()
            paths[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) * 1e3 for name, s in times.items()}


def training_paths(N: int, d: int, V: int) -> tuple[dict, int]:
    V_pad = (V + 63) // 64 * 64
    g = torch.Generator().manual_seed(V)
    h = torch.randn(N, d, generator=g).requires_grad_()
    w = (torch.randn(V_pad, d, generator=g) * 0.05).requires_grad_()
    y = torch.randint(0, V, (N,), generator=g)

    def step(loss_fn, **kw):
        def run():
            h.grad = w.grad = None
            loss = loss_fn(h, w, y, V, SOFTCAP, **kw)
            loss.backward()
            return loss.detach(), h.grad.clone(), w.grad.clone()
        return run

    chunk = default_chunk(torch.device("cpu"), V)
    paths = {"logits": step(head_loss_reference), "kernel_reference": step(head_loss)}
    for c in sorted({chunk, 64, 128, 512, 2048}):
        paths[f"chunk{c}"] = step(chunked_head_loss, chunk=c)
    want = paths["logits"]()
    for name, fn in paths.items():
        for a, b in zip(fn(), want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=f"{name} differs from the logits path")
    return paths, chunk


def evaluation_paths(N: int, d: int, V: int) -> dict:
    g = torch.Generator().manual_seed(V + 1)
    head = nn.Linear(d, (V + 63) // 64 * 64, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) * 0.05)
    hidden = torch.randn(N // 128, 128, d, generator=g)  # (B, T, d)
    y = torch.randint(0, V, (N // 128, 128), generator=g)

    def tail(h, feats, targets):  # the tscale model's tail without the index: head, soft-cap, per-token loss
        logits = SOFTCAP * torch.tanh(head(h).float() / SOFTCAP)
        return token_losses(logits[..., :V], targets)

    def whole():
        with torch.no_grad():
            return tail(hidden, None, y)

    def chunked():
        with torch.no_grad():
            return token_losses_in_chunks(tail, hidden, None, y, V)

    torch.testing.assert_close(chunked(), whole(), rtol=1e-5, atol=1e-5)
    return {"eval_whole": whole, "eval_chunked": chunked}


def index_step_paths(V: int) -> dict:
    """A training step (forward + backward of the mean per-token loss) of a tiny tscale model with the index's
    inputs and mixer, 16 x 128 tokens: the whole logits at once (one chunk) against default_chunk's chunks."""
    from tscale.config import IndexConfig, ModelConfig
    from tscale.index.mixing import IndexFeatures
    from tscale.model import build_model
    from tscale.ops import fused_loss

    cfg = ModelConfig(arch="tscale", vocab_size=V, eos_id=V - 1, n_layer=4, n_head=4, head_dim=32, d_model=128,
                      seq_len=128, window=32, global_every=2)
    torch.manual_seed(0)
    model = build_model(cfg, IndexConfig(path="x", inputs=True, mixer=True, gate_stats=True))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, V, (16, 128), generator=g), torch.randint(0, V, (16, 128), generator=g)
    nxt = torch.randint(-1, V, (16, 128, 4), generator=g)
    feats = IndexFeatures(torch.randint(0, 40, (16, 128), generator=g), nxt,
                          torch.randint(1, 6, (16, 128, 4), generator=g) * (nxt >= 0))
    default = fused_loss.CPU_CHUNK_ELEMENTS

    def step(elements):
        def run():
            fused_loss.CPU_CHUNK_ELEMENTS = elements
            try:
                model.zero_grad(set_to_none=True)
                loss = model(x, index=feats, targets=y).mean()
                loss.backward()
            finally:
                fused_loss.CPU_CHUNK_ELEMENTS = default
            return loss.detach()
        return run

    paths = {"index_step_whole": step(10 ** 12), "index_step_chunked": step(default)}
    torch.testing.assert_close(paths["index_step_chunked"](), paths["index_step_whole"](), rtol=1e-5, atol=1e-6)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per step (the tiny presets' 16 x 128)")
    ap.add_argument("--dim", type=int, default=128, help="width of the head's input")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    allocator = reuse_freed_blocks()  # as CPU training sets it
    metrics = {}
    for V in (50257, 4096):
        paths, chunk = training_paths(args.tokens, args.dim, V)
        ms = run_interleaved({**paths, **evaluation_paths(args.tokens, args.dim, V), **index_step_paths(V)}, args.rounds)
        for name, t in ms.items():
            metrics[f"{name}_ms_v{V}"] = round(t, 1)
        metrics[f"default_chunk_v{V}"] = chunk
        metrics[f"train_speedup_v{V}"] = round(ms["logits"] / ms[f"chunk{chunk}"], 3)
        metrics[f"eval_speedup_v{V}"] = round(ms["eval_whole"] / ms["eval_chunked"], 3)
        metrics[f"index_step_speedup_v{V}"] = round(ms["index_step_whole"] / ms["index_step_chunked"], 3)
        print(f"V {V}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items()), flush=True)
    note = (f"cpu loss (cpu_loss_speed.py): {torch.get_num_threads()} threads, {args.tokens} tokens x {args.dim} "
            f"into a head of V (padded to a multiple of 64), soft-cap {SOFTCAP}, fp32; training = forward + backward "
            f"of the mean loss: logits path, the kernel's torch reference, the chunked loss at several chunks "
            f"(default_chunk: at most {CPU_CHUNK_ELEMENTS} logits); evaluation = per-token losses without gradients, "
            f"whole logits against chunks (tscale.model.loss.token_losses_in_chunks); index_step = forward + backward of a tiny tscale model (4 x 128, 16 x 128 tokens) with the index's inputs and mixer, one chunk against default chunks; every path checked against the logits path; the paths "
            f"interleaved {args.rounds} times, median ms; glibc allocator policy of CPU training "
            f"{'applied' if allocator else 'not available'}. *_speedup_*: logits path / default chunk.")
    print(f"-> {merge_metrics('cpu_loss', metrics, note, args.out_dir)}")


if __name__ == "__main__":
    main()
