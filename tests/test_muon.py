"""Muon + AdamW: orthogonalisation, parameter groups, state_dict round trip, learning, exact resume, schedules."""

import io
import json
import os
import signal

import pytest
import safetensors.torch
import torch

from tscale.config import ModelConfig, OptimConfig, load_config
from tscale.data.shards import TokenFolder
from tscale.data.tokenize import tokenize_corpus
from tscale.errors import UserError
from tscale.model import build_model
from tscale.model.loss import mean_loss
from tscale.optim import build_optimizer
from tscale.optim.muon import NS_COEFFS, Muon, orthogonalize
from tscale.optim.schedule import lr_at
from tscale.train.checkpoint import load_train_state, open_checkpoint
from tscale.train.loop import train_run

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TINY = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.seq_len=32", "train.batch_size=4",
        "train.eval_every=0", "train.log_every=1", "optim.warmup_steps=5", 'optim.name="muon"',
        'optim.decay="trapezoid"', "model.window=8", "model.global_every=2", "model.dropout=0.1"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, shakespeare_jsonl):
    out = tmp_path_factory.mktemp("tok") / "tokens"
    tokenize_corpus([shakespeare_jsonl], out, vocab_size=512, quiet=True)
    return out


@pytest.mark.parametrize("shape", [(64, 32), (32, 96), (50, 40)])
def test_orthogonalize_gives_near_orthogonal_matrices(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    x = orthogonalize(g)
    assert x.shape == g.shape
    s = torch.linalg.svdvals(x)
    assert s.min() > 0.6 and s.max() < 1.25  # the quintic iteration's band around 1
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    assert torch.nn.functional.cosine_similarity((u @ vh).flatten(), x.flatten(), dim=0) > 0.95


def _reference_step(params, grads, state, lr, mu, wd, ns_steps, betas, eps, kind):
    """One Muon or AdamW step parameter by parameter, as the optimizer's docstring defines it."""
    for p, g in zip(params, grads):
        st = state.setdefault(id(p), {})
        if kind == "muon":
            buf = st.setdefault("buf", torch.zeros_like(p))
            buf.mul_(mu).add_(g)
            update = orthogonalize(g.add(buf, alpha=mu), ns_steps)
            rows, cols = p.shape
            p.mul_(1 - lr * wd).add_(update, alpha=-lr * max(1.0, rows / cols) ** 0.5)
        else:
            st["t"] = st.get("t", 0) + 1
            m = st.setdefault("m", torch.zeros_like(p)).lerp_(g, 1 - betas[0])
            v = st.setdefault("v", torch.zeros_like(p)).mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
            denom = (v / (1 - betas[1] ** st["t"])).sqrt_().add_(eps)
            p.mul_(1 - lr * wd).addcdiv_(m, denom, value=-lr / (1 - betas[0] ** st["t"]))


@pytest.mark.parametrize("kind", ["muon", "adam"])
def test_grouped_step_matches_the_per_parameter_definition(kind):
    """Shapes repeat (batched Newton-Schulz, multi-tensor updates) and differ (tall, wide, vectors for Adam)."""
    gen = torch.Generator().manual_seed(3)
    shapes = [(48, 16), (16, 40), (48, 16), (24, 24), (16, 40), (48, 16)] + ([(7,), (24, 24, 2)] if kind == "adam" else [])
    params = [torch.randn(*s, generator=gen) for s in shapes]
    mine = [p.clone() for p in params]
    initial = [p.clone() for p in params]
    wd = 0.1
    opt = Muon([{"params": mine, "kind": kind, "lr_scale": 0.5, "weight_decay": wd}], lr=0.02, momentum=0.9,
               betas=(0.9, 0.95), eps=1e-8, ns_steps=5)
    state: dict = {}
    for _ in range(3):
        grads = [torch.randn(*s, generator=gen) for s in shapes]
        for p, g in zip(mine, grads):
            p.grad = g.clone()
        opt.step()
        _reference_step(params, grads, state, 0.01, 0.9, wd, 5, (0.9, 0.95), 1e-8, kind)
    for p, q in zip(mine, params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert not any(torch.equal(p, p0) for p, p0 in zip(mine, initial))  # every parameter moved


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, cuda])])
def test_compiled_step_matches_the_definition_and_compiles_once(device):
    """optim.compile_step: the Muon group's update under torch.compile, the rate changing every step (as a
    schedule's does) without a new graph. On CUDA the Newton-Schulz products run in fp16, where Inductor rounds
    fewer intermediates than eager code does."""
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(5)
    shapes = [(48, 16), (16, 40), (48, 16), (24, 24)]
    params = [torch.randn(*s, generator=gen).to(device) for s in shapes]
    initial = [p.clone() for p in params]
    mine = [p.clone() for p in params]
    wd = 0.1
    torch._dynamo.reset()
    counters.clear()
    opt = Muon([{"params": mine, "kind": "muon", "lr_scale": 1.0, "weight_decay": wd}], lr=0.02, momentum=0.9,
               ns_steps=5, compile_step=True)
    state: dict = {}
    graphs = []
    for lr in (0.02, 0.015, 0.01, 0.005):
        opt.param_groups[0]["lr"] = lr
        grads = [torch.randn(*s, generator=gen).to(device) for s in shapes]
        for p, g in zip(mine, grads):
            p.grad = g.clone()
        opt.step()
        graphs.append(counters["stats"]["unique_graphs"])
        _reference_step(params, grads, state, lr, 0.9, wd, 5, (0.9, 0.95), 1e-8, "muon")
    tol = 1e-5 if device == "cpu" else 2e-2
    for p, q, p0 in zip(mine, params, initial):  # the parameters' movement, as the definition moves them
        assert float((p - q).norm()) <= tol * float((q - p0).norm())
    assert graphs[0] >= 1 and graphs[-1] == graphs[0], f"graphs compiled after each step: {graphs}"


