"""Muon for the hidden matrices plus AdamW for everything else, as one torch optimizer.

Muon (per matrix): Nesterov momentum of the gradient, then the update is orthogonalised by a
quintic Newton-Schulz iteration (fp16 products on CUDA, fp32 elsewhere) and scaled by
sqrt(max(1, rows / cols)); decoupled weight decay. The embedding, the head and vectors (norm
gains, biases) take AdamW steps with their own rates.

Why fp16 rather than bf16 for the iteration: tensor cores run both at one rate, and fp16's three
more mantissa bits bring the update about 7x closer to the float32 iteration (scripts/bench/
muon_profile.py measures it). Its range suffices because every value is bounded: each matrix is
normalised (in its own dtype, before the cast) to Frobenius norm 1, so x x^T and its square have
entries of at most 1 and the polynomial at most |a| + |b| + |c| < 11.

A step is launched per group, not per parameter: the momentum updates are torch's multi-tensor
(_foreach) ops, the AdamW updates its fused AdamW kernel, and the matrices of one shape (a
layer's qkv across all layers, say) are orthogonalised together as one batch of matrix products.
The arithmetic per matrix is the same; what shrinks is the number of kernel launches, which
bounds a small model's optimizer step on a GPU (hundreds per matrix otherwise).

Each param group has "kind" ("muon" or "adam") and "lr_scale": the training loop writes the
schedule's value for optim.lr into group["lr"], and a group steps with group["lr"] * group["lr_scale"],
so every group follows one schedule at its own rate. All state lives in `state` and `param_groups`,
so state_dict() / load_state_dict() resume a run exactly.
"""

import torch
import torch.nn as nn

from tscale.config import OptimConfig

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def ns_dtype_for(t: torch.Tensor) -> torch.dtype:
    """The dtype of the Newton-Schulz products: fp16 on CUDA (see the module docstring), fp32 elsewhere."""
    return torch.float16 if t.is_cuda else torch.float32


