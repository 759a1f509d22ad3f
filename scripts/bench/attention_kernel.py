"""The fused attention kernel against compiled FlexAttention and torch SDPA, forward + backward, at the model's shapes.

At B*T = 32768 tokens (T 1024, B 32; T 4096, B 8), H heads of D = 128 (tscale-124m: 6 of 128), bf16:
  local   window 128 + documents of random lengths (starts with probability 1/--doc-len) + sink:
          the model's sliding-window layers. kernel (tscale.ops.attention_kernel) vs flex
          (torch.compile(flex_attention) with the BlockMask and null sink slot of
          tscale.ops.attention.flex_inputs, built once outside the timing, as a fair lower bound
          on what the flex path costs).
  causal  plain causal, no documents, no sink: kernel vs SDPA (is_causal=True; flash backend).
  fa2     both masks again through torch's FlashAttention-2 (aten::_flash_attention_forward /
          _backward; documents as a variable-length batch, the window as window_size_left, the
          sink exact on top of it: tscale/ops/attention_fa2.py, the model's `train.attention =
          "fa2"`), to weigh it against the kernel; its (B, H, T, D) <-> (tokens, H, D) layout
          copies are timed with it (the model's own layout needs none). Skipped, saying why, where this torch's FlashAttention
          refuses the arguments or its result differs from the reference.
Each timed call is forward + backward (torch.autograd.grad of the output with a fixed dO); times
are medians of --repeats calls, each between two CUDA events, after --warmup calls. Before timing,
the kernel (and flex) run once per shape over the whole batch and batch row 0 is checked against
attention_reference (output and dq/dk/dv within 2.5% of the largest reference value); a mismatch
aborts the run. Most of the run time is compiling flex (once per T).
TFLOP/s counts the useful products only: 4 D FLOPs per visible (query, key) pair forward, 2.5x
that backward (3.5x in all), the same count for every implementation of a mask.

Run: python scripts/bench/attention_kernel.py [--heads 6] [--repeats 30] [--no-write]
Writes docs/bench/attention_kernel.json: kernel_vs_flex_speedup (flex time / kernel time on the
local mask, the smaller over the two T), causal_vs_sdpa_time_ratio (kernel time / SDPA time on
plain causal, the larger over the two T), and every per-shape time (ms) and TFLOP/s.
Targets: kernel_vs_flex_speedup >= 1.3, causal_vs_sdpa_time_ratio <= 1.25.
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_record  # noqa: E402

from tscale.ops.attention import (_compiled_flex, attention_kernel, attention_reference, flex_inputs,  # noqa: E402
                                  kernel_unusable_reason)
from tscale.ops.attention_fa2 import attention_fa2  # noqa: E402
from tscale.ops.doc_runs import runs_of_doc_ids  # noqa: E402

TOKENS = 32768
D = 128
WINDOW = 128
TOL = 2.5e-2


def median_ms(fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def fwd_bwd(f, leaves, do):
    """A callable running out = f(*leaves) and its backward (gradients of every leaf)."""
    def run():
        out = f(*leaves)
        torch.autograd.grad(out, leaves, do)
    return run


def doc_ids(B: int, T: int, mean_len: int, g: torch.Generator) -> torch.Tensor:
    """(B, T) int64 ids from random document starts, as the model's cumsum of start flags."""
    starts = torch.rand(B, T, generator=g) < 1.0 / mean_len
    return starts.long().cumsum(1)


def visible_pairs(B: int, T: int, window: int, docs: torch.Tensor | None) -> int:
    """Number of visible (query, key) pairs of one head, summed over the batch."""
    pos = torch.arange(T)
    if docs is None:
        first = torch.zeros(B, T, dtype=torch.long)
    else:
        new = torch.ones(B, T, dtype=torch.bool)
        new[:, 1:] = docs[:, 1:] != docs[:, :-1]
        first = torch.where(new, pos, torch.zeros_like(pos)).cummax(1).values  # first position of each doc
    seen = pos - first + 1  # (B, T): keys of the query's document up to itself
    if window:
        seen = seen.clamp(max=window)
    return int(seen.sum())


