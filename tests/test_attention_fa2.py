"""tscale.ops.attention_fa2 (FlashAttention-2 under the tscale mask) against attention_reference, with a reference FlashAttention.

The aten FlashAttention ops run on CUDA only; here a float64 stand-in with their varlen contract
(tokens x heads layout, (H, tokens) log-sum-exp, a backward that reads the output only through
rowsum(dO * O)) replaces them, so the layouts, window offset, document runs, padding runs and
the sink's forward scaling and backward substitution are checked on the CPU; the GPU test runs
the real ops.
"""

import pytest
import torch

from helpers_attention_runs import compare_over_runs, tiny_tscale_args, train_each
from tscale.ops import attention_fa2, attention_runs, doc_runs


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
def test_matches_the_reference_with_a_stand_in_flash_attention(monkeypatch, window, docs, sink):
    monkeypatch.setattr(attention_fa2, "flash_forward", _fake_forward)
    monkeypatch.setattr(attention_fa2, "flash_backward", _fake_backward)
    compare_over_runs(window, docs, sink)  # the reference computes in float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("window,docs,sink", [(0, False, False), (5, True, True), (0, True, False)])
def test_cuda_flash_attention_matches_the_reference(window, docs, sink):
    reason = attention_fa2.fa2_unusable_reason(torch.device("cuda"), torch.bfloat16, 8)
    if reason:
        pytest.skip(reason)
    compare_over_runs(window, docs, sink, device="cuda", dtype=torch.bfloat16, tol=3e-2)


def test_runs_open_at_row_starts_and_documents_and_pad_with_empty_runs():
    opens = torch.tensor([[False, False, True, False, False], [False, False, False, False, False]])
    runs = doc_runs.doc_runs(opens, 2, 5, bucket=4)
    assert runs.cu.tolist() == [0, 2, 5, 10, 10] and runs.cu.dtype == torch.int32
    assert runs.max_len == 5  # T, whatever the runs: a static bound for torch.compile
    runs = doc_runs.doc_runs(None, 3, 4, bucket=64)
    assert runs.cu.tolist()[:3] == [0, 4, 8] and len(runs.cu) == 65 and set(runs.cu.tolist()[3:]) == {12}
    assert runs.max_len == 4


def test_run_bucket_defaults_small_and_takes_the_environment(monkeypatch):
    monkeypatch.delenv("TSCALE_RUN_BUCKET", raising=False)
    assert len(doc_runs.doc_runs(None, 3, 4).cu) == doc_runs.RUN_BUCKET + 1  # 3 runs -> one bucket of slots
    monkeypatch.setenv("TSCALE_RUN_BUCKET", "2")
    assert doc_runs.doc_runs(None, 3, 4).cu.tolist() == [0, 4, 8, 12, 12]  # 3 runs -> 4 slots
    monkeypatch.setenv("TSCALE_RUN_BUCKET", "0")
    with pytest.raises(ValueError, match="TSCALE_RUN_BUCKET='0'"):
        doc_runs.doc_runs(None, 3, 4)


def test_run_slots_rise_to_a_high_water_mark_with_headroom():
    slots = doc_runs.RunSlots(bucket=8, headroom=0.25)
    assert slots(32) == 40  # 32 * 1.25 = 40, a multiple of 8
    assert [slots(n) for n in (33, 40, 12)] == [40, 40, 40]  # within the mark: the same shape
    assert slots(41) == 56  # 41 * 1.25 = 51.25 -> 52 -> 56
    opens = torch.zeros(2, 8, dtype=torch.bool)
    opens[0, 3] = True  # 3 runs
    runs = doc_runs.doc_runs(opens, 2, 8, slots=doc_runs.RunSlots(bucket=2, headroom=0.5))
    assert runs.cu.tolist() == [0, 3, 8, 16, 16, 16, 16]  # 3 * 1.5 = 4.5 -> 5 -> 6 slots
    started = doc_runs.RunSlots(bucket=8, initial=58)
    assert [started(n) for n in (32, 64, 65)] == [64, 64, 88]  # 58 -> 64 holds until a batch exceeds it


def test_expected_slots_cover_the_rows_and_the_documents_a_batch_holds():
    assert doc_runs.expected_slots(32, 1024, 0, 10_000) == 36  # no documents: the row starts + 4
    # 32 x 1024 tokens with a document every 5,600: lam = 5.85 -> 32 + ceil(11.7 + 9.67) + 4 = 58
    assert doc_runs.expected_slots(32, 1024, 1000, 5_600_000) == 58
    assert doc_runs.expected_slots(8, 4096, 1000, 5_600_000) == 34


def test_runs_of_doc_ids_open_where_the_id_changes():
    doc_ids = torch.tensor([[3, 3, 4, 4, 4], [7, 7, 7, 7, 7]])
    assert doc_runs.runs_of_doc_ids(doc_ids, 2, 5).cu.tolist()[:4] == [0, 2, 5, 10]
    assert doc_runs.runs_of_doc_ids(None, 2, 5).cu.tolist()[:3] == [0, 5, 10]


def test_unusable_reasons_name_what_is_missing():
    assert "CUDA" in attention_fa2.fa2_unusable_reason(torch.device("cpu"), torch.bfloat16, 128)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_training_through_fa2_follows_the_kernel(tmp_path, shakespeare_jsonl, mode):
    args = [*tiny_tscale_args(tmp_path, shakespeare_jsonl), "train.compile=true", f'train.compile_mode="{mode}"']
    curves, _ = train_each(args, tmp_path, ("auto", "fa2", "fa2_global"))
    torch.testing.assert_close(curves["fa2"], curves["auto"], rtol=2e-2, atol=0)  # bf16, two kernels
    torch.testing.assert_close(curves["fa2_global"], curves["auto"], rtol=2e-2, atol=0)


def test_training_through_fa2_follows_the_default_attention(monkeypatch, tmp_path, shakespeare_jsonl):
    """train.attention = "fa2" and "fa2_global" (stand-in FlashAttention on the CPU): the tscale model's losses,
    documents, window and sink included, are the default path's; "fa2" runs every layer through FlashAttention,
    "fa2_global" only the global one; and the choice is refused where it cannot run. The most frequent token plays
    the model's eos, so that every window holds many documents."""
    from tscale.config import load_config
    from tscale.errors import UserError
    from tscale.train.loop import train_run

    args = tiny_tscale_args(tmp_path, shakespeare_jsonl)
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        train_run(load_config(None, [*args, 'train.attention="fa2"', 'train.device="cpu"']), tmp_path / "refused",
                  quiet=True)
    lefts = []  # window_size_left of every FlashAttention forward: -1 for a global layer, window - 1 otherwise

    def counted_forward(*a, **kw):
        lefts.append(kw["window_size_left"])
        return _fake_forward(*a, **kw)

    monkeypatch.setattr(attention_fa2, "flash_forward", counted_forward)
    monkeypatch.setattr(attention_fa2, "flash_backward", _fake_backward)
    monkeypatch.setitem(attention_runs.UNUSABLE, "fa2", lambda *a: None)
    curves, served = train_each([*args, 'train.device="cpu"'], tmp_path, ("auto", "fa2", "fa2_global"), lefts)
    assert len(curves["fa2"]) == 4
    assert served == {"auto": set(), "fa2": {-1, 7}, "fa2_global": {-1}}  # model.window = 8, one global layer
    torch.testing.assert_close(curves["fa2"], curves["auto"], rtol=1e-4, atol=0)
    torch.testing.assert_close(curves["fa2_global"], curves["auto"], rtol=1e-4, atol=0)
