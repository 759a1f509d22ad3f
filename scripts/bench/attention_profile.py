"""Where the fused attention kernel's forward + backward time goes: GPU time per kernel, by mask and length.

The shapes and masks of scripts/bench/attention_kernel.py (B*T = 32768 tokens, 6 heads of 128,
bf16; local = window 128 + random documents + sink, causal = plain causal), each run under
torch.profiler for --steps forward + backward calls after a warm-up (--windows: the local mask at each of these
windows, "local" at 128 and "local_w<N>" at the others); every GPU kernel's time is
summed by name and divided by the steps. SDPA's causal call is profiled beside for reference.

Run: python scripts/bench/attention_profile.py [--seq 1024 4096] [--windows 128] [--steps 10] [--out FILE.json]
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_cost import kernel_times  # noqa: E402
from attention_kernel import D, TOKENS, WINDOW, doc_ids, fwd_bwd  # noqa: E402
from common import git_commit, gpu_name  # noqa: E402

from tscale.ops.attention import attention_kernel, kernel_unusable_reason  # noqa: E402


def _local(window: int, docs: torch.Tensor, scale: float):
    """The local mask's call at `window`: random documents, the sink."""
    return lambda a, b, c: attention_kernel(a, b, c, window=window, doc_ids=docs, sink=True, scale=scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--windows", type=int, nargs="+", default=[WINDOW])
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--doc-len", type=int, default=400)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attention_profile: needs a CUDA GPU")
    g = torch.Generator().manual_seed(0)
    record = {"gpu": gpu_name(), "torch": torch.__version__, "commit": git_commit(), "profiles": {}}
    for T in args.seq:
        B = TOKENS // T
        q, k, v, do = (torch.randn(B, args.heads, T, D, generator=g).cuda().bfloat16() for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]
        docs = doc_ids(B, T, args.doc_len, g).cuda().int()
        if reason := kernel_unusable_reason(q, k, v):
            sys.exit(f"attention_profile: the kernel cannot run here: {reason}")
        scale = D ** -0.5
        cases = {("local" if w == WINDOW else f"local_w{w}"): _local(w, docs, scale) for w in args.windows}
        cases["causal"] = lambda a, b, c: attention_kernel(a, b, c, window=0, doc_ids=None, sink=False, scale=scale)
        cases["sdpa_causal"] = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True)
        for name, f in cases.items():
            times = kernel_times(fwd_bwd(f, leaves, do), args.steps, q.device)
            key = f"T{T}_{name}"
            record["profiles"][key] = times
            print(f"{key}: {sum(times.values()):.3f} ms of GPU kernels per forward + backward")
            for kernel, ms in times.items():
                print(f"  {ms:8.3f} ms  {kernel}")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
