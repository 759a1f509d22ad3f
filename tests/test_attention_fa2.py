"""tscale.ops.attention_fa2 (FlashAttention-2 under the tscale mask) against attention_reference, with a reference FlashAttention.

The aten FlashAttention ops run on CUDA only; here a float64 stand-in with their varlen contract
(tokens x heads layout, (H, tokens) log-sum-exp, a backward that reads the output only through
rowsum(dO * O)) replaces them, so the layouts, window offset, document runs, padding runs and
the sink's forward scaling and backward substitution are checked on the CPU; the GPU test runs
the real ops.
"""

import pytest
import torch

from tscale.ops import attention_fa2
from tscale.ops.attention import attention_reference


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


def _compare(window, docs, sink, device="cpu", dtype=torch.float64, tol=1e-5, over_runs=None, backend="fa2",
             B=2, H=3, T=12, D=8, doc_rate=0.25, seed=0):
    """over_runs (attention_fa2 by default, its runs built for `backend`) against attention_reference on random
    q, k, v (B, T, H, D) and documents opening at `doc_rate` per token: output and gradients."""
    over_runs = over_runs or attention_fa2.attention_fa2
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(4))
    opens = torch.rand(B, T, generator=g) < doc_rate if docs else None
    runs = attention_fa2.doc_runs(opens, B, T, bucket=4, backend=backend).to(device)
    leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    out = over_runs(*leaves, runs, window=window, sink=sink, scale=D ** -0.5)  # (B, T, H, D)
    got = (out, *torch.autograd.grad(out, leaves, do.to(device, dtype)))
    ref_leaves = [t.transpose(1, 2).clone().requires_grad_() for t in (q, k, v)]  # (B, H, T, D)
    doc_ids = opens.long().cumsum(1) if docs else None
    ref = attention_reference(*ref_leaves, window=window, doc_ids=doc_ids, sink=sink, scale=D ** -0.5)
    want = (ref, *torch.autograd.grad(ref, ref_leaves, do.transpose(1, 2)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a.cpu().double(), b.transpose(1, 2).double(), rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("window,docs,sink", [(0, False, False), (5, True, True), (0, True, True), (3, False, True)])
def test_matches_the_reference_with_a_stand_in_flash_attention(monkeypatch, window, docs, sink):
    monkeypatch.setattr(attention_fa2, "flash_forward", _fake_forward)
    monkeypatch.setattr(attention_fa2, "flash_backward", _fake_backward)
    _compare(window, docs, sink)  # the reference computes in float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("window,docs,sink", [(0, False, False), (5, True, True), (0, True, False)])
def test_cuda_flash_attention_matches_the_reference(window, docs, sink):
    reason = attention_fa2.fa2_unusable_reason(torch.device("cuda"), torch.bfloat16, 8)
    if reason:
        pytest.skip(reason)
    _compare(window, docs, sink, device="cuda", dtype=torch.bfloat16, tol=3e-2)


def test_runs_open_at_row_starts_and_documents_and_pad_with_empty_runs():
    opens = torch.tensor([[False, False, True, False, False], [False, False, False, False, False]])
    runs = attention_fa2.doc_runs(opens, 2, 5, bucket=4)
    assert runs.cu.tolist() == [0, 2, 5, 10, 10] and runs.cu.dtype == torch.int32
    assert runs.max_len == 5  # T, whatever the runs: a static bound for torch.compile
    runs = attention_fa2.doc_runs(None, 3, 4, bucket=64)
    assert runs.cu.tolist()[:3] == [0, 4, 8] and len(runs.cu) == 65 and set(runs.cu.tolist()[3:]) == {12}
    assert runs.max_len == 4


def test_runs_of_doc_ids_open_where_the_id_changes():
    doc_ids = torch.tensor([[3, 3, 4, 4, 4], [7, 7, 7, 7, 7]])
    assert attention_fa2.runs_of_doc_ids(doc_ids, 2, 5).cu.tolist()[:4] == [0, 2, 5, 10]
    assert attention_fa2.runs_of_doc_ids(None, 2, 5).cu.tolist()[:3] == [0, 5, 10]


def test_unusable_reasons_name_what_is_missing():
    assert "CUDA" in attention_fa2.fa2_unusable_reason(torch.device("cpu"), torch.bfloat16, 128)


def _tiny_tscale_args(tmp_path, shakespeare_jsonl) -> list[str]:
    """A 2-layer tscale model on Shakespeare whose eos is the most frequent token (many documents per window)."""
    import numpy as np

    from tscale.data.shards import TokenFolder
    from tscale.data.tokenize import tokenize_corpus

    tokens = tmp_path / "tokens"
    tokenize_corpus([shakespeare_jsonl], tokens, vocab_size=512, quiet=True)
    train_ids = TokenFolder(tokens).shards("train")[0].tokens
    frequent = int(np.bincount(train_ids[:200_000]).argmax())
    return ['model.arch="tscale"', "model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.head_dim=16",
            "model.seq_len=64", "model.window=8", "model.global_every=2", f"model.eos_id={frequent}",
            "train.batch_size=4", "model.zero_init=false", "optim.warmup_steps=0", "optim.lr=3e-3",
            "train.eval_every=0", "train.ckpt_every=0", "train.log_every=1", "train.steps=4", f'data.tokens="{tokens}"']


def _losses(run) -> list[float]:
    import json

    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def _train_each(args: list[str], tmp_path, impls, seen: list | None = None) -> tuple[dict, dict]:
    """Train the tiny model once per train.attention choice: (losses by choice, set(seen) after each run by choice),
    `seen` being a list the test's stand-in appends to (emptied before each run)."""
    from tscale.config import load_config
    from tscale.train.loop import train_run

    seen = [] if seen is None else seen
    curves, served = {}, {}
    for impl in impls:
        seen.clear()
        train_run(load_config(None, [*args, f'train.attention="{impl}"']), tmp_path / impl, quiet=True)
        curves[impl], served[impl] = _losses(tmp_path / impl), set(seen)
    return curves, served


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_training_through_fa2_follows_the_kernel(tmp_path, shakespeare_jsonl, mode):
    args = [*_tiny_tscale_args(tmp_path, shakespeare_jsonl), "train.compile=true", f'train.compile_mode="{mode}"']
    curves, _ = _train_each(args, tmp_path, ("auto", "fa2", "fa2_global"))
    torch.testing.assert_close(curves["fa2"], curves["auto"], rtol=2e-2, atol=0)  # bf16, two kernels
    torch.testing.assert_close(curves["fa2_global"], curves["auto"], rtol=2e-2, atol=0)


def test_training_through_fa2_follows_the_default_attention(monkeypatch, tmp_path, shakespeare_jsonl):
    """train.attention = "fa2" and "fa2_global" (stand-in FlashAttention on the CPU): the tscale model's losses,
    documents, window and sink included, are the default path's; "fa2" runs every layer through FlashAttention,
    "fa2_global" only the global one; and the choice is refused where it cannot run. The most frequent token plays
    the model's eos, so that every window holds many documents."""
    from tscale.config import load_config
    from tscale.errors import UserError
    from tscale.train import loop
    from tscale.train.loop import train_run

    args = _tiny_tscale_args(tmp_path, shakespeare_jsonl)
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        train_run(load_config(None, [*args, 'train.attention="fa2"', 'train.device="cpu"']), tmp_path / "refused",
                  quiet=True)
    lefts = []  # window_size_left of every FlashAttention forward: -1 for a global layer, window - 1 otherwise

    def counted_forward(*a, **kw):
        lefts.append(kw["window_size_left"])
        return _fake_forward(*a, **kw)

    monkeypatch.setattr(attention_fa2, "flash_forward", counted_forward)
    monkeypatch.setattr(attention_fa2, "flash_backward", _fake_backward)
    monkeypatch.setattr(loop, "fa2_unusable_reason", lambda *a: None)
    curves, served = _train_each([*args, 'train.device="cpu"'], tmp_path, ("auto", "fa2", "fa2_global"), lefts)
    assert len(curves["fa2"]) == 4
    assert served == {"auto": set(), "fa2": {-1, 7}, "fa2_global": {-1}}  # model.window = 8, one global layer
    torch.testing.assert_close(curves["fa2"], curves["auto"], rtol=1e-4, atol=0)
    torch.testing.assert_close(curves["fa2_global"], curves["auto"], rtol=1e-4, atol=0)
