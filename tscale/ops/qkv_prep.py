"""A tscale layer's attention inputs from its qkv product in one pass: QK normalisation, RoPE and v's copy, fused.

The model's own path (tscale.model.tscale_lm.Attention) splits the (B, T, 3, H, D) product, normalises q and
k in float32, rotates them and casts them back; under torch.compile that is one generated kernel a direction at
about twice the bytes' time (docs/BENCHMARKS.md). `qkv_prep` does it in one CUDA pass that reads the product once
and writes q, k and v contiguous, and its backward writes the product's gradient directly, with no stacking of
dq, dk and dv after it (csrc/qkv/qkv_prep_kernel.cuh). `qkv_prep_reference` is its twin in torch ops, the same
arithmetic as the model's path; tests/test_qkv_prep.py compares the kernel (on the CPU through the emulator
of tests/attention_emu, on a GPU directly) with it, backward included.

qkv_prep(qkv (B, T, 3, H, D), cos (T, D), sin (T, D), eps, norm, rope) -> q, k, v, each (B, T, H, D) in qkv's dtype
    cos, sin: tscale_lm.rope_tables' (the rotation's sign in sin's first half); norm: RMS over D without gains.
"""

import torch
import torch.nn.functional as F

from tscale.ops.backend import cuda_kernels_available


def qkv_prep_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, norm: bool,
                       rope: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's twin: q and k in float32 through the norm and the rotation, cast back; v contiguous."""
    q, k, v = qkv.unbind(2)  # 3 x (B, T, H, D)
    out = []
    for x in (q, k):
        x = x.float()
        if norm:
            x = F.rms_norm(x, (x.shape[-1],), eps=eps)
        if rope:
            x = x * cos[:, None] + x.roll(x.shape[-1] // 2, dims=-1) * sin[:, None]  # cos, sin (T, 1, D)
        out.append(x.to(qkv.dtype))
    return out[0], out[1], v.contiguous()


def kernel_serves(qkv: torch.Tensor, cos: torch.Tensor) -> bool:
    """Whether the CUDA kernel takes these inputs (else the reference runs)."""
    return (qkv.is_cuda and qkv.dtype == torch.bfloat16 and qkv.dim() == 5 and qkv.shape[2] == 3
            and qkv.shape[-1] in (64, 128) and qkv.is_contiguous() and cos.dtype == torch.float32
            and cuda_kernels_available())


def _register_fake() -> None:
    """Shapes of the kernels' results for torch.compile's tracing (the ops exist only with tscale._C)."""
    if not hasattr(torch.ops.tscale, "qkv_prep"):
        return

    @torch.library.register_fake("tscale::qkv_prep")
    def _fake(qkv, cos, sin, eps, norm, rope):
        B, T, _, H, D = qkv.shape
        return tuple(qkv.new_empty(B, T, H, D) for _ in range(3))

    @torch.library.register_fake("tscale::qkv_prep_backward")
    def _fake_backward(dq, dk, dv, qkv, cos, sin, eps, norm, rope):
        return torch.empty_like(qkv)


if cuda_kernels_available():
    _register_fake()


class _QkvPrep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, eps: float, norm: bool, rope: bool):
        ctx.save_for_backward(qkv, cos, sin)
        ctx.args = eps, norm, rope
        return torch.ops.tscale.qkv_prep(qkv, cos, sin, eps, norm, rope)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        qkv, cos, sin = ctx.saved_tensors
        dqkv = torch.ops.tscale.qkv_prep_backward(dq, dk, dv, qkv, cos, sin, *ctx.args)
        return dqkv, None, None, None, None, None


def qkv_prep(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float = 1e-6, norm: bool = True,
             rope: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, T, H, D) from qkv (B, T, 3, H, D): the kernel where it serves, else the reference."""
    if kernel_serves(qkv, cos):
        return _QkvPrep.apply(qkv, cos.contiguous(), sin.contiguous(), float(eps), bool(norm), bool(rope))
    return qkv_prep_reference(qkv, cos, sin, eps, norm, rope)


__all__ = ["kernel_serves", "qkv_prep", "qkv_prep_reference"]
