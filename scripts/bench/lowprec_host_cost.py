"""Host time per call of the low-precision product ops, eager, against a bf16 product: what a step pays per layer
before the GPU sees any work.

    python scripts/bench/lowprec_host_cost.py [--calls 2000] [--size 256]

Issues `--calls` calls of each op on small (size x size) operands, so the GPU never falls behind,
and prints the host's microseconds per call: torch.mm in bf16, torch._int_mm, the CUTLASS int8
kernel called directly (when built), and tscale::scaled_mm_rows in int8 and fp8 (the switchback
recipes' product: the custom op's dispatch, its argument checks and its path choice around the
same kernels). Under torch.compile without CUDA graphs a step pays these per product: 2 per
linear layer and step in the switchback recipes (192 layers at 1.5B). --cpu runs the same calls on
the CPU (their host cost only, a smoke test).
"""

import argparse
import time

import torch

from tscale.ops import lowprec


def per_call_us(fn, calls: int, device: torch.device) -> float:
    """Host microseconds per call of fn over `calls` calls issued without waiting (after 20 warm-up calls)."""
    for _ in range(20):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize()
    return host / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--cpu", action="store_true", help="the CPU paths (a smoke test)")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("lowprec_host_cost.py: needs a CUDA GPU (or --cpu)")
    device = torch.device("cpu" if args.cpu else "cuda")
    n = args.size
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16)  # (M, K)
    w = torch.randn(n, n, device=device, dtype=torch.bfloat16)  # (N, K)
    xq, sx = lowprec.quantize_reference(x, torch.int8, -1)  # (M, K), (M, 1)
    wq, sw = lowprec.quantize_reference(w, torch.int8, -1)  # (N, K), (N, 1)
    xf, sxf = lowprec.quantize_reference(x, torch.float8_e4m3fn, -1)
    wf, swf = lowprec.quantize_reference(w, torch.float8_e4m3fn, -1)
    ops = {"bf16 torch.mm": lambda: torch.mm(x, w.t()),
           "torch._int_mm": lambda: torch._int_mm(xq, wq.t())}
    if device.type == "cuda" and lowprec._cutlass_kernels():
        cutlass = lowprec._cutlass_op(device.index or 0)
        wq_cm = wq.t()  # (K, N), column-major
        sa, sb = sx.reshape(-1).contiguous(), sw.reshape(-1).contiguous()  # (M,), (N,)
        ops["CUTLASS int8, direct"] = lambda: cutlass(xq, wq_cm, sa, sb)
    ops["tscale::scaled_mm_rows int8"] = lambda: lowprec.scaled_mm_rows(xq, wq, sx, sw, torch.bfloat16)
    if device.type == "cuda":
        ops["tscale::scaled_mm_rows fp8"] = lambda: lowprec.scaled_mm_rows(xf, wf, sxf, swf, torch.bfloat16)
    for name, fn in ops.items():
        print(f"{name:32s} {per_call_us(fn, args.calls, device):8.1f} us per call (host)", flush=True)


if __name__ == "__main__":
    main()
