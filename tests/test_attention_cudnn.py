"""tscale.ops.attention_cudnn (cuDNN's attention under the tscale mask) against attention_reference, with a reference cuDNN.

cuDNN's ragged attention runs on Hopper GPUs only; here a float64 stand-in with the contract of
the module's two doors (packed (tokens, H, D) tensors, run offsets, per-sequence (n, H, T, 1)
log-sum-exp stats, a backward that reads the output only through rowsum(dO * O)) replaces them,
so the layouts, the window's bound, document runs, empty padding runs and the sink's forward
scaling and backward substitution are checked on the CPU; the GPU tests run cuDNN itself.
"""

import pytest
import torch

from helpers_attention_runs import compare_over_runs, tiny_step_benchmark_inputs, tiny_tscale_args, train_each
from tscale.ops import attention_cudnn, attention_runs


def _runs_of_tokens(cu: list[int], tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens,) run index and position in the run of every packed token."""
    seq, pos = torch.zeros(tokens, dtype=torch.long), torch.zeros(tokens, dtype=torch.long)
    for i in range(len(cu) - 1):
        seq[cu[i]:cu[i + 1]] = i
        pos[cu[i]:cu[i + 1]] = torch.arange(cu[i + 1] - cu[i])
    return seq, pos


def _scores(q, k, cu, window, scale):
    """(H, tokens, tokens) float64 scores, -inf outside the same run, the causal bound and the window."""
    seq, pos = _runs_of_tokens(cu.tolist(), q.shape[0])
    ok = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])
    if window:
        ok &= pos[:, None] - pos[None, :] < window
    s = torch.einsum("ihd,jhd->hij", q.double(), k.double()) * scale
    return s.masked_fill(~ok, float("-inf")), seq, pos


def _fake_forward(q, k, v, cu, max_len, window, scale):
    s, seq, pos = _scores(q, k, cu, window, scale)
    lse = torch.logsumexp(s, -1)  # (H, tokens)
    out = torch.einsum("hij,jhd->ihd", torch.exp(s - lse[..., None]), v.double())  # (tokens, H, D)
    stats = torch.full((cu.numel() - 1, q.shape[1], max_len, 1), float("nan"), dtype=torch.float32)
    stats[seq, :, pos, 0] = lse.t().float()  # per run, padded to max_len: the rest is never read
    return out.to(q.dtype), stats


def _fake_backward(g, q, k, v, o, stats, cu, max_len, window, scale):
    s, seq, pos = _scores(q, k, cu, window, scale)
    lse = stats[seq, :, pos, 0].t().double()  # (H, tokens)
    p = torch.exp(s - lse[..., None])
    dp = torch.einsum("ihd,jhd->hij", g.double(), v.double())
    delta = (g.double() * o.double()).sum(-1).t()  # (H, tokens): all the backward reads of the output
    ds = p * (dp - delta[..., None])
    dq = torch.einsum("hij,jhd->ihd", ds, k.double()) * scale
    dk = torch.einsum("hij,ihd->jhd", ds, q.double()) * scale
    dv = torch.einsum("hij,ihd->jhd", p, g.double())
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


def _compare(window, docs, sink, **kw):
    """attention_cudnn against the reference (helpers_attention_runs' comparison), documents at 4 per row."""
    T = kw.get("T", 12)
    compare_over_runs(window, docs, sink, over_runs=attention_cudnn.attention_cudnn, backend="cudnn", doc_rate=4 / T, **kw)


@pytest.mark.parametrize("window,docs,sink", [(0, False, False), (5, True, True), (0, True, True), (3, False, True)])
def test_matches_the_reference_with_a_stand_in_cudnn(monkeypatch, window, docs, sink):
    monkeypatch.setattr(attention_cudnn, "cudnn_forward", _fake_forward)
    monkeypatch.setattr(attention_cudnn, "cudnn_backward", _fake_backward)
    _compare(window, docs, sink)


def test_tokens_lse_reads_each_token_from_its_run_and_position():
    cu = torch.tensor([0, 3, 5, 9, 9, 9], dtype=torch.int32)  # two empty padding runs
    stats = torch.randn(5, 2, 4, 1)
    got = attention_cudnn.tokens_lse(stats, cu, 9)  # (tokens, H)
    want = torch.stack([stats[0, :, 0, 0], stats[0, :, 1, 0], stats[0, :, 2, 0], stats[1, :, 0, 0],
                        stats[1, :, 1, 0], stats[2, :, 0, 0], stats[2, :, 1, 0], stats[2, :, 2, 0], stats[2, :, 3, 0]])
    torch.testing.assert_close(got, want)


def test_the_run_says_which_layers_take_which_attention():
    from tscale.config import load_config
    from tscale.train.loop import _attention_note

    def note(choice: str) -> str:
        return _attention_note(load_config(None, ['model.arch="tscale"', f'train.attention="{choice}"']))

    assert note("auto") == ""
    assert "the global layers: cuDNN's attention" in note("cudnn_global")
    assert "every layer: torch's FlashAttention-2" in note("fa2")


def test_unusable_reason_names_what_is_missing():
    assert "CUDA" in attention_cudnn.cudnn_unusable_reason(torch.device("cpu"), torch.bfloat16, 128)


def test_training_through_cudnn_follows_the_default_attention(monkeypatch, tmp_path, shakespeare_jsonl):
    """train.attention = "cudnn" and "cudnn_global" (stand-in cuDNN on the CPU): the tscale model's losses are
    the default path's; "cudnn" runs every layer through cuDNN, "cudnn_global" only the global one; and the choice
    is refused where it cannot run."""
    from tscale.config import load_config
    from tscale.errors import UserError
    from tscale.train.loop import train_run

    args = tiny_tscale_args(tmp_path, shakespeare_jsonl)
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        train_run(load_config(None, [*args, 'train.attention="cudnn"', 'train.device="cpu"']), tmp_path / "refused",
                  quiet=True)
    windows = []  # the window of every cuDNN forward: 0 for a global layer

    def counted_forward(q, k, v, cu, max_len, window, scale):
        windows.append(window)
        return _fake_forward(q, k, v, cu, max_len, window, scale)

    monkeypatch.setattr(attention_cudnn, "cudnn_forward", counted_forward)
    monkeypatch.setattr(attention_cudnn, "cudnn_backward", _fake_backward)
    monkeypatch.setitem(attention_runs.UNUSABLE, "cudnn", lambda *a: None)
    curves, served = train_each([*args, 'train.device="cpu"'], tmp_path, ("auto", "cudnn", "cudnn_global"), windows)
    assert len(curves["cudnn"]) == 4
    assert served == {"auto": set(), "cudnn": {0, 8}, "cudnn_global": {0}}  # model.window = 8, one global layer
    torch.testing.assert_close(curves["cudnn"], curves["auto"], rtol=1e-4, atol=0)
    torch.testing.assert_close(curves["cudnn_global"], curves["auto"], rtol=1e-4, atol=0)


def test_training_says_when_the_document_runs_outgrow_their_slots(monkeypatch, tmp_path, shakespeare_jsonl, capsys):
    """A batch with more runs than the slot mark is a new shape (a recompile, new cuDNN graphs): training says so.
    The mark starts at 0 and has no headroom here, so every batch holding more runs than all before it grows it."""
    from tscale.config import load_config
    from tscale.ops import doc_runs
    from tscale.train import loop
    from tscale.train.loop import train_run

    monkeypatch.setattr(attention_cudnn, "cudnn_forward", _fake_forward)
    monkeypatch.setattr(attention_cudnn, "cudnn_backward", _fake_backward)
    monkeypatch.setitem(attention_runs.UNUSABLE, "cudnn", lambda *a: None)
    monkeypatch.setattr(loop, "expected_slots", lambda *a: 0)
    monkeypatch.setattr(loop, "RunSlots", lambda initial: doc_runs.RunSlots(bucket=1, headroom=0.0, initial=initial))
    args = [*tiny_tscale_args(tmp_path, shakespeare_jsonl), 'train.device="cpu"', 'train.attention="cudnn"']
    train_run(load_config(None, args), tmp_path / "run", quiet=False)
    notes = [line for line in capsys.readouterr().err.splitlines() if "document runs than the" in line]
    assert notes and all("from now on" in line for line in notes)
    assert not any(line.startswith("step 0:") for line in notes)  # the first batch sets the mark: no recompile yet


def _cuda_cudnn_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    reason = attention_cudnn.cudnn_unusable_reason(torch.device("cuda"), torch.bfloat16, 128)
    if reason:
        pytest.skip(reason)


@pytest.mark.cuda
@pytest.mark.parametrize("window,docs,sink,T,D", [(0, False, False, 128, 128), (0, True, True, 256, 128),
                                                 (128, True, True, 512, 128), (37, True, True, 200, 64),
                                                 (16, False, True, 64, 64)])
def test_cuda_cudnn_matches_the_reference(window, docs, sink, T, D):
    """cuDNN itself against the float64 reference, bf16 inputs: several lengths, head dims, windows, documents."""
    _cuda_cudnn_or_skip()
    _compare(window, docs, sink, device="cuda", dtype=torch.bfloat16, tol=3e-2, B=3, H=2, T=T, D=D, seed=T + window)


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_training_through_cudnn_follows_the_kernel(tmp_path, shakespeare_jsonl, mode):
    _cuda_cudnn_or_skip()
    args = [*tiny_tscale_args(tmp_path, shakespeare_jsonl), "train.compile=true", f'train.compile_mode="{mode}"']
    curves, _ = train_each(args, tmp_path, ("auto", "cudnn", "cudnn_global"))
    torch.testing.assert_close(curves["cudnn"], curves["auto"], rtol=2e-2, atol=0)  # bf16, two kernels
    torch.testing.assert_close(curves["cudnn_global"], curves["auto"], rtol=2e-2, atol=0)


def test_step_benchmark_times_cudnn_in_the_layers_it_serves(monkeypatch):
    """attention_cost.attention_step_cost(impl="cudnn" / "cudnn_global") with the stand-in: the path it reports and
    the layers whose calls go through cuDNN (every one, or the global one only)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "bench"))
    import attention_cost

    windows = []

    def counted_forward(q, k, v, cu, max_len, window, scale):
        windows.append(window)
        return _fake_forward(q, k, v, cu, max_len, window, scale)

    monkeypatch.setattr(attention_cudnn, "cudnn_forward", counted_forward)
    monkeypatch.setattr(attention_cudnn, "cudnn_backward", _fake_backward)
    model, idx = tiny_step_benchmark_inputs()
    for impl, served in (("cudnn", {0, 8}), ("cudnn_global", {0})):
        windows.clear()
        cost = attention_cost.attention_step_cost(model, idx, None, repeats=1, compile_ops=False, warmup=1, impl=impl)
        assert cost["path"].startswith("cuDNN's attention over the document runs") and cost["tscale_s"] > 0
        assert ("in the global layers" in cost["path"]) == (impl == "cudnn_global")
        assert set(windows) == served
