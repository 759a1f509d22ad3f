"""Training curves read from a run's metrics.jsonl: validation curve, training wall-clock, loss crossings.

Pure functions on the records `tscale train` writes: log records carry step, tokens and
tokens_per_s (the rate over the steps since the previous log record, evaluation and
checkpoint time left out); validation records carry step and val_loss. Tokens are what the
model was trained on before the record; training seconds are summed from the log records,
so evaluation and checkpoints are not counted. torch.compile compiles during the first step,
so the first log interval holds the compile: train_time_curve(compile_in_first=True) counts
that interval at the next one's rate.
"""

import json
import os
from bisect import bisect_left

Point = tuple[float, float]


def read_records(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def log_records(records: list[dict]) -> list[dict]:
    return sorted((r for r in records if "tokens_per_s" in r), key=lambda r: r["step"])


def tokens_per_step(records: list[dict]) -> int:
    first = log_records(records)[0]
    return round(first["tokens"] / first["step"])


def val_curve(records: list[dict]) -> list[Point]:
    """(tokens trained on, val_loss) for every validation record, in step order."""
    per_step = tokens_per_step(records)
    return [(r["step"] * per_step, r["val_loss"]) for r in sorted(records, key=lambda r: r["step"]) if "val_loss" in r]


def train_time_curve(records: list[dict], compile_in_first: bool = False) -> list[Point]:
    """(tokens, cumulative training seconds), starting at (0, 0): each log interval's tokens / its tokens_per_s.

    compile_in_first: the first interval (the compile) is counted at the second interval's rate."""
    logs = log_records(records)
    rates = [r["tokens_per_s"] for r in logs]
    if compile_in_first and len(rates) > 1:
        rates[0] = rates[1]
    points = [(0.0, 0.0)]
    for r, rate in zip(logs, rates):
        tokens, seconds = points[-1]
        points.append((float(r["tokens"]), seconds + (r["tokens"] - tokens) / rate))
    return points


def interpolate(points: list[Point], x: float) -> float:
    """Piecewise-linear y at x over points sorted by x; x outside their range is an error."""
    xs = [p[0] for p in points]
    if not xs or x < xs[0] or x > xs[-1]:
        raise ValueError(f"x = {x} outside the curve's range [{xs[0] if xs else None}, {xs[-1] if xs else None}]")
    i = bisect_left(xs, x)
    if xs[i] == x:
        return points[i][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def crossing(curve: list[Point], target: float) -> float | None:
    """The first x where the curve reaches y <= target, linear between the last point above and the first at or below.

    None if it never does. If the first point is already at or below, its x (an upper bound:
    there is nothing earlier to interpolate from).
    """
    for i, (x, y) in enumerate(curve):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = curve[i - 1]
            return x0 + (x - x0) * (y0 - target) / (y0 - y)
    return None


def steady_tokens_per_s(records: list[dict], skip_tokens: float = 0.0) -> float:
    """Training tokens per second over the log intervals that start at or after `skip_tokens` (warm-up left out)."""
    points = train_time_curve(records)
    kept = [(p0, p1) for p0, p1 in zip(points, points[1:]) if p0[0] >= skip_tokens]
    if not kept:
        kept = list(zip(points, points[1:]))
    tokens = sum(p1[0] - p0[0] for p0, p1 in kept)
    seconds = sum(p1[1] - p0[1] for p0, p1 in kept)
    return tokens / seconds
