"""Low-precision linear layers for training: the matmul custom op and its autograd, the nn.Linear drop-in, the converter.

`convert_linears(model, recipe)` swaps the model's nn.Linear modules for `LowPrecLinear`
from outside the model. A LowPrecLinear keeps the very same weight and bias Parameters
(fp32 master weights, the optimizer state and the checkpoint keys are untouched) and
quantises the weight and the activations at every call, then multiplies through
tscale.ops.lowprec. Gradients come back in the dtypes of the inputs and the weight.

The products run inside one torch custom op (tscale::lowprec_matmul, with its backward op), so
torch.compile sees a single node per layer instead of the products' Python dispatch.

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

from tscale.config import PrecisionConfig
from tscale.errors import UserError
from tscale.ops.lowprec import quantize, scaled_mm
from tscale.precision.delayed import add_state, delayed_matmul
from tscale.precision.graph_matmul import fp8_tensorwise_matmul, switchback_matmul
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


_NO_TENSOR = (0,)  # the shape of an output or argument that a recipe does not use


def _keeps_quantised(lowp_backward: bool, rowwise: bool) -> bool:
    """Whether the backward reuses the forward's quantised, transposed x and W (per-tensor low-precision backward)."""
    return lowp_backward and not rowwise


@torch.library.custom_op("tscale::lowprec_matmul", mutates_args=())
def _matmul_op(x: torch.Tensor, weight: torch.Tensor, fwd_dtype: torch.dtype, grad_dtype: torch.dtype,
               lowp_backward: bool, rowwise: bool, out_dtype: torch.dtype, fast_accum: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """y (M, N) = x (M, K) @ weight (N, K)^T, plus what the backward keeps: xq_t (K, M), sx, wq_t (K, N), sw
    when _keeps_quantised, else four empty tensors. One opaque op, so torch.compile neither breaks its
    graph at the products' dispatch nor recompiles per layer shape."""
    with torch.autocast(x.device.type, enabled=False):
        if _keeps_quantised(lowp_backward, rowwise):  # the backward products want x^T and W^T: the same casts
            xq, sx, xq_t = quantize(x, fwd_dtype, None, transpose=True)  # (M, K), (), (K, M)
            wq, sw, wq_t = quantize(weight, fwd_dtype, None, transpose=True)  # (N, K), (), (K, N)
            return scaled_mm(xq, wq.t(), sx, sw, out_dtype, fast_accum), xq_t, sx, wq_t, sw  # y (M, N)
        axis = -1 if rowwise else None
        xq, sx = quantize(x, fwd_dtype, axis)  # (M, K), () | (M, 1)
        wq, sw = quantize(weight, fwd_dtype, axis)  # (N, K), () | (N, 1)
        y = scaled_mm(xq, wq.t(), sx, _t(sw), out_dtype, fast_accum)  # (M, N)
        return (y, *(x.new_empty(_NO_TENSOR) for _ in range(4)))


@_matmul_op.register_fake
def _(x, weight, fwd_dtype, grad_dtype, lowp_backward, rowwise, out_dtype, fast_accum):
    (M, K), N = x.shape, weight.shape[0]
    y = x.new_empty((M, N), dtype=out_dtype)
    if _keeps_quantised(lowp_backward, rowwise):
        return (y, x.new_empty((K, M), dtype=fwd_dtype), x.new_empty((), dtype=torch.float32),
                x.new_empty((K, N), dtype=fwd_dtype), x.new_empty((), dtype=torch.float32))
    return (y, *(x.new_empty(_NO_TENSOR) for _ in range(4)))


@torch.library.custom_op("tscale::lowprec_matmul_backward", mutates_args=())
def _matmul_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, xq_t: torch.Tensor,
                        sx: torch.Tensor, wq_t: torch.Tensor, sw: torch.Tensor, fwd_dtype: torch.dtype,
                        grad_dtype: torch.dtype, lowp_backward: bool, rowwise: bool, out_dtype: torch.dtype,
                        x_dtype: torch.dtype, w_dtype: torch.dtype, need_x: bool, need_w: bool
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """dx (M, K) in x_dtype and dW (N, K) in w_dtype for dy (M, N); an empty tensor for a gradient not needed.

    x and weight are given (and xq_t ... sw empty) unless _keeps_quantised, and the other way round."""
    dt = out_dtype
    dx = dw = None
    with torch.autocast(dy.device.type, enabled=False):
        dy = dy.contiguous()  # (M, N)
        if not lowp_backward:
            g = dy.to(dt)
            dx = g @ weight.to(dt) if need_x else None  # (M, K)
            dw = g.t() @ x.to(dt) if need_w else None  # (N, K)
        elif not rowwise:
            gq, sg, gq_t = quantize(dy, grad_dtype, None, transpose=True)  # (M, N), (), (N, M)
            dx = scaled_mm(gq, wq_t.t(), sg, sw, dt) if need_x else None  # (M, N) @ (N, K)
            dw = scaled_mm(gq_t, xq_t.t(), sg, sx, dt) if need_w else None  # (N, M) @ (M, K)
        else:
            if need_x:
                gq, sg = quantize(dy, grad_dtype, -1)  # (M, N), (M, 1)
                _, swc, wqc_t = quantize(weight, fwd_dtype, 0, transpose=True)  # (1, K), (K, N)
                dx = scaled_mm(gq, wqc_t.t(), sg, swc, dt)  # (M, N) @ (N, K)
            if need_w:
                _, sgc, gqc_t = quantize(dy, grad_dtype, 0, transpose=True)  # (1, N), (N, M)
                _, sxc, xqc_t = quantize(x, fwd_dtype, 0, transpose=True)  # (1, K), (K, M)
                dw = scaled_mm(gqc_t, xqc_t.t(), sgc.t(), sxc, dt)  # (N, M) @ (M, K)
    dx = dx.to(x_dtype) if dx is not None else dy.new_empty(_NO_TENSOR, dtype=x_dtype)
    dw = dw.to(w_dtype) if dw is not None else dy.new_empty(_NO_TENSOR, dtype=w_dtype)
    return dx, dw


@_matmul_backward_op.register_fake
def _(dy, x, weight, xq_t, sx, wq_t, sw, fwd_dtype, grad_dtype, lowp_backward, rowwise, out_dtype, x_dtype, w_dtype,
      need_x, need_w):
    M, N = dy.shape
    K = xq_t.shape[0] if _keeps_quantised(lowp_backward, rowwise) else x.shape[1]
    dx = dy.new_empty((M, K) if need_x else _NO_TENSOR, dtype=x_dtype)
    dw = dy.new_empty((N, K) if need_w else _NO_TENSOR, dtype=w_dtype)
    return dx, dw


def _setup_context(ctx, inputs, output) -> None:
    x, weight, fwd_dtype, grad_dtype, lowp_backward, rowwise, out_dtype, _fast_accum = inputs
    ctx.args = (fwd_dtype, grad_dtype, lowp_backward, rowwise, out_dtype, x.dtype, weight.dtype)
    ctx.keeps_quantised = _keeps_quantised(lowp_backward, rowwise)
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(*(output[1:] if ctx.keeps_quantised else (x, weight)))


def _backward(ctx, dy, *_saved_grads):
    saved = ctx.saved_tensors
    none = dy.new_empty(_NO_TENSOR)
    x, weight, xq_t, sx, wq_t, sw = (none, none, *saved) if ctx.keeps_quantised else (*saved, none, none, none, none)
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dx, dw = _matmul_backward_op(dy, x, weight, xq_t, sx, wq_t, sw, *ctx.args, need_x, need_w)
    return (dx if need_x else None, dw if need_w else None, None, None, None, None, None, None)


_matmul_op.register_autograd(_backward, setup_context=_setup_context)


def lowprec_matmul(x: torch.Tensor, weight: torch.Tensor, recipe: Recipe, out_dtype: torch.dtype) -> torch.Tensor:
    """y (M, N) = x (M, K) @ weight (N, K)^T with the recipe's low-precision products, forward and backward."""
    if recipe.in_graph and not recipe.lowp_weight_grad:
        return switchback_matmul(x, weight, recipe.fwd_dtype, recipe.grad_dtype, out_dtype, recipe.fast_accum)
    if recipe.in_graph:
        return fp8_tensorwise_matmul(x, weight, out_dtype, recipe.fast_accum)
    lowp_backward = recipe.grad_dtype is not None
    grad_dtype = recipe.grad_dtype if lowp_backward else recipe.fwd_dtype  # unused without a low-precision backward
    return _matmul_op(x, weight, recipe.fwd_dtype, grad_dtype, lowp_backward, recipe.rowwise, out_dtype,
                      recipe.fast_accum)[0]


class LowPrecLinear(nn.Linear):
    """An nn.Linear whose products run in a low-precision recipe; it shares the original's weight and bias."""

    def __init__(self, linear: nn.Linear, recipe: Recipe):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # (N, K), the master weight, trained as before
        self.register_parameter("bias", linear.bias)
        self.recipe = recipe
        if recipe.delayed_history:
            add_state(self, recipe.delayed_history)  # amax_x, amax_w, amax_g

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, dt = x.shape[:-1], compute_dtype(x)
        x2 = x.reshape(-1, self.in_features).to(dt)  # (M, K): the backward keeps x as a plain nn.Linear would
        if self.recipe.delayed_history and self.training and torch.is_grad_enabled():  # training steps only
            y = delayed_matmul(x2, self.weight, self, dt, self.recipe.fast_accum)  # (M, N)
        else:
            y = lowprec_matmul(x2, self.weight, self.recipe, dt)  # (M, N)
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
                    int8_backward: bool = False, fp8_fast_accum: bool = False,
                    quantize_in_graph: bool = False, delayed_history: int = 0) -> list[str]:
    """Swap the chosen nn.Linear modules of `model` for LowPrecLinear in place; the names converted.

    recipe: "bf16" (nothing converted), a name of recipes.RECIPES, or a Recipe.
    include / exclude: module names (a plain word matches any part of a name, a glob the whole).
    delayed_history > 0: fp8_tensorwise with delayed scaling over that many calls (precision/delayed.py).
    """
    r = recipe if isinstance(recipe, Recipe) else get_recipe(recipe, int8_backward, fp8_fast_accum, quantize_in_graph,
                                                             delayed_history)
    if r is None:
        return []
    return replace_linears(model, lambda linear: LowPrecLinear(linear, r), include, exclude)


def convert_linears_as_configured(model: nn.Module, precision: PrecisionConfig) -> list[str]:
    """convert_linears with every choice of a run's [precision] section, as training applies them."""
    return convert_linears(model, precision.recipe, exclude=precision.exclude, int8_backward=precision.int8_backward,
                           fp8_fast_accum=precision.fp8_fast_accum, quantize_in_graph=precision.quantize_in_graph,
                           delayed_history=precision.amax_history if precision.scaling == "delayed" else 0)
