"""Low-precision inference: a checkpoint's linear weights converted once at load time.

Modes (`tscale infer/eval --precision`):
  bf16     unchanged: bf16 autocast on CUDA, fp32 on the CPU
  int8-w   int8 weights, one scale per output channel, cast on the fly; the product in the compute dtype, then the
           scales (they save memory, not time: the cast is one more pass over the weights at every call)
  fp8-w    the same with e4m3 weights
  int8     int8 weights as above and int8 activations with one dynamic scale per token: int8 x int8 -> int32
  fp8      e4m3 weights and activations, per-channel / per-token scales: the fp8 product
The embedding and the head stay as they are by default (`exclude`).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from tscale.errors import UserError
from tscale.ops.lowprec import quantize, scaled_mm
from tscale.precision.linear import compute_dtype, replace_linears

INFER_MODES = ("bf16", "int8-w", "fp8-w", "int8", "fp8")
_MODES = {"int8-w": (torch.int8, False), "fp8-w": (torch.float8_e4m3fn, False),
          "int8": (torch.int8, True), "fp8": (torch.float8_e4m3fn, True)}


class QuantizedLinear(nn.Module):
    """Inference-only linear layer: a frozen low-precision weight (N, K) with per-output-channel scales (N, 1)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype, quantize_activations: bool,
                 device: torch.device | str | None = None):
        """device: where the quantised weight is made and kept (default: the linear layer's)."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.quantize_activations = quantize_activations
        with torch.no_grad():
            qweight, scale = quantize(linear.weight.detach().to(device), dtype, -1)  # (N, K), (N, 1)
        bias = linear.bias.detach().to(device, copy=True) if linear.bias is not None else None
        self.register_buffer("qweight", qweight)
        self.register_buffer("w_scale", scale)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        dt = compute_dtype(x)
        if self.quantize_activations:
            xq, sx = quantize(x2, self.qweight.dtype, -1)  # (M, K), (M, 1)
            y = scaled_mm(xq, self.qweight.t(), sx, self.w_scale.t(), dt)  # (M, N)
        else:  # the scale after the product: the cast weight is exact in the compute dtype, and one pass fewer
            y = F.linear(x2.to(dt), self.qweight.to(dt)) * self.w_scale.t().to(dt)  # (M, N)
        y = y.view(*lead, self.out_features)
        return y + self.bias.to(y.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        act = "dynamic per-token" if self.quantize_activations else "weight-only"
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.qweight.dtype}, {act}"


def store_linears_in(model: nn.Module, dtype: torch.dtype) -> list[str]:
    """Keep every plain nn.Linear's weight and bias in `dtype` (frozen); the names.

    For a model run under autocast to `dtype`: its products then read the weights as autocast would have cast them,
    the same values, without casting every weight again at each call (autocast's cache lasts one context, a
    forward pass). A weight shared with another module (a head tied to the embedding) becomes the layer's own
    copy, so the embedding keeps its precision.
    """
    done = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear:
            continue
        module.weight = nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)
        if module.bias is not None:
            module.bias = nn.Parameter(module.bias.detach().to(dtype), requires_grad=False)
        done.append(name)
    return done


def quantize_for_inference(model: nn.Module, mode: str, include=None, exclude=("wte", "lm_head"),
                           device: torch.device | str | None = None) -> list[str]:
    """Replace the model's chosen nn.Linear modules for inference in `mode` (see the module docstring); the names.

    device: where the quantised weights go, each made there from its layer's weights in turn (default: where the
    layers are), so that a model on the CPU converted for a GPU never has all its full-precision weights there.
    """
    if mode not in INFER_MODES:
        raise UserError(f"--precision {mode}: expected one of {', '.join(INFER_MODES)}")
    if mode == "bf16":
        return []
    dtype, act = _MODES[mode]
    return replace_linears(model, lambda linear: QuantizedLinear(linear, dtype, act, device), include, exclude)
