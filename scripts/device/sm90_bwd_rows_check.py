"""The Hopper backward's forms against attention_reference at chosen lengths, each (form, T) in its own process.

    python3 scripts/device/sm90_bwd_rows_check.py [--forms 1-1-1 1-2-1] [--seq 64 320 333 1024]

A form is WGS-TMA-EARLY_DV (tests/helpers_attention_kernel.py, HOPPER_BACKWARD_FORMS). For every form and length, one
child process runs layouts none and sparse with windows 0 and 128 (sink on for the second window) and prints one line a
case: the largest error of dq, dk and dv over the tolerance's bound, or how the process ended. A GPU fault ends only
its own child, so the table shows which lengths and forms fault.
"""

import argparse
import os
import subprocess
import sys

CHILD = r"""
import sys, torch
sys.path.insert(0, "tests")
from helpers_attention import doc_ids
from tscale.ops.attention import attention_kernel, attention_reference
T = int(sys.argv[1])
for layout in ("none", "sparse"):
    for window, sink in ((0, False), (128, True)):
        g = torch.Generator().manual_seed(T + window)
        q, k, v, do = (torch.randn(2, 3, T, 128, generator=g).to(torch.bfloat16).cuda() for _ in range(4))
        docs = doc_ids(2, T, layout, g)
        docs = docs.cuda() if docs is not None else None
        kw = dict(window=window, doc_ids=docs, sink=sink, scale=128 ** -0.5)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        got = torch.autograd.grad(attention_kernel(*leaves, **kw), leaves, do)
        ref = [t.float().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(attention_reference(*ref, **kw), ref, do.float())
        torch.cuda.synchronize()
        worst = max(((a.float() - b).abs().max() / (2.5e-2 * b.abs().max() + 1e-3)).item() for a, b in zip(got, want))
        print(f"T {T} {layout} window {window}: error / bound {worst:.3f} {'ok' if worst <= 1 else 'FAIL'}", flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forms", nargs="+", default=["1-1-1", "1-2-1"])
    ap.add_argument("--seq", nargs="+", type=int, default=[64, 320, 333, 1024])
    args = ap.parse_args()
    for form in args.forms:
        wgs, tma, early = form.split("-")
        env = dict(os.environ, TSCALE_ATTENTION_BWD_KERNEL="sm90", TSCALE_ATTENTION_SM90_BWD_WGS=wgs,
                   TSCALE_ATTENTION_SM90_BWD_TMA=tma, TSCALE_ATTENTION_SM90_BWD_EARLY_DV=early)
        for T in args.seq:
            r = subprocess.run([sys.executable, "-c", CHILD, str(T)], env=env, capture_output=True, text=True,
                               timeout=300)
            for line in r.stdout.splitlines():
                print(f"form {form} {line}")
            if r.returncode != 0:
                err = [ln for ln in r.stderr.splitlines() if "Error" in ln or "error" in ln]
                print(f"form {form} T {T}: exit {r.returncode}: {err[-1] if err else r.stderr[-300:]}")


if __name__ == "__main__":
    main()