def check(name: str, run_once, q, k, v, do, fatal: bool = True, **kw) -> bool:
    """run_once() -> (out, dq, dk, dv) over the whole batch; batch row 0 against attention_reference. Exits on a
    mismatch (returns False instead when not `fatal`). (The reference materialises (H, T, T) scores, so one row
    is what it can afford at T = 4096.)"""
    got = [t[:1] for t in run_once()]
    ref_leaves = [t[:1].detach().float().requires_grad_() for t in (q, k, v)]
    docs = kw["doc_ids"]
    ref = attention_reference(*ref_leaves, **{**kw, "doc_ids": docs[:1] if docs is not None else None})
    want = (ref, *torch.autograd.grad(ref, ref_leaves, do[:1].float()))
    for part, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a.float() - b).abs().max().item()
        bound = TOL * b.abs().max().item() + 1e-3
        if not (err <= bound):  # also catches NaN
            message = (f"attention_kernel bench: {name} {part} differs from attention_reference "
                       f"(max error {err:.4g} > {bound:.4g}); not timing a wrong implementation")
            if fatal:
                sys.exit(message)
            print(message)
            return False
    print(f"checked {name}: output and gradients match attention_reference")
    return True


def fa2_bhtd(q, k, v, runs, window: int, sink: bool, scale: float) -> torch.Tensor:
    """attention_fa2 on (B, H, T, D) tensors, like the other columns."""
    out = attention_fa2(*(t.transpose(1, 2) for t in (q, k, v)), runs, window=window, sink=sink, scale=scale)
    return out.transpose(1, 2)  # (B, H, T, D)


def time_fa2(name: str, f, leaves, do, T: int, args, q, k, v, **kw) -> float | None:
    """Median ms of FlashAttention-2's forward + backward, or None (with the reason printed) if it cannot serve."""
    try:
        if not check(name, outputs(f, leaves, do, T), q, k, v, do, fatal=False, **kw):
            return None
        return median_ms(fwd_bwd(f, leaves, do), args.warmup, args.repeats)
    except (RuntimeError, TypeError) as e:  # an older torch: no window arguments, or another log-sum-exp layout
        print(f"{name}: skipped ({str(e).splitlines()[0]})")
        return None


