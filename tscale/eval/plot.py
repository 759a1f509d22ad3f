"""Loss curves of a run as a PNG: train loss and val loss against step, from the run's metrics.jsonl."""

import json
import os
from pathlib import Path

from tscale.errors import UserError
from tscale.fileio import atomic_path


def read_curves(metrics: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """{"train": [(step, loss)], "val": [(step, val_loss)]} from metrics.jsonl; UserError if none."""
    metrics = Path(metrics)
    if not metrics.is_file():
        raise UserError(f"{metrics}: no such file (the run has no metrics to plot)")
    curves: dict[str, list[tuple[int, float]]] = {"train": [], "val": []}
    with open(metrics, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                # a run killed mid-write leaves a torn last line; anything else is corruption
                if f.readline():
                    raise UserError(f"{metrics}:{lineno}: not valid JSON") from None
                break
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                continue
            for curve, key in (("train", "loss"), ("val", "val_loss")):
                if isinstance(rec.get(key), (int, float)):
                    curves[curve].append((rec["step"], float(rec[key])))
    if not curves["train"] and not curves["val"]:
        raise UserError(f"{metrics}: no loss values to plot")
    return curves


def plot_curves(metrics: str | os.PathLike, png: str | os.PathLike, title: str | None = None,
                eval_point: tuple[int, float] | None = None) -> Path:
    """Draw the curves of metrics.jsonl into `png` (atomically); `eval_point` marks an eval's (step, val_loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read_curves(metrics)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    try:
        if curves["train"]:
            steps, losses = zip(*curves["train"])
            ax.plot(steps, losses, label="train loss", linewidth=1.0, alpha=0.8)
        if curves["val"]:
            steps, losses = zip(*curves["val"])
            ax.plot(steps, losses, label="val loss", marker="o", markersize=3, linewidth=1.5)
        if eval_point is not None:
            ax.plot([eval_point[0]], [eval_point[1]], "r*", markersize=10, label="tscale eval")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats / token)")
        ax.set_title(title or str(Path(metrics).parent.name))
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        png = Path(png)
        with atomic_path(png) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return png
