"""The tscale architecture: attention op (reference, FlexAttention, custom op), masks, sink, KV cache, switches."""

import json
import math

import pytest
import torch
from helpers_attention import doc_ids

from tscale.config import ModelConfig, load_config
from tscale.data.shards import TokenFolder
from tscale.data.tokenize import tokenize_corpus
from tscale.errors import UserError
from tscale.model import build_model
from tscale.model.tscale_lm import apply_rope, layer_window, rope_tables
from tscale.ops.attention import _attention_op, attention, attention_flex, attention_reference
from tscale.train.loop import train_run

TINY = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.seq_len=32", "train.batch_size=4",
        "train.eval_every=0", "train.ckpt_every=0", "train.log_every=1", "optim.warmup_steps=5", "optim.lr=3e-3",
        "model.window=8", "model.global_every=2"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, shakespeare_jsonl):
    out = tmp_path_factory.mktemp("tok") / "tokens"
    tokenize_corpus([shakespeare_jsonl], out, vocab_size=512, quiet=True)
    return out


def _qkv(B=2, H=2, Tq=40, Tk=40, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=dtype)
    k, v = (torch.randn(B, H, Tk, D, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v


def _docs(B, T, layout, seed=0):
    return doc_ids(B, T, layout, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("window", [0, 1, 7])
@pytest.mark.parametrize("sink", [False, True])
def test_flex_matches_reference(window, sink):
    q, k, v = _qkv()
    for layout in ("none", "random", "each"):
        docs = _docs(2, 40, layout)
        ref = attention_reference(q, k, v, window=window, doc_ids=docs, sink=sink, scale=0.3)
        flex = attention_flex(q, k, v, window=window, doc_ids=docs, sink=sink, scale=0.3)
        torch.testing.assert_close(flex, ref, atol=2e-5, rtol=1e-4)
    q, k, v = _qkv(Tq=3, Tk=40)  # decoding: the queries are the last 3 positions
    docs = _docs(2, 40, "random")
    ref = attention_reference(q, k, v, window=window, doc_ids=docs, sink=sink, scale=0.3)
    torch.testing.assert_close(attention_flex(q, k, v, window=window, doc_ids=docs, sink=sink, scale=0.3), ref,
                               atol=2e-5, rtol=1e-4)


def _grads(fn, q, k, v, g):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), g))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="FlexAttention backward needs CUDA"))])
def test_flex_backward_matches_reference(device):
    """On CUDA flex runs its own backward; on CPU it has none and attention_flex falls back to the reference."""
    q, k, v = (t.to(device) for t in _qkv(Tq=64, Tk=64))
    g = torch.randn_like(q)
    docs = _docs(2, 64, "random").to(device)
    kw = dict(window=9, doc_ids=docs, sink=True, scale=0.25)
    ref = _grads(lambda a, b, c: attention_reference(a, b, c, **kw), q, k, v, g)
    flex = _grads(lambda a, b, c: attention_flex(a, b, c, **kw), q, k, v, g)
    for a, b in zip(flex, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_custom_op_backward_and_compile():
    q, k, v = _qkv(Tq=24, Tk=24, D=8, dtype=torch.float64)
    docs = _docs(2, 24, "random", seed=3)
    g = torch.randn_like(q)
    for window, sink in [(0, True), (5, False), (5, True)]:
        kw = dict(window=window, doc_ids=docs, sink=sink, scale=0.4)
        ref = _grads(lambda a, b, c: attention_reference(a, b, c, **kw), q, k, v, g)
        op = _grads(lambda a, b, c: attention(a, b, c, **kw), q, k, v, g)
        for a, b in zip(op, ref):
            torch.testing.assert_close(a, b)
    torch.library.opcheck(_attention_op, (q, k, v, docs, 5, True, 0.4), test_utils=("test_schema", "test_faketensor"))

    def fn(a, b, c):
        return attention(a, b, c, window=5, doc_ids=docs, sink=True, scale=0.4)

    compiled = _grads(torch.compile(fn, backend="aot_eager", fullgraph=True), q, k, v, g)
    for a, b in zip(compiled, _grads(fn, q, k, v, g)):
        torch.testing.assert_close(a, b)


def test_masks_hide_other_documents_and_old_keys():
    q, k, v = _qkv(B=1, Tq=30, Tk=30)
    docs = torch.tensor([[0] * 10 + [1] * 12 + [2] * 8])
    p = 20  # a query of document 1 (positions 10..21)
    base = attention(q, k, v, window=6, doc_ids=docs, sink=True, scale=0.3)[0, :, p]
    for j, visible in [(9, False), (14, False), (15, True), (20, True), (21, False), (25, False)]:
        k2, v2 = k.clone(), v.clone()
        k2[0, :, j] += 1.0
        v2[0, :, j] += 1.0
        out = attention(q, k2, v2, window=6, doc_ids=docs, sink=True, scale=0.3)[0, :, p]
        assert torch.equal(out, base) != visible, f"key {j} for query {p}"


def test_sink_is_softmax_plus_one():
    q, k, v = _qkv(B=1, H=1, Tq=12, Tk=12, dtype=torch.float64)
    s = (q @ k.transpose(-1, -2)) * 0.5  # (1, 1, T, T)
    e = s.exp().tril()
    expected = (e @ v) / (1 + e.sum(-1, keepdim=True))
    torch.testing.assert_close(attention(q, k, v, window=0, doc_ids=None, sink=True, scale=0.5), expected)
    plain = torch.softmax(s.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), -math.inf), -1) @ v
    torch.testing.assert_close(attention(q, k, v, window=0, doc_ids=None, sink=False, scale=0.5), plain)


