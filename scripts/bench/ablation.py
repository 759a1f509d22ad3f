"""Issue 3's ablation: each tscale element switched off alone, plus the gpt2 baseline, at one small token budget.

  run     train every variant not done yet: real `tscale train` processes, --jobs at a time on one
          GPU (the metric is validation loss at a fixed token count, which sharing the GPU does not
          change), all ended by --deadline; finished variants are kept in WORK/ablation/results.json,
          so a later call runs only what is missing
  report  WORK/ablation/results.json -> OUT_DIR/ablation.json and a markdown table on stdout

Every variant trains on the same windows in the same order (same seed; one pass) and is scored on
the same fixed validation windows at the end. The "tscale_seed2" row repeats the full model with
another seed (initialisation and data order): the spread between the two tscale rows is the noise
floor against which the other differences are read.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_record  # noqa: E402

# name, what differs from the full tscale model, base config key, --set overrides
VARIANTS = [
    ("tscale", "all elements on (reference)", "tscale", []),
    ("gpt2", "the gpt2 baseline: LayerNorm, GELU, learned positions, tied, biases, AdamW", "gpt2", []),
    ("no_rope", "learned absolute positions instead of RoPE", "tscale", ["model.rope=false"]),
    ("no_qk_norm", "no QK normalisation", "tscale", ["model.qk_norm=false"]),
    ("layernorm", "LayerNorm instead of RMSNorm", "tscale", ['model.norm="layer"']),
    ("gelu", "GELU MLP instead of squared ReLU", "tscale", ['model.mlp="gelu"']),
    ("no_zero_init", "output projections and head initialised like the rest", "tscale", ["model.zero_init=false"]),
    ("tied", "embedding tied to the head", "tscale", ["model.tie_embeddings=true"]),
    ("no_softcap", "no logit soft-cap", "tscale", ["model.logit_softcap=0"]),
    ("no_sink", "no attention sink", "tscale", ["model.sink=false"]),
    ("no_doc_mask", "attention crosses document boundaries", "tscale", ["model.doc_mask=false"]),
    ("all_global", "every layer sees the whole context (no windows)", "tscale", ["model.window=0"]),
    ("adamw", "AdamW (lr 2e-3) on everything instead of Muon + AdamW", "tscale",
     ['optim.name="adamw"', "optim.lr=2e-3"]),
    ("tscale_seed2", "all elements on, seed 2 (noise floor)", "tscale", ["train.seed=2"]),
]


@dataclass
class Scale:
    configs: dict
    tokens_per_run: float
    batch_size: int
    seq_len: int
    eval_batches: int
    log_every: int
    extra: dict = field(default_factory=dict)  # base config key -> extra overrides
    env: dict = field(default_factory=dict)


FULL = Scale(configs={"tscale": "configs/tscale-6x512.toml", "gpt2": "configs/gpt2-6x512.toml"},
             tokens_per_run=12e6, batch_size=16, seq_len=1024, eval_batches=64, log_every=25,
             env={"TORCHINDUCTOR_COMPILE_THREADS": "4"})
TINY = Scale(configs={"tscale": "configs/tscale-tiny-cpu.toml", "gpt2": "configs/tiny-cpu.toml"},
             tokens_per_run=8 * 128, batch_size=4, seq_len=32, eval_batches=2, log_every=4,
             extra={base: ["model.d_model=64", "model.window=8", "optim.warmup_steps=2", "train.device=cpu",
                           "train.compile=false"] for base in ("tscale", "gpt2")},
             env={"OMP_NUM_THREADS": "1"})


def steps_of(s: Scale) -> int:
    return max(2, round(s.tokens_per_run / (s.batch_size * s.seq_len)))


def overrides_of(s: Scale, base: str, own: list[str], tokens: Path) -> list[str]:
    steps = steps_of(s)
    return [f"model.seq_len={s.seq_len}", f"train.batch_size={s.batch_size}", "train.grad_accum=1",
            f"train.steps={steps}", f"train.eval_every={max(1, steps // 2)}", f"train.eval_batches={s.eval_batches}",
            "train.ckpt_every=0", f"train.log_every={s.log_every}", f'data.tokens="{tokens}"',
            *s.extra.get(base, []), *own]


def final_val_loss(run_dir: Path, steps: int) -> float | None:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r.get("step") == steps and "val_loss" in r:
            return r["val_loss"]
    return None


class Job:
    def __init__(self, name: str, base: str, own: list[str], s: Scale, work: Path, tokens: Path):
        self.name, self.base = name, base
        self.run_dir = work / "runs" / name
        self.overrides = overrides_of(s, base, own, tokens)
        self.config = s.configs[base]
        self.steps = steps_of(s)
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self, limit_s: float, env: dict, log_dir: Path) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)
        extra = [f"train.time_limit_s={limit_s:.0f}"] if limit_s else []
        cmd = [sys.executable, "-m", "tscale", "train", str(REPO / self.config), "-o", str(self.run_dir), "--quiet"]
        for o in [*self.overrides, *extra]:
            cmd += ["--set", o]
        self.log = open(log_dir / f"{self.name}.log", "w")
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                     cwd=REPO)

    def finish(self) -> dict | None:
        """The result if the run trained every step and was scored at the end, else None (the run is removed)."""
        self.log.close()
        val = final_val_loss(self.run_dir, self.steps)
        if self.proc.returncode != 0 or val is None:
            tail = Path(self.log.name).read_text(errors="replace").splitlines()[-5:]
            print(f"ablation {self.name}: incomplete (exit {self.proc.returncode}); " + " | ".join(tail), flush=True)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return None
        shutil.rmtree(self.run_dir / "ckpt", ignore_errors=True)  # only metrics.jsonl and config.toml are needed
        return {"val_loss": val, "steps": self.steps, "config": self.config, "overrides": self.overrides,
                "wall_s": round(time.time() - self.started, 1), "run": str(self.run_dir)}


def load_results(work: Path) -> dict:
    path = work / "results.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def save_results(work: Path, results: dict) -> None:
    tmp = work / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(work / "results.json")


def cmd_run(args, s: Scale) -> None:
    work = args.work / "ablation"
    (work / "logs").mkdir(parents=True, exist_ok=True)
    results = load_results(work)
    wanted = [v for v in VARIANTS if not args.only or v[0] in args.only]
    todo = [Job(n, b, o, s, work, args.tokens) for n, _, b, o in wanted
            if results.get(n, {}).get("steps") != steps_of(s)]
    print(f"ablation: {len(todo)} of {len(wanted)} variants to run, {steps_of(s)} steps of "
          f"{s.batch_size * s.seq_len:,} tokens each, {args.jobs} at a time", flush=True)
    running: list[Job] = []
    while todo or running:
        now = time.time()
        left = args.deadline - now - args.margin if args.deadline else 0.0
        while todo and len(running) < args.jobs and (not args.deadline or left >= args.min_job_s):
            job = todo.pop(0)
            job.start(left, s.env, work / "logs")
            running.append(job)
            print(f"ablation {job.name}: started ({len(running)} running)", flush=True)
        if args.deadline and todo and not running and left < args.min_job_s:
            print(f"ablation: {len(todo)} variant(s) not started, {left:.0f} s left: "
                  + ", ".join(j.name for j in todo), flush=True)
            break
        time.sleep(0.5)
        for job in [j for j in running if j.proc.poll() is not None]:
            running.remove(job)
            done = job.finish()
            if done:
                results[job.name] = done
                save_results(work, results)
                print(f"ablation {job.name}: val loss {done['val_loss']:.4f} ({done['wall_s']:.0f} s)", flush=True)
        if args.deadline and time.time() > args.deadline:  # their time limits should have ended them: stop the rest
            for job in running:
                job.proc.kill()
                job.proc.wait()
                job.finish()
            break


def params_of(run_dir: Path) -> int | None:
    """All parameters of the model a run trained (a tied head counted once), from its resolved config."""
    from tscale.config import load_config
    from tscale.model import build_model

    import torch

    path = run_dir / "config.toml"
    if not path.is_file():
        return None
    with torch.device("meta"):  # shapes only: instant, no memory
        return sum(p.numel() for p in build_model(load_config(path).model).parameters())


def cmd_report(args, s: Scale) -> None:
    results = load_results(args.work / "ablation")
    ref = results.get("tscale", {}).get("val_loss")
    steps = results[next(iter(results))]["steps"] if results else steps_of(s)  # as run, whatever --tokens-per-run
    tokens = steps * s.batch_size * s.seq_len
    lines = [f"Validation loss after {tokens / 1e6:.2f}M training tokens ({s.configs['tscale']} with one change; "
             f"Δ = variant - full tscale, positive = the element helps)", "",
             "| variant | what differs from full tscale | parameters | val loss | Δ |", "|---|---|---:|---:|---:|"]
    metrics = {"tokens_per_run": tokens}
    for name, what, _, _ in VARIANTS:
        r = results.get(name)
        if not r:
            lines.append(f"| {name} | {what} | | not run | |")
            continue
        params = params_of(Path(r["run"]))
        delta = r["val_loss"] - ref if ref is not None else None
        metrics[f"val_loss_{name}"] = round(r["val_loss"], 4)
        if delta is not None:
            metrics[f"delta_{name}"] = round(delta, 4)
        lines.append(f"| {name} | {what} | {params / 1e6:.1f}M | {r['val_loss']:.4f} | "
                     f"{'' if delta is None or name == 'tscale' else f'{delta:+.4f}'} |")
    if "delta_tscale_seed2" in metrics:
        metrics["seed_noise"] = abs(metrics["delta_tscale_seed2"])
    missing = [n for n, *_ in VARIANTS if n not in results]
    notes = (f"{steps} steps of {s.batch_size} x {s.seq_len} tokens per variant, one pass over the same "
             f"windows in the same order (seed 1337 except tscale_seed2), val loss on {s.eval_batches} x "
             f"{s.batch_size} fixed validation windows at the end; base configs {s.configs['tscale']} and "
             f"{s.configs['gpt2']}; one element changed at a time from the full tscale model. "
             + (f"Not run: {', '.join(missing)}." if missing else "All variants ran."))
    path = write_record("ablation", metrics, notes, args.out_dir)
    print("\n".join(lines))
    print(f"\nwrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["run", "report"])
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "issue3")
    ap.add_argument("--tokens", type=Path, help="token folder [WORK/tokens]")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds by which every run must have ended")
    ap.add_argument("--margin", type=float, default=20.0, help="seconds kept free before the deadline")
    ap.add_argument("--min-job-s", type=float, default=100.0, help="start no run with less time than this left")
    ap.add_argument("--jobs", type=int, default=4, help="runs at a time")
    ap.add_argument("--tokens-per-run", type=float, help="training tokens per variant [12e6; tiny: 1024]")
    ap.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    ap.add_argument("--tiny", action="store_true", help="CPU-sized models and budgets (plumbing check)")
    args = ap.parse_args()
    s = TINY if args.tiny else FULL
    if args.tokens_per_run:
        s.tokens_per_run = args.tokens_per_run
    args.tokens = (args.tokens or args.work / "tokens").resolve()
    args.work = args.work.resolve()
    {"run": cmd_run, "report": cmd_report}[args.command](args, s)


if __name__ == "__main__":
    main()
