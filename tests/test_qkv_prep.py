"""The fused attention-input kernel (csrc/qkv) against its reference twin, forward and backward: on the CPU through the
emulator of tests/attention_emu, on a GPU directly; and the twin against the model's own path."""

from pathlib import Path

import pytest
import torch

from helpers_emu import build_emulator
from tscale.config import ModelConfig
from tscale.model.tscale_lm import _plain_norm, apply_rope, rope_tables
from tscale.ops.qkv_prep import kernel_serves, qkv_prep, qkv_prep_reference

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CASES = [  # B, T, H, D, norm, rope
    (2, 5, 3, 128, True, True), (1, 7, 2, 64, True, True), (2, 4, 2, 128, False, True), (1, 6, 3, 64, True, False)]


def _inputs(B, T, H, D, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(B, T, 3, H, D, generator=g) * 2 + 0.3).to(torch.bfloat16)  # a mean, so norms are not 1
    cos, sin = rope_tables(T + 3, D, 10000.0)
    grads = [torch.randn(B, T, H, D, generator=g).to(torch.bfloat16) for _ in range(3)]
    return qkv.to(device), cos[:T].to(device), sin[:T].to(device), [x.to(device) for x in grads]


def _reference_backward(qkv, cos, sin, grads, norm, rope):
    x = qkv.clone().requires_grad_(True)
    outs = qkv_prep_reference(x, cos, sin, 1e-6, norm, rope)
    torch.autograd.backward(outs, grads)
    return outs, x.grad


def test_reference_is_the_models_own_path():
    """qkv_prep_reference computes what tscale_lm.Attention does between its qkv product and attention."""
    qkv, cos, sin, _ = _inputs(2, 6, 3, 128)
    q, k, v = qkv.unbind(2)
    cfg = ModelConfig(arch="tscale", norm="rms")
    rope = (cos[:, None], sin[:, None])
    want = [apply_rope(_plain_norm(cfg, x.float()), *rope).to(torch.bfloat16) for x in (q, k)]
    got = qkv_prep_reference(qkv, cos, sin, 1e-6, True, True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[2], v)
    assert got[2].is_contiguous() and not torch.equal(got[0], q)


def test_cpu_tensors_take_the_reference():
    qkv, cos, sin, _ = _inputs(1, 4, 2, 64)
    assert not kernel_serves(qkv, cos)
    for got, want in zip(qkv_prep(qkv, cos, sin), qkv_prep_reference(qkv, cos, sin, 1e-6, True, True)):
        assert torch.equal(got, want)


@pytest.fixture(scope="module")
def emu():
    return build_emulator("tscale_qkv_emu", "qkv_emu/qkv_prep_emu.cpp", ["csrc/qkv"])


