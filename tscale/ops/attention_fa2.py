"""torch's FlashAttention-2 under the tscale mask: documents as a varlen batch, the window, and an exact sink on top.

An alternative to the fused kernel of csrc/attention for training steps (`train.attention =
"fa2"`, or "fa2_global" for the global layers alone), built on aten::_flash_attention_forward /
_backward. The mask maps onto it as:
  documents  a variable-length batch, one sequence per document run of each batch row
             (tscale.ops.doc_runs, computed on the host from the batch's token ids before it goes to
             the GPU, so no step waits on a device-to-host copy);
  window     window_size_left = window - 1 (FlashAttention counts the keys before the query);
  sink       y = o * sigmoid(lse) forward. The backward runs FlashAttention's own kernel with the
             gradient s * dy and the output y in place of o: its dS = P (dP - rowsum(dO * O))
             then equals the null slot's softmax gradient exactly (docs/architecture.md).
q, k, v come in the (B, T, H, D) layout the model's qkv projection makes, which is the (tokens,
H, D) layout FlashAttention wants: no transposes.
"""

import torch

from tscale.ops.doc_runs import DocRuns


def flash_forward(*args, **kwargs):
    """aten::_flash_attention_forward (a module-level name, so a test can stand a reference in for it)."""
    return torch.ops.aten._flash_attention_forward(*args, **kwargs)


def flash_backward(*args, **kwargs):
    """aten::_flash_attention_backward."""
    return torch.ops.aten._flash_attention_backward(*args, **kwargs)


class _FlashMasked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, window, sink, scale):
        B, T, H, D = q.shape
        q2, k2, v2 = (t.reshape(B * T, H, D) for t in (q, k, v))  # (tokens, H, D)
        left = window - 1 if window else -1
        out, lse, rng, unused, _ = flash_forward(q2, k2, v2, cu, cu, max_len, max_len, 0.0, True, False, scale=scale,
                                                 window_size_left=left, window_size_right=0)
        gate = torch.sigmoid(_tokens_by_heads(lse, B * T, H)).unsqueeze(-1) if sink else None  # (tokens, H, 1)
        y = out * gate.to(out.dtype) if sink else out  # (tokens, H, D)
        ctx.save_for_backward(q2, k2, v2, y, lse, cu, rng, unused, *([gate] if sink else []))
        ctx.args = (B, T, H, D, max_len, left, sink, scale)
        return y.view(B, T, H, D)

    @staticmethod
    def backward(ctx, dy):
        q2, k2, v2, y, lse, cu, rng, unused, *gate = ctx.saved_tensors
        B, T, H, D, max_len, left, sink, scale = ctx.args
        g = dy.reshape(B * T, H, D)  # (tokens, H, D)
        if sink:
            g = g * gate[0].to(g.dtype)
        dq, dk, dv = flash_backward(g.contiguous(), q2, k2, v2, y, lse, cu, cu, max_len, max_len, 0.0, True, rng,
                                    unused, scale=scale, window_size_left=left, window_size_right=0)
        return dq.view(B, T, H, D), dk.view(B, T, H, D), dv.view(B, T, H, D), None, None, None, None, None


def _tokens_by_heads(lse: torch.Tensor, tokens: int, H: int) -> torch.Tensor:
    """FlashAttention's log-sum-exp as (tokens, H) float32, from the (H, tokens) layout of its varlen kernels."""
    if lse.dim() == 2 and tuple(lse.shape) == (H, tokens):
        return lse.t().float()
    raise RuntimeError(f"unexpected FlashAttention log-sum-exp layout {tuple(lse.shape)} for {tokens} tokens x {H} heads")


def attention_fa2(q, k, v, runs: DocRuns, *, window: int, sink: bool, scale: float) -> torch.Tensor:
    """Causal attention of q, k, v (B, T, H, D) within the runs (documents), window and sink -> (B, T, H, D)."""
    return _FlashMasked.apply(q, k, v, runs.cu, runs.max_len, window, sink, scale)


def fa2_unusable_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why attention_fa2 cannot run here, or None."""
    if device.type != "cuda":
        return "it needs a CUDA GPU (torch's FlashAttention-2)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"it needs bfloat16 or float16 activations, not {dtype}"
    if head_dim % 8 or head_dim > 256:
        return f"head dimension {head_dim}: FlashAttention-2 takes multiples of 8 up to 256"
    if "window_size_left" not in str(torch.ops.aten._flash_attention_forward.default._schema):
        return f"this torch ({torch.__version__}) has no sliding-window FlashAttention"
    return None


__all__ = ["attention_fa2", "fa2_unusable_reason"]
