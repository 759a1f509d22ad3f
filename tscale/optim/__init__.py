"""Optimizers and learning-rate schedules; `build_optimizer` picks the one optim.name asks for."""

import torch
import torch.nn as nn

from tscale.config import OptimConfig
from tscale.errors import UserError


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device,
                    freeze_variance_at: int | None = None) -> torch.optim.Optimizer:
    """AdamW or Muon (+ AdamW) over `model`; the loop writes the scheduled optim.lr into every group's "lr"."""
    from tscale.optim.adamw import build_adamw
    from tscale.optim.muon import build_muon

    if cfg.name == "adamw":
        return build_adamw(model, cfg, device, freeze_variance_at=freeze_variance_at)
    if freeze_variance_at is not None:
        raise UserError('dist.onebit_what = "momentum" (1-bit Adam) needs optim.name = "adamw"; '
                        'with Muon use dist.onebit_what = "gradient" or dist.compression = "none"')
    return build_muon(model, cfg, device)


__all__ = ["build_optimizer"]
