"""The attention op: causal, sliding window, document boundaries and attention sink, as one masked softmax.

Layout (B, H, T, D). Queries are the last Tq of the Tk key positions (Tq == Tk in training,
Tq < Tk when decoding with a KV cache): query i sits at absolute position p = Tk - Tq + i and
sees key j iff j <= p, p - j < window (window 0: no limit) and doc_ids[b, j] == doc_ids[b, p]
(doc_ids None: no document mask). With `sink` a null slot of logit 0 and value 0 joins every
softmax ("softmax plus one"): weights exp(s_j) / (1 + sum_k exp(s_k)).

Three paths with one meaning: `attention_reference` (explicit mask, matmul, softmax; float32
math), `attention_flex` (torch FlexAttention with a BlockMask from the same mask rule; the sink
is an appended null key/value slot), and `attention`, the door the model uses: a torch custom
op (tscale::attention, fake and autograd registered, so torch.compile traces through it) that
runs the reference forward and its analytic backward; on CUDA, until the fused kernel of
csrc/attention exists, `attention` takes the compiled FlexAttention path instead when Tq == Tk
(training, prefill), and the reference for cached decoding (Tq < Tk: small score matrices, and
no recompilation of flex for every new key length).
"""

import functools
import logging
import os
import warnings
from typing import Optional

import torch

log = logging.getLogger("tscale.ops")


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """The causal + sliding-window rule on broadcastable absolute positions."""
    ok = k_pos <= q_pos
    if window > 0:
        ok = ok & (q_pos - k_pos < window)
    return ok


def attention_mask(tq: int, tk: int, window: int, doc_ids: torch.Tensor | None, device) -> torch.Tensor:
    """Which keys each query sees: (Tq, Tk), or (B, Tq, Tk) with document ids (B, Tk)."""
    q_pos = torch.arange(tk - tq, tk, device=device)[:, None]  # (Tq, 1)
    k_pos = torch.arange(tk, device=device)[None, :]  # (1, Tk)
    mask = _visible(q_pos, k_pos, window)  # (Tq, Tk)
    if doc_ids is not None:
        mask = mask & (doc_ids[:, tk - tq:, None] == doc_ids[:, None, :])  # (B, Tq, Tk)
    return mask


def _acc(t: torch.Tensor) -> torch.dtype:
    """The reference computes in float32, or float64 for float64 inputs (gradcheck)."""
    return torch.promote_types(t.dtype, torch.float32)


