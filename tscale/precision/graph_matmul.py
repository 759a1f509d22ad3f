"""Low-precision products with their quantisation as plain torch ops, for torch.compile to fuse with its neighbours.

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

The switchback recipes (int8_switchback, fp8_switchback; recipes.py) take switchback_matmul:
rowwise scales only, the weight gradient in the compute dtype, the products through the
opaque tscale::scaled_mm_rows (CUTLASS / cuBLASLt / torch paths of tscale.ops.lowprec).
"""

import torch

from tscale.ops.lowprec import fp8_mm_reference, quantize_reference, scaled_mm_rows

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


class _SwitchbackMatmul(torch.autograd.Function):
    """y (M, N) = x (M, K) @ weight (N, K)^T: forward and input gradient in low precision, weight gradient not."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, lowp_dtype: torch.dtype, grad_dtype: torch.dtype,
                out_dtype: torch.dtype, fast_accum: bool) -> torch.Tensor:
        xq, sx = quantize_reference(x, lowp_dtype, -1)  # (M, K), (M, 1): one scale per token
        wq, sw = quantize_reference(weight, lowp_dtype, -1)  # (N, K), (N, 1): one per output channel
        ctx.save_for_backward(x, weight)
        ctx.dtypes = (lowp_dtype, grad_dtype, out_dtype)
        return scaled_mm_rows(xq, wq, sx, sw, out_dtype, fast_accum)  # (M, N)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight = ctx.saved_tensors
        lowp_dtype, grad_dtype, out_dtype = ctx.dtypes
        dy = dy.contiguous()  # (M, N)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            gq, sg = quantize_reference(dy, grad_dtype, -1)  # (M, N), (M, 1)
            wq_t, sw_t = quantize_reference(weight.t().contiguous(), lowp_dtype, -1)  # (K, N), (K, 1): per input
            dx = scaled_mm_rows(gq, wq_t, sg, sw_t, out_dtype).to(x.dtype)  # (M, K)
        if ctx.needs_input_grad[1]:
            dw = (dy.to(out_dtype).t() @ x.to(out_dtype)).to(weight.dtype)  # (N, K): contracts over the tokens
        return dx, dw, None, None, None, None


def switchback_matmul(x: torch.Tensor, weight: torch.Tensor, lowp_dtype: torch.dtype, grad_dtype: torch.dtype,
                      out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """y (M, N) = x (M, K) @ weight (N, K)^T in a switchback recipe (recipes.py), traceable end to end.

    Forward x and weight rowwise in lowp_dtype; input gradient dy rowwise in grad_dtype times
    weight^T rowwise (one scale per input channel) in lowp_dtype; weight gradient dy^T x in
    out_dtype from the unquantised x, as nn.Linear computes it. fast_accum: the forward product only.
    """
    with torch.autocast(x.device.type, enabled=False):
        return _SwitchbackMatmul.apply(x, weight, lowp_dtype, grad_dtype, out_dtype, fast_accum)
