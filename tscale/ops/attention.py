"""The attention op: causal, sliding window, document boundaries and attention sink, as one masked softmax.

Layout (B, H, T, D). Queries are the last Tq of the Tk key positions (Tq == Tk in training,
Tq < Tk when decoding with a KV cache): query i sits at absolute position p = Tk - Tq + i and
sees key j iff j <= p, p - j < window (window 0: no limit) and doc_ids[b, j] == doc_ids[b, p]
(doc_ids None: no document mask). With `sink` a null slot of logit 0 and value 0 joins every
softmax ("softmax plus one"): weights exp(s_j) / (1 + sum_k exp(s_k)).

Four implementations with one meaning:
  `attention_reference`  explicit mask, matmul, softmax; float32 math; the definition.
  `attention_flex`       torch FlexAttention with a BlockMask of the same rule (the sink is an
                         appended null key/value slot); compiled on CUDA.
  `attention_kernel`     the fused CUDA kernels of csrc/attention (forward and backward, bf16 in
                         and out, fp32 accumulation, tiles the mask hides are skipped): the
                         extension's ops tscale::attention_fwd_cuda / _bwd_cuda under an
                         autograd.Function.
  `attention_sdpa`       torch's scaled_dot_product_attention with is_causal, for plain causal calls
                         only (no window, documents or sink): the baseline a benchmark sets the
                         model's masked attention against, never chosen automatically.
`attention`, the door the model uses, picks a path per call (`attention_path` says which):
  kernel     CUDA, Tq == Tk, bfloat16 q/k/v, head dim 64 or 128, tscale._C built with CUDA, sm_80+,
             at most KERNEL_MAX_SEQ_LEN tokens a sequence and KERNEL_MAX_BATCH sequences and heads;
  flex       any other CUDA call with Tq == Tk (training, prefill);
  reference  the rest: cached decoding (Tq < Tk: small score matrices, and no recompilation of
             flex for every new key length) and CPU, through the custom op tscale::attention
             (reference forward, analytic backward); a call with nothing to differentiate runs
             the reference's plain ops, without the custom op's wrappers.
Every path is a torch custom op or traceable, with fake implementations, so torch.compile
traces through `attention`.

Forcing a path (benchmarks, comparisons): TSCALE_ATTENTION=kernel|flex|reference|sdpa in the
environment, or attention(..., impl=...), which wins over it. A forced kernel or sdpa raises
ValueError for a call it cannot serve (e.g. float32 inputs or cached decoding for the kernel, any
mask beyond causal for sdpa) instead of quietly taking another path. TSCALE_OPS=reference (all
of tscale.ops) makes the automatic choice the reference.

The kernel takes doc_ids as int32 (converted here; ids must fit in int32, as document counts do)
and accumulates dQ with atomics, so its dq is not bit-reproducible from run to run.
"""

import functools
import logging
import os
import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from tscale.ops.backend import kernels_usable_on, op_defined

log = logging.getLogger("tscale.ops")

IMPLS = ("kernel", "flex", "reference", "sdpa")
# The kernels launch an (H, tiles, B) grid of tiles of at least 64 rows, whose y and z stop at 65535; the op takes
# at most 65535 heads as well (csrc/attention/attention_host.h).
KERNEL_MAX_SEQ_LEN = 65535 * 64
KERNEL_MAX_BATCH = 65535


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


def _flex_function(cuda: bool):
    """flex_attention as a call on these tensors should take it: compiled once for eager CUDA calls; as it is
    inside a graph being compiled (which compiles it there, and would warn at tracing the cached wrapper)
    and on CPU."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex() if cuda and not torch.compiler.is_compiling() else flex_attention


def _flex_call(q, k, v, block_mask, scale: float):
    if q.is_cuda:
        return _flex_function(True)(q, k, v, block_mask=block_mask, scale=scale)
    with warnings.catch_warnings():  # on CPU flex runs unfused, which is what a comparison needs
        warnings.simplefilter("ignore", UserWarning)
        return _flex_function(False)(q, k, v, block_mask=block_mask, scale=scale)


def flex_inputs(q, k, v, *, window: int, doc_ids: torch.Tensor | None, sink: bool):
    """(k, v, block_mask) as attention_flex hands them to flex_attention: the sink as a null key/value appended
    at index Tk, visible to every query, and the mask rule as a BlockMask."""
    from torch.nn.attention.flex_attention import create_block_mask

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
    return k, v, block_mask


def _needs_grad(q, k, v) -> bool:
    """Whether this call's result will be differentiated (autograd on and an input that requires grad)."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def attention_flex(q, k, v, *, window: int, doc_ids: torch.Tensor | None, sink: bool,
                   scale: float) -> torch.Tensor:
    """FlexAttention with a BlockMask of the same rule; where flex cannot run (CPU backward), the reference."""
    if not q.is_cuda and _needs_grad(q, k, v):
        _say_once("FlexAttention has no backward on CPU; attention_flex runs the reference there")
        return attention_reference(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)
    k, v, block_mask = flex_inputs(q, k, v, window=window, doc_ids=doc_ids, sink=sink)
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
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)  # contiguous, as the matmuls make them


