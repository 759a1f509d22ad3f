"""The fp8 tensorwise product with its quantisation as plain torch ops, for torch.compile to fuse with the layer's neighbours.

`precision.quantize_in_graph` (recipe fp8_tensorwise only) routes a LowPrecLinear here instead of
the tscale::lowprec_matmul custom op. The arithmetic is the recipe's own (quantize_reference:
one scale per tensor, e4m3 activations and weights, e5m2 output gradients; the same three
products), but nothing is opaque: under torch.compile Inductor sees the amax reductions and
casts and can fold them into the kernels that produce or consume the activations (the norm, the
MLP's activation, the attention output), where the custom op costs separate passes over them.
The products are torch._scaled_mm on CUDA (all dims multiples of 16), the fp32 reference
elsewhere. Which of the two routes a model trains faster with is a measurement, not a rule
(scripts/bench/lowprec_train.py, recipe fp8_tensorwise_graph).

Products for y = x W^T, x (M, K), W (N, K), dy (M, N):
  forward      y  = xq  @ Wq^T   e4m3 x e4m3
  grad input   dx = gq  @ Wq     e5m2 x e4m3
  grad weight  dW = gq^T @ xq    e5m2 x e4m3
The backward keeps xq and Wq (one byte per value) instead of x and W.
"""

import torch

from tscale.ops.lowprec import fp8_mm_reference, quantize_reference

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _column_major(b: torch.Tensor) -> torch.Tensor:
    """b (K, N) with column-major strides, as torch._scaled_mm wants its second operand."""
    return b if b.stride(0) == 1 else b.t().contiguous().t()


def scaled_product(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """(M, N) = (a (M, K) @ b (K, N)) * scale_a * scale_b, a and b fp8, one scale each."""
    (M, K), N = a.shape, b.shape[1]
    if a.is_cuda and M % 16 == 0 and K % 16 == 0 and N % 16 == 0:
        return torch._scaled_mm(a.contiguous(), _column_major(b), scale_a, scale_b, out_dtype=out_dtype,
                                use_fast_accum=fast_accum)
    return fp8_mm_reference(a, b, scale_a, scale_b, out_dtype)


class _Fp8TensorwiseMatmul(torch.autograd.Function):
    """y (M, N) = x (M, K) @ weight (N, K)^T in fp8_tensorwise; gradients in x's and weight's dtypes."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype, fast_accum: bool) -> torch.Tensor:
        xq, sx = quantize_reference(x, E4M3)  # (M, K), ()
        wq, sw = quantize_reference(weight, E4M3)  # (N, K), ()
        ctx.save_for_backward(xq, sx, wq, sw)
        ctx.dtypes = (x.dtype, weight.dtype, out_dtype)
        return scaled_product(xq, wq.t(), sx, sw, out_dtype, fast_accum)  # (M, N)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        xq, sx, wq, sw = ctx.saved_tensors
        x_dtype, w_dtype, out_dtype = ctx.dtypes
        gq, sg = quantize_reference(dy.contiguous(), E5M2)  # (M, N), ()
        dx = scaled_product(gq, wq, sg, sw, out_dtype).to(x_dtype) if ctx.needs_input_grad[0] else None  # (M, K)
        dw = scaled_product(gq.t(), xq, sg, sx, out_dtype).to(w_dtype) if ctx.needs_input_grad[1] else None  # (N, K)
        return dx, dw, None, None


def fp8_tensorwise_matmul(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype,
                          fast_accum: bool = False) -> torch.Tensor:
    """y (M, N) = x (M, K) @ weight (N, K)^T through fp8_tensorwise products, traceable end to end."""
    with torch.autocast(x.device.type, enabled=False):
        return _Fp8TensorwiseMatmul.apply(x, weight, out_dtype, fast_accum)
