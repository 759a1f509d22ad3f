"""AdamW with decoupled weight decay on matrices only (not on biases, norms or embeddings' positions)."""

import torch
import torch.nn as nn

from tscale.config import OptimConfig


def build_adamw(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             fused=device.type == "cuda")
