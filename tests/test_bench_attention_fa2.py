"""The FlashAttention-2 column of the attention benchmark: its mask mapping and exact sink, with a reference FlashAttention.

The aten FlashAttention ops run on CUDA only; here a float64 stand-in with their varlen contract
(tokens x heads layout, (H, tokens) log-sum-exp, a backward that reads the output only through
rowsum(dO * O)) replaces them, so the wrapper's layouts, window offset, document runs and the
sink's forward scaling and backward substitution are checked against attention_reference.
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
import attention_fa2  # noqa: E402

from tscale.ops.attention import attention_reference  # noqa: E402


def _visible(cu, max_len, left, T_total):
    """(tokens, tokens) bool: same sequence, causal, and within `left` keys before the query (-1: no limit)."""
    seq = torch.zeros(T_total, dtype=torch.long)
    for i in range(len(cu) - 1):
        seq[cu[i]:cu[i + 1]] = i
    pos = torch.arange(T_total)
    ok = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])
    if left >= 0:
        ok &= pos[:, None] - pos[None, :] <= left
    return ok


def _fake_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal, debug, *, scale, window_size_left,
                  window_size_right):
    assert causal and window_size_right == 0 and dropout == 0.0
    ok = _visible(cu_q.tolist(), max_q, window_size_left, q.shape[0])  # (tokens, tokens)
    s = torch.einsum("ihd,jhd->hij", q.double(), k.double()) * scale  # (H, tokens, tokens)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, -1)  # (H, tokens)
    out = torch.einsum("hij,jhd->ihd", torch.exp(s - lse[..., None]), v.double())  # (tokens, H, D)
    empty = torch.empty(0)
    return out.to(q.dtype), lse.float(), empty, empty, empty


def _fake_backward(g, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dropout, causal, rng, unused, *, scale,
                   window_size_left, window_size_right):
    ok = _visible(cu_q.tolist(), max_q, window_size_left, q.shape[0])
    s = torch.einsum("ihd,jhd->hij", q.double(), k.double()) * scale
    p = torch.exp(s.masked_fill(~ok, float("-inf")) - lse.double()[..., None])  # (H, tokens, tokens)
    dp = torch.einsum("ihd,jhd->hij", g.double(), v.double())
    delta = (g.double() * out.double()).sum(-1).t()  # (H, tokens): what FlashAttention reads of `out`
    ds = p * (dp - delta[..., None])
    dq = torch.einsum("hij,jhd->ihd", ds, k.double()) * scale
    dk = torch.einsum("hij,ihd->jhd", ds, q.double()) * scale
    dv = torch.einsum("hij,ihd->jhd", p, g.double())
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


@pytest.mark.parametrize("window,docs,sink", [(0, False, False), (5, True, True), (0, True, True), (3, False, True)])
def test_flash_column_matches_the_reference(monkeypatch, window, docs, sink):
    monkeypatch.setattr(attention_fa2, "flash_forward", _fake_forward)
    monkeypatch.setattr(attention_fa2, "flash_backward", _fake_backward)
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 12, 8
    q, k, v, do = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(4))
    doc_ids = (torch.rand(B, T, generator=g) < 0.25).long().cumsum(1) if docs else None
    cu, max_len = attention_fa2.cu_seqlens(doc_ids, B, T)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention_fa2.flash_masked(*leaves, cu, max_len, window, sink, D ** -0.5)
    got = (out, *torch.autograd.grad(out, leaves, do))
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = attention_reference(*ref_leaves, window=window, doc_ids=doc_ids, sink=sink, scale=D ** -0.5)
    want = (ref, *torch.autograd.grad(ref, ref_leaves, do))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-5, atol=1e-5)  # the reference computes in float32


def test_document_runs_of_each_row_become_sequences():
    doc_ids = torch.tensor([[1, 1, 2, 2, 2], [0, 0, 0, 0, 0]])
    cu, longest = attention_fa2.cu_seqlens(doc_ids, 2, 5)
    assert cu.tolist() == [0, 2, 5, 10] and cu.dtype == torch.int32 and longest == 5
    cu, longest = attention_fa2.cu_seqlens(None, 3, 4)
    assert cu.tolist() == [0, 4, 8, 12] and longest == 4
