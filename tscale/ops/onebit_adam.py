"""The fused elementwise passes of 1-bit Adam's frozen-variance phase: torch references and the CPU kernels.

onebit_adam_fold_(g, m, inv_d, beta1, bound):  g <- (1 - beta1) clamp(g inv_d, +-bound) + beta1 m inv_d
onebit_adam_step_(p, m, u, d, decay, step_size):  m <- u d;  p <- decay p - step_size u

All (N,)-shaped float32 of one size (any shape, same numel, contiguous). The CPU kernels
(csrc/optim/onebit_adam.cpp) do each in one pass over memory instead of three or four torch
operations; on other devices the references run (tscale/optim/adamw.py explains the math).
"""

import torch

from tscale.ops.backend import kernels_usable_on


def onebit_adam_fold_reference(g: torch.Tensor, m: torch.Tensor, inv_d: torch.Tensor, beta1: float,
                               bound: float) -> None:
    g.mul_(inv_d).clamp_(-bound, bound).mul_(1 - beta1)
    g.addcmul_(m, inv_d, value=beta1)


def onebit_adam_step_reference(p: torch.Tensor, m: torch.Tensor, u: torch.Tensor, d: torch.Tensor, decay: float,
                               step_size: float) -> None:
    torch.mul(u, d, out=m)
    if decay != 1.0:
        p.mul_(decay)
    p.add_(u, alpha=-step_size)


def _fused(*tensors: torch.Tensor) -> bool:
    t = tensors[0]
    return (t.device.type == "cpu" and kernels_usable_on("cpu")
            and all(x.dtype == torch.float32 and x.is_contiguous() for x in tensors))


def onebit_adam_fold_(g: torch.Tensor, m: torch.Tensor, inv_d: torch.Tensor, beta1: float, bound: float) -> None:
    if _fused(g, m, inv_d):
        torch.ops.tscale.onebit_adam_fold_(g.view(-1), m.view(-1), inv_d.view(-1), beta1, bound)
    else:
        onebit_adam_fold_reference(g, m.view_as(g), inv_d.view_as(g), beta1, bound)


def onebit_adam_step_(p: torch.Tensor, m: torch.Tensor, u: torch.Tensor, d: torch.Tensor, decay: float,
                      step_size: float) -> None:
    if _fused(p, m, u, d):
        torch.ops.tscale.onebit_adam_step_(p.view(-1), m.view(-1), u.view(-1), d.view(-1), decay, step_size)
    else:
        onebit_adam_step_reference(p, m, u.view_as(p), d.view_as(p), decay, step_size)
