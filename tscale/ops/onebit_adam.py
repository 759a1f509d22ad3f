"""The fused elementwise passes of 1-bit Adam's frozen-variance phase: torch references and the CPU kernels.

onebit_adam_fold_(g, m, inv_d, beta1, bound):  g <- (1 - beta1) clamp(g inv_d, +-bound) + beta1 m inv_d
onebit_adam_step_(p, m, u, d, decay, step_size):  m <- u d;  p <- decay p - step_size u
onebit_adam_fold_pack_(worker, g, ms, inv_ds, offsets, beta1, bound, chunk) -> (bits, scales):
    the fold of every parameter k at g[offsets[k]:][:ms[k].numel()] (the rest of the bucket g as
    it is) added to the residual worker, which is then packed with error feedback
    (tscale.ops.bitpack.pack_signs_feedback_); g is left unchanged

All (N,)-shaped float32 of one size (any shape, same numel, contiguous). The CPU kernels
(csrc/optim/onebit_adam.cpp) do each in one pass over memory instead of three or four torch
operations; on other devices the references run (tscale/optim/adamw.py explains the math).
"""

import torch

from tscale.ops.backend import kernels_usable_on
from tscale.ops.bitpack import pack_signs_feedback_add_


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


def onebit_adam_fold_pack_reference(worker: torch.Tensor, g: torch.Tensor, ms: list[torch.Tensor],
                                    inv_ds: list[torch.Tensor], offsets: list[int], beta1: float, bound: float,
                                    chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    u = g.clone()  # (n,)
    for m, inv_d, off in zip(ms, inv_ds, offsets):
        onebit_adam_fold_reference(u[off: off + m.numel()], m.reshape(-1), inv_d.reshape(-1), beta1, bound)
    return pack_signs_feedback_add_(worker, u, chunk)


def onebit_adam_fold_pack_(worker: torch.Tensor, g: torch.Tensor, ms: list[torch.Tensor], inv_ds: list[torch.Tensor],
                           offsets: list[int], beta1: float, bound: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    if _fused(worker, g, *ms, *inv_ds):
        return torch.ops.tscale.onebit_adam_fold_pack_(worker, g, [m.view(-1) for m in ms], [d.view(-1) for d in inv_ds],
                                                       list(offsets), beta1, bound, chunk)
    return onebit_adam_fold_pack_reference(worker, g, ms, inv_ds, offsets, beta1, bound, chunk)
