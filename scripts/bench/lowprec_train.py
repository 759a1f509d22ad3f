"""End-to-end training with the low-precision recipes against bf16: tokens/s at 124M and 1.5B, and quality.

    python scripts/bench/lowprec_train.py speed [--sizes 124m 1p5b] [--recipes ...] [--steps 30] [--warmup 10]
        [--compile-mode reduce-overhead]
    python scripts/bench/lowprec_train.py quality TOKENS [--train-tokens 100000000] [--recipes ...]
    add --tiny to either: CPU, a 2-layer model, a few steps (a smoke test; records go to --out-dir)

speed: the real training loop (tscale.train.loop.train_run) on a token folder of random ids,
gpt2 architecture at 124M (configs/gpt2-124m.toml) and 1.5B (48 x 1600, 25 heads, GPT-2 XL's
shape), the same batch for every recipe, bf16 autocast and torch.compile; tokens/s is the
harmonic mean of the rates logged after the warm-up steps (total tokens / total time). One
process runs every recipe of a size, one after the other. --compile-mode sets train.compile_mode
for every recipe (the metrics' size label gets the mode: `1p5b_reduce_overhead`); --compile-block-once sets
train.compile_block_once (label suffix `_block_once`); --grad-accum N sets train.grad_accum (N micro-batches
per optimizer step, so the optimizer's share of a step falls N-fold; label suffix `_accumN`).

quality: configs/gpt2-124m.toml on TOKENS (the benchmark corpus of DESIGN.md) for
--train-tokens tokens, one pass, the same seed and windows for every recipe, each as a
`tscale train` subprocess that is resumed if stopped (a finished run is kept, so a second call
continues); then `tscale eval` of each final checkpoint on every validation token in bf16.

Both merge their metrics into docs/bench/lowprec.json (the other metrics stay):
`{fp8,int8}_vs_bf16_train_speedup_{124m,1p5b}` (fp8 = fp8_tensorwise, int8 = int8_switchback: the
recipe of each kind a user should train with; int8 was int8_rowwise until int8_switchback trained
faster at 1.5B with its loss within the target),
`train_tokens_per_s_<recipe>_<size>`, `train_speedup_<recipe>_<size>` and `run_s_<recipe>_<size>` (the whole
run's seconds: building, compiling and every step) for every recipe run
(int8_rowwise_bwd: int8_rowwise with precision.int8_backward, all three products in int8;
fp8_tensorwise_fastacc: fp8_tensorwise with precision.fp8_fast_accum; fp8_tensorwise_graph: fp8_tensorwise with
precision.quantize_in_graph, its quantisation left to torch.compile; fp8_tensorwise_delayed: fp8_tensorwise with
precision.scaling = "delayed" (each cast scaled by the operand's earlier amax, one read); int8_switchback / fp8_switchback: the
forward and input-gradient products in int8 / fp8, the weight gradient in bf16), and `{fp8,int8}_val_loss_rel_diff`
= (val loss of the recipe - val loss of bf16) / val loss of bf16 with `val_loss_<recipe>`.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402
from train_throughput import random_token_folder  # noqa: E402

import torch  # noqa: E402

from tscale.config import load_config  # noqa: E402
from tscale.train.checkpoint import checkpoint_dirs  # noqa: E402
from tscale.train.loop import train_run  # noqa: E402

RECIPES = ["bf16", "fp8_tensorwise", "fp8_tensorwise_fastacc", "fp8_tensorwise_graph", "fp8_tensorwise_delayed",
           "fp8_rowwise", "int8_rowwise", "int8_rowwise_bwd", "int8_switchback", "fp8_switchback"]
INT8_BACKWARD = "int8_rowwise_bwd"  # int8_rowwise with its backward products in int8 too (precision.int8_backward)
FP8_FAST_ACCUM = "fp8_tensorwise_fastacc"  # fp8_tensorwise with fast accumulation in its forward product
FP8_IN_GRAPH = "fp8_tensorwise_graph"  # fp8_tensorwise quantised by traceable torch ops (precision.quantize_in_graph)
FP8_DELAYED = "fp8_tensorwise_delayed"  # fp8_tensorwise with delayed scaling (precision.scaling = "delayed")
HEADLINE = {"fp8": "fp8_tensorwise", "int8": "int8_switchback"}
SIZES = {
    "124m": {"config": "configs/gpt2-124m.toml", "sets": ["train.batch_size=32"]},
    "1p5b": {"config": "configs/gpt2-124m.toml",
             "sets": ["model.n_layer=48", "model.n_head=25", "model.d_model=1600", "train.batch_size=8"]},
}
TINY = {"config": None, "sets": ['model.arch="gpt2"', "model.n_layer=2", "model.n_head=2", "model.d_model=64",
                                 "model.seq_len=64", "train.batch_size=4", "train.compile=false", 'train.device="cpu"',
                                 "train.eval_batches=2", "optim.warmup_steps=2"]}


def recipe_sets(recipe: str) -> list[str]:
    """The --set overrides that select a recipe of RECIPES."""
    if recipe == INT8_BACKWARD:
        return ['precision.recipe="int8_rowwise"', "precision.int8_backward=true"]
    if recipe == FP8_FAST_ACCUM:
        return ['precision.recipe="fp8_tensorwise"', "precision.fp8_fast_accum=true"]
    if recipe == FP8_IN_GRAPH:
        return ['precision.recipe="fp8_tensorwise"', "precision.quantize_in_graph=true"]
    if recipe == FP8_DELAYED:
        return ['precision.recipe="fp8_tensorwise"', 'precision.scaling="delayed"']
    return [f'precision.recipe="{recipe}"']


def harmonic_rate(records: list[dict], after_step: int) -> float:
    """Total tokens / total time over the logged intervals that end after `after_step` (one rate per interval)."""
    timed = [r["tokens_per_s"] for r in records if "tokens_per_s" in r and r["step"] > after_step]
    if not timed:
        raise SystemExit(f"no rate logged after step {after_step}: raise --steps")
    return len(timed) / sum(1 / r for r in timed)


class MovedCheck:
    """An on_step hook: which parameters did not move from step `first` to step `last` (steps that skipped their
    products). It touches the parameters at those two steps only, so the steps between run undisturbed."""

    def __init__(self, first: int, last: int, sample: int = 4096):
        self.first, self.last, self.sample = first, last, sample
        self.start: dict[str, torch.Tensor] = {}
        self.frozen: list[str] = []

    def __call__(self, step: int, model) -> None:
        if step not in (self.first, self.last):
            return
        head = {n: p.detach().flatten()[:self.sample].clone() for n, p in model.named_parameters()}  # (<= sample,)
        if step == self.first:
            self.start = head
        else:
            self.frozen = [n for n, h in head.items() if torch.equal(h, self.start[n])]


def speedups(rates: dict[str, float], size: str) -> dict:
    """{recipe rates, fp8 / int8 speedups over bf16} for one size, from {recipe: tokens/s}."""
    out = {f"train_tokens_per_s_{recipe}_{size}": round(rate) for recipe, rate in rates.items()}
    if "bf16" in rates:
        out.update({f"train_speedup_{recipe}_{size}": round(rate / rates["bf16"], 4)
                    for recipe, rate in rates.items() if recipe != "bf16"})
    for kind, recipe in HEADLINE.items():
        if f"train_speedup_{recipe}_{size}" in out:
            out[f"{kind}_vs_bf16_train_speedup_{size}"] = out[f"train_speedup_{recipe}_{size}"]
    return out


def quality_diffs(losses: dict[str, float]) -> dict:
    """{val_loss_<recipe>, fp8 / int8 relative differences to bf16} from {recipe: val loss}."""
    out = {f"val_loss_{recipe}": round(loss, 5) for recipe, loss in losses.items()}
    if "bf16" in losses:
        out.update({f"val_loss_rel_diff_{recipe}": round((loss - losses["bf16"]) / losses["bf16"], 5)
                    for recipe, loss in losses.items() if recipe != "bf16"})
    for kind, recipe in HEADLINE.items():
        if recipe in losses and "bf16" in losses:
            out[f"{kind}_val_loss_rel_diff"] = round((losses[recipe] - losses["bf16"]) / losses["bf16"], 5)
    return out


def speed(args, out_dir: Path) -> tuple[dict, Path | None]:
    """Each size's recipes one after the other; the record is merged into out_dir after every recipe, so a
    run stopped part-way (a time limit) keeps what it measured. (metrics, the record's path)."""
    sizes = {"tiny": TINY} if args.tiny else {s: SIZES[s] for s in args.sizes}
    log_every = 1 if args.tiny else 5
    metrics, done, path = {}, [], None
    with tempfile.TemporaryDirectory() as tmp:
        for size, spec in sizes.items():
            config = REPO / spec["config"] if spec["config"] else None
            shape = load_config(config, spec["sets"])  # batch and sequence: the same for every recipe
            tokens = Path(tmp) / f"tokens-{size}"
            accum = args.grad_accum
            random_token_folder(tokens, (args.warmup + args.steps + 2) * accum * shape.train.batch_size
                                * (shape.model.seq_len + 1))
            rates = {}
            label = size if args.compile_mode == "default" else f"{size}_{args.compile_mode.replace('-', '_')}"
            label += ("_block_once" if args.compile_block_once else "") + (f"_accum{accum}" if accum > 1 else "")
            for recipe in args.recipes:
                once = ["train.compile_block_once=true"] if args.compile_block_once else []
                cfg = load_config(config, [*spec["sets"], f'train.compile_mode="{args.compile_mode}"', *once,
                                           f"train.grad_accum={accum}", *recipe_sets(recipe),
                                           f"train.steps={args.warmup + args.steps}", "train.eval_every=0",
                                           "train.ckpt_every=0", f"train.log_every={log_every}", f'data.tokens="{tokens}"'])
                run = Path(tmp) / f"run-{size}-{recipe}"
                moved = MovedCheck(args.warmup, args.warmup + args.steps)
                t0 = time.perf_counter()
                train_run(cfg, run, quiet=True, on_step=moved)
                run_s = time.perf_counter() - t0  # the model's build and compilation, and every step
                records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                if moved.frozen:  # a rate of steps that skipped work is no rate: say so, record nothing
                    print(f"{label} {recipe}: NOT RECORDED, {len(moved.frozen)} parameters did not move over the timed "
                          f"steps: {', '.join(moved.frozen[:6])}", flush=True)
                    continue
                rates[recipe] = harmonic_rate(records, args.warmup)
                print(f"{label} {recipe}: {rates[recipe]:,.0f} tokens/s; whole run {run_s:.0f} s", flush=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                metrics.update(speedups(rates, label))
                metrics[f"run_s_{recipe}_{label}"] = round(run_s, 1)
                done.append(f"{label} {recipe}")
                path = merge_metrics("lowprec", metrics, _speed_notes(args, sizes, done), out_dir)
    return metrics, path


def _speed_notes(args, sizes: dict, done: list[str]) -> str:
    """The speed part's paragraph: what ran, and which runs finished."""
    return (f"speed {'+'.join(sizes)} (lowprec_train.py speed): gpt2 {', '.join(sizes)} on random ids, "
            f"{args.steps} timed steps after {args.warmup}, "
            f"{'CPU, no compile' if args.tiny else f'bf16 autocast + compile ({args.compile_mode} mode)'}"
            f"{', train.compile_block_once' if args.compile_block_once else ''}"
            f"{f', train.grad_accum = {args.grad_accum}' if args.grad_accum > 1 else ''}, recipes "
            f"{', '.join(args.recipes)}; fp8 = {HEADLINE['fp8']}, int8 = {HEADLINE['int8']}; measured: {', '.join(done)}")


def tscale(args: list, log: Path) -> None:
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ tscale {' '.join(map(str, args))}\n")
        f.flush()
        if subprocess.run([sys.executable, "-m", "tscale", *map(str, args)], stdout=f, stderr=subprocess.STDOUT,
                          cwd=REPO).returncode:
            sys.exit(f"tscale {args[0]} failed; see {log}")


def quality(args) -> tuple[dict, str]:
    spec = TINY if args.tiny else {"config": "configs/gpt2-124m.toml", "sets": []}
    cfg = load_config(REPO / spec["config"] if spec["config"] else None, spec["sets"])
    per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len
    steps = max(1, int(args.train_tokens) // per_step)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    losses = {}
    for recipe in args.recipes:
        run = work / f"run-{recipe}"
        done = checkpoint_dirs(run)
        if not (done and done[-1][0] == steps):
            if done:
                tscale(["train", "-o", run, "--resume", "--quiet"], log)
            else:
                sets = [*spec["sets"], *recipe_sets(recipe), f"train.steps={steps}",
                        f"optim.warmup_steps={max(1, steps // 10)}", f"train.eval_every={steps}",
                        f"train.ckpt_every={max(1, steps // 4)}", "train.keep_last=1"]
                config = [REPO / spec["config"]] if spec["config"] else []
                tscale(["train", *config, *[a for s in sets for a in ("--set", s)], "--tokens", args.tokens.resolve(),
                        "-o", run, "--quiet"], log)
        out = work / f"eval-{recipe}.json"
        if not out.is_file():
            tscale(["eval", run, "--tokens", args.tokens.resolve(), "--out", out,
                    *(["--device", "cpu", "--max-tokens", "2000"] if args.tiny else [])], log)
        losses[recipe] = json.loads(out.read_text())["val_loss"]
        print(f"{recipe}: val loss {losses[recipe]:.4f}", flush=True)
    notes = (f"quality (lowprec_train.py quality): {'tiny gpt2' if args.tiny else 'configs/gpt2-124m.toml'}, {steps} steps x "
             f"{per_step} tokens ({steps * per_step:,} tokens, one pass), same seed and windows per recipe; val loss of "
             f"`tscale eval` (bf16) on {'2,000' if args.tiny else 'every'} validation token(s)")
    return quality_diffs(losses), notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["speed", "quality"])
    ap.add_argument("tokens", type=Path, nargs="?", help="quality: the token folder to train on")
    ap.add_argument("--recipes", nargs="+", choices=RECIPES, default=None)
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--steps", type=int, default=30, help="speed: timed steps per run")
    ap.add_argument("--warmup", type=int, default=10, help="speed: steps before timing (compile included)")
    ap.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                    help="speed: train.compile_mode of every run")
    ap.add_argument("--compile-block-once", action="store_true",
                    help="speed: train.compile_block_once for every run (one block traced; far shorter compiles)")
    ap.add_argument("--grad-accum", type=int, default=1,
                    help="speed: micro-batches per optimizer step (train.grad_accum) for every run")
    ap.add_argument("--train-tokens", type=float, default=100e6, help="quality: tokens per run")
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "lowprec-quality", help="quality: run folders")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test with a tiny model")
    ap.add_argument("--out-dir", type=Path, help="folder of lowprec.json [default: docs/bench; with --tiny required]")
    args = ap.parse_args()
    if args.tiny and args.out_dir is None:
        ap.error("--tiny writes a smoke-test record: give --out-dir (not docs/bench)")
    if args.tiny and (args.compile_mode != "default" or args.compile_block_once):
        ap.error("--compile-mode and --compile-block-once need torch.compile, which --tiny turns off")
    if args.grad_accum > 1 and args.compile_mode == "reduce-overhead":
        ap.error("--grad-accum needs a compile mode without CUDA graphs (they refuse gradient accumulation)")
    if args.mode == "quality" and args.tokens is None:
        ap.error("quality needs TOKENS (a token folder)")
    if not args.tiny and not torch.cuda.is_available():
        sys.exit("lowprec_train: needs a CUDA GPU (or --tiny)")
    args.recipes = args.recipes or (RECIPES if args.mode == "speed" else ["bf16", *HEADLINE.values()])
    out_dir = args.out_dir or REPO / "docs" / "bench"
    if args.mode == "speed":  # merged after every recipe
        metrics, path = speed(args, out_dir)
    else:
        metrics, notes = quality(args)
        path = merge_metrics("lowprec", metrics, notes, out_dir)
    print(json.dumps(metrics, indent=1))
    print(path)


if __name__ == "__main__":
    main()
