"""train.compile_block_once: one trace of a transformer block serves every block, with the same losses and gradients."""

import pytest
import torch

from tscale.config import ModelConfig, load_config
from tscale.errors import UserError
from tscale.model import build_model

SHAPES = {"gpt2": {}, "tscale": {"head_dim": 16, "window": 8, "global_every": 2}}


def _model(arch: str, n_layer: int):
    torch.manual_seed(0)
    return build_model(ModelConfig(arch=arch, n_layer=n_layer, n_head=2, d_model=32, seq_len=32, vocab_size=128,
                                   eos_id=0, **SHAPES[arch]))


def _compiled_step(model, idx, once: bool, backend: str = "aot_eager"):
    """(loss, gradients, ops traced by dynamo) of one compiled forward + backward (bf16 autocast on a GPU)."""
    model.compile_block_once = once
    model.zero_grad()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=idx.is_cuda):
        loss = torch.compile(lambda i: model(i, loss_targets=i), backend=backend, fullgraph=True)(idx)
    loss.backward()
    captured = torch._dynamo.utils.counters["stats"]["calls_captured"]
    return loss.detach().float(), [p.grad.float().clone() for p in model.parameters()], captured


@pytest.mark.parametrize("arch", list(SHAPES))
def test_blocks_compiled_once_train_as_the_whole_graph_does(arch):
    model = _model(arch, 4)
    idx = torch.randint(1, 128, (2, 32))
    idx[:, 10] = 0  # a document boundary (eos) inside each row
    loss_full, grads_full, _ = _compiled_step(model, idx, once=False)
    loss_once, grads_once, _ = _compiled_step(model, idx, once=True)
    torch.testing.assert_close(loss_once, loss_full, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads_once, grads_full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert sum(g.abs().sum() for g in grads_once) > 0


@pytest.mark.parametrize("arch", list(SHAPES))
def test_tracing_work_does_not_grow_with_depth(arch):
    idx = torch.randint(1, 128, (2, 32))
    captured = {(n, once): _compiled_step(_model(arch, n), idx, once)[2] for n in (2, 6) for once in (False, True)}
    assert captured[6, False] > captured[2, False] + 20  # every block traced again
    assert captured[6, True] <= captured[2, True] + 8  # the block traced once (tscale: once per window kind)


def test_eager_calls_are_plain_calls():
    model = _model("tscale", 3)
    idx = torch.randint(1, 128, (2, 32))
    with torch.no_grad():
        plain = model(idx)
        model.compile_block_once = True
        torch.testing.assert_close(model(idx), plain, rtol=0, atol=0)


def test_config_says_what_compile_block_once_needs():
    assert load_config(None, ["train.compile=true", "train.compile_block_once=true"]).train.compile_block_once
    with pytest.raises(UserError, match="needs train.compile = true"):
        load_config(None, ["train.compile_block_once=true"])
    with pytest.raises(UserError, match='train.attention = "auto"'):
        load_config(None, ["train.compile=true", "train.compile_block_once=true", 'train.attention="fa2"'])


def test_torch_versions_read_for_the_autograd_function_check():
    from tscale.model.block_region import _major_minor

    assert _major_minor("2.11.0+cu130") == (2, 11)
    assert _major_minor("2.13.0.dev20261101+cpu") == (2, 13)
    assert _major_minor("3.0rc1") == (3, 0)


def test_traced_recipes_refused_where_torch_cannot_compile_them_once(monkeypatch, tmp_path, tiny_corpus):
    """On a torch whose dynamo fails on an autograd.Function inside the region (2.11), training says so in one
    line before compiling; the custom-op recipes are not affected."""
    from tscale.data.tokenize import tokenize_corpus
    from tscale.model import block_region
    from tscale.train.loop import train_run

    tokens = tmp_path / "tokens"
    tokenize_corpus([tiny_corpus], tokens, vocab_size=300, quiet=True)
    monkeypatch.setattr(block_region, "HOLDS_AUTOGRAD_FUNCTIONS", False)
    args = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.seq_len=16", "train.batch_size=2",
            "train.steps=1", "train.eval_every=0", "train.ckpt_every=0", "train.compile=true",
            "train.compile_block_once=true", 'train.device="cpu"', f'data.tokens="{tokens}"']
    with pytest.raises(UserError, match=r'precision.recipe = "int8_switchback" needs torch >= 2.13'):
        train_run(load_config(None, [*args, 'precision.recipe="int8_switchback"']), tmp_path / "refused", quiet=True)
    assert not (tmp_path / "refused" / "metrics.jsonl").exists()


@pytest.mark.parametrize("recipe", ["int8_switchback", "fp8_tensorwise"])
def test_low_precision_blocks_compile_once_too(recipe):
    """The switchback recipe's traced quantisation and the custom op of the others inside the one region."""
    from tscale.model import block_region
    from tscale.precision import convert_linears
    from tscale.precision.recipes import get_recipe

    if get_recipe(recipe).in_graph and not block_region.HOLDS_AUTOGRAD_FUNCTIONS:
        pytest.skip(f"torch {torch.__version__} cannot compile a traced recipe once per block (training refuses it)")
    model = _model("gpt2", 3)
    convert_linears(model, recipe)
    idx = torch.randint(1, 128, (2, 32))
    loss_full, grads_full, _ = _compiled_step(model, idx, once=False)
    loss_once, grads_once, _ = _compiled_step(model, idx, once=True)
    torch.testing.assert_close(loss_once, loss_full, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads_once, grads_full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", list(SHAPES))
def test_cuda_blocks_compiled_once_by_inductor_match_the_whole_graph(arch):
    """Inductor's code for one block, reused: the same bf16 step as the whole-step graph, up to rounding."""
    model = _model(arch, 4).cuda()
    idx = torch.randint(1, 128, (2, 32), device="cuda")
    idx[:, 10] = 0
    loss_full, grads_full, _ = _compiled_step(model, idx, once=False, backend="inductor")
    loss_once, grads_once, _ = _compiled_step(model, idx, once=True, backend="inductor")
    torch.testing.assert_close(loss_once, loss_full, rtol=1e-2, atol=1e-2)
    for a, b in zip(grads_once, grads_full):
        assert ((a - b).norm() / b.norm().clamp_min(1e-12)).item() < 0.05
