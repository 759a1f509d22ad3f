"""fp8_tensorwise with delayed scaling: each operand's scale from the amax of its earlier calls, kept per layer.

`precision.scaling = "delayed"` (recipe fp8_tensorwise) routes a LowPrecLinear here. The three
products and their dtypes are fp8_tensorwise's (linear.py), but each quantised operand (x and W
in the forward pass, dy in the backward) takes its scale from the largest amax of its last
`precision.amax_history` calls instead of its own: the cast needs no amax pass first, so it reads
the operand once (tscale::quantize_delayed) where dynamic scaling reads it twice. Values beyond the
scale saturate to the format's largest finite value. A layer's first call, with an empty history,
scales by the operand's own amax. Only training steps (train mode, gradients on) take delayed scales
and feed the histories; evaluation and other calls without gradients quantise with dynamic scales,
as `tscale eval` does, and leave the histories to the training data.

The history lives in three int32 buffers per layer (amax_x, amax_w, amax_g: history + 2 entries,
quantize_delayed_reference in tscale/ops/lowprec.py has the layout), updated in place by the
quantize calls. They are not in the model's state_dict (a checkpoint's weights stay those of the
plain model); training saves them with each rank's state (precision_state) so that --resume
continues with the same scales.

The products run in two custom ops, forward and backward, that declare the buffers they update;
an autograd.Function joins them (a custom op that mutates its inputs cannot carry autograd itself).
"""

import torch
import torch.nn as nn

from tscale.errors import UserError
from tscale.ops.lowprec import quantize_delayed, scaled_mm

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
STATE_BUFFERS = ("amax_x", "amax_w", "amax_g")


@torch.library.custom_op("tscale::fp8_delayed_matmul", mutates_args=("amax_x", "amax_w"))
def _forward_op(x: torch.Tensor, weight: torch.Tensor, amax_x: torch.Tensor, amax_w: torch.Tensor,
                out_dtype: torch.dtype, fast_accum: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """y (M, N) = x (M, K) @ weight (N, K)^T, and what the backward keeps: xq_t (K, M), sx, wq_t (K, N), sw."""
    with torch.autocast(x.device.type, enabled=False):
        xq, sx, xq_t = quantize_delayed(x, E4M3, amax_x, transpose=True)  # (M, K), (), (K, M)
        wq, sw, wq_t = quantize_delayed(weight, E4M3, amax_w, transpose=True)  # (N, K), (), (K, N)
        return scaled_mm(xq, wq.t(), sx, sw, out_dtype, fast_accum), xq_t, sx, wq_t, sw


@_forward_op.register_fake
def _(x, weight, amax_x, amax_w, out_dtype, fast_accum):
    (M, K), N = x.shape, weight.shape[0]
    return (x.new_empty((M, N), dtype=out_dtype), x.new_empty((K, M), dtype=E4M3), x.new_empty((), dtype=torch.float32),
            x.new_empty((K, N), dtype=E4M3), x.new_empty((), dtype=torch.float32))


@torch.library.custom_op("tscale::fp8_delayed_matmul_backward", mutates_args=("amax_g",))
def _backward_op(dy: torch.Tensor, xq_t: torch.Tensor, sx: torch.Tensor, wq_t: torch.Tensor, sw: torch.Tensor,
                 amax_g: torch.Tensor, out_dtype: torch.dtype, x_dtype: torch.dtype, w_dtype: torch.dtype,
                 need_x: bool, need_w: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """dx (M, K) in x_dtype and dW (N, K) in w_dtype for dy (M, N); an empty tensor for a gradient not needed."""
    with torch.autocast(dy.device.type, enabled=False):
        gq, sg, gq_t = quantize_delayed(dy.contiguous(), E5M2, amax_g, transpose=True)  # (M, N), (), (N, M)
        dx = scaled_mm(gq, wq_t.t(), sg, sw, out_dtype).to(x_dtype) if need_x else dy.new_empty((0,), dtype=x_dtype)
        dw = scaled_mm(gq_t, xq_t.t(), sg, sx, out_dtype).to(w_dtype) if need_w else dy.new_empty((0,), dtype=w_dtype)
    return dx, dw  # (M, N) @ (N, K); (N, M) @ (M, K)


@_backward_op.register_fake
def _(dy, xq_t, sx, wq_t, sw, amax_g, out_dtype, x_dtype, w_dtype, need_x, need_w):
    (M, N), K = dy.shape, xq_t.shape[0]
    return (dy.new_empty((M, K) if need_x else (0,), dtype=x_dtype),
            dy.new_empty((N, K) if need_w else (0,), dtype=w_dtype))


class _DelayedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, amax_x, amax_w, amax_g, out_dtype, fast_accum):
        y, xq_t, sx, wq_t, sw = _forward_op(x, weight, amax_x, amax_w, out_dtype, fast_accum)
        ctx.save_for_backward(xq_t, sx, wq_t, sw)
        ctx.amax_g = amax_g
        ctx.dtypes = (out_dtype, x.dtype, weight.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dx, dw = _backward_op(dy, *ctx.saved_tensors, ctx.amax_g, *ctx.dtypes, need_x, need_w)
        return (dx if need_x else None, dw if need_w else None, None, None, None, None, None)


def delayed_matmul(x: torch.Tensor, weight: torch.Tensor, layer: nn.Module, out_dtype: torch.dtype,
                   fast_accum: bool = False) -> torch.Tensor:
    """y (M, N) = x (M, K) @ weight (N, K)^T in fp8_tensorwise with the delayed scales of `layer`'s buffers."""
    with torch.autocast(x.device.type, enabled=False):
        return _DelayedMatmul.apply(x, weight, layer.amax_x, layer.amax_w, layer.amax_g, out_dtype, fast_accum)


def add_state(layer: nn.Module, history: int) -> None:
    """Give `layer` its three amax histories (zeros: empty) on its weight's device, outside its state_dict."""
    for name in STATE_BUFFERS:
        layer.register_buffer(name, torch.zeros(history + 2, dtype=torch.int32, device=layer.weight.device),
                              persistent=False)


def precision_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The amax histories of every delayed-scaling layer of `model`, by buffer name, as CPU copies."""
    return {f"{name}.{b}": getattr(m, b).detach().cpu().clone()
            for name, m in model.named_modules() if hasattr(m, STATE_BUFFERS[0]) for b in STATE_BUFFERS}


def load_precision_state(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy histories saved by precision_state back; `where` names the checkpoint in an error.

    A checkpoint without them (dynamic scaling, or an older run) leaves the histories empty: each layer's
    next call scales by its own amax, as a fresh run's first does."""
    if not state:
        return
    own = precision_state(model)
    if set(state) != set(own):
        raise UserError(f"{where}: its delayed-scaling state does not match this run's layers (saved with another "
                        f"precision.scaling or precision.amax_history?); resume with the run's own [precision] settings")
    for key, saved in state.items():
        owner, _, buffer = key.rpartition(".")
        target = getattr(model.get_submodule(owner), buffer)
        if target.shape != saved.shape:
            raise UserError(f"{where}: {key} holds {saved.numel() - 2} amax entries, this run keeps "
                            f"{target.numel() - 2}; resume with the run's own precision.amax_history")
        target.copy_(saved)
