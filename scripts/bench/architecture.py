"""Issue 3's architecture benchmark: gpt2 vs tscale convergence and throughput, and the attention cost of a step.

Subcommands, each its own process, so that one device call runs them in turn under one deadline
(scripts/bench/issue3_gpu.sh is the driver); each adds its result to WORK/results.json:

  warmup --arch A        compile A's training and evaluation graphs on random ids (fills the Inductor
                         cache, so the measured run's compile is a cache hit; run it beside tokenizing)
  convergence --arch A   train A on the token folder: gpt2 first, for the budget B; its final val loss
                         is the target tscale must reach (tscale stops as soon as an evaluation does).
                         With --beside, tscale runs its whole schedule at the same time as gpt2 (on
                         another GPU of the host) and the report reads the crossing from its curve
  attention [--warm]     time all attention (forward + backward) of one training step of the tscale
                         model vs the same model with causal SDPA in every layer, at each sequence length
                         (--warm: only compile, on random ids, so the timed run's compile is a cache hit)
  report                 WORK/results.json + the runs' metrics.jsonl -> OUT_DIR/architecture.json (merged
                         with the metrics a previous part already wrote there) and a markdown table
  screen --name N ...    tscale variants (each a `convergence --arch tscale --name N --tscale-set ...` run)
                         against gpt2's final loss: of this work folder's gpt2 run, else of --target-record
                         (a recorded run of the same protocol), so that several variants fit one device call
                         without training gpt2 again -> WORK/screen.json and a markdown table; never the
                         headline record

Protocol (docs/architecture.md): both models see the same windows of the benchmark corpus in the
same order (same seed, 32 x 1024 tokens a step), one pass, and are scored on the same fixed
validation windows. gpt2 trains for B tokens; tscale's schedule spans 0.5 B and it is evaluated
every ~5M tokens; the crossing of gpt2's final loss is interpolated linearly between evaluations.
Training time counts the loop's steps only (compile, evaluation and checkpoints left out), from
the tokens_per_s of every log interval. --tiny runs the same code on CPU-sized models.
"""

import argparse
import dataclasses
import fcntl
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import curves  # noqa: E402
from common import REPO, measurement_stamp, write_record  # noqa: E402

@dataclass
class Scale:
    """Sizes of one benchmark scale: the real one on an H200, or --tiny on a CPU."""

    configs: dict
    seq_len: int
    batch_size: int
    budget_tokens: float
    eval_tokens: float
    gpt2_evals: int
    eval_batches: int
    log_every: int
    gpt2_overrides: list[str]
    tscale_overrides: list[str]
    extra: list[str] = field(default_factory=list)
    attn_seq_lens: tuple = (1024, 4096)
    attn_tokens: int = 32768
    attn_repeats: int = 20
    attn_compile: bool = True
    max_ratio: float = 0.5  # tscale's schedule spans this fraction of B


FULL = Scale(
    configs={"gpt2": "configs/gpt2-124m.toml", "tscale": "configs/tscale-124m.toml"},
    seq_len=1024, batch_size=32, budget_tokens=100e6, eval_tokens=5e6, gpt2_evals=8, eval_batches=40, log_every=10,
    # The preset's 700 warm-up steps are llm.c's for a 10B-token run; 200 steps (6.5M tokens, 6.6%) suit 100M.
    gpt2_overrides=["optim.warmup_steps=200"], tscale_overrides=[],
)
TINY = Scale(
    configs={"gpt2": "configs/tiny-cpu.toml", "tscale": "configs/tscale-tiny-cpu.toml"},
    seq_len=32, batch_size=4, budget_tokens=24 * 128, eval_tokens=4 * 128, gpt2_evals=4, eval_batches=4, log_every=1,
    # At toy scale the zero-initialised head is what lags: a faster head lets the crossing code path run.
    gpt2_overrides=["optim.warmup_steps=4"],
    tscale_overrides=["optim.warmup_steps=2", "optim.head_lr=0.01", "optim.embed_lr=0.075"],
    extra=["model.d_model=64", "model.window=8", "train.compile=false", "train.device=cpu", "train.time_limit_s=0"],
    attn_seq_lens=(32, 64), attn_tokens=128, attn_repeats=3, attn_compile=False,
    max_ratio=1.0,  # toy models show no advantage; a whole-budget schedule lets the crossing code run
)


