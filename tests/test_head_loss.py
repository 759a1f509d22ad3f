"""The head's loss with its gradient made in one pass (tscale/ops/head_loss.py): kernel, reference twin, models, loop."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tscale.config import load_config
from tscale.data.tokenize import tokenize_corpus
from tscale.ops.fused_loss import head_loss_reference
from tscale.ops.head_loss import head_loss, softcap_xent_grad, softcap_xent_grad_reference
from tscale.train.loop import train_run

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _logits(N, V_pad, seed=0, dtype=torch.float32, device="cpu", spread=4.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, V_pad, generator=g) * spread).to(device=device, dtype=dtype)


@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_reference_twin_is_cross_entropy_and_its_gradient(softcap):
    """Losses are F.cross_entropy's per token; grad is autograd's gradient of their sum, times scale."""
    N, V, V_pad, scale = 29, 37, 40, 0.25
    logits = _logits(N, V_pad, dtype=torch.float64)
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(1))
    x = logits.clone().requires_grad_()
    z = softcap * torch.tanh(x / softcap) if softcap else x
    want = F.cross_entropy(z[:, :V], targets, reduction="none")
    want.sum().backward()
    losses, grad = softcap_xent_grad_reference(logits, targets, V, softcap, scale)
    torch.testing.assert_close(losses, want.detach().float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, x.grad * scale, rtol=1e-4, atol=1e-7)  # the twin computes in float32
    assert torch.all(grad[:, V:] == 0) and grad[:, :V].abs().sum() > 0


def _case(N=37, d=16, V_pad=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, d, generator=g), torch.randn(V_pad, d, generator=g) * 0.5,
            torch.randint(0, 21, (N,), generator=g))


def _loss_and_grads(fn, hidden, weight, targets, **kw):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = fn(h, w, targets, **kw)
    (3.0 * loss).backward()  # an upstream gradient other than 1: the backward scales the products by it
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_head_loss_matches_the_logits_path_in_float32(softcap):
    hidden, weight, targets = _case()
    want = _loss_and_grads(head_loss_reference, hidden, weight, targets, vocab_size=21, softcap=softcap)
    got = _loss_and_grads(head_loss, hidden, weight, targets, vocab_size=21, softcap=softcap)
    for name, a, b in zip(("loss", "hidden grad", "weight grad"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
    assert torch.all(got[2][21:] == 0), "the head's padding rows get no gradient"


def test_head_loss_under_bfloat16_autocast_matches_the_logits_path():
    hidden, weight, targets = _case(N=64, d=32, V_pad=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _loss_and_grads(head_loss_reference, hidden, weight, targets, vocab_size=21, softcap=15.0)
        got = _loss_and_grads(head_loss, hidden, weight, targets, vocab_size=21, softcap=15.0)
    assert got[1].dtype == hidden.dtype and got[2].dtype == weight.dtype
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=1e-3)
    for a, b in zip(got[1:], want[1:]):
        assert (a - b).abs().max() <= 0.02 * b.abs().max()


def test_head_loss_rejects_bad_shapes():
    hidden, weight, targets = _case()
    with pytest.raises(ValueError, match="targets"):
        head_loss(hidden, weight, targets[:-1], 21)
    with pytest.raises(ValueError, match="vocab_size 25"):
        head_loss(hidden, weight, targets, 25)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, shakespeare_jsonl) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokens"
    tokenize_corpus([shakespeare_jsonl], out, vocab_size=512, quiet=True)
    return out


def test_training_with_the_loss_kernel_follows_the_logits_path(tokens, tmp_path, monkeypatch):
    import tscale.model.loss as loss_module

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return head_loss(*args, **kwargs)

    monkeypatch.setattr(loss_module, "head_loss", counting)
    args = ['model.arch="tscale"', "model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.head_dim=16",
            "model.seq_len=32", "model.window=8", "model.global_every=2", "train.batch_size=4",
            "optim.warmup_steps=0", "train.eval_every=0", "train.ckpt_every=0", "train.log_every=1", "train.steps=5",
            f'data.tokens="{tokens}"']
    curves = {}
    for on in ("false", "true"):
        train_run(load_config(None, [*args, f"train.loss_kernel={on}"]), tmp_path / on, quiet=True)
        rows = map(json.loads, (tmp_path / on / "metrics.jsonl").read_text().splitlines())
        curves[on] = [r["loss"] for r in rows if "loss" in r]
    assert len(curves["true"]) == 5 and calls == [(4 * 32, 32)] * 5  # the kernel run's steps, and only those
    assert curves["true"] == pytest.approx(curves["false"], rel=1e-4)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("softcap", [0.0, 15.0])
@pytest.mark.parametrize("N,V,V_pad", [(37, 1000, 1024), (5, 8, 8), (64, 50257, 50304), (3, 65530, 65536)])
def test_kernel_matches_its_reference_on_random_logits(N, V, V_pad, softcap):
    logits = _logits(N, V_pad, seed=N, dtype=torch.bfloat16, device="cuda")
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(V)).cuda()
    scale = 1.0 / N
    losses, grad = torch.ops.tscale.softcap_xent_grad(logits, targets, V, softcap, scale)
    want_losses, want_grad = softcap_xent_grad_reference(logits, targets, V, softcap, scale)
    assert grad.dtype == torch.bfloat16 and grad.shape == logits.shape
    torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad.float(), want_grad.float(), rtol=2e-2, atol=1e-3 * scale)
    assert torch.all(grad[:, V:] == 0)
    if not softcap:  # softmax minus one-hot: every row sums to 0 (the soft-cap's derivative weighs the terms apart)
        assert (grad.float().sum(1).abs() <= 1e-2 * scale).all(), "each row's gradient sums to about 0"


@pytest.mark.cuda
@cuda
def test_kernel_marks_a_target_outside_the_vocabulary():
    logits = _logits(4, 64, dtype=torch.bfloat16, device="cuda")
    losses, _ = softcap_xent_grad(logits, torch.tensor([0, 49, 50, -1], device="cuda"), 50, 0.0, 1.0)
    assert torch.isfinite(losses[:2]).all() and torch.isnan(losses[2:]).all()


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("compiled", [False, True])
def test_head_loss_on_cuda_under_bfloat16_autocast(compiled):
    """The GPT-2 vocabulary padded as the models pad it, soft-cap on; eager and compiled, backward included."""
    g = torch.Generator().manual_seed(0)
    N, d, V, V_pad = 5000, 256, 50257, 50304
    hidden = torch.randn(N, d, generator=g).cuda()
    weight = (torch.randn(V_pad, d, generator=g) * 0.05).cuda()
    targets = torch.randint(0, V, (N,), generator=g).cuda()
    fused = torch.compile(head_loss) if compiled else head_loss
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = _loss_and_grads(head_loss_reference, hidden, weight, targets, vocab_size=V, softcap=15.0)
        got = _loss_and_grads(fused, hidden, weight, targets, vocab_size=V, softcap=15.0)
    torch.testing.assert_close(got[0], want[0], rtol=2e-3, atol=2e-3)
    for a, b in zip(got[1:], want[1:]):
        assert torch.isfinite(a).all() and (a - b).abs().max() <= 0.02 * b.abs().max()
