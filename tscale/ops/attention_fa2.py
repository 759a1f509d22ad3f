"""torch's FlashAttention-2 under the tscale mask: documents as a varlen batch, the window, and an exact sink on top.

An alternative to the fused kernel of csrc/attention for training steps (`train.attention =
"fa2"`, or "fa2_global" for the global layers alone), built on aten::_flash_attention_forward /
_backward. The mask maps onto it as:
  documents  a variable-length batch, one sequence per document run of each batch row
             (`doc_runs`, computed on the host from the batch's token ids before it goes to
             the GPU, so no step waits on a device-to-host copy);
  window     window_size_left = window - 1 (FlashAttention counts the keys before the query);
  sink       y = o * sigmoid(lse) forward. The backward runs FlashAttention's own kernel with the
             gradient s * dy and the output y in place of o: its dS = P (dP - rowsum(dO * O))
             then equals the null slot's softmax gradient exactly (docs/architecture.md).
q, k, v come in the (B, T, H, D) layout the model's qkv projection makes, which is the (tokens,
H, D) layout FlashAttention wants: no transposes. The run offsets are padded with empty
sequences to a multiple of RUN_BUCKET, so torch.compile and CUDA graphs see few shapes.
"""

from dataclasses import dataclass

import torch

RUN_BUCKET = 64  # run counts are padded up to a multiple of this (empty sequences cost FlashAttention nothing)


def flash_forward(*args, **kwargs):
    """aten::_flash_attention_forward (a module-level name, so a test can stand a reference in for it)."""
    return torch.ops.aten._flash_attention_forward(*args, **kwargs)


def flash_backward(*args, **kwargs):
    """aten::_flash_attention_backward."""
    return torch.ops.aten._flash_attention_backward(*args, **kwargs)


@dataclass
class DocRuns:
    """The sequences of a (B, T) batch for FlashAttention's varlen form: offsets (N + 1,) int32, and the bound on
    their length FlashAttention sizes its grid by: T, whatever the batch (a per-batch value would make
    torch.compile specialise on it and recompile every step). `windowed`: whether the sliding-window layers take
    the runs' attention too (False: only the global layers do, the windowed ones keep tscale.ops.attention).
    `backend`: which attention runs over them: "fa2" (attention_fa2) or "cudnn" (tscale.ops.attention_cudnn)."""

    cu: torch.Tensor
    max_len: int
    windowed: bool = True
    backend: str = "fa2"

    def serves(self, window: int) -> bool:
        """Whether a layer of this window (0: the whole context) runs the runs' attention (not tscale.ops.attention)."""
        return self.windowed or not window

    def to(self, device, non_blocking: bool = False) -> "DocRuns":
        """On `device`; non_blocking to a GPU copies from pinned memory (from pageable memory CUDA would first wait
        for the stream's queued work, and the host could no longer run ahead of the GPU)."""
        cu = self.cu.pin_memory() if non_blocking and torch.device(device).type == "cuda" else self.cu
        return DocRuns(cu.to(device, non_blocking=non_blocking), self.max_len, self.windowed, self.backend)


def doc_runs(opens: torch.Tensor | None, B: int, T: int, bucket: int = RUN_BUCKET, windowed: bool = True,
             backend: str = "fa2") -> DocRuns:
    """The runs of a (B, T) batch: opens (B, T) bool, True where a document opens (the model's rule: at an
    eos token, which opens the next document), on the host; None: one run per row. Every row opens a run
    at 0. Offsets padded with empty runs to a multiple of `bucket`; max_len is T; windowed, backend as DocRuns."""
    new = torch.zeros(B, T, dtype=torch.bool)
    new[:, 0] = True
    if opens is not None:
        new |= opens.cpu()
    starts = new.flatten().nonzero().flatten()  # (N,)
    n = starts.numel()
    cu = torch.full((-(-n // bucket) * bucket + 1,), B * T, dtype=torch.int32)
    cu[:n] = starts.to(torch.int32)
    return DocRuns(cu, T, windowed, backend)


def runs_of_doc_ids(doc_ids: torch.Tensor | None, B: int, T: int, backend: str = "fa2") -> DocRuns:
    """doc_runs of document ids (B, T) as tscale.ops.attention takes them (None: one run per row): a run
    opens where the id changes."""
    opens = None
    if doc_ids is not None:
        opens = torch.zeros(B, T, dtype=torch.bool)
        opens[:, 1:] = (doc_ids[:, 1:] != doc_ids[:, :-1]).cpu()
    return doc_runs(opens, B, T, backend=backend)


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


__all__ = ["DocRuns", "attention_fa2", "doc_runs", "fa2_unusable_reason", "runs_of_doc_ids"]
