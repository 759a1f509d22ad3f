"""AdamW with decoupled weight decay on matrices only (not on biases, norms or embeddings' positions).

With `freeze_variance_at` set (1-bit Adam, tscale/dist/onebit.py), steps from that count on
keep the second moment frozen and take p.grad as the new first moment: the gradient exchange
has already folded the gradient into the momentum and averaged it across ranks.
"""

import torch
import torch.nn as nn

from tscale.config import OptimConfig


class AdamW(torch.optim.AdamW):
    """torch's AdamW, plus the frozen-variance momentum step of 1-bit Adam after `freeze_variance_at` steps."""

    def __init__(self, params, freeze_variance_at: int | None = None, **kwargs):
        super().__init__(params, **kwargs)
        self.freeze_variance_at = freeze_variance_at

    def steps_taken(self) -> int:
        for group in self.param_groups:
            for p in group["params"]:
                if "step" in self.state[p]:
                    return int(self.state[p]["step"])
        return 0

    @torch.no_grad()
    def step(self, closure=None):
        if self.freeze_variance_at is None or self.steps_taken() < self.freeze_variance_at:
            return super().step(closure)
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            v_correction = 1 - beta2 ** self.freeze_variance_at
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] += 1
                m_correction = 1 - beta1 ** float(state["step"])
                # the averaged momentum; coordinates that never had a gradient (v == 0, e.g. padded
                # vocabulary rows) stay still, since 1 bit cannot say zero and v could not scale it
                state["exp_avg"].copy_(p.grad).mul_(state["exp_avg_sq"] > 0)
                denom = (state["exp_avg_sq"] / v_correction).sqrt_().add_(eps)
                p.mul_(1 - lr * wd)
                p.addcdiv_(state["exp_avg"], denom, value=-lr / m_correction)
        return None


def build_adamw(model: nn.Module, cfg: OptimConfig, device: torch.device,
                freeze_variance_at: int | None = None) -> AdamW:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return AdamW(groups, freeze_variance_at=freeze_variance_at, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                 eps=cfg.eps, fused=device.type == "cuda")