def _model(**kw) -> torch.nn.Module:
    fields = dict(n_layer=3, n_head=2, d_model=32, seq_len=48, vocab_size=100, eos_id=7, window=5, global_every=2,
                  zero_init=False)
    torch.manual_seed(0)
    return build_model(ModelConfig(**{**fields, **kw})).double().eval()


@pytest.mark.parametrize("switches", [{}, {"rope": False, "sink": False}, {"window": 0, "doc_mask": False}])
def test_kv_cache_decoding_equals_full_forward(switches):
    model = _model(**switches)
    idx = torch.randint(0, 100, (2, 40), generator=torch.Generator().manual_seed(1))
    idx[idx == 7] = 8
    idx[0, 10], idx[1, 3], idx[1, 20], idx[1, 21] = 7, 7, 7, 7
    full = model(idx)  # (B, T, V)
    cache = model.new_cache(2, 48, "cpu", torch.float64)
    pieces = [model(idx[:, :13], cache), model(idx[:, 13:17], cache)] + [model(idx[:, t:t + 1], cache)
                                                                        for t in range(17, 40)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full)


def test_model_logits_never_see_another_document_or_past_the_window():
    model = _model(window=4, global_every=0, n_layer=2)  # reach: 2 layers x 3 positions back
    idx = torch.randint(8, 100, (1, 40), generator=torch.Generator().manual_seed(2))
    idx[0, 15] = 7  # document 1 runs from position 15 on
    base = model(idx)
    other = idx.clone()
    other[0, 14] = 50 if idx[0, 14] != 50 else 51  # last token of document 0
    assert torch.equal(model(other)[0, 15:], base[0, 15:])
    assert not torch.equal(model(other)[0, 14], base[0, 14])
    far = idx.clone()
    far[0, 30] = 50 if idx[0, 30] != 50 else 51
    assert torch.equal(model(far)[0, 37:], base[0, 37:])  # 37 - 30 > 6
    assert not torch.equal(model(far)[0, 36], base[0, 36])


def test_flops_count_windows_and_config_checks():
    cfg = ModelConfig(n_layer=4, n_head=2, head_dim=8, d_model=32, seq_len=64, vocab_size=100, eos_id=0,
                      window=16, global_every=2)
    assert [layer_window(cfg, i) for i in range(4)] == [16, 0, 16, 0]
    model = build_model(cfg)
    assert model.matmul_params() == 4 * (32 * 48 + 16 * 32 + 2 * 32 * 128) + 32 * 128
    assert model.flops_per_token(64) == 6 * model.matmul_params() + 12 * 16 * (16 + 64 + 16 + 64)
    assert model.flops_per_token(8) == 6 * model.matmul_params() + 12 * 16 * 8 * 4
    assert (ModelConfig().n_head, ModelConfig().head_dim) == (6, 128)
    assert (ModelConfig(arch="gpt2").n_head, ModelConfig(arch="gpt2").head_dim) == (12, 64)
    for bad, words in [(["model.d_model=100"], "not a multiple of model.head_dim 128"),
                       (["model.arch=\"gpt2\"", "model.n_head=4", "model.head_dim=8"], "needs model.n_head"),
                       (["model.n_head=3", "model.head_dim=5"], "even model.head_dim"),
                       (["model.vocab_size=50", "model.eos_id=50"], "eos_id 50 is outside")]:
        with pytest.raises(UserError, match=words):
            load_config(None, bad)
    with pytest.raises(ValueError, match="eos_id must be resolved"):
        build_model(ModelConfig(vocab_size=100, d_model=128))