def _setup_context(ctx, inputs, output):
    q, k, v, doc_ids, window, sink, scale = inputs
    ctx.save_for_backward(q, k, v, doc_ids)
    ctx.window, ctx.sink, ctx.scale = window, sink, scale


def _backward(ctx, grad):
    q, k, v, doc_ids = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(grad.contiguous(), q, k, v, doc_ids, ctx.window, ctx.sink, ctx.scale)
    return dq, dk, dv, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def _token_major(q: torch.Tensor) -> torch.Tensor:
    """A (B, H, T, D) tensor in (B, T, H, D) storage, as the kernels make out, dq, dk and dv."""
    B, H, T, D = q.shape
    return q.new_empty(B, T, H, D).transpose(1, 2)


# The fused kernel's ops are the extension's own (csrc/attention/attention.cpp), called through an
# autograd.Function: torch.library.custom_op's wrappers and its autograd registration cost the host
# more per call than the kernels take at small shapes (scripts/bench/attention_host_cost.py).
if kernels_usable_on("cpu") and op_defined("attention_fwd_cuda"):
    @torch.library.register_fake("tscale::attention_fwd_cuda")
    def _kernel_fwd_fake(q, k, v, doc_ids, window, sink, scale):
        B, H, T, _ = q.shape
        return _token_major(q), q.new_empty(B, H, T, dtype=torch.float32)  # out, lse (contiguous)

    @torch.library.register_fake("tscale::attention_bwd_cuda")
    def _kernel_bwd_fake(dout, q, k, v, out, lse, doc_ids, window, sink, scale):
        return _token_major(q), _token_major(q), _token_major(q)


class _KernelAttention(torch.autograd.Function):
    """out (B, H, T, D) of the fused kernel; its backward kernels from the saved out and log-sum-exp.

    out, dq, dk and dv come in (B, T, H, D) storage, the layout of the model's projections, so the model's
    transpose back to (B, T, H, D) is a view and its output projection reads out without a copy."""

    @staticmethod
    def forward(ctx, q, k, v, doc_ids, window: int, sink: bool, scale: float):
        out, lse = torch.ops.tscale.attention_fwd_cuda(q, k, v, doc_ids, window, sink, scale)
        ctx.save_for_backward(q, k, v, out, lse, doc_ids)
        ctx.window, ctx.sink, ctx.scale = window, sink, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, doc_ids = ctx.saved_tensors
        dq, dk, dv = torch.ops.tscale.attention_bwd_cuda(grad, q, k, v, out, lse, doc_ids, ctx.window, ctx.sink,
                                                         ctx.scale)
        return dq, dk, dv, None, None, None, None


def attention_kernel(q, k, v, *, window: int, doc_ids: torch.Tensor | None, sink: bool,
                     scale: float) -> torch.Tensor:
    """The fused kernel: q, k, v bf16 (B, H, T, D) of one shape, D 64 or 128 -> (B, H, T, D) bf16, differentiable."""
    if doc_ids is not None and doc_ids.dtype != torch.int32:
        doc_ids = doc_ids.to(torch.int32)
    return _KernelAttention.apply(q, k, v, doc_ids, window, sink, scale)


@torch.compiler.assume_constant_result  # evaluated once when traced, not traced into
def _cuda_kernel_problem(index: int) -> str:
    """Why the fused kernel cannot run on CUDA device `index` ("" when it can): build and architecture."""
    if not kernels_usable_on("cuda"):
        return "tscale._C is not built with CUDA kernels (or TSCALE_OPS=reference)"
    if torch.cuda.get_device_capability(index) < (8, 0):
        return "the GPU is older than sm_80"
    return ""


def _fits_kernel_grid(shape) -> bool:
    """(B, H, T, D) within KERNEL_MAX_BATCH sequences and heads and KERNEL_MAX_SEQ_LEN tokens a sequence."""
    return shape[0] <= KERNEL_MAX_BATCH and shape[1] <= KERNEL_MAX_BATCH and shape[2] <= KERNEL_MAX_SEQ_LEN


