"""AdamW with decoupled weight decay on matrices only (not on biases, norms or embeddings' positions).

With `freeze_variance_at` set (1-bit Adam, tscale/dist/onebit.py), steps from that count on
keep the second moment v frozen. The gradient exchange then works on the preconditioned
momentum u = m / d, d = sqrt(v_hat) + eps the frozen denominator: `fold_gradient` turns this
rank's gradient into its u (in the bucket, before compression), the exchange averages u
across ranks, and `step` takes the average from p.grad, moves p by -lr u / (1 - beta1^t) and
keeps m = u d. With v frozen, d is the same on every rank and every step, so averaging u is
averaging m; but u has Adam's O(1) magnitude in every coordinate, which is what a 1-bit code
with one scale per chunk can carry (docs/distributed.md, "Large vocabularies").
"""

import torch
import torch.nn as nn

from tscale.config import OptimConfig
from tscale.ops.onebit_adam import onebit_adam_fold_, onebit_adam_step_


class AdamW(torch.optim.AdamW):
    """torch's AdamW, plus the frozen-variance momentum step of 1-bit Adam after `freeze_variance_at` steps."""

    def __init__(self, params, freeze_variance_at: int | None = None, **kwargs):
        super().__init__(params, **kwargs)
        self.freeze_variance_at = freeze_variance_at
        self._group_of = {id(p): group for group in self.param_groups for p in group["params"]}
        self._frozen: dict[int, tuple] = {}  # id(p) -> (d, 1 / d, v == 0 or None)

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._frozen.clear()

    def _frozen_denom(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(d, 1 / d, mask): d = sqrt(v / (1 - beta2^T)) + eps of the variance frozen at step T,
        kept once computed (v no longer changes), its inverse, and where v == 0 (None if nowhere)."""
        cached = self._frozen.get(id(p))
        if cached is None:
            group = self._group_of[id(p)]
            v = self.state[p]["exp_avg_sq"]
            d = (v / (1 - group["betas"][1] ** self.freeze_variance_at)).sqrt_().add_(group["eps"])
            zero = v == 0
            cached = self._frozen[id(p)] = (d, d.reciprocal(), zero if zero.any() else None)
        return cached

    @torch.no_grad()
    def fold_gradient(self, p: torch.Tensor, g: torch.Tensor) -> None:
        """In place: g <- beta1 m / d + (1 - beta1) clamp(g / d, +-1/sqrt(1 - beta2)), this rank's next u.

        The clamp is the largest |g| / sqrt(v) plain Adam can ever see (its v would take in
        (1 - beta2) g^2 first): a gradient far above the frozen variance, e.g. of a token first
        seen after the warm-up, moves p by at most what Adam would have moved it.
        """
        beta1, beta2 = self._group_of[id(p)]["betas"]
        inv_d = self._frozen_denom(p)[1].view_as(g)
        bound = (1 - beta2) ** -0.5
        m = self.state[p].get("exp_avg")
        if m is None:
            g.mul_(inv_d).clamp_(-bound, bound).mul_(1 - beta1)
        else:
            onebit_adam_fold_(g, m.view_as(g), inv_d, beta1, bound)

    def fold_terms(self, params: list[torch.Tensor]) -> tuple[list, list, float, float] | None:
        """(m's, 1 / d's, beta1, bound) of these parameters for one fused fold over their bucket, or None
        when they cannot share one (a parameter without momentum yet, or groups with other betas)."""
        betas = {self._group_of[id(p)]["betas"] for p in params}
        if len(betas) != 1 or any("exp_avg" not in self.state[p] for p in params):
            return None
        beta1, beta2 = betas.pop()
        return ([self.state[p]["exp_avg"] for p in params], [self._frozen_denom(p)[1] for p in params], beta1,
                (1 - beta2) ** -0.5)

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
            lr, wd = group["lr"], group["weight_decay"]
            beta1 = group["betas"][0]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] += 1
                m_correction = 1 - beta1 ** float(state["step"])
                # p.grad: the averaged u = m / d; coordinates that never had a gradient (v == 0,
                # e.g. padded vocabulary rows) stay still, since 1 bit cannot say zero
                d, _, zero = self._frozen_denom(p)
                u = p.grad if zero is None else p.grad.masked_fill_(zero, 0.0)
                onebit_adam_step_(p, state["exp_avg"], u, d, 1 - lr * wd, lr / m_correction)
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