def test_presets_build():
    cfg = load_config("configs/tscale-124m.toml", ["model.vocab_size=50257", "model.eos_id=50256"])
    with torch.device("meta"):
        model = build_model(cfg.model)
    assert sum(p.numel() for p in model.parameters()) == 123_587_328
    assert load_config("configs/gpt2-124m.toml").model.arch == "gpt2"
    assert load_config("configs/tscale-tiny-cpu.toml").model.arch == "tscale"


SWITCHES = ["", "model.rope=false", "model.norm=\"layer\"", "model.qk_norm=false", "model.bias=true",
            "model.mlp=\"gelu\"", "model.zero_init=false", "model.tie_embeddings=false", "model.logit_softcap=0",
            "model.sink=false", "model.doc_mask=false", "model.window=0", "model.global_every=0",
            "optim.name=\"muon\"", "optim.decay=\"trapezoid\""]


def test_every_switch_trains(tokens, tmp_path):
    eos = TokenFolder(tokens).eos_id
    for i, switch in enumerate(SWITCHES):
        cfg = load_config(None, [*TINY, f'data.tokens="{tokens}"', f"model.eos_id={eos}", "train.steps=3",
                                 *([switch] if switch else [])])
        result = train_run(cfg, tmp_path / f"run{i}", quiet=True)
        assert result.step == 3 and math.isfinite(result.last_loss), switch


def test_tscale_with_muon_learns(tokens, tmp_path):
    eos = TokenFolder(tokens).eos_id
    cfg = load_config(None, [*TINY, f'data.tokens="{tokens}"', f"model.eos_id={eos}", "train.steps=40",
                             'optim.name="muon"', 'optim.decay="trapezoid"'])
    train_run(cfg, tmp_path / "run", quiet=True)
    curve = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(curve[-5:]) / 5 < sum(curve[:5]) / 5 - 0.5


def test_tied_head_starts_with_logits_of_order_one():
    """A tied embedding doubles as the head: its init must not push the first logits into the soft-cap."""
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, head_dim=16, d_model=256, seq_len=16, vocab_size=300, eos_id=0,
               arch="tscale", logit_softcap=30.0)
    tied = build_model(ModelConfig(**cfg, tie_embeddings=True)).eval()
    idx = torch.randint(1, 300, (2, 16))  # (B, T)
    with torch.no_grad():
        logits = tied(idx)  # (B, T, V)
    assert tied.lm_head.weight is tied.wte.weight
    assert 0.2 < logits.std().item() < 3.0


def test_rope_rotates_each_pair_by_its_positions_angle():
    """apply_rope on rope_tables against the rotation written out in float64: pair (i, i + D/2) of the vector at
    position p turns by p * theta^(-2i/D); so scores depend on the positions' difference only."""
    T, H, D, theta = 40, 3, 16, 10000.0
    x = torch.randn(2, T, H, D, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(T, D, theta)
    got = apply_rope(x, cos[:, None], sin[:, None])  # (B, T, H, D)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    c, s_ = angle.cos()[:, None], angle.sin()[:, None]  # (T, 1, D/2)
    x1, x2 = x.double()[..., :D // 2], x.double()[..., D // 2:]
    want = torch.cat([x1 * c - x2 * s_, x1 * s_ + x2 * c], dim=-1)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    # one query vector and one key vector placed at every position: their score depends on the distance only
    rq = apply_rope(x[0, 3, 0].expand(1, T, 1, D), cos[:, None], sin[:, None])[0, :, 0]  # (T, D)
    rk = apply_rope(x[1, 9, 0].expand(1, T, 1, D), cos[:, None], sin[:, None])[0, :, 0]
    scores = rq @ rk.T  # (T, T)
    for shift in (1, 5, 17):
        diagonal = scores.diagonal(shift)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-4, rtol=1e-4)
