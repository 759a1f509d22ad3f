"""Benchmark training runs through the real loop (tscale.train.loop.train_run): stop hooks, deadlines, compile warm-up.

A run here is exactly `tscale train CONFIG --set ...` (same config loading, same loop, same
metrics.jsonl), run in this process so that a step hook can end it the moment its
validation loss reaches a target, without the checkpoint a signal would cost.
"""

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from tscale.config import load_config
from tscale.train.loop import train_run
from train_throughput import random_token_folder


class StopRun(Exception):
    """Raised by a step hook to end a run at once; metrics.jsonl is already flushed."""


def last_val_loss(run_dir: Path) -> float | None:
    """The newest val_loss in run_dir/metrics.jsonl, or None."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    val = None
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "val_loss" in record:
            val = record["val_loss"]
    return val


def stop_at_val_loss(run_dir: Path, target: float, eval_every: int) -> Callable:
    """A step hook that ends the run once an evaluation has scored val_loss <= target."""

    def hook(step: int, model: torch.nn.Module) -> None:
        if step > 1 and (step - 1) % eval_every == 0:
            val = last_val_loss(run_dir)
            if val is not None and val <= target:
                raise StopRun(f"val_loss {val:.4f} <= {target:.4f} at step {step - 1}")

    return hook


def count_params(model: torch.nn.Module) -> dict:
    """Parameter counts: all (a tied head counted once), inside the blocks, and in matrix products per token."""
    blocks = sum(p.numel() for p in model.blocks.parameters())
    return {"params": sum(p.numel() for p in model.parameters()), "block_params": blocks,
            "matmul_params": model.matmul_params()}


def train(config: Path, overrides: list[str], run_dir: Path, on_step: Callable | None = None,
          quiet: bool = True) -> dict:
    """Run `tscale train` in this process; returns how it ended and the model's parameter counts."""
    cfg = load_config(config, overrides)
    facts: dict = {}

    def hook(step: int, model: torch.nn.Module) -> None:
        if not facts:
            facts.update(count_params(model))
        if on_step is not None:
            on_step(step, model)

    t0 = time.time()
    try:
        result = train_run(cfg, run_dir, quiet=quiet, on_step=hook)
        ended = "time limit" if result.stopped_early else "end"
    except StopRun as e:
        ended = str(e)
    return {"run": str(run_dir), "ended": ended, "wall_s": time.time() - t0, **facts}


def warm_compile(config: Path, overrides: list[str], work: Path, batch_size: int, seq_len: int) -> float:
    """Compile a run's graphs into the Inductor cache: a few steps and one evaluation on random GPT-2 ids.

    Same config and shapes as the real run, so its compile is a cache hit; the random token
    folder has the GPT-2 vocabulary (50257 ids, eos 50256), as the benchmark corpus does.
    """
    shutil.rmtree(work, ignore_errors=True)
    tokens = random_token_folder(work / "tokens", 50 * (batch_size + 1) * (seq_len + 1))
    t0 = time.time()
    train(config, [*overrides, f'data.tokens="{tokens}"', "train.steps=10", "train.eval_every=2",
                   "train.eval_batches=1", "train.time_limit_s=0"],
          work / "run", on_step=_stop_after(3))
    shutil.rmtree(work, ignore_errors=True)
    return time.time() - t0


def _stop_after(last: int) -> Callable:
    def hook(step: int, model) -> None:
        if step >= last:
            raise StopRun(f"warm-up done at step {step}")

    return hook
