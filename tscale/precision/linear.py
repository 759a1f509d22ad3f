"""Low-precision linear layers for training: the autograd Function, the nn.Linear drop-in, and the converter.

`convert_linears(model, recipe)` swaps the model's nn.Linear modules for `LowPrecLinear`
from outside the model. A LowPrecLinear keeps the very same weight and bias Parameters
(fp32 master weights, the optimizer state and the checkpoint keys are untouched) and
quantises the weight and the activations at every call, then multiplies through
tscale.ops.lowprec. Gradients come back in the dtypes of the inputs and the weight.

Products for y = x W^T, x (M, K), W (N, K), dy (M, N), one per pass:
  forward      y  = x  @ W^T   operands in recipe.fwd_dtype
  grad input   dx = dy @ W     dy in recipe.grad_dtype, W in fwd_dtype
  grad weight  dW = dy^T @ x   dy in recipe.grad_dtype, x in fwd_dtype
Per-tensor scales: one scale each, and the transposed copies come from the same quantize
call. Rowwise: each product's left operand has a scale per row, its right operand one per
column, i.e. along the contracted dimension never: the scales factor out of every sum.
"""

import fnmatch

import torch
import torch.nn as nn

from tscale.errors import UserError
from tscale.ops.lowprec import quantize, scaled_mm
from tscale.precision.recipes import Recipe, get_recipe


def _t(scale: torch.Tensor) -> torch.Tensor:
    """The scale of the transposed operand: () stays (), (M, 1) becomes (1, M)."""
    return scale if scale.dim() == 0 else scale.t()


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a plain nn.Linear would compute in here: the autocast dtype when autocast is on, else x's."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class LowPrecMatmul(torch.autograd.Function):
    """y (M, N) = x (M, K) @ weight (N, K)^T with the recipe's low-precision products, forward and backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, recipe: Recipe, out_dtype: torch.dtype) -> torch.Tensor:
        ctx.recipe, ctx.out_dtype = recipe, out_dtype
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        lowp_tensorwise = recipe.grad_dtype is not None and not recipe.rowwise
        axis = -1 if recipe.rowwise else None
        with torch.autocast(x.device.type, enabled=False):
            if lowp_tensorwise:  # the backward products want x^T and W^T: the same casts, transposed
                xq, sx, xq_t = quantize(x, recipe.fwd_dtype, None, transpose=True)  # (M, K), (), (K, M)
                wq, sw, wq_t = quantize(weight, recipe.fwd_dtype, None, transpose=True)  # (N, K), (), (K, N)
                ctx.save_for_backward(xq_t, sx, wq_t, sw)
            else:
                xq, sx = quantize(x, recipe.fwd_dtype, axis)  # (M, K), () | (M, 1)
                wq, sw = quantize(weight, recipe.fwd_dtype, axis)  # (N, K), () | (N, 1)
                ctx.save_for_backward(x.to(out_dtype), weight)  # x as a plain nn.Linear under autocast keeps it
            return scaled_mm(xq, wq.t(), sx, _t(sw), out_dtype)  # (M, N)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        r, dt = ctx.recipe, ctx.out_dtype
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx = dw = None
        with torch.autocast(dy.device.type, enabled=False):
            dy = dy.contiguous()  # (M, N)
            if r.grad_dtype is None:
                x, w = ctx.saved_tensors
                g = dy.to(dt)
                dx = g @ w.to(dt) if need_x else None  # (M, K)
                dw = g.t() @ x.to(dt) if need_w else None  # (N, K)
            elif not r.rowwise:
                xq_t, sx, wq_t, sw = ctx.saved_tensors
                gq, sg, gq_t = quantize(dy, r.grad_dtype, None, transpose=True)  # (M, N), (), (N, M)
                dx = scaled_mm(gq, wq_t.t(), sg, sw, dt) if need_x else None  # (M, N) @ (N, K)
                dw = scaled_mm(gq_t, xq_t.t(), sg, sx, dt) if need_w else None  # (N, M) @ (M, K)
            else:
                x, w = ctx.saved_tensors
                if need_x:
                    gq, sg = quantize(dy, r.grad_dtype, -1)  # (M, N), (M, 1)
                    _, sw, wq_t = quantize(w, r.fwd_dtype, 0, transpose=True)  # (1, K), (K, N)
                    dx = scaled_mm(gq, wq_t.t(), sg, sw, dt)  # (M, N) @ (N, K)
                if need_w:
                    _, sg, gq_t = quantize(dy, r.grad_dtype, 0, transpose=True)  # (1, N), (N, M)
                    _, sx, xq_t = quantize(x, r.fwd_dtype, 0, transpose=True)  # (1, K), (K, M)
                    dw = scaled_mm(gq_t, xq_t.t(), sg.t(), sx, dt)  # (N, M) @ (M, K)
        dx = dx.to(ctx.x_dtype) if dx is not None else None
        dw = dw.to(ctx.w_dtype) if dw is not None else None
        return dx, dw, None, None


class LowPrecLinear(nn.Linear):
    """An nn.Linear whose products run in a low-precision recipe; it shares the original's weight and bias."""

    def __init__(self, linear: nn.Linear, recipe: Recipe):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # (N, K), the master weight, trained as before
        self.register_parameter("bias", linear.bias)
        self.recipe = recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = LowPrecMatmul.apply(x.reshape(-1, self.in_features), self.weight, self.recipe, compute_dtype(x))  # (M, N)
        y = y.view(*lead, self.out_features)
        return y + self.bias.to(y.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}"


def _matches(name: str, pattern: str) -> bool:
    """A glob pattern matches the whole dotted name; a plain word matches any part of it."""
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def selected(name: str, include=None, exclude=()) -> bool:
    """Whether the module called `name` is converted: it matches some include (or include is None) and no exclude."""
    if include is not None and not any(_matches(name, p) for p in include):
        return False
    return not any(_matches(name, p) for p in exclude)


def replace_linears(model: nn.Module, make, include=None, exclude=()) -> list[str]:
    """Replace every plain nn.Linear chosen by include/exclude with make(linear); the names replaced."""
    if isinstance(include, str) or isinstance(exclude, str):
        raise UserError("include and exclude are lists of module names, not a single string")
    done = []
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or not selected(name, include, exclude):
            continue
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, make(module))
        done.append(name)
    return done


def convert_linears(model: nn.Module, recipe: str | Recipe, include=None, exclude=("embedding", "head"),
                    int8_backward: bool = False) -> list[str]:
    """Swap the chosen nn.Linear modules of `model` for LowPrecLinear in place; the names converted.

    recipe: "bf16" (nothing converted), "fp8_tensorwise", "fp8_rowwise", "int8_rowwise", or a Recipe.
    include / exclude: module names (a plain word matches any part of a name, a glob the whole).
    """
    r = recipe if isinstance(recipe, Recipe) else get_recipe(recipe, int8_backward)
    if r is None:
        return []
    return replace_linears(model, lambda linear: LowPrecLinear(linear, r), include, exclude)
