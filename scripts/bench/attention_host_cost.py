"""Host time of one attention call (forward, and forward + backward), eager, beside SDPA's: is a step of them bound by the host?

    python scripts/bench/attention_host_cost.py [--calls 200] [--shapes 1x128 32x1024]

For each shape (batch x sequence length; 6 heads of 128, the 124M tscale layer) and each path, issues
`--calls` calls without waiting for the GPU and prints the host's microseconds per call beside the
wall time per call once the GPU has finished. Where the two agree the calls are bound by the host.
Paths: the fused kernel through tscale.ops.attention (a window of 128 with document ids and the sink,
as a windowed layer calls it), the same custom op with no mask but causality, and
F.scaled_dot_product_attention(is_causal=True). At 1 x 128 the GPU work is negligible, so the
host time is what the path costs the host. Needs a CUDA GPU with tscale._C built for it.
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F

from tscale.ops.attention import attention, kernel_unusable_reason

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

    return {name: (f, with_backward(f)) for name, f in
            (("kernel_local", kernel_local), ("kernel_causal", kernel_causal), ("sdpa_causal", sdpa))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--shapes", nargs="+", default=["1x128", "32x1024"], help="BATCHxSEQ_LEN")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_host_cost.py: needs a CUDA GPU")
    probe = torch.zeros(1, H, 16, D, device="cuda", dtype=torch.bfloat16)
    why = kernel_unusable_reason(probe, probe, probe)
    if why:
        raise SystemExit(f"attention_host_cost.py: the fused kernel cannot run here: {why}")
    results = {}
    for shape in args.shapes:
        B, T = (int(x) for x in shape.split("x"))
        for name, (fwd, fwd_bwd) in paths(B, T).items():
            with torch.no_grad():
                f_host, f_wall = timed(fwd, args.calls)
            b_host, b_wall = timed(fwd_bwd, args.calls)
            results[f"{shape}_{name}"] = {"fwd_host_us": round(f_host, 1), "fwd_wall_us": round(f_wall, 1),
                                          "fwd_bwd_host_us": round(b_host, 1), "fwd_bwd_wall_us": round(b_wall, 1)}
            print(f"{shape:>8} {name:<14} forward host {f_host:8.1f} wall {f_wall:8.1f} us | "
                  f"forward + backward host {b_host:8.1f} wall {b_wall:8.1f} us", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