def tokens_per_step(s: Scale) -> int:
    return s.seq_len * s.batch_size


def gpt2_steps(s: Scale) -> int:
    return math.ceil(s.budget_tokens / tokens_per_step(s))


def _multiple(n: float, of: int) -> int:
    return max(of, round(n / of) * of)


def run_overrides(s: Scale, arch: str, tokens: Path, max_ratio: float, variant: tuple[str, ...] = ()) -> list[str]:
    """The --set list of one convergence run (the warm-up uses the same, so its graphs are the same); variant:
    more settings of the tscale run (--tscale-set), last so that they win."""
    common = [f"model.seq_len={s.seq_len}", f"train.batch_size={s.batch_size}", "train.grad_accum=1",
              f"train.eval_batches={s.eval_batches}", "train.ckpt_every=0", f"train.log_every={s.log_every}",
              f'data.tokens="{tokens}"', *s.extra]
    if arch == "gpt2":
        steps = gpt2_steps(s)
        every = _multiple(steps / s.gpt2_evals, s.log_every)
        return [*common, f"train.steps={steps}", f"train.eval_every={every}", *s.gpt2_overrides]
    steps = round(max_ratio * gpt2_steps(s))
    every = _multiple(s.eval_tokens / tokens_per_step(s), s.log_every)
    return [*common, f"train.steps={steps}", f"train.eval_every={every}", *s.tscale_overrides, *variant]


