"""One forward + backward call of the fused attention kernel per case, for Nsight Compute to profile.

Cases (scripts/bench/attention_kernel.py's shapes: B*T = 32768 tokens, 6 heads of 128, bf16):
local (window 128 + random documents + sink) and causal (plain), at each --seq. Each case runs
--warmup times unprofiled, then once between cudaProfilerStart and cudaProfilerStop, so
`ncu --profile-from-start off` sees exactly one call of each kernel per case.

Run: ncu --profile-from-start off ... python scripts/bench/attention_ncu_target.py [--seq 1024 4096]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_kernel import D, TOKENS, WINDOW, doc_ids  # noqa: E402

from tscale.ops.attention import attention_kernel, kernel_unusable_reason  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--cases", nargs="+", default=["local", "causal"], choices=["local", "causal"])
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    for T in args.seq:
        B = TOKENS // T
        q, k, v, do = (torch.randn(B, args.heads, T, D, generator=g).cuda().bfloat16() for _ in range(4))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        docs = doc_ids(B, T, 400, g).cuda().int()
        if reason := kernel_unusable_reason(q, k, v):  # also loads tscale._C, which registers the kernels
            sys.exit(f"attention_ncu_target: the kernel cannot run here: {reason}")
        for case in args.cases:
            local = case == "local"

            def call():
                out = attention_kernel(q, k, v, window=WINDOW if local else 0, doc_ids=docs if local else None,
                                       sink=local, scale=D ** -0.5)
                torch.autograd.grad(out, (q, k, v), do)

            for _ in range(args.warmup):
                call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"profiled T {T} {case}")


if __name__ == "__main__":
    main()
