"""Host time of one attention call (forward, and forward + backward), eager, beside SDPA's: is a step of them bound by the host?

    python scripts/bench/attention_host_cost.py [--calls 200] [--shapes 1x128 32x1024]

For each shape (batch x sequence length; 6 heads of 128, the 124M tscale layer) and each path, issues
`--calls` calls without waiting for the GPU and prints the host's microseconds per call beside the
wall time per call once the GPU has finished. Where the two agree the calls are bound by the host.
Paths: the fused kernel through tscale.ops.attention (a window of 128 with document ids and the sink,
as a windowed layer calls it), the same with no mask but causality, F.scaled_dot_product_attention
(is_causal=True), and the extension's forward and backward ops called directly (ops_local: what the
ops themselves cost the host, without autograd). At 1 x 128 the GPU work is negligible, so the
host time is what the path costs the host. Needs a CUDA GPU with tscale._C built for it.
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_record  # noqa: E402

from tscale.ops.attention import attention, kernel_unusable_reason  # noqa: E402

H, D = 6, 128


def timed(call, calls: int) -> tuple[float, float]:
    """(host µs per call, wall µs per call): issued back to back, then one wait for the GPU."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return host / calls * 1e6, wall / calls * 1e6


def paths(B: int, T: int) -> dict:
    """name -> (forward call, forward + backward call) on fresh bf16 (B, H, T, D) tensors."""
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dy = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    docs = (torch.arange(T, device="cuda") // max(1, T // 2)).expand(B, T).contiguous()  # two documents a row
    scale = D ** -0.5

    def kernel_local():
        return attention(q, k, v, window=128, doc_ids=docs, sink=True, scale=scale, impl="kernel")

    def kernel_causal():
        return attention(q, k, v, window=0, doc_ids=None, sink=False, scale=scale, impl="kernel")

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def with_backward(fwd):
        return lambda: torch.autograd.grad(fwd(), (q, k, v), dy)

    docs32 = docs.int()

    def ops_local():  # the extension's ops called directly: their own host cost, no autograd
        return torch.ops.tscale.attention_fwd_cuda(q, k, v, docs32, 128, True, scale)

    def ops_local_backward():
        out, lse = ops_local()
        return torch.ops.tscale.attention_bwd_cuda(dy, q, k, v, out, lse, docs32, 128, True, scale)

    calls = {name: (f, with_backward(f)) for name, f in
             (("kernel_local", kernel_local), ("kernel_causal", kernel_causal), ("sdpa_causal", sdpa))}
    calls["ops_local"] = (ops_local, ops_local_backward)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--shapes", nargs="+", default=["1x128", "32x1024"], help="BATCHxSEQ_LEN")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench", help="folder of the record attention_host_cost.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_host_cost.py: needs a CUDA GPU")
    probe = torch.zeros(1, H, 16, D, device="cuda", dtype=torch.bfloat16)
    why = kernel_unusable_reason(probe, probe, probe)
    if why:
        raise SystemExit(f"attention_host_cost.py: the fused kernel cannot run here: {why}")
    metrics = {}
    for shape in args.shapes:
        B, T = (int(x) for x in shape.split("x"))
        for name, (fwd, fwd_bwd) in paths(B, T).items():
            with torch.no_grad():
                f_host, f_wall = timed(fwd, args.calls)
            b_host, b_wall = timed(fwd_bwd, args.calls)
            metrics.update({f"{shape}_{name}_fwd_host_us": round(f_host, 1), f"{shape}_{name}_fwd_wall_us": round(f_wall, 1),
                            f"{shape}_{name}_fwd_bwd_host_us": round(b_host, 1),
                            f"{shape}_{name}_fwd_bwd_wall_us": round(b_wall, 1)})
            print(f"{shape:>8} {name:<14} forward host {f_host:8.1f} wall {f_wall:8.1f} us | "
                  f"forward + backward host {b_host:8.1f} wall {b_wall:8.1f} us", flush=True)
    notes = (f"Eager calls, {args.calls} per path issued without waiting, then one wait; 6 heads of 128; host = the "
             "issuing loop's time per call, wall = until the GPU finished. kernel_local: window 128, two documents a "
             "row, sink; kernel_causal: causality only; ops_local: the extension's ops called directly, no autograd.")
    print(write_record("attention_host_cost", metrics, notes, args.out))


if __name__ == "__main__":
    main()