class Results:
    """WORK/results.json: what each subcommand found, read-modify-written whole."""

    def __init__(self, work: Path):
        self.path = work / "results.json"

    def load(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def put(self, key: str, value) -> None:
        """Set one key; runs side by side (--beside) each put theirs, so the read-modify-write holds a lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.load()
            data[key] = value
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            tmp.replace(self.path)


def _time_left(deadline: float | None, margin: float) -> float:
    """Seconds a run may take before `deadline` (epoch seconds) less `margin`; 0 = no limit."""
    if not deadline:
        return 0.0
    left = deadline - time.time() - margin
    if left < 30:
        sys.exit(f"architecture: only {left + margin:.0f} s left before the deadline; not starting")
    return left


def cmd_warmup(args, s: Scale) -> None:
    from train_runs import warm_compile

    overrides = run_overrides(s, args.arch, args.tokens, args.max_ratio, args.tscale_set)
    seconds = warm_compile(REPO / s.configs[args.arch], overrides, args.work / f"warm-{args.arch}",
                           s.batch_size, s.seq_len)
    print(f"warm-up {args.arch}: {seconds:.0f} s", flush=True)


def cmd_convergence(args, s: Scale) -> None:
    from train_runs import stop_at_val_loss, train

    from report_architecture import screen_target

    results = Results(args.work)
    name = args.name or args.arch
    run_dir = args.work / "runs" / name
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    overrides = run_overrides(s, args.arch, args.tokens, args.max_ratio, args.tscale_set)
    hook = None
    if args.arch == "tscale" and not args.beside:
        target = screen_target(results.load(), args.target_record, s.seq_len)
        if target is None:
            sys.exit(f"architecture: run `convergence --arch gpt2` at T {s.seq_len} first (its final val loss is the "
                     f"target), or name a recorded one of that length with --target-record")
        every = int(next(o for o in overrides if o.startswith("train.eval_every=")).split("=")[1])
        hook = stop_at_val_loss(run_dir, target["final_val_loss"], every)
    limit = _time_left(args.deadline, margin=25 if args.arch == "tscale" else 10)
    if limit:
        overrides.append(f"train.time_limit_s={limit:.0f}")
    print(f"convergence {args.arch}: tscale train {s.configs[args.arch]} " + " ".join(f"--set {o}" for o in overrides),
          flush=True)
    outcome = train(REPO / s.configs[args.arch], overrides, run_dir, on_step=hook, quiet=not args.verbose)
    records = curves.read_records(run_dir / "metrics.jsonl")
    vals = curves.val_curve(records)
    outcome.update(config=s.configs[args.arch], overrides=overrides, variant=list(args.tscale_set),
                   final_val_loss=vals[-1][1] if vals else None,
                   steps=records[-1]["step"], planned_steps=_planned_steps(overrides))
    results.put(name, outcome)
    print(f"convergence {name}: {outcome['ended']}; {outcome['steps']} steps, last val loss "
          f"{outcome['final_val_loss']}, {outcome['wall_s']:.0f} s", flush=True)


def _planned_steps(overrides: list[str]) -> int:
    return int(next(o for o in overrides if o.startswith("train.steps=")).split("=")[1])


def cmd_attention(args, s: Scale) -> None:
    """Time the attention of one step at each length; with --warm only compile it, on random ids, without tokens."""
    import torch

    from attention_cost import attention_step_cost
    from tscale.config import load_config
    from tscale.data.loader import TrainLoader
    from tscale.devices import resolve_autocast_dtype, resolve_device
    from tscale.model import build_model
    from tscale.train.loop import resolve_data

    results = Results(args.work)
    out, path = {}, None
    if args.attention != "auto":
        from tscale.ops.attention_runs import parse_choice, unusable_reason

        why = unusable_reason(parse_choice(args.attention)[0], resolve_device("auto"), torch.bfloat16, 128)
        if why:
            raise SystemExit(f"architecture.py attention --attention {args.attention}: {why}")
    for seq_len in s.attn_seq_lens:
        batch = max(1, s.attn_tokens // seq_len)
        overrides = [f"model.seq_len={seq_len}", f'data.tokens="{args.tokens}"',
                     *[o for o in s.extra if o.startswith(("train.device", "model."))]]
        if args.warm:  # the GPT-2 vocabulary of the benchmark corpus, as the warm-ups of train_runs use
            overrides += ["model.vocab_size=50257", "model.eos_id=50256"]
        cfg = load_config(REPO / s.configs["tscale"], overrides)
        device = resolve_device(cfg.train.device)
        torch.manual_seed(cfg.train.seed)
        if args.warm:
            x = torch.randint(0, cfg.model.vocab_size - 1, (batch, seq_len))
        else:
            folder = resolve_data(cfg)
            x = TrainLoader(folder, seq_len, batch, cfg.train.seed).next_batch()[0]  # (B, T): a run's first batch
        model = build_model(cfg.model).to(device)
        t0 = time.time()
        cost = attention_step_cost(model, x.to(device), resolve_autocast_dtype(cfg.train.dtype, device),
                                   1 if args.warm else s.attn_repeats, warmup=1 if args.warm else 3,
                                   compile_ops=s.attn_compile and device.type == "cuda", impl=args.attention,
                                   profile_steps=0 if args.warm else args.profile_steps)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.warm:
            print(f"attention warm-up T={seq_len}: {time.time() - t0:.0f} s", flush=True)
            continue
        path = path or cost["path"]
        cost.update(path=path, batch_size=batch, seq_len=seq_len, window=cfg.model.window,
                    global_every=cfg.model.global_every, stamp=measurement_stamp())
        out[str(seq_len)] = cost
        print(f"attention T={seq_len}: tscale {1e3 * cost['tscale_s']:.2f} ms, SDPA {1e3 * cost['sdpa_s']:.2f} ms, "
              f"ratio {cost['tscale_s'] / cost['sdpa_s']:.3f} ({path}; {cost['dtype']}, "
              f"{cost['docs_per_row']:.2f} documents per row; {time.time() - t0:.0f} s)", flush=True)
        for side in ("tscale", "sdpa"):
            for kernel, ms in list(cost.get(f"{side}_kernels_ms", {}).items())[:12]:
                print(f"  {side} {ms:8.3f} ms  {kernel}", flush=True)
    if not args.warm:
        results.put("attention" if args.attention == "auto" else f"attention_{args.attention}", out)


def cmd_report(args, s: Scale) -> None:
    from report_architecture import build_report

    metrics, notes, table, header = build_report(Results(args.work).load(), args.out_dir, s)
    path = write_record("architecture", metrics, notes, args.out_dir, header=header)
    print(table)
    print(f"wrote {path}")


def cmd_screen(args, s: Scale) -> None:
    from report_architecture import screen_report, screen_target

    results = Results(args.work).load()
    target = screen_target(results, args.target_record, s.seq_len)
    if target is None:
        sys.exit(f"architecture screen: no target: no gpt2 run at T {s.seq_len} in the work folder and no usable "
                 f"--target-record")
    rows, table = screen_report(results, target, args.name_list)
    (args.work / "screen.json").write_text(json.dumps({"target": target, "runs": rows}, indent=1) + "\n")
    print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["warmup", "convergence", "attention", "report", "screen"])
    ap.add_argument("--arch", choices=["gpt2", "tscale"])
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "issue3", help="work folder (results.json, runs/)")
    ap.add_argument("--tokens", type=Path, help="token folder of the benchmark corpus [WORK/tokens]")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench", help="where architecture.json goes")
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds by which a run must have ended")
    ap.add_argument("--budget-tokens", type=float, help="gpt2's training budget B [100e6; tiny: 3072]")
    ap.add_argument("--eval-tokens", type=float, help="tokens between tscale's evaluations [5e6]")
    ap.add_argument("--max-ratio", type=float, help="tscale's schedule spans this fraction of B [0.5; tiny: 1.0]")
    ap.add_argument("--seq-len", type=int,
                    help="window length of the convergence runs, the tokens a step kept [1024; tiny: 32]")
    ap.add_argument("--tiny", action="store_true", help="CPU-sized models and budgets (plumbing check)")
    ap.add_argument("--warm", action="store_true", help="attention: only compile, on random ids (beside tokenizing)")
    ap.add_argument("--attention", choices=["auto", "fa2", "fa2_global", "cudnn", "cudnn_global"], default="auto",
                    help="attention: the tscale model's op, as train.attention chooses it [auto]")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="attention: also profile this many steps of each side (kernel time by name, in results.json)")
    ap.add_argument("--beside", action="store_true",
                    help="convergence --arch tscale: run the whole schedule beside gpt2's run, not stopping at its loss")
    ap.add_argument("--tscale-set", action="append", default=[], metavar="KEY=VALUE",
                    help="warmup / convergence --arch tscale: one more setting of the tscale run (repeatable), e.g. "
                         "model.sink=false, to time a variant against gpt2's run; the report names it")
    ap.add_argument("--name", action="append", default=[], metavar="NAME",
                    help="convergence --arch tscale: the run's name in results.json and runs/ [tscale]; screen: the "
                         "runs to report (repeatable)")
    ap.add_argument("--target-record", type=Path,
                    help="convergence --arch tscale / screen: where the work folder has no gpt2 run, take its final "
                         "loss, training time and budget from this architecture.json (same protocol and corpus)")
    ap.add_argument("--verbose", action="store_true", help="show the training progress lines")
    args = ap.parse_args()
    s = dataclasses.replace(TINY if args.tiny else FULL)  # a copy: the options below change it
    if args.budget_tokens:
        s.budget_tokens = args.budget_tokens
    if args.eval_tokens:
        s.eval_tokens = args.eval_tokens
    args.max_ratio = args.max_ratio or s.max_ratio
    if args.seq_len:
        if args.seq_len < 1 or tokens_per_step(s) % args.seq_len:
            ap.error(f"--seq-len {args.seq_len}: must divide the {tokens_per_step(s):,} tokens a step")
        s.batch_size, s.seq_len = tokens_per_step(s) // args.seq_len, args.seq_len
    args.work = args.work.resolve()
    args.tokens = (args.tokens or args.work / "tokens").resolve()
    if args.command in ("warmup", "convergence") and not args.arch:
        ap.error(f"{args.command} needs --arch")
    args.tscale_set = tuple(args.tscale_set)
    if args.tscale_set and args.arch != "tscale":
        ap.error("--tscale-set applies to `warmup` / `convergence --arch tscale` only")
    args.name_list = args.name
    if args.command == "screen" and not args.name_list:
        ap.error("screen needs --name for each run to report")
    if args.command != "screen" and len(args.name) > 1:
        ap.error("--name is given once, except for screen")
    if args.name and args.command == "convergence" and args.arch != "tscale":
        ap.error("--name applies to `convergence --arch tscale` (gpt2's run is the target, named gpt2)")
    args.name = args.name[0] if args.name and args.command != "screen" else None
    if args.beside and not (args.command == "convergence" and args.arch == "tscale"):
        ap.error("--beside applies to `convergence --arch tscale` only (gpt2's run always trains its whole budget)")
    {"warmup": cmd_warmup, "convergence": cmd_convergence, "attention": cmd_attention,
     "report": cmd_report, "screen": cmd_screen}[args.command](args, s)


if __name__ == "__main__":
    main()
