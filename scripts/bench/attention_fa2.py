"""torch's FlashAttention-2 under the tscale mask, for scripts/bench/attention_kernel.py to time beside the fused kernel.

Not a path of the model: a measurement of what the library's kernel would cost on the same mask,
to decide between improving csrc/attention and building on FlashAttention-2
(docs/architecture.md, "Another route"). The mask maps onto aten::_flash_attention_forward /
_backward as:
  documents  a variable-length batch: one sequence per document run of each batch row
             (cu_seqlens built once on the host from the doc ids, outside the timing, as the
             FlexAttention column's BlockMask is);
  window     window_size_left = window - 1 (FlashAttention counts the keys before the query);
  sink       y = o * sigmoid(lse) forward; backward through FlashAttention's own kernel with the
             gradient s * dy and the output y in place of o, which gives the exact gradient of
             the null slot's softmax (docs/architecture.md derives it).
Layouts: (B, H, T, D) in and out, as the model's attention; the transposes to the (tokens, H, D)
layout FlashAttention wants are inside the timed call.
"""

import torch


def flash_forward(*args, **kwargs):
    """aten::_flash_attention_forward (a module-level name, so a test can stand a reference in for it)."""
    return torch.ops.aten._flash_attention_forward(*args, **kwargs)


def flash_backward(*args, **kwargs):
    """aten::_flash_attention_backward."""
    return torch.ops.aten._flash_attention_backward(*args, **kwargs)


def cu_seqlens(doc_ids: torch.Tensor | None, B: int, T: int) -> tuple[torch.Tensor, int]:
    """(N + 1,) int32 offsets of every document run of every batch row in the (B * T) tokens, and the longest."""
    if doc_ids is None:
        starts = torch.arange(0, B * T, T)
    else:
        d = doc_ids.cpu()
        new = torch.ones(B, T, dtype=torch.bool)
        new[:, 1:] = d[:, 1:] != d[:, :-1]
        starts = new.flatten().nonzero().flatten()
    offsets = torch.cat([starts, torch.tensor([B * T])]).to(torch.int32)
    return offsets, int((offsets[1:] - offsets[:-1]).max())


class _FlashMasked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, window, sink, scale):
        B, H, T, D = q.shape
        q2, k2, v2 = (t.transpose(1, 2).reshape(B * T, H, D) for t in (q, k, v))  # (tokens, H, D)
        left = window - 1 if window else -1
        out, lse, rng, unused, _ = flash_forward(q2, k2, v2, cu, cu, max_len, max_len, 0.0, True, False, scale=scale,
                                                 window_size_left=left, window_size_right=0)
        lse_t = _tokens_by_heads(lse, B * T, H)  # (tokens, H)
        y = out * torch.sigmoid(lse_t).unsqueeze(-1).to(out.dtype) if sink else out  # (tokens, H, D)
        ctx.save_for_backward(q2, k2, v2, y, lse, lse_t, cu, rng, unused)
        ctx.args = (B, H, T, D, max_len, left, sink, scale)
        return y.view(B, T, H, D).transpose(1, 2)

    @staticmethod
    def backward(ctx, dy):
        q2, k2, v2, y, lse, lse_t, cu, rng, unused = ctx.saved_tensors
        B, H, T, D, max_len, left, sink, scale = ctx.args
        g = dy.transpose(1, 2).reshape(B * T, H, D)  # (tokens, H, D)
        if sink:
            g = g * torch.sigmoid(lse_t).unsqueeze(-1).to(g.dtype)
        dq, dk, dv = flash_backward(g.contiguous(), q2, k2, v2, y, lse, cu, cu, max_len, max_len, 0.0, True, rng,
                                    unused, scale=scale, window_size_left=left, window_size_right=0)
        back = [t.view(B, T, H, D).transpose(1, 2) for t in (dq, dk, dv)]
        return (*back, None, None, None, None, None)


def _tokens_by_heads(lse: torch.Tensor, tokens: int, H: int) -> torch.Tensor:
    """FlashAttention's log-sum-exp as (tokens, H) float32, from the (H, tokens) layout of its varlen kernels."""
    if lse.dim() == 2 and lse.shape == (H, tokens):
        return lse.t().float()
    raise RuntimeError(f"unexpected FlashAttention log-sum-exp layout {tuple(lse.shape)} for {tokens} tokens x {H} heads")


def flash_masked(q, k, v, cu: torch.Tensor, max_len: int, window: int, sink: bool, scale: float) -> torch.Tensor:
    """Attention of q, k, v (B, H, T, D) under documents (cu, on q's device), window and sink, through FlashAttention-2."""
    return _FlashMasked.apply(q, k, v, cu, max_len, window, sink, scale)
