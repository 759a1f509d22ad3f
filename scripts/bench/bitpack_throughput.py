"""Sign-packing throughput of tscale._C (pack_signs, unpack_signs, unpack_signs_accumulate_) on GPU and CPU.

GB/s counts the float32 bytes on the uncompressed side (read by pack, written by unpack), so
it compares directly with memory bandwidth. The baseline is the pure-torch reference of the
same op on the same device, timed the same way. On the GPU, times come from CUDA events
after warm-up; on the CPU, from wall time.

Run: python scripts/bench/bitpack_throughput.py [--numel 67108864] [--chunk 2048] [--no-write]
Writes docs/bench/bitpack_throughput.json (metrics {device}_{op}_gbps and _ref_gbps).
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, time_per_call, write_record  # noqa: E402

import tscale._C  # noqa: E402,F401  (registers torch.ops.tscale.*)
from tscale.ops import bitpack  # noqa: E402


def measure(device: torch.device, numel: int, chunk: int, repeats: int) -> dict[str, float]:
    x = torch.randn(numel, device=device)  # (N,)
    bits, scales = torch.ops.tscale.pack_signs(x, chunk)
    out = torch.zeros_like(x)
    gb = numel * 4 / 1e9
    kernels = {
        "pack": lambda: torch.ops.tscale.pack_signs(x, chunk),
        "unpack": lambda: torch.ops.tscale.unpack_signs(bits, scales, numel, chunk),
        "unpack_acc": lambda: torch.ops.tscale.unpack_signs_accumulate_(out, bits, scales, chunk),
    }
    references = {
        "pack": lambda: bitpack.pack_signs_reference(x, chunk),
        "unpack": lambda: bitpack.unpack_signs_reference(bits, scales, numel, chunk),
        "unpack_acc": lambda: out.add_(bitpack.unpack_signs_reference(bits, scales, numel, chunk)),
    }
    metrics = {}
    for op in kernels:
        metrics[f"{device.type}_{op}_gbps"] = gb / time_per_call(kernels[op], device, repeats, warmup=2)
        metrics[f"{device.type}_{op}_ref_gbps"] = gb / time_per_call(references[op], device, max(1, repeats // 4), warmup=2)
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=64 * 2**20, help="values per call on the GPU")
    parser.add_argument("--cpu-numel", type=int, default=16 * 2**20, help="values per call on the CPU")
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-write", action="store_true", help="print only, do not write docs/bench")
    parser.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = parser.parse_args()

    metrics = {}
    if torch.cuda.is_available():
        import tscale._C as ext

        if not ext.with_cuda:
            sys.exit("a GPU is visible but tscale._C has no CUDA kernels: rebuild with `pip install --no-build-isolation -e .`")
        metrics.update(measure(torch.device("cuda"), args.numel, args.chunk, args.repeats))
    metrics.update(measure(torch.device("cpu"), args.cpu_numel, args.chunk, max(2, args.repeats // 10)))
    for key, value in metrics.items():
        print(f"{key:28s} {value:10.2f} GB/s")
    notes = (f"float32 GB/s on the uncompressed side; numel {args.numel} (GPU), {args.cpu_numel} (CPU, "
             f"{torch.get_num_threads()} threads), chunk {args.chunk}; *_ref_gbps: the pure-torch reference")
    if not args.no_write:
        print(write_record("bitpack_throughput", {k: round(v, 3) for k, v in metrics.items()}, notes,
                           args.out_dir))


if __name__ == "__main__":
    main()
