"""The head's fused losses against the logits path, inside both models and in training.

chunked: tscale/ops/fused_loss.py (train.fused_loss); kernel: tscale/ops/head_loss.py (train.loss_kernel), whose
kernel's own tests are in test_head_loss.py.
"""

import json
from pathlib import Path

import pytest
import torch

from tscale.config import IndexConfig, ModelConfig, load_config
from tscale.data.tokenize import tokenize_corpus
from tscale.errors import UserError
from tscale.model import build_model
from tscale.model.loss import head_mean_loss, mean_loss
from tscale.ops.fused_loss import chunked_head_loss, head_loss_reference
from tscale.ops.head_loss import head_loss
from tscale.train.loop import train_run


def _case(N=37, d=16, V_pad=24, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, d, generator=g, dtype=dtype)
    weight = (torch.randn(V_pad, d, generator=g) * 0.5).to(dtype)
    targets = torch.randint(0, 21, (N,), generator=g)
    return hidden, weight, targets


def _loss_and_grads(fn, hidden, weight, targets, **kw):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = fn(h, w, targets, **kw)
    (3.0 * loss).backward()  # an upstream gradient other than 1
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("softcap", [0.0, 2.0])
@pytest.mark.parametrize("chunk", [1, 8, 100])  # one token at a time, chunks that do not divide N, one chunk
def test_chunked_loss_matches_the_reference_in_float32(softcap, chunk):
    hidden, weight, targets = _case()
    want = _loss_and_grads(head_loss_reference, hidden, weight, targets, vocab_size=21, softcap=softcap)
    got = _loss_and_grads(chunked_head_loss, hidden, weight, targets, vocab_size=21, softcap=softcap, chunk=chunk)
    for name, a, b in zip(("loss", "hidden grad", "weight grad"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
    assert torch.all(got[2][21:] == 0), "the head's padding rows get no gradient"
    assert got[1].abs().sum() > 0 and got[2][:21].abs().sum() > 0


def test_cpu_chunks_keep_the_logits_under_the_buffer_bound(monkeypatch):
    """On a CPU the default chunk holds at most CPU_CHUNK_ELEMENTS logits (so buffers are reused), on a GPU
    DEFAULT_CHUNK tokens; the loss in those chunks is the reference's."""
    from tscale.ops import fused_loss

    assert fused_loss.default_chunk(torch.device("cpu"), 50_257) * 50_257 <= fused_loss.CPU_CHUNK_ELEMENTS
    assert fused_loss.default_chunk(torch.device("cpu"), 50_257) >= 100  # not a token at a time either
    assert fused_loss.default_chunk(torch.device("cuda"), 50_257) == fused_loss.DEFAULT_CHUNK
    assert fused_loss.default_chunk(torch.device("cpu"), 10 * fused_loss.CPU_CHUNK_ELEMENTS) == 1
    monkeypatch.setattr(fused_loss, "CPU_CHUNK_ELEMENTS", 21 * 5)  # 5 tokens a chunk: 8 chunks of 37 tokens
    chunks = []
    real_matmul = torch.Tensor.__matmul__

    def counted(a, b):
        chunks.append(a.shape[0])
        return real_matmul(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", counted)
    hidden, weight, targets = _case()
    got = _loss_and_grads(chunked_head_loss, hidden, weight, targets, vocab_size=21, softcap=2.0)
    monkeypatch.setattr(torch.Tensor, "__matmul__", real_matmul)
    want = _loss_and_grads(head_loss_reference, hidden, weight, targets, vocab_size=21, softcap=2.0)
    assert chunks[::3] == [5] * 7 + [2]  # each chunk's logits product (n, d) @ (d, V), then its two gradients
    for name, a, b in zip(("loss", "hidden grad", "weight grad"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")


@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_one_pass_loss_matches_the_reference_in_float32(softcap):
    hidden, weight, targets = _case()
    want = _loss_and_grads(head_loss_reference, hidden, weight, targets, vocab_size=21, softcap=softcap)
    got = _loss_and_grads(head_loss, hidden, weight, targets, vocab_size=21, softcap=softcap)
    for name, a, b in zip(("loss", "hidden grad", "weight grad"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
    assert torch.all(got[2][21:] == 0), "the head's padding rows get no gradient"


FUSED = {"chunked": lambda *a, **kw: chunked_head_loss(*a, **kw, chunk=16), "kernel": head_loss}


@pytest.mark.parametrize("how", list(FUSED))
def test_fused_losses_under_bfloat16_autocast_match_the_reference(how):
    hidden, weight, targets = _case(N=64, d=32, V_pad=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _loss_and_grads(head_loss_reference, hidden, weight, targets, vocab_size=21, softcap=15.0)
        got = _loss_and_grads(FUSED[how], hidden, weight, targets, vocab_size=21, softcap=15.0)
    assert got[1].dtype == hidden.dtype and got[2].dtype == weight.dtype
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=1e-3)
    for a, b in zip(got[1:], want[1:]):
        assert (a - b).abs().max() <= 0.02 * b.abs().max()


def test_fused_losses_reject_bad_shapes():
    hidden, weight, targets = _case()
    with pytest.raises(ValueError, match="targets"):
        chunked_head_loss(hidden, weight, targets[:-1], 21)
    with pytest.raises(ValueError, match="chunk"):
        chunked_head_loss(hidden, weight, targets, 21, chunk=0)
    with pytest.raises(ValueError, match="targets"):
        head_loss(hidden, weight, targets[:-1], 21)
    with pytest.raises(ValueError, match="vocab_size 25"):
        head_loss(hidden, weight, targets, 25)


@pytest.mark.parametrize("how", ["chunked", "kernel"])
@pytest.mark.parametrize("arch", ["gpt2", "tscale"])
def test_models_give_the_same_loss_and_gradients_either_way(arch, how):
    extra = dict(head_dim=16, window=8, global_every=2, logit_softcap=10.0, zero_init=False) if arch == "tscale" else {}
    cfg = ModelConfig(arch=arch, vocab_size=100, eos_id=99, n_layer=2, n_head=2, d_model=32, seq_len=16, **extra)
    torch.manual_seed(0)
    model = build_model(cfg)
    idx, targets = torch.randint(0, 100, (3, 16)), torch.randint(0, 100, (3, 16))
    results = []
    for fused in (False, True):
        model.zero_grad(set_to_none=True)
        loss = model(idx, loss_targets=targets, head_loss=how) if fused else mean_loss(model(idx), targets)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (plain, plain_grads), (fused, fused_grads) = results
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    assert plain_grads.keys() == fused_grads.keys()
    for name in plain_grads:
        torch.testing.assert_close(fused_grads[name], plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("arch", ["gpt2", "tscale"])
@pytest.mark.parametrize("with_index", [False, True])
def test_per_token_losses_on_a_cpu_are_made_in_chunks_and_match_the_whole_logits(arch, with_index, monkeypatch):
    """model(idx, targets=...) on a CPU takes its logits (and the index's mixture) a chunk of tokens at a time:
    the same per-token losses and gradients as one pass over the whole logits."""
    from tscale.index.mixing import IndexFeatures
    from tscale.model.loss import token_losses
    from tscale.ops import fused_loss

    extra = dict(head_dim=16, window=8, global_every=2, logit_softcap=10.0, zero_init=False) if arch == "tscale" else {}
    cfg = ModelConfig(arch=arch, vocab_size=100, eos_id=99, n_layer=2, n_head=2, d_model=32, seq_len=16, **extra)
    torch.manual_seed(0)
    model = build_model(cfg, IndexConfig(path="x", inputs=True, mixer=True, gate_stats=True) if with_index else None)
    with torch.no_grad():
        model.lm_head.weight.normal_()
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, 100, (3, 16), generator=g), torch.randint(0, 100, (3, 16), generator=g)
    nxt = torch.randint(-1, 100, (3, 16, 4), generator=g)
    kw = {"index": IndexFeatures(torch.randint(0, 40, (3, 16), generator=g), nxt,
                                 torch.randint(1, 6, (3, 16, 4), generator=g) * (nxt >= 0))} if with_index else {}
    heads = []
    model.lm_head.register_forward_hook(lambda module, args, out: heads.append(tuple(args[0].shape[:-1])))
    results = []
    for elements in (10 ** 12, 100 * 10):  # one chunk (the whole logits); 10 tokens a chunk: 5 chunks of 48 tokens
        monkeypatch.setattr(fused_loss, "CPU_CHUNK_ELEMENTS", elements)
        model.zero_grad(set_to_none=True)
        nats = model(idx, targets=targets, **kw)  # (B, T)
        (nats * torch.linspace(0.5, 2.0, 16)).sum().backward()  # a gradient that weighs the positions
        results.append((nats.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert heads == [(1, 48)] + [(1, 10)] * 4 + [(1, 8)]
    (whole, whole_grads), (chunked, chunked_grads) = results
    assert chunked.shape == (3, 16) and whole_grads.keys() == chunked_grads.keys()
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
    for name in whole_grads:
        torch.testing.assert_close(chunked_grads[name], whole_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    if not with_index:  # and the whole pass is the models' logits path
        with torch.no_grad():
            torch.testing.assert_close(whole, token_losses(model(idx), targets), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, shakespeare_jsonl) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokens"
    tokenize_corpus([shakespeare_jsonl], out, vocab_size=512, quiet=True)
    return out


ARGS = ['model.arch="tscale"', "model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.head_dim=16",
        "model.seq_len=32", "model.window=8", "model.global_every=2", "train.batch_size=4", "optim.warmup_steps=0",
        "train.eval_every=0", "train.ckpt_every=0", "train.log_every=1", "train.steps=5"]


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


# (setting, the loss function it routes the step through, steps that call it: train.loss_kernel is the kernel on a
# GPU, the chunked loss on a CPU)
ON_GPU = torch.cuda.is_available()
TRAINED_WITH = [("train.fused_loss", "chunked_head_loss", 5),
                ("train.loss_kernel", "head_loss", 5 if ON_GPU else 0),
                ("train.loss_kernel", "chunked_head_loss", 0 if ON_GPU else 5)]


@pytest.mark.parametrize("setting,name,calls_expected", TRAINED_WITH)
def test_training_with_a_fused_loss_follows_the_logits_path(tokens, tmp_path, monkeypatch, setting, name,
                                                            calls_expected):
    import tscale.model.loss as loss_module

    calls = []
    fused_loss = getattr(loss_module, name)

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return fused_loss(*args, **kwargs)

    monkeypatch.setattr(loss_module, name, counting)
    curves = {}
    for on in ("false", "true"):  # the logits path, then the fused loss
        cfg = load_config(None, [*ARGS, f'data.tokens="{tokens}"', "train.loss_kernel=false", f"{setting}={on}"])
        train_run(cfg, tmp_path / on, quiet=True)
        curves[on] = _losses(tmp_path / on)
    assert len(curves["true"]) == 5 and calls == [(4 * 32, 32)] * calls_expected  # the fused run's steps only
    rel = 1e-2 if ON_GPU else 1e-4  # bf16 on a GPU
    assert curves["true"] == pytest.approx(curves["false"], rel=rel)


def test_fused_loss_refuses_a_converted_head(tokens, tmp_path):
    cfg = load_config(None, [*ARGS, f'data.tokens="{tokens}"', "train.fused_loss=true",
                             'precision.recipe="int8_rowwise"', "precision.exclude=[]"])
    with pytest.raises(UserError, match="precision.exclude"):
        train_run(cfg, tmp_path / "converted", quiet=True)


@pytest.mark.parametrize("how", ["chunked", "kernel"])
def test_head_losses_refuse_a_model_with_the_index(how):
    cfg = ModelConfig(arch="gpt2", vocab_size=100, eos_id=99, n_layer=1, n_head=2, d_model=32, seq_len=16)
    model = build_model(cfg, IndexConfig(path="unused", mixer=True))
    assert model.index is not None
    with pytest.raises(ValueError, match="are for models without the token index"):
        head_mean_loss(model.lm_head, torch.randn(1, 16, 32), torch.randint(0, 100, (1, 16)), 100, 0.0, model.index,
                       how)


def test_head_mean_loss_refuses_an_unknown_choice():
    head = torch.nn.Linear(32, 100, bias=False)
    with pytest.raises(ValueError, match="choose one of kernel, chunked"):
        head_mean_loss(head, torch.randn(1, 16, 32), torch.randint(0, 100, (1, 16)), 100, how="logits")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("how", list(FUSED))
@pytest.mark.parametrize("compiled", [False, True])
def test_fused_losses_on_cuda_under_bfloat16_autocast(compiled, how):
    """The GPT-2 vocabulary padded as the models pad it, soft-cap on; eager and compiled, backward included."""
    g = torch.Generator().manual_seed(0)
    N, d, V, V_pad = 5000, 256, 50257, 50304
    hidden = torch.randn(N, d, generator=g).cuda()
    weight = (torch.randn(V_pad, d, generator=g) * 0.05).cuda()
    targets = torch.randint(0, V, (N,), generator=g).cuda()
    # chunks of 1,024, the last one partial: compiling unrolls the chunk loop (313 chunks of 16 took over 9 minutes)
    loss = (lambda *a, **kw: chunked_head_loss(*a, **kw, chunk=1024)) if how == "chunked" else FUSED[how]
    fused = torch.compile(loss, fullgraph=how == "kernel") if compiled else loss
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = _loss_and_grads(head_loss_reference, hidden, weight, targets, vocab_size=V, softcap=15.0)
        got = _loss_and_grads(fused, hidden, weight, targets, vocab_size=V, softcap=15.0)
    torch.testing.assert_close(got[0], want[0], rtol=2e-3, atol=2e-3)
    for a, b in zip(got[1:], want[1:]):
        assert torch.isfinite(a).all() and (a - b).abs().max() <= 0.02 * b.abs().max()
