"""Learning-rate schedule: linear warmup, then cosine or linear decay to a floor, or a trapezoid.

"trapezoid" (warmup-stable-decay): linear warmup, constant at lr, then a linear decay to the
floor over the last `decay_frac` of the steps.
"""

import math

from tscale.config import OptimConfig


def lr_at(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Learning rate for optimizer step `step` (0-based) of `total_steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.decay == "trapezoid":
        decay_steps = max(1, round(cfg.decay_frac * total_steps))
        progress = min(1.0, max(0.0, (step + 1 - (total_steps - decay_steps)) / decay_steps))
        return cfg.lr - (cfg.lr - floor) * progress
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.decay == "cosine" else 1 - progress
    return floor + (cfg.lr - floor) * shape
