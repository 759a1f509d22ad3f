"""Host time of one layer's cuDNN attention (tscale.ops.attention_cudnn), forward + backward, eager.

    python scripts/bench/cudnn_host_cost.py [--batch 32] [--seq-len 1024] [--calls 50]

Issues `--calls` forward + backward pairs of one global layer's attention (6 heads of 128, sink,
one document per row) without waiting for the GPU, and prints the host's seconds per pair beside
the wall time per pair once the GPU has finished: when the two agree, a step of such calls is
bound by the host, not the GPU (docs/BENCHMARKS.md, the attention cost with cudnn_global).
Needs a Hopper GPU and the cuDNN frontend (`pip install -e ".[hopper]"`).
"""

import argparse
import time

import torch

from tscale.ops.attention_cudnn import attention_cudnn, cudnn_unusable_reason
from tscale.ops.doc_runs import doc_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    H, D = 6, 128
    if not torch.cuda.is_available():
        raise SystemExit("cudnn_host_cost.py: needs a CUDA GPU")
    why = cudnn_unusable_reason(torch.device("cuda"), torch.bfloat16, D)
    if why:
        raise SystemExit(f"cudnn_host_cost.py: {why}")
    B, T = args.batch, args.seq_len
    runs = doc_runs(None, B, T, backend="cudnn").to("cuda")
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dy = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)

    def pair():
        y = attention_cudnn(q, k, v, runs, window=0, sink=True, scale=D ** -0.5)  # (B, T, H, D)
        torch.autograd.grad(y, (q, k, v), dy)

    pair()  # builds the two graphs
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        pair()
    host = (time.perf_counter() - t0) / args.calls
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / args.calls
    print(f"B={B} T={T}: host {1e3 * host:.3f} ms per forward + backward, wall {1e3 * wall:.3f} ms")


if __name__ == "__main__":
    main()
