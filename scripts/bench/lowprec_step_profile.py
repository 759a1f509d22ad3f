"""Where a training step's time goes per low-precision recipe: kernel time per step by kind, gpt2 at 124M or 1.5B.

    python scripts/bench/lowprec_step_profile.py [--size 1p5b] [--recipes bf16 int8_switchback ...]
        [--warmup 6] [--active 3] [--compile-block-once] [--out PATH]
    add --tiny for a CPU smoke test (a 2-layer model, CPU operator times instead of kernels)

For each recipe the real loop (tscale.train.loop.train_run, torch.compile in default mode, so
that every kernel is visible; CUDA graphs would hide them) trains gpt2 of lowprec_train.py's
shape on random ids; torch.profiler records `active` steps after `warmup`. Printed per recipe:
the kernel time per step (the GPU's busy time) and its split into bf16 matrix products, int8 /
fp8 products, Inductor's fused kernels (norms, activations, the quantisation the switchback
recipes leave to it), tscale's quantize kernels, attention, the optimizer and the rest, with
the top kernels. The share of the bf16 step spent in matrix products bounds what faster
products can give: a step whose products take a share s of its time cannot run faster than
1 / (1 - s + s / r) with products r times faster. Writes the tables to --out as JSON.
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arch_profile import loop_kernel_ms  # noqa: E402
from common import REPO, measurement_stamp  # noqa: E402
from lowprec_project import kernel_class  # noqa: E402
from lowprec_train import RECIPES, SIZES, TINY, recipe_sets  # noqa: E402
from train_throughput import random_token_folder  # noqa: E402

import torch  # noqa: E402

from tscale.config import load_config  # noqa: E402
from tscale.fileio import write_json_atomic  # noqa: E402

# kinds of kernel besides the products, by substrings of their names, tried in this order before
# the products (lowprec_project.kernel_class); rowwise_kernel ... cast_tiles are tscale's quantize
# kernels (csrc/fp8); aten:: names are the CPU operators of --tiny
KINDS = (
    ("quantize", ("rowwise_kernel", "amax_", "cast_tiles", "scales_kernel")),
    ("attention", ("attention", "flash", "fmha", "attn", "sdpa", "cudnn")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "muon")),
)
CPU_PRODUCTS = {"aten::mm": "matmul", "aten::addmm": "matmul", "aten::bmm": "matmul", "aten::_int_mm": "lowp_matmul"}


def kind_of(name: str) -> str:
    """quantize, attention, optimizer, matmul (bf16 products), lowp_matmul (fp8 / int8), inductor or other."""
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    product = CPU_PRODUCTS.get(name) or {"bf16": "matmul", "fp8": "lowp_matmul", "int8": "lowp_matmul"}.get(
        kernel_class(name))
    if product:
        return product
    return "inductor" if ("triton" in low or "cpp_fused" in low) else "other"


def kernel_times(recipe: str, spec: dict, tokens: Path, warmup: int, active: int, once: bool,
                 cuda: bool) -> dict[str, float]:
    """Milliseconds per step of every kernel (CPU: operator, self time) over `active` profiled steps of the loop,
    training `recipe` at the shape of `spec`."""
    config = REPO / spec["config"] if spec["config"] else None
    sets = [*spec["sets"], *recipe_sets(recipe), f"train.steps={warmup + active + 1}", "train.eval_every=0",
            "train.ckpt_every=0", "train.log_every=1000", f'data.tokens="{tokens}"']
    if cuda:
        once_sets = ["train.compile_block_once=true"] if once else []
        sets += ["train.compile=true", 'train.compile_mode="default"', *once_sets]
    return loop_kernel_ms(load_config(config, sets), warmup, active, cuda)


def summary(times: dict[str, float], top: int) -> dict:
    kinds: dict[str, float] = {}
    for name, ms in times.items():
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    busy = sum(times.values())
    products = kinds.get("matmul", 0.0) + kinds.get("lowp_matmul", 0.0)
    ranked = sorted(times.items(), key=lambda kv: -kv[1])[:top]
    return {"kernel_ms_per_step": round(busy, 3), "kind_ms_per_step": {k: round(v, 3) for k, v in kinds.items()},
            "product_share": round(products / busy, 4) if busy else 0.0,
            "top_kernels_ms_per_step": [[n, round(ms, 4)] for n, ms in ranked],
            "kernels_ms_per_step": {n: round(ms, 4) for n, ms in sorted(times.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1p5b", choices=list(SIZES))
    ap.add_argument("--recipes", nargs="+", default=["bf16", "int8_switchback", "fp8_tensorwise"], choices=RECIPES)
    ap.add_argument("--warmup", type=int, default=6, help="steps before profiling (compile included)")
    ap.add_argument("--active", type=int, default=3, help="profiled steps")
    ap.add_argument("--compile-block-once", action="store_true", help="train.compile_block_once (shorter compiles)")
    ap.add_argument("--top", type=int, default=15, help="kernels printed per recipe")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test with a tiny model")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "lowprec_step_profile.json")
    args = ap.parse_args()
    cuda = not args.tiny
    if cuda and not torch.cuda.is_available():
        sys.exit("lowprec_step_profile.py: needs a CUDA GPU (or --tiny)")
    spec = TINY if args.tiny else SIZES[args.size]
    report = {"measured": measurement_stamp(), "size": "tiny" if args.tiny else args.size,
              "compile_block_once": args.compile_block_once, "recipes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        shape = load_config(REPO / spec["config"] if spec["config"] else None, spec["sets"])
        tokens = random_token_folder(Path(tmp) / "tokens", (args.warmup + args.active + 3) * shape.train.batch_size
                                     * (shape.model.seq_len + 1))
        for recipe in args.recipes:
            try:
                times = kernel_times(recipe, spec, tokens, args.warmup, args.active, args.compile_block_once, cuda)
            except Exception as exc:  # one recipe that cannot compile here must not lose the others' tables
                report["recipes"][recipe] = {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"}
                print(f"== {recipe}: FAILED {report['recipes'][recipe]['error']}", flush=True)
            else:
                table = report["recipes"][recipe] = summary(times, args.top)
                kinds = sorted(table["kind_ms_per_step"].items(), key=lambda kv: -kv[1])
                print(f"== {recipe}: {table['kernel_ms_per_step']:.2f} ms per step, products "
                      f"{table['product_share']:.1%}; " + ", ".join(f"{k} {ms:.2f}" for k, ms in kinds), flush=True)
                for name, ms in table["top_kernels_ms_per_step"]:
                    print(f"  {ms:8.3f} ms  {kind_of(name):11s} {name[:100]}", flush=True)
            if cuda:
                torch.cuda.empty_cache()
            write_json_atomic(args.out, report)  # after every recipe: a run stopped by its time limit keeps the rest
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