def _probs(q, k, doc_ids, window: int, sink: bool, scale: float) -> torch.Tensor:
    """Attention weights (B, H, Tq, Tk) in float32 or wider; with the sink they sum to less than one."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    mask = attention_mask(Tq, Tk, window, doc_ids, q.device)
    if mask.dim() == 3:
        mask = mask[:, None]  # (B, 1, Tq, Tk)
    acc = _acc(q)
    scores = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sink:
        scores = torch.cat([scores, scores.new_zeros(B, H, Tq, 1)], dim=-1)  # (B, H, Tq, Tk+1)
    return torch.softmax(scores, dim=-1)[..., :Tk]


def attention_reference(q, k, v, *, window: int, doc_ids: torch.Tensor | None, sink: bool,
                        scale: float) -> torch.Tensor:
    """Reference attention: q (B, H, Tq, D), k and v (B, H, Tk, D) -> (B, H, Tq, D), differentiable by autograd."""
    return (_probs(q, k, doc_ids, window, sink, scale) @ v.to(_acc(q))).to(q.dtype)


def _reference_backward(grad, q, k, v, doc_ids, window: int, sink: bool, scale: float):
    """Gradients of attention_reference, written out: dV = P^T dO, dS = P (dP - rowsum(P dP)), dQ, dK from dS."""
    p = _probs(q, k, doc_ids, window, sink, scale)  # (B, H, Tq, Tk)
    acc = p.dtype
    g = grad.to(acc)  # (B, H, Tq, D)
    dv = p.transpose(-1, -2) @ g  # (B, H, Tk, D)
    dp = g @ v.to(acc).transpose(-1, -2)  # (B, H, Tq, Tk); the sink's value is 0, so its dP is 0
    ds = p * (dp - (p * dp).sum(-1, keepdim=True)) * scale  # (B, H, Tq, Tk)
    dq = ds @ k.to(acc)  # (B, H, Tq, D)
    dk = ds.transpose(-1, -2) @ q.to(acc)  # (B, H, Tk, D)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _say_once(message: str) -> None:
    if not torch.compiler.is_compiling():  # said in eager runs; a traced graph has nothing to say
        _log_once(message)


@functools.cache
def _log_once(message: str) -> None:
    log.info("ops: %s", message)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex_call(q, k, v, block_mask, scale: float):
    from torch.nn.attention.flex_attention import flex_attention

    if q.is_cuda:
        return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale)
    with warnings.catch_warnings():  # on CPU flex runs unfused, which is what a comparison needs
        warnings.simplefilter("ignore", UserWarning)
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)


def attention_flex(q, k, v, *, window: int, doc_ids: torch.Tensor | None, sink: bool,
                   scale: float) -> torch.Tensor:
    """FlexAttention with a BlockMask of the same rule; where flex cannot run (CPU backward), the reference."""
    from torch.nn.attention.flex_attention import create_block_mask

    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if not q.is_cuda and needs_grad:
        _say_once("FlexAttention has no backward on CPU; attention_flex runs the reference there")
        return attention_reference(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    offset = Tk - Tq
    if sink:  # a null key (logit q.0 = 0) and null value at index Tk, visible to every query
        k = torch.cat([k, k.new_zeros(B, H, 1, D)], dim=2)  # (B, H, Tk+1, D)
        v = torch.cat([v, v.new_zeros(B, H, 1, v.shape[-1])], dim=2)
    docs = doc_ids
    if docs is not None and sink:
        docs = torch.cat([docs, docs[:, -1:]], dim=1)  # (B, Tk+1): the null slot needs an index too

    def mask_mod(b, h, q_idx, kv_idx):
        p = q_idx + offset
        ok = _visible(p, kv_idx, window)
        if docs is not None:
            ok = ok & (docs[b, kv_idx] == docs[b, p])
        if sink:
            ok = ok | (kv_idx == Tk)
        return ok

    block_mask = create_block_mask(mask_mod, B if docs is not None else None, None, Tq, Tk + int(sink),
                                   device=q.device)
    return _flex_call(q, k, v, block_mask, scale)


@torch.library.custom_op("tscale::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: Optional[torch.Tensor],
                  window: int, sink: bool, scale: float) -> torch.Tensor:
    return attention_reference(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)


@_attention_op.register_fake
def _attention_fake(q, k, v, doc_ids, window, sink, scale):
    return q.new_empty(*q.shape[:-1], v.shape[-1])  # (B, H, Tq, Dv)


@torch.library.custom_op("tscale::attention_backward", mutates_args=())
def _attention_backward_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           doc_ids: Optional[torch.Tensor], window: int, sink: bool,
                           scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _reference_backward(grad, q, k, v, doc_ids, window, sink, scale)


@_attention_backward_op.register_fake
def _attention_backward_fake(grad, q, k, v, doc_ids, window, sink, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, doc_ids, window, sink, scale = inputs
    ctx.save_for_backward(q, k, v, doc_ids)
    ctx.window, ctx.sink, ctx.scale = window, sink, scale


def _backward(ctx, grad):
    q, k, v, doc_ids = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(grad.contiguous(), q, k, v, doc_ids, ctx.window, ctx.sink, ctx.scale)
    return dq, dk, dv, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, *, window: int, doc_ids: torch.Tensor | None, sink: bool, scale: float) -> torch.Tensor:
    """Masked attention q (B, H, Tq, D), k and v (B, H, Tk, D), doc_ids (B, Tk) or None -> (B, H, Tq, D)."""
    if q.is_cuda and q.shape[2] == k.shape[2] and os.environ.get("TSCALE_OPS") != "reference":
        _say_once("attention: FlexAttention (compiled) on CUDA; the reference for cached decoding")
        return attention_flex(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)
    _say_once("attention: torch reference (custom op tscale::attention)")
    return _attention_op(q, k, v, doc_ids, window, sink, scale)


__all__ = ["attention", "attention_flex", "attention_mask", "attention_reference"]