def kernel_unusable_reason(q, k, v) -> str | None:
    """Why the fused kernel cannot serve attention on these tensors, or None when it can."""
    if not _fits_kernel_grid(q.shape):
        return (f"shape {tuple(q.shape)} is past the kernel's grid (at most {KERNEL_MAX_BATCH} sequences, "
                f"{KERNEL_MAX_BATCH} heads and {KERNEL_MAX_SEQ_LEN} tokens a sequence)")
    if not q.is_cuda:
        return f"the inputs are on {q.device.type}, not CUDA"
    if q.shape[2] != k.shape[2]:
        return f"Tq {q.shape[2]} != Tk {k.shape[2]} (cached decoding)"
    if not (q.shape == k.shape == v.shape):
        return f"q, k, v differ in shape: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    if not (q.dtype == k.dtype == v.dtype == torch.bfloat16):
        return f"the inputs are {q.dtype}/{k.dtype}/{v.dtype}, not bfloat16"
    if q.shape[-1] not in (64, 128):
        return f"head dim {q.shape[-1]} is not 64 or 128"
    return _cuda_kernel_problem(q.device.index) or None


def _kernel_serves(q, k, v) -> bool:
    """kernel_unusable_reason(q, k, v) is None, without building messages (cheap to trace)."""
    return (q.is_cuda and q.shape == k.shape == v.shape and q.dtype == k.dtype == v.dtype == torch.bfloat16
            and q.shape[-1] in (64, 128) and _fits_kernel_grid(q.shape) and not _cuda_kernel_problem(q.device.index))


def attention_path(q, k, v, impl: str | None = None) -> str:
    """The path `attention` takes for these tensors: "kernel", "flex" or "reference" (see the module docstring)."""
    choice = impl or os.environ.get("TSCALE_ATTENTION") or "auto"
    if choice not in ("auto", *IMPLS):
        raise ValueError(f"attention: unknown path {choice!r} (TSCALE_ATTENTION or impl); expected one of {IMPLS}")
    if choice == "kernel":
        reason = kernel_unusable_reason(q, k, v)
        if reason is not None:
            raise ValueError(f"attention: the fused kernel was asked for (TSCALE_ATTENTION or impl) but cannot serve "
                             f"this call: {reason}")
        return "kernel"
    if choice != "auto":
        return choice
    if os.environ.get("TSCALE_OPS") == "reference":
        return "reference"
    if _kernel_serves(q, k, v):
        return "kernel"
    if q.is_cuda and q.shape[2] == k.shape[2]:
        return "flex"
    return "reference"


def sdpa_unusable_reason(q, k, window: int, doc_ids: torch.Tensor | None, sink: bool) -> str | None:
    """Why causal SDPA cannot compute this call exactly, or None when it can."""
    if q.shape[2] != k.shape[2]:
        return f"Tq {q.shape[2]} != Tk {k.shape[2]} (cached decoding)"
    if 0 < window < k.shape[2]:
        return f"window {window} hides keys of a {k.shape[2]}-token sequence"
    if doc_ids is not None:
        return "document ids are given"
    if sink:
        return "the sink is on"
    return None


def attention_sdpa(q, k, v, *, window: int, doc_ids: torch.Tensor | None, sink: bool,
                   scale: float) -> torch.Tensor:
    """F.scaled_dot_product_attention(is_causal=True): q, k, v (B, H, T, D) -> (B, H, T, D), plain causal calls only."""
    if reason := sdpa_unusable_reason(q, k, window, doc_ids, sink):
        raise ValueError(f"attention: the SDPA path serves plain causal attention only, not this call: {reason} "
                         "(set model.window = 0, model.doc_mask = false and model.sink = false)")
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def attention(q, k, v, *, window: int, doc_ids: torch.Tensor | None, sink: bool, scale: float,
              impl: str | None = None) -> torch.Tensor:
    """Masked attention q (B, H, Tq, D), k and v (B, H, Tk, D), doc_ids (B, Tk) or None -> (B, H, Tq, D)."""
    path = attention_path(q, k, v, impl)
    if path == "sdpa":
        _say_once("attention: torch SDPA, plain causal (forced)")
        return attention_sdpa(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)
    if path == "kernel":
        _say_once("attention: fused CUDA kernel (tscale::attention_fwd_cuda); other paths where it cannot serve")
        return attention_kernel(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)
    if path == "flex":
        _say_once("attention: FlexAttention (compiled on CUDA)")
        return attention_flex(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)
    _say_once("attention: torch reference (the custom op tscale::attention where gradients are needed)")
    if not _needs_grad(q, k, v):
        # nothing to differentiate (decoding, evaluation): the plain ops, without the custom op's wrappers
        return attention_reference(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)
    return _attention_op(q, k, v, doc_ids, window, sink, scale)


__all__ = ["IMPLS", "attention", "attention_flex", "attention_kernel", "attention_mask", "attention_path",
           "attention_reference", "attention_sdpa", "flex_inputs", "kernel_unusable_reason", "sdpa_unusable_reason"]