@pytest.mark.parametrize("seed", [0, 1])  # the emulator's fibers run in another random order
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_kernel_matches_its_reference(emu, case, seed):
    B, T, H, D, norm, rope = case
    emu.set_seed(seed)
    qkv, cos, sin, grads = _inputs(B, T, H, D, seed=seed)
    want, want_dqkv = _reference_backward(qkv, cos, sin, grads, norm, rope)
    got = emu.qkv_prep(qkv, cos, sin, 1e-6, norm, rope)
    for x, y in zip(got, want):
        assert x.shape == y.shape and x.is_contiguous()
        torch.testing.assert_close(x.float(), y.float(), rtol=1e-2, atol=1e-2)  # one bf16 rounding apart at most
    assert torch.equal(got[2], want[2])
    dqkv = emu.qkv_prep_backward(*grads, qkv, cos, sin, 1e-6, norm, rope)
    torch.testing.assert_close(dqkv.float(), want_dqkv.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(dqkv[:, :, 2], grads[2])


def test_emulated_kernel_rejects_what_it_cannot_take(emu):
    qkv, cos, sin, _ = _inputs(1, 4, 2, 64)
    with pytest.raises(RuntimeError, match="head dimension"):
        emu.qkv_prep(torch.zeros(1, 4, 3, 2, 32, dtype=torch.bfloat16), cos[:, :32], sin[:, :32], 1e-6, True, True)
    with pytest.raises(RuntimeError, match="cos and sin"):
        emu.qkv_prep(qkv, cos[:3], sin[:3], 1e-6, True, True)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernel_matches_its_reference(case):
    B, T, H, D, norm, rope = case
    qkv, cos, sin, grads = _inputs(B, T, H, D, device="cuda")
    assert kernel_serves(qkv, cos)
    want, want_dqkv = _reference_backward(qkv, cos, sin, grads, norm, rope)
    x = qkv.clone().requires_grad_(True)
    got = qkv_prep(x, cos, sin, 1e-6, norm, rope)
    torch.autograd.backward(got, grads)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(x.grad.float(), want_dqkv.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.cuda
@cuda
def test_kernel_under_torch_compile():
    """The ops' fake shapes let torch.compile trace them; forward and backward as in eager mode."""
    qkv, cos, sin, grads = _inputs(2, 64, 6, 128, device="cuda")

    def step(x):
        q, k, v = qkv_prep(x, cos, sin)
        return (q.float() * grads[0]).sum() + (k.float() * grads[1]).sum() + (v.float() * grads[2]).sum()

    eager, compiled = qkv.clone().requires_grad_(True), qkv.clone().requires_grad_(True)
    step(eager).backward()
    torch.compile(step, fullgraph=True)(compiled).backward()
    torch.testing.assert_close(compiled.grad.float(), eager.grad.float(), rtol=1e-2, atol=1e-2)


def _tiny_model(**model):
    from tscale.model import build_model

    cfg = ModelConfig(arch="tscale", n_layer=2, n_head=2, head_dim=64, d_model=128, seq_len=32, window=8,
                      global_every=2, vocab_size=64, eos_id=0, **model)
    torch.manual_seed(0)
    return build_model(cfg)


@pytest.mark.parametrize("model", [{}, {"qk_norm": False}], ids=["qk_norm", "no_qk_norm"])
def test_model_takes_its_inputs_from_the_op_when_it_serves(monkeypatch, model):
    """train.qkv_kernel's path through the model, on the CPU: with the kernel standing in as its reference twin,
    the layers' outputs and gradients are the model's own path's."""
    import tscale.model.tscale_lm as lm

    calls = []

    def stand_in(qkv, cos, sin, eps, norm, rope):
        calls.append((tuple(cos.shape), eps, norm, rope))
        return qkv_prep_reference(qkv, cos, sin, eps, norm, rope)

    idx = torch.randint(1, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    plain, fused = _tiny_model(**model), _tiny_model(**model)
    fused.use_qkv_kernel(True)
    monkeypatch.setattr(lm, "kernel_serves", lambda qkv, cos: True)
    monkeypatch.setattr(lm, "qkv_prep", stand_in)
    want, got = plain(idx), fused(idx)
    assert calls == [((32, 64), 1e-6, model.get("qk_norm", True), True)] * 2  # both layers
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    want.float().square().mean().backward()
    got.float().square().mean().backward()
    for a, b in zip(plain.parameters(), fused.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)


def test_model_keeps_its_own_path_where_the_op_cannot_serve(monkeypatch):
    """Off by default; on, still the model's ops for a LayerNorm QK norm, without RoPE, when decoding, and wherever
    the kernel does not take the tensors (CPU ones here)."""
    import tscale.model.tscale_lm as lm

    qkv = torch.zeros(1, 4, 3, 2, 64, dtype=torch.bfloat16)
    assert not _tiny_model().blocks[0].attn.qkv_kernel
    on = {}
    for norm in ("rms", "layer"):
        model = _tiny_model(norm=norm)
        model.use_qkv_kernel(True)
        on[norm] = model.blocks[0].attn, (model.rope_cos[:4, None], model.rope_sin[:4, None])
    attn, rope = on["rms"]
    assert not attn._fused_inputs(qkv, rope, None)  # CPU tensors: kernel_serves says no
    monkeypatch.setattr(lm, "kernel_serves", lambda qkv, cos: True)
    assert attn._fused_inputs(qkv, rope, None)
    assert not attn._fused_inputs(qkv, None, None) and not attn._fused_inputs(qkv, rope, object())
    assert not on["layer"][0]._fused_inputs(qkv, on["layer"][1], None)


def test_training_takes_qkv_kernel_for_tscale_and_refuses_it_for_gpt2(tmp_path):
    """A tscale run with the option trains (on a CPU through the model's own ops); a gpt2 run gets a one-line error."""
    from tscale.config import load_config
    from tscale.data.tokenize import tokenize_corpus
    from tscale.errors import UserError
    from tscale.train.loop import train_run

    src = tmp_path / "text.txt"
    src.write_text("a b c d e f g h i j k l m n o p\n" * 200)
    tokenize_corpus([src], tmp_path / "tokens", vocab_size=300, quiet=True)
    configs = Path(__file__).resolve().parents[1] / "configs"
    sets = [f'data.tokens="{tmp_path / "tokens"}"', "train.steps=2", "train.batch_size=2", "model.seq_len=32",
            "train.eval_every=0", "train.ckpt_every=0", "train.qkv_kernel=true"]
    train_run(load_config(configs / "tscale-tiny-cpu.toml", sets), tmp_path / "tscale", quiet=True)
    assert (tmp_path / "tscale" / "metrics.jsonl").read_text().strip()
    with pytest.raises(UserError, match="train.qkv_kernel applies to the tscale architecture"):
        train_run(load_config(configs / "tiny-cpu.toml", sets), tmp_path / "gpt2", quiet=True)


@pytest.mark.cuda
@cuda
def test_model_with_the_kernel_matches_its_own_path_on_a_gpu():
    idx = torch.randint(1, 64, (2, 32), generator=torch.Generator().manual_seed(1)).cuda()
    plain, fused = _tiny_model().cuda(), _tiny_model().cuda()
    fused.use_qkv_kernel(True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert fused.blocks[0].attn._fused_inputs(
            torch.zeros(2, 32, 3, 2, 64, device="cuda", dtype=torch.bfloat16), (fused.rope_cos[:32, None],
                                                                                  fused.rope_sin[:32, None]), None)
        want, got = plain(idx).float(), fused(idx).float()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    want.square().mean().backward()
    got.square().mean().backward()
    for a, b in zip(plain.parameters(), fused.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=5e-2, atol=5e-3)