@pytest.mark.parametrize("shape", [(48, 80), (3, 40, 24)])
def test_orthogonalize_is_the_quintic_iteration(shape):
    """The fused products compute x <- a x + (b m + c m m) x, m = x x^T, on the short side, normalised first."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(7))
    a, b, c = NS_COEFFS
    tall = shape[-2] > shape[-1]
    x = g.mT if tall else g
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(3):
        m = x @ x.mT
        x = a * x + (b * m + c * (m @ m)) @ x
    torch.testing.assert_close(orthogonalize(g, steps=3), x.mT if tall else x, rtol=1e-4, atol=1e-5)


def test_fp16_iteration_is_closer_to_float32_than_bf16():
    """The reason the CUDA iteration runs in fp16: at one tensor-core rate, several times closer to float32."""
    g = torch.randn(3, 64, 160, generator=torch.Generator().manual_seed(11)) * 1e-3  # a gradient's scale
    exact = orthogonalize(g, dtype=torch.float32)
    fp16, bf16 = (float((orthogonalize(g, dtype=d) - exact).norm() / exact.norm())
                  for d in (torch.float16, torch.bfloat16))
    assert fp16 < 1e-2 and fp16 < bf16 / 4, (fp16, bf16)


def test_orthogonalize_normalises_before_the_cast():
    """Entries below fp16's smallest subnormal (6e-8) survive: each matrix is scaled to norm 1 in its own dtype
    first (cast first, they would all round to zero)."""
    g = torch.randn(2, 48, 80, generator=torch.Generator().manual_seed(12)) * 1e-9
    exact = orthogonalize(g, dtype=torch.float32)
    half = orthogonalize(g, dtype=torch.float16)
    assert half.dtype == torch.float32 and float((half - exact).norm() / exact.norm()) < 1e-2


def test_batched_orthogonalize_equals_one_matrix_at_a_time():
    g = torch.randn(5, 40, 24, generator=torch.Generator().manual_seed(4))  # tall: iterates on the transpose
    batched = orthogonalize(g)
    single = torch.stack([orthogonalize(m) for m in g])
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-6)


def _model(**overrides):
    """A tiny tscale model; `overrides`: ModelConfig fields (its defaults otherwise)."""
    torch.manual_seed(0)
    return build_model(ModelConfig(n_layer=2, n_head=2, d_model=32, seq_len=16, vocab_size=64, eos_id=0, window=4,
                                   global_every=2, **overrides))


def test_groups_and_rates():
    model = _model(tie_embeddings=False)
    cfg = OptimConfig(name="muon", lr=1e-3, muon_lr=0.02, embed_lr=0.05, head_lr=0.004, scalar_lr=0.01)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    assert isinstance(opt, Muon)
    names = {id(p): n for n, p in model.named_parameters()}
    kinds = {names[id(p)]: (g["kind"], round(g["lr"] * g["lr_scale"], 6)) for g in opt.param_groups for p in g["params"]}
    assert kinds["blocks.0.attn.qkv.weight"] == ("muon", 0.02)
    assert kinds["blocks.1.mlp.proj.weight"] == ("muon", 0.02)
    assert kinds["wte.weight"] == ("adam", 0.05)
    assert kinds["lm_head.weight"] == ("adam", 0.004)
    assert kinds["blocks.0.norm_1.weight"] == ("adam", 0.01)
    assert len(kinds) == len(list(model.parameters()))
    with pytest.raises(UserError, match="1-bit Adam"):
        build_optimizer(model, cfg, torch.device("cpu"), freeze_variance_at=10)


def test_a_tied_embedding_trains_once_at_the_heads_rate():
    model = _model(tie_embeddings=True)
    cfg = OptimConfig(name="muon", lr=1e-3, muon_lr=0.02, embed_lr=0.05, head_lr=0.004, scalar_lr=0.01)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    shared = [(g["kind"], round(g["lr"] * g["lr_scale"], 6)) for g in opt.param_groups for p in g["params"]
              if p is model.wte.weight]
    assert shared == [("adam", 0.004)]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


@pytest.mark.parametrize("setting,device,triton,compiled", [
    ("auto", "cpu", True, False), ("auto", "cuda", True, True), ("auto", "cuda", False, False),
    (False, "cuda", True, False), (True, "cpu", False, True)])
def test_compile_step_auto_compiles_on_a_gpu_with_triton_only(setting, device, triton, compiled, monkeypatch):
    """optim.compile_step = "auto" (the default) compiles Muon's update for a CUDA device whose torch.compile can
    generate kernels, not for the CPU; true and false are obeyed as given."""
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: triton)
    cfg = OptimConfig(name="muon", compile_step=setting)
    opt = build_optimizer(_model(), cfg, torch.device(device))
    assert (opt._compiled_update is not None) == compiled
    assert OptimConfig().compile_step == "auto"


def _steps(model, opt, batches):
    losses = []
    for x in batches:
        loss = mean_loss(model(x[:, :-1]), x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_state_dict_round_trip_and_loss_goes_down():
    cfg = OptimConfig(name="muon", lr=3e-3)
    data = torch.randint(1, 64, (4, 17), generator=torch.Generator().manual_seed(1))
    batches = [data] * 30
    a = _model()
    opt_a = build_optimizer(a, cfg, torch.device("cpu"))
    losses = _steps(a, opt_a, batches[:10])
    b = _model()
    b.load_state_dict(a.state_dict())
    opt_b = build_optimizer(b, cfg, torch.device("cpu"))
    saved = io.BytesIO()
    torch.save(opt_a.state_dict(), saved)  # as a checkpoint does: state_dict() holds live tensors
    opt_b.load_state_dict(torch.load(io.BytesIO(saved.getvalue())))
    losses += _steps(a, opt_a, batches[10:])
    _steps(b, opt_b, batches[10:])
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert losses[-1] < losses[0] - 1.0


def test_trapezoid_schedule():
    cfg = OptimConfig(lr=1.0, warmup_steps=2, decay="trapezoid", decay_frac=0.5, min_lr_ratio=0.1)
    assert [round(lr_at(s, 10, cfg), 3) for s in range(10)] == [0.5, 1.0, 1.0, 1.0, 1.0, 0.82, 0.64, 0.46, 0.28, 0.1]


def _losses(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def test_exact_resume_with_muon(tokens, tmp_path):
    eos = TokenFolder(tokens).eos_id
    args = [*TINY, f'data.tokens="{tokens}"', f"model.eos_id={eos}", "train.steps=24", "train.ckpt_every=8"]
    straight = train_run(load_config(None, args), tmp_path / "a", quiet=True)

    def stop_at_12(step, model):
        if step == 12:
            os.kill(os.getpid(), signal.SIGTERM)

    first = train_run(load_config(None, args), tmp_path / "b", quiet=True, on_step=stop_at_12)
    assert first.stopped_early and first.step == 12
    state = load_train_state(open_checkpoint(tmp_path / "b"))
    assert any("momentum_buffer" in s for s in state["optimizer"]["state"].values())  # Muon did train
    resumed = train_run(load_config(tmp_path / "b" / "config.toml"), tmp_path / "b", resume=True, quiet=True)
    assert resumed.step == straight.step == 24
    assert _losses(tmp_path / "b") == _losses(tmp_path / "a")
    a = safetensors.torch.load_file(str(straight.checkpoint / "model.safetensors"))
    b = safetensors.torch.load_file(str(resumed.checkpoint / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