@torch.no_grad()
def orthogonalize(g: torch.Tensor, steps: int = 5, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Approximately U V^T for g = U S V^T, (R, C) or a batch (n, R, C): singular values pushed into about [0.7, 1.2]."""
    a, b, c = NS_COEFFS
    dtype = dtype or ns_dtype_for(g)
    x = g / (torch.linalg.vector_norm(g, dim=(-2, -1), keepdim=True) + 1e-7)  # each matrix to norm 1, then cast
    x = x.to(dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT  # (..., C, R): iterate on the short side
    addmm = torch.baddbmm if x.dim() == 3 else torch.addmm  # beta * input + alpha * (m1 @ m2), one kernel
    for _ in range(steps):  # x <- (a I + b m + c m^2) x, m = x x^T
        m = x @ x.mT  # (..., r, r)
        poly = addmm(m, m, m, beta=b, alpha=c)  # (..., r, r)
        poly.diagonal(dim1=-2, dim2=-1).add_(a)
        x = poly @ x  # (..., r, C): a plain product; a x as its beta term would first copy x into the result
    return (x.mT if tall else x).to(g.dtype)


@torch.no_grad()
def muon_update(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor],
                lr: float | torch.Tensor, momentum: float, weight_decay: float, ns_steps: int,
                shapes: tuple[tuple[tuple[int, ...], tuple[int, int]], ...]) -> None:
    """One Muon step of `params` in place: Nesterov momentum into `bufs`, decoupled decay, and each shape's batch
    of updates orthogonalised together (shapes: (indices into params, (rows, cols)) per shape).

    lr is a float when called eagerly, a 0-dim tensor on the params' device under torch.compile (one graph for
    every rate); there the update's scaling is written as plain ops for Inductor to fuse.
    """
    compiled = torch.compiler.is_compiling()
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_add_(bufs, grads)
    updates = torch._foreach_add(grads, bufs, alpha=momentum)  # Nesterov
    if weight_decay:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    for members, (rows, cols) in shapes:
        batch = torch.stack([updates[i] for i in members])  # (n, R, C), normalised before orthogonalize's cast
        orth = list(orthogonalize(batch, ns_steps).unbind(0))
        scale = -max(1.0, rows / cols) ** 0.5
        targets = [params[i] for i in members]
        if compiled:
            torch._foreach_add_(targets, torch._foreach_mul(orth, lr * scale))
        else:
            torch._foreach_add_(targets, orth, alpha=lr * scale)


class Muon(torch.optim.Optimizer):
    """Groups of kind "muon" (2-D params only) and kind "adam"; see the module docstring for lr_scale."""

    def __init__(self, groups: list[dict], lr: float, momentum: float = 0.95, betas=(0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, ns_steps: int = 5, compile_step: bool = False):
        defaults = dict(lr=lr, lr_scale=1.0, momentum=momentum, betas=betas, eps=eps, weight_decay=weight_decay,
                        ns_steps=ns_steps, kind="adam")
        super().__init__(groups, defaults)
        # compile_step: the Muon groups' update through torch.compile, its passes fused (optim.compile_step)
        self._compiled_update = torch.compile(muon_update, dynamic=False) if compile_step else None
        self._lr_tensors: dict[torch.device, torch.Tensor] = {}
        for group in self.param_groups:
            if group["kind"] == "muon" and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon groups take 2-D matrices only")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._muon_step(group)
            else:
                self._adam_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        lr = group["lr"] * group["lr_scale"]
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            bufs.append(state["momentum_buffer"])
        shapes = tuple((tuple(members), shape) for shape, members in _by_shape(params).items())
        update, rate = muon_update, lr
        if self._compiled_update is not None:
            rate = self._lr_tensors.get(params[0].device)
            if rate is None:
                rate = self._lr_tensors[params[0].device] = torch.zeros((), device=params[0].device)
            rate.fill_(lr)  # one graph for every rate the schedule gives: the rate is data, not a constant
            update = self._compiled_update
        update(params, [p.grad for p in params], bufs, rate, group["momentum"], group["weight_decay"],
               group["ns_steps"], shapes)

    def _adam_step(self, group: dict) -> None:
        """torch's fused AdamW kernel, one call per device and dtype: both moments, the bias corrections, the decay
        and the update in one pass over each tensor (the multi-tensor op per term it replaces took seven)."""
        lr = group["lr"] * group["lr_scale"]
        beta1, beta2 = group["betas"]
        by_place: dict[tuple, list[torch.Tensor]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            elif state["step"].device != p.device:  # load_state_dict leaves step counts where they were saved
                state["step"] = state["step"].to(p.device)
            by_place.setdefault((p.device, p.dtype), []).append(p)
        for params in by_place.values():
            states = [self.state[p] for p in params]
            steps = [st["step"] for st in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(params, [p.grad for p in params], [st["exp_avg"] for st in states],
                                [st["exp_avg_sq"] for st in states], [], steps, lr=lr, beta1=beta1, beta2=beta2,
                                weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False, maximize=False)


def _by_shape(params: list[torch.Tensor]) -> dict[tuple[int, ...], list[int]]:
    """Indices of `params` grouped by shape, in first-seen order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(tuple(p.shape), []).append(i)
    return groups


def muon_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """Hidden matrices (inside model.blocks) to Muon; embeddings, head and vectors to AdamW at their rates."""
    hidden, embed, head, vectors = [], [], [], []
    head_weight = getattr(getattr(model, "lm_head", None), "weight", None)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p is head_weight:
            head.append(p)
        elif p.dim() == 2 and name.startswith("blocks."):
            hidden.append(p)
        elif p.dim() == 2:
            embed.append(p)
        else:
            vectors.append(p)
    groups = [
        {"params": hidden, "kind": "muon", "lr_scale": cfg.muon_lr / cfg.lr, "weight_decay": cfg.weight_decay},
        {"params": embed, "kind": "adam", "lr_scale": cfg.embed_lr / cfg.lr, "weight_decay": 0.0},
        {"params": head, "kind": "adam", "lr_scale": cfg.head_lr / cfg.lr, "weight_decay": 0.0},
        {"params": vectors, "kind": "adam", "lr_scale": cfg.scalar_lr / cfg.lr, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def compiles_step(cfg: OptimConfig, device: torch.device) -> bool:
    """Whether Muon's update runs through torch.compile: optim.compile_step, where "auto" means on a CUDA device
    whose torch.compile can generate kernels (Triton is installed); elsewhere the eager step serves."""
    if cfg.compile_step != "auto":
        return cfg.compile_step
    from torch.utils._triton import has_triton

    return device.type == "cuda" and has_triton()


def build_muon(model: nn.Module, cfg: OptimConfig, device: torch.device) -> Muon:
    compile_step = compiles_step(cfg, device)
    return Muon(muon_groups(model, cfg), lr=cfg.lr, momentum=cfg.muon_momentum, betas=(cfg.beta1, cfg.beta2),
                eps=cfg.eps, compile_step=compile_step)