def outputs(f, leaves, do, T: int):
    """A callable giving (out, grads...) of f over leaves, the gradients cut to T keys (flex's sink slot)."""
    def run():
        out = f(*leaves)
        return (out.detach(), *(g_[:, :, :T] for g_ in torch.autograd.grad(out, leaves, do)))
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--doc-len", type=int, default=400, help="mean document length of the local mask")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attention_kernel bench: needs a CUDA GPU")
    dev = torch.device("cuda")
    H, scale = args.heads, D ** -0.5
    g = torch.Generator().manual_seed(0)
    probe = torch.zeros(1, 1, 1, D, device=dev, dtype=torch.bfloat16)
    reason = kernel_unusable_reason(probe, probe, probe)
    if reason:
        sys.exit(f"attention_kernel bench: the fused kernel cannot run here: {reason}")

    metrics, rows, speedups, ratios = {}, [], [], []
    for T in args.seq:
        B = max(1, TOKENS // T)
        q, k, v, do = (torch.randn(B, H, T, D, generator=g).to(dev, torch.bfloat16) for _ in range(4))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        docs = doc_ids(B, T, args.doc_len, g).to(dev)
        docs32 = docs.to(torch.int32)

        # local: window 128 + documents + sink
        kw = dict(window=WINDOW, doc_ids=docs, sink=True, scale=scale)

        def kernel_local(a, b, c):
            return attention_kernel(a, b, c, window=WINDOW, doc_ids=docs32, sink=True, scale=scale)

        k2, v2, bm = flex_inputs(q, k, v, window=WINDOW, doc_ids=docs, sink=True)  # built once, untimed
        flex_leaves = [q.clone().requires_grad_(), k2.clone().requires_grad_(), v2.clone().requires_grad_()]

        def flex_local(a, b, c):
            return _compiled_flex()(a, b, c, block_mask=bm, scale=scale)

        check(f"kernel local T={T}", outputs(kernel_local, leaves, do, T), q, k, v, do, **kw)
        check(f"flex local T={T}", outputs(flex_local, flex_leaves, do, T), q, k, v, do, **kw)  # compiles flex
        t_kernel = median_ms(fwd_bwd(kernel_local, leaves, do), args.warmup, args.repeats)
        t_flex = median_ms(fwd_bwd(flex_local, flex_leaves, do), args.warmup, args.repeats)
        flops = 3.5 * 4 * D * H * visible_pairs(B, T, WINDOW, docs.cpu())
        rows.append((T, B, "local", "kernel", t_kernel, flops / t_kernel / 1e9))
        rows.append((T, B, "local", "flex", t_flex, flops / t_flex / 1e9))
        speedups.append(t_flex / t_kernel)
        runs = runs_of_doc_ids(docs, B, T).to(dev)  # built once, untimed, like the BlockMask

        def fa2_local(a, b, c):
            return fa2_bhtd(a, b, c, runs, WINDOW, True, scale)

        t_fa2 = time_fa2(f"fa2 local T={T}", fa2_local, leaves, do, T, args, q, k, v, **kw)
        if t_fa2 is not None:
            rows.append((T, B, "local", "fa2", t_fa2, flops / t_fa2 / 1e9))
            metrics[f"T{T}_local_fa2_vs_kernel_speedup"] = t_kernel / t_fa2

        # causal: no window, no documents, no sink
        kw = dict(window=0, doc_ids=None, sink=False, scale=scale)

        def kernel_causal(a, b, c):
            return attention_kernel(a, b, c, window=0, doc_ids=None, sink=False, scale=scale)

        def sdpa_causal(a, b, c):
            return F.scaled_dot_product_attention(a, b, c, is_causal=True, scale=scale)

        check(f"kernel causal T={T}", outputs(kernel_causal, leaves, do, T), q, k, v, do, **kw)
        t_kc = median_ms(fwd_bwd(kernel_causal, leaves, do), args.warmup, args.repeats)
        t_sdpa = median_ms(fwd_bwd(sdpa_causal, leaves, do), args.warmup, args.repeats)
        flops = 3.5 * 4 * D * H * visible_pairs(B, T, 0, None)
        rows.append((T, B, "causal", "kernel", t_kc, flops / t_kc / 1e9))
        rows.append((T, B, "causal", "sdpa", t_sdpa, flops / t_sdpa / 1e9))
        ratios.append(t_kc / t_sdpa)
        rows_only = runs_of_doc_ids(None, B, T).to(dev)

        def fa2_causal(a, b, c):
            return fa2_bhtd(a, b, c, rows_only, 0, False, scale)

        t_fa2c = time_fa2(f"fa2 causal T={T}", fa2_causal, leaves, do, T, args, q, k, v, **kw)
        if t_fa2c is not None:
            rows.append((T, B, "causal", "fa2", t_fa2c, flops / t_fa2c / 1e9))

        for (t_, b_, mask, impl, ms, tflops) in [r for r in rows if r[0] == T]:
            metrics[f"T{t_}_{mask}_{impl}_ms"] = ms
            metrics[f"T{t_}_{mask}_{impl}_tflops"] = tflops
        metrics[f"T{T}_kernel_vs_flex_speedup"] = t_flex / t_kernel
        metrics[f"T{T}_causal_vs_sdpa_time_ratio"] = t_kc / t_sdpa
        torch.cuda.empty_cache()

    metrics["kernel_vs_flex_speedup"] = min(speedups)
    metrics["causal_vs_sdpa_time_ratio"] = max(ratios)
    print(f"{'T':>5} {'B':>3} {'mask':>7} {'impl':>7} {'ms (fwd+bwd)':>13} {'TFLOP/s':>8}")
    for T, B, mask, impl, ms, tflops in rows:
        print(f"{T:>5} {B:>3} {mask:>7} {impl:>7} {ms:>13.3f} {tflops:>8.1f}")
    print(f"kernel_vs_flex_speedup (flex / kernel, local mask, worst T): {metrics['kernel_vs_flex_speedup']:.2f} "
          f"(target >= 1.3)")
    print(f"causal_vs_sdpa_time_ratio (kernel / SDPA, plain causal, worst T): "
          f"{metrics['causal_vs_sdpa_time_ratio']:.2f} (target <= 1.25)")
    if not args.no_write:
        notes = (f"B*T = {TOKENS} tokens, H = {H}, D = {D}, bf16, forward + backward, median of {args.repeats} "
                 f"CUDA-event timings. local = window {WINDOW} + random documents (mean length {args.doc_len}) + sink; "
                 f"flex timed with its BlockMask and sink slot prebuilt. causal = plain causal vs SDPA "
                 f"(is_causal=True). Kernel checked against attention_reference at every shape before timing. "
                 f"fa2 = torch's FlashAttention-2 (aten::_flash_attention_forward / _backward) on the same masks "
                 f"(tscale/ops/attention_fa2.py: documents as a varlen batch built outside the timing, "
                 f"window_size_left = window - 1, exact sink on top), checked the same way; "
                 f"T*_local_fa2_vs_kernel_speedup = kernel time / fa2 time.")
        path = write_record("attention_kernel", metrics, notes, args.out_dir)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
