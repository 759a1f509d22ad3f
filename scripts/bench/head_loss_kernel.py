"""The head's loss kernel alone under several policies, and against an earlier version of it.

    python scripts/bench/head_loss_kernel.py [--base DIR] [--tokens 32768] [--vocab 50257] [--softcaps 30 0]
                                             [--repeats 20] [--rounds 2] [--out-dir docs/bench]

Builds scripts/bench/head_loss_kernel/ with torch.utils.cpp_extension: csrc/loss/softcap_xent_kernel.cuh
instantiated under the policies of variants.cu (how many blocks share a multiprocessor, how many vectors a
thread loads at once) and, with --base, the kernel and backend files found in DIR
(softcap_xent_kernel.cuh, softcap_xent_cuda_backend.cuh of an earlier commit). On one training step's
logits (N tokens x the vocabulary padded to a multiple of 64, bf16 drawn from N(0, 16)), each is checked
against the reference twin, then timed with CUDA events (REPEATS calls after 3), the variants interleaved
for ROUNDS rounds; GB/s counts one read and one write of the logits. The
installed op (torch.ops.tscale.softcap_xent_grad) is timed beside them. Record: head_loss_kernel.json.
"""

import argparse
import functools
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, round_orders, time_per_call, write_record  # noqa: E402

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

from tscale.ops.head_loss import softcap_xent_grad_reference  # noqa: E402

HERE = Path(__file__).resolve().parent / "head_loss_kernel"


def build(base: Path | None, build_dir: Path):
    """The benchmark's extension: the policies of variants.cu, and base.cu over DIR's files when given."""
    sources = [HERE / "bind.cpp", HERE / "variants.cu"]
    flags = []
    if base is not None:
        for name, as_name in (("softcap_xent_kernel.cuh", "base_kernel.cuh"),
                              ("softcap_xent_cuda_backend.cuh", "base_backend.cuh")):
            shutil.copy(base / name, build_dir / as_name)
        shutil.copy(HERE / "base.cu", build_dir / "base.cu")
        sources.append(build_dir / "base.cu")
        flags.append("-DXENT_BENCH_BASE")
    return cpp_extension.load(
        "xent_bench", [str(s) for s in sources], build_directory=str(build_dir),
        extra_include_paths=[str(REPO / "csrc" / "loss"), str(build_dir)], extra_cflags=["-O3", *flags],
        extra_cuda_cflags=["-O3", "--use_fast_math", "-DNDEBUG", "--expt-relaxed-constexpr", *flags], verbose=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="folder with an earlier softcap_xent_kernel.cuh and its CUDA backend")
    ap.add_argument("--tokens", type=int, default=32_768)
    ap.add_argument("--vocab", type=int, default=50_257)
    ap.add_argument("--softcaps", type=float, nargs="+", default=[30.0, 0.0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("head_loss_kernel.py: needs a CUDA GPU")
    dev = torch.device("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        mod = build(args.base, Path(tmp))
    paths = {name: functools.partial(mod.run, name) for name in mod.variants()}
    if args.base is not None:
        paths["base"] = mod.base
    paths["op"] = torch.ops.tscale.softcap_xent_grad
    N, V = args.tokens, args.vocab
    V_pad = -(-V // 64) * 64
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(N, V_pad, generator=g) * 4.0).to(dev, torch.bfloat16)  # (N, V_pad)
    targets = torch.randint(0, V, (N,), generator=g).to(dev)  # (N,)
    gb = 2 * logits.numel() * logits.element_size() / 1e9
    metrics = {}
    for softcap in args.softcaps:
        tag = f"cap{softcap:g}"
        want_losses, want_grad = softcap_xent_grad_reference(logits, targets, V, softcap, 1.0 / N)
        for name, fn in paths.items():
            losses, grad = fn(logits, targets, V, softcap, 1.0 / N)
            torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
            torch.testing.assert_close(grad.float(), want_grad.float(), rtol=2e-2, atol=1e-3 / N,
                                       msg=lambda m: f"{name}: {m}")
        del want_losses, want_grad, losses, grad
        times = {name: [] for name in paths}
        for order in round_orders(list(paths), args.rounds):
            for name in order:
                fn = paths[name]
                ms = time_per_call(lambda: fn(logits, targets, V, softcap, 1.0 / N), dev, args.repeats) * 1e3
                times[name].append(ms)
        for name, ts in times.items():
            ms = min(ts)
            metrics[f"{tag}_{name}_ms"] = round(ms, 3)
            metrics[f"{tag}_{name}_gb_per_s"] = round(gb / (ms / 1e3), 1)
            print(f"softcap {softcap:g}: {name:14s} " + " ".join(f"{t:.3f}" for t in ts)
                  + f" ms -> {gb / (ms / 1e3):,.0f} GB/s", flush=True)
    notes = (f"head loss kernel alone (head_loss_kernel.py): N = {N} rows, vocabulary {V} padded to {V_pad}, bf16 "
             f"logits N(0, 16), each variant checked against the reference twin, then timed with CUDA events over "
             f"{args.repeats} calls after 3, {args.rounds} interleaved rounds, the fastest kept; GB/s = one read and "
             f"one write of the logits; policies: scripts/bench/head_loss_kernel/variants.cu; op = the installed "
             f"torch.ops.tscale.softcap_xent_grad" + ("; base = the kernel of --base" if args.base else ""))
    print(f"-> {write_record('head_loss_kernel', metrics, notes, args.out_dir)}")


if __name__ == "__main__":
    main()
