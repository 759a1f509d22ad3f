"""fp8 / int8: quantize and the scaled products, the low-precision linear layers, training recipes, inference modes."""

import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tscale.config import load_config
from tscale.ops import lowprec
from tscale.ops.lowprec import QMAX, fp8_mm, int8_mm, quantize, quantize_reference
from tscale.train.checkpoint import load_model
from tscale.precision import (INFER_MODES, LowPrecLinear, lowprec_matmul, QuantizedLinear, convert_linears, get_recipe,
                              quantize_for_inference)

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
# half a unit in the last place, relative (normal range), and the smallest subnormal step / 2, in units of the scale
REL_STEP = {E4M3: 2.0 ** -4, E5M2: 2.0 ** -3}
SUBNORMAL_HALF_STEP = {E4M3: 2.0 ** -10, E5M2: 2.0 ** -17}
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def rand(*shape, seed=0, device="cpu", dtype=torch.float32):
    """Random values, never zero, with row magnitudes spread over two decades."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    x = torch.where(x.abs() < 1e-3, torch.full_like(x, 1e-3), x)
    rows = 10 ** (torch.rand(shape[0], 1, generator=g) * 2 - 1)  # (M, 1) in [0.1, 10]
    return (x * rows).to(device=device, dtype=dtype)


def dequant(q, scale):
    return q.float() * scale


# ---- quantize -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [E4M3, E5M2, INT8])
@pytest.mark.parametrize("axis", [None, -1, 0])
def test_quantize_round_trip_error_is_within_half_a_step(dtype, axis):
    x = rand(48, 80, seed=1)
    q, scale = quantize_reference(x, dtype, axis)
    assert q.dtype == dtype and q.shape == x.shape
    assert scale.shape == {None: (), -1: (48, 1), 0: (1, 80)}[axis]
    err = (dequant(q, scale) - x).abs()
    if dtype == INT8:
        bound = scale / 2 * (1 + 1e-5)
    else:
        bound = torch.maximum(x.abs() * REL_STEP[dtype], scale * SUBNORMAL_HALF_STEP[dtype]) * (1 + 1e-5)
    assert (err <= bound).all()
    top = q.float().abs().amax() if axis is None else q.float().abs().amax(dim=axis)
    assert torch.equal(top, torch.full_like(top, QMAX[dtype]))  # the amax lands on the largest code


@pytest.mark.parametrize("dtype", [E4M3, INT8])
def test_rowwise_scales_beat_one_scale_on_rows_of_different_size(dtype):
    x = rand(32, 64, seed=2)
    x[::2] *= 1e-3  # every other row a thousand times smaller
    rel = {}
    for axis in (None, -1):
        q, s = quantize_reference(x, dtype, axis)
        rel[axis] = ((dequant(q, s) - x).norm(dim=1) / x.norm(dim=1)).max().item()  # worst row
    assert rel[-1] < 0.05 and rel[None] > 2 * rel[-1]


def test_quantize_saturates_clamps_and_handles_zero_rows():
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 4.0]])
    for dtype in (E4M3, E5M2, INT8):
        q, s = quantize_reference(x, dtype, -1)
        assert torch.equal(q[0].float(), torch.zeros(3)) and s[0, 0] > 0
        assert q[1].float().abs().max() == QMAX[dtype]
    q, s, q_t = quantize_reference(x, INT8, None, transpose=True)
    assert torch.equal(q_t, q.t().contiguous())


@pytest.mark.skipif(not lowprec._quantize_kernel_on("cpu"), reason="tscale._C built without the quantize op")
@pytest.mark.parametrize("dtype", [E4M3, E5M2, INT8])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
def test_cpu_quantize_kernel_equals_reference(dtype, in_dtype):
    x = rand(37, 53, seed=3, dtype=in_dtype)
    for axis in (None, -1, 0):
        for transpose in (False, True):
            got = torch.ops.tscale.quantize(x, dtype, axis, transpose)
            want = quantize_reference(x, dtype, axis, transpose)
            assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
            assert torch.equal(got[1], want[1])
            if transpose:
                assert torch.equal(got[2].view(torch.uint8), want[2].view(torch.uint8))


# ---- scaled products --------------------------------------------------------------------------------------


def test_products_equal_dequantise_then_matmul():
    a, b = rand(24, 64, seed=4), rand(40, 64, seed=5)  # (M, K), (N, K)
    for dtype, mm in ((E4M3, fp8_mm), (INT8, int8_mm)):
        for axis in (None, -1):
            qa, sa = quantize(a, dtype, axis)
            qb, sb = quantize(b, dtype, axis)
            sb_t = sb if sb.dim() == 0 else sb.t()
            got = mm(qa, qb.t(), sa, sb_t, torch.float32)  # (M, N)
            want = dequant(qa, sa) @ dequant(qb, sb).t()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
            full = a @ b.t()
            rel = ((got - full).norm() / full.norm()).item()
            assert rel < {(E4M3, None): 0.06, (E4M3, -1): 0.05, (INT8, None): 0.04, (INT8, -1): 0.01}[dtype, axis]


def test_product_shape_errors_are_clear():
    q = torch.zeros(4, 8, dtype=INT8)
    with pytest.raises(ValueError, match="expected"):
        int8_mm(q, q, torch.tensor(1.0), torch.tensor(1.0), torch.float32)
    with pytest.raises(ValueError, match="scale_a"):
        int8_mm(q, q.t(), torch.ones(3, 1), torch.tensor(1.0), torch.float32)


# ---- the low-precision matmul op and its autograd ---------------------------------------------------------

# recipe -> (forward, grad input, grad weight) relative error bounds against fp32 on random data
TOLERANCE = {
    "fp8_tensorwise": (0.06, 0.10, 0.10),  # e4m3 forward, e5m2 gradients
    "fp8_rowwise": (0.06, 0.06, 0.06),
    "int8_rowwise": (0.015, 1e-6, 1e-6),  # backward in high precision: exact
    "int8_rowwise+int8_backward": (0.015, 0.03, 0.03),  # per-column scales over rows of unequal size
    "fp8_tensorwise+fast_accum": (0.06, 0.10, 0.10),  # fast accumulation in the forward product
    "fp8_tensorwise+in_graph": (0.06, 0.10, 0.10),  # the same recipe as traceable torch ops
    "int8_switchback": (0.015, 0.03, 1e-6),  # rowwise forward and input gradient; weight gradient unquantised
    "fp8_switchback": (0.06, 0.06, 1e-6),
}


def _recipe(name):
    if name.endswith("int8_backward"):
        return get_recipe("int8_rowwise", True)
    if name.endswith("in_graph"):
        return get_recipe(name.split("+")[0], quantize_in_graph=True)
    if name.endswith("fast_accum"):
        return get_recipe(name.split("+")[0], fp8_fast_accum=True)
    return get_recipe(name)


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("name", list(TOLERANCE))
def test_function_forward_and_backward_match_fp32(name):
    x, w, g = rand(64, 96, seed=6), rand(48, 96, seed=7) * 0.05, rand(64, 48, seed=8)
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = lowprec_matmul(xa, wa, _recipe(name), torch.float32)
    y.backward(g)
    xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
    (xb @ wb.t()).backward(g)
    fwd, gx, gw = TOLERANCE[name]
    errors = _rel(y, xb @ wb.t()), _rel(xa.grad, xb.grad), _rel(wa.grad, wb.grad)
    assert errors[0] < fwd and errors[1] < gx and errors[2] < gw, errors
    assert xa.grad.dtype == wa.grad.dtype == torch.float32


def test_layer_under_autocast_computes_in_bf16_and_keeps_fp32_master_grads():
    torch.manual_seed(0)
    layer = LowPrecLinear(nn.Linear(32, 16), get_recipe("fp8_rowwise"))
    x = torch.randn(2, 8, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)  # (B, T, N)
    assert y.shape == (2, 8, 16) and y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.dtype == layer.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    assert layer.bias.grad is not None


def test_convert_linears_keeps_parameters_names_and_exclusions():
    from tscale.config import ModelConfig
    from tscale.model import build_model

    model = build_model(ModelConfig(n_layer=2, n_head=2, d_model=32, seq_len=16, vocab_size=100, eos_id=0))
    params = dict(model.named_parameters())
    names = convert_linears(model, "int8_rowwise", exclude=["wte", "lm_head", "attn.proj"])
    assert names == ["blocks.0.attn.qkv", "blocks.0.mlp.fc", "blocks.0.mlp.proj",
                     "blocks.1.attn.qkv", "blocks.1.mlp.fc", "blocks.1.mlp.proj"]
    assert all(p is params[n] for n, p in model.named_parameters())
    assert type(model.lm_head) is nn.Linear and isinstance(model.blocks[0].mlp.fc, LowPrecLinear)
    assert convert_linears(model, "fp8_tensorwise", include=["*.mlp.*"]) == []  # already converted
    assert convert_linears(build_model(model.cfg), "bf16") == []
    model(torch.randint(0, 100, (2, 16))).sum().backward()


def test_fast_accumulation_reaches_the_forward_product_only(monkeypatch):
    seen = []
    real = lowprec._product

    def spy(kind, a, b, scale_a, scale_b, out_dtype, fast_accum=False):
        seen.append((tuple(a.shape), fast_accum))
        return real(kind, a, b, scale_a, scale_b, out_dtype, fast_accum)

    monkeypatch.setattr(lowprec, "_product", spy)
    recipe = get_recipe("fp8_tensorwise", fp8_fast_accum=True)
    assert recipe.fast_accum and recipe.name == "fp8_tensorwise+fast_accum"
    layer = LowPrecLinear(nn.Linear(32, 16, bias=False), recipe)
    x = rand(8, 32, seed=16).requires_grad_()
    layer(x).backward(rand(8, 16, seed=17))
    assert seen == [((8, 32), True), ((8, 16), False), ((16, 8), False)]  # forward, grad input, grad weight


def test_fast_accumulation_needs_an_fp8_recipe():
    from tscale.errors import UserError

    with pytest.raises(UserError, match="fp8_fast_accum"):
        get_recipe("int8_rowwise", fp8_fast_accum=True)
    with pytest.raises(UserError, match="fp8_fast_accum needs an fp8 recipe"):
        load_config(None, ['precision.recipe="int8_rowwise"', "precision.fp8_fast_accum=true"])
    assert load_config(None, ['precision.recipe="fp8_rowwise"', "precision.fp8_fast_accum=true"]).precision.fp8_fast_accum


def test_in_graph_route_computes_what_the_custom_op_computes():
    """Same quantised operands, same three products: the two routes of fp8_tensorwise agree to fp32 rounding."""
    x, w, g = rand(48, 64, seed=20), rand(80, 64, seed=21) * 0.05, rand(48, 80, seed=22)
    results = []
    for recipe in (get_recipe("fp8_tensorwise"), get_recipe("fp8_tensorwise", quantize_in_graph=True)):
        xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = lowprec_matmul(xa, wa, recipe, torch.float32)
        y.backward(g)
        results.append((y, xa.grad, wa.grad))
    assert results[1][0].abs().sum() > 0
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, dtype", [("int8_switchback", INT8), ("fp8_switchback", E4M3)])
def test_switchback_products_are_the_recipes(name, dtype):
    """Forward and input gradient from rowwise-quantised operands, weight gradient from the unquantised ones."""
    x, w, g = rand(48, 64, seed=23), rand(80, 64, seed=24) * 0.05, rand(48, 80, seed=25)
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = lowprec_matmul(xa, wa, get_recipe(name), torch.float32)  # (48, 80)
    y.backward(g)
    xq, sx = quantize_reference(x, dtype, -1)  # (48, 64), (48, 1)
    wq, sw = quantize_reference(w, dtype, -1)  # (80, 64), (80, 1)
    torch.testing.assert_close(y, dequant(xq, sx) @ dequant(wq, sw).t(), rtol=1e-5, atol=1e-5)
    gq, sg = quantize_reference(g, dtype, -1)  # (48, 80), (48, 1)
    wq_t, sw_t = quantize_reference(w.t().contiguous(), dtype, -1)  # (64, 80), (64, 1): per input channel
    torch.testing.assert_close(xa.grad, dequant(gq, sg) @ dequant(wq_t, sw_t).t(), rtol=1e-5, atol=1e-5)
    assert _rel(xa.grad, g @ w) > 1e-4  # the input gradient did go through the quantised operands
    torch.testing.assert_close(wa.grad, g.t() @ x, rtol=1e-5, atol=1e-5)


def test_switchback_quantisation_fuses_into_the_norm_and_activation_kernels():
    """What the switchback recipes are for: Inductor (its CPU code here) casts each row where the norm or the
    activation function writes it, instead of in passes of its own."""
    import re

    from torch._inductor.utils import run_and_get_code

    from tscale.config import ModelConfig
    from tscale.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gpt2", n_layer=1, n_head=2, d_model=64, seq_len=32, vocab_size=128, eos_id=0))
    convert_linears(model, "int8_switchback")
    torch._dynamo.reset()
    forward = torch.compile(lambda i: model(i, loss_targets=i))
    _, code = run_and_get_code(forward, torch.randint(0, 128, (2, 32)))
    kernels = set(re.findall(r"cpp_fused\w*", "\n".join(code)))  # Inductor names a kernel after the ops it fuses
    assert any("native_layer_norm" in k and "round" in k for k in kernels), sorted(kernels)
    assert any("gelu" in k and "round" in k for k in kernels), sorted(kernels)


def test_switchback_recipes_always_quantise_in_the_graph():
    from tscale.errors import UserError

    recipe = get_recipe("fp8_switchback", fp8_fast_accum=True)
    assert recipe.in_graph and not recipe.lowp_weight_grad and recipe.fast_accum and recipe.rowwise
    with pytest.raises(UserError, match="always quantise in the graph"):
        get_recipe("int8_switchback", quantize_in_graph=True)
    assert load_config(None, ['precision.recipe="int8_switchback"']).precision.recipe == "int8_switchback"


def test_in_graph_route_needs_fp8_tensorwise():
    from tscale.errors import UserError

    assert get_recipe("fp8_tensorwise", quantize_in_graph=True).in_graph
    with pytest.raises(UserError, match="quantize_in_graph"):
        get_recipe("int8_rowwise", quantize_in_graph=True)
    with pytest.raises(UserError, match="quantize_in_graph needs"):
        load_config(None, ['precision.recipe="fp8_rowwise"', "precision.quantize_in_graph=true"])


def _eager_and_compiled_grads(model, idx, backend: str) -> tuple[list, list]:
    """The parameters' gradients of one bf16-autocast step of `model` on idx (B, T), eager and torch.compile'd."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    grads = []
    for run in (model, compiled):
        model.zero_grad()
        with torch.autocast(idx.device.type, dtype=torch.bfloat16):
            loss = run(idx).float().square().mean()  # (B, T, V) logits -> ()
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads[0], grads[1]


@pytest.mark.parametrize("name", list(TOLERANCE))
def test_converted_model_compiles_as_one_graph_and_matches_eager(name):
    """No graph break and one compilation for all the layers' shapes: the products' dispatch stays inside the op."""
    from tscale.config import ModelConfig
    from tscale.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gpt2", n_layer=2, n_head=2, d_model=32, seq_len=16, vocab_size=100, eos_id=0))
    convert_linears(model, _recipe(name))
    idx = torch.randint(0, 100, (2, 16))
    eager, compiled = _eager_and_compiled_grads(model, idx, backend="aot_eager")
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e, rtol=0, atol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


# ---- training ----------------------------------------------------------------------------------------------

TINY = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.seq_len=32", "train.batch_size=4",
        "train.eval_every=0", "train.ckpt_every=0", "train.log_every=1", "optim.warmup_steps=3", "optim.lr=1e-2"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, shakespeare_jsonl):
    from tscale.data.tokenize import tokenize_corpus

    out = tmp_path_factory.mktemp("lowprec") / "tokens"
    tokenize_corpus([shakespeare_jsonl], out, vocab_size=512, quiet=True)
    return out


def _train(tokens, run, *extra):
    from tscale.train.loop import train_run

    seen = {}

    def on_step(step, model):
        seen["types"] = {type(m).__name__ for m in model.modules()}
        seen["dtypes"] = {p.dtype for p in model.parameters()}

    cfg = load_config(None, [*TINY, f'data.tokens="{tokens}"', *extra])
    result = train_run(cfg, run, quiet=True, on_step=on_step)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return result, [r["loss"] for r in records if "loss" in r], seen


@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "fp8_rowwise", "int8_rowwise", "int8_backward", "fp8_in_graph",
                                    "int8_switchback"])
def test_training_with_each_recipe_lowers_the_loss(tokens, tmp_path, recipe):
    extra = {"int8_backward": ['precision.recipe="int8_rowwise"', "precision.int8_backward=true"],
             "fp8_in_graph": ['precision.recipe="fp8_tensorwise"', "precision.quantize_in_graph=true"]}.get(
        recipe, [f'precision.recipe="{recipe}"'])
    result, loss, seen = _train(tokens, tmp_path / "run", "train.steps=10", *extra)
    assert sum(loss[-3:]) / 3 < sum(loss[:3]) / 3 - 0.3
    assert "LowPrecLinear" in seen["types"] and seen["dtypes"] == {torch.float32}  # fp32 master weights
    plain, _ = load_model(result.checkpoint)  # same weight names: the checkpoint loads into a plain model
    assert type(plain.blocks[0].mlp.fc) is nn.Linear


# ---- inference ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tokens, tmp_path_factory):
    """A tiny model trained in fp32 for 40 steps: its run folder."""
    run = tmp_path_factory.mktemp("lowprec-run") / "run"
    _train(tokens, run, "train.steps=40")
    return run


def test_quantized_linear_modes_match_the_float_layer():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    x = torch.randn(5, 7, 64)
    want = linear(x)
    for mode, tol in (("int8-w", 0.01), ("fp8-w", 0.05), ("int8", 0.02), ("fp8", 0.07)):
        model = nn.Sequential(linear)
        quantize_for_inference(model, mode, exclude=())
        assert isinstance(model[0], QuantizedLinear)
        assert _rel(model(x).detach(), want.detach()) < tol, mode


def test_weight_only_layers_compute_with_their_dequantised_weights():
    """int8-w / fp8-w: the product with weight * per-channel scale, in float32 and under bf16 autocast."""
    torch.manual_seed(1)
    linear = nn.Linear(96, 40)
    x = torch.randn(3, 5, 96)
    for mode in ("int8-w", "fp8-w"):
        model = nn.Sequential(linear)
        quantize_for_inference(model, mode, exclude=())
        layer = model[0]
        want = F.linear(x, layer.qweight.float() * layer.w_scale, linear.bias)  # (3, 5, 40)
        assert torch.allclose(layer(x), want, rtol=1e-5, atol=1e-5), mode
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = layer(x)
        assert got.dtype == torch.bfloat16 and _rel(got.float(), want) < 1e-2, mode


def test_greedy_generation_in_low_precision_mostly_matches(trained):
    from tscale.infer import Engine, GenerationParams, SamplingParams

    params = GenerationParams(max_new_tokens=8, sampling=SamplingParams(temperature=0.0))
    prompts = ["ROMEO:", "The king", "What say"]
    base = Engine.from_checkpoint(trained, "cpu")
    ids = [list(base.token_stream(base.encode_prompt(p), 8, params.sampling, None)) for p in prompts]
    for mode in ("int8-w", "fp8-w", "int8", "fp8"):
        eng = Engine.from_checkpoint(trained, "cpu", precision=mode)
        assert any(isinstance(m, QuantizedLinear) for m in eng.model.modules())
        got = [list(eng.token_stream(eng.encode_prompt(p), 8, params.sampling, None)) for p in prompts]
        assert all(g[0] == b[0] for g, b in zip(got, ids)), mode
        same = sum(a == b for g, i in zip(got, ids) for a, b in zip(g, i))
        assert same >= 0.6 * sum(len(i) for i in ids), mode


@pytest.mark.parametrize("precision", ["bf16", "int8-w"])
def test_linears_stored_in_bf16_give_what_autocast_gives(trained, precision):
    """The engine's GPU form: linear weights kept in bf16, the same logits under bf16 autocast, the embedding kept."""
    model, _ = load_model(trained, "cpu", precision)
    stored, _ = load_model(trained, "cpu", precision, linears_dtype=torch.bfloat16)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = model(idx), stored(idx)
    assert torch.equal(got, want)
    linears = [m for m in stored.modules() if type(m) is nn.Linear]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert stored.wte.weight.dtype == torch.float32 and stored.lm_head.weight is not stored.wte.weight


def test_quantized_head_is_its_own_copy_and_scores_close(trained, tokens, run_cli, tmp_path):
    """--quantize-head: the head becomes a QuantizedLinear, the embedding keeps its float32 weights."""
    from tscale.eval import evaluate_checkpoint
    from tscale.infer import Engine

    base, _ = load_model(trained, "cpu")
    eng = Engine.from_checkpoint(trained, "cpu", precision="int8", quantize_head=True)
    assert isinstance(eng.model.lm_head, QuantizedLinear)
    assert torch.equal(eng.model.wte.weight, base.wte.weight)
    r = evaluate_checkpoint(trained, tokens, "cpu", batch_size=16, max_tokens=1500, precision="int8",
                            quantize_head=True)
    kept = evaluate_checkpoint(trained, tokens, "cpu", batch_size=16, max_tokens=1500, precision="int8")
    assert r["quantize_head"] and not kept["quantize_head"]
    assert r["perplexity"] != kept["perplexity"] and abs(r["perplexity"] / kept["perplexity"] - 1) < 0.01
    code, out = run_cli("infer", trained, "--prompt", "x", "--quantize-head", "--device", "cpu")
    assert code == 2 and "--quantize-head" in out and "--precision" in out and len(out.strip().splitlines()) == 1


def test_eval_perplexity_of_each_mode_is_close_to_fp32(trained, tokens):
    from tscale.eval import evaluate_checkpoint

    base = evaluate_checkpoint(trained, tokens, "cpu", batch_size=16, max_tokens=1500)
    for mode, tol in (("int8-w", 0.01), ("fp8-w", 0.03), ("int8", 0.01), ("fp8", 0.03)):
        r = evaluate_checkpoint(trained, tokens, "cpu", batch_size=16, max_tokens=1500, precision=mode)
        assert r["precision"] == mode
        assert abs(r["perplexity"] / base["perplexity"] - 1) < tol, (mode, r["perplexity"], base["perplexity"])


def test_cli_precision_options(trained, tokens, tmp_path, run_cli):
    code, out = run_cli("eval", trained, "--tokens", tokens, "--max-tokens", 500, "--precision", "int8",
                        "--out", tmp_path / "eval.json", "--device", "cpu")
    assert code == 0, out
    assert json.loads((tmp_path / "eval.json").read_text())["precision"] == "int8"
    code, out = run_cli("infer", trained, "--prompt", "ROMEO:", "--max-new-tokens", 4, "--precision", "fp8-w",
                        "--device", "cpu")
    assert code == 0, out
    code, out = run_cli("infer", trained, "--prompt", "x", "--precision", "int4")
    assert code == 2 and "int4" in out
    assert set(INFER_MODES) == {"bf16", "int8-w", "fp8-w", "int8", "fp8"}


# ---- CUDA: kernels against the references (run on the GPU machine) -------------------------------------------


@CUDA
@pytest.mark.parametrize("mode", ["int8-w", "fp8"])
def test_cuda_layers_quantised_one_at_a_time_never_hold_the_whole_model(mode):
    """A model on the CPU converted for the GPU: the GPU holds one float32 layer at a time, not all of them."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])  # 8 x 16 MiB of float32 weights
    x = torch.randn(4, 2048)
    want = nn.Sequential(*[copy.deepcopy(layer) for layer in model])
    quantize_for_inference(want, mode, exclude=())
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    quantize_for_inference(model, mode, exclude=(), device="cuda")
    model.to("cuda")
    peak = torch.cuda.max_memory_allocated() - before
    # 32 MiB of 1-byte weights, one 16 MiB float32 layer and its quantiser's temporaries; all the layers at once on
    # the GPU would be 128 MiB before any of them is quantised
    assert peak < 96 * 2**20, peak
    assert all(b.device.type == "cuda" for b in model.buffers())
    with torch.autocast("cuda", dtype=torch.bfloat16):  # as the engine runs it
        got = model(x.cuda()).float().cpu()
    assert _rel(got, want(x).detach()) < 0.05


@CUDA
@pytest.mark.parametrize("dtype", [E4M3, E5M2, INT8])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(37, 53), (256, 768), (64, 12800), (100, 72), (30, 64)])
def test_cuda_quantize_equals_reference(dtype, in_dtype, shape):
    """Odd (scalar kernels); model-like and a row too long to cache (vectorised); partial 64 x 64 tiles
    (vectorised); M not a multiple of 4 (vectorised, scalar when transposed)."""
    assert lowprec._quantize_kernel_on("cuda"), "tscale._C was built without the CUDA quantize kernel"
    x = rand(*shape, seed=9, device="cuda", dtype=in_dtype)
    for axis in (None, -1, 0):
        for transpose in (False, True):
            got = quantize(x, dtype, axis, transpose)
            want = quantize_reference(x.cpu(), dtype, axis, transpose)
            for g, w in zip(got, want):
                g = g.cpu()
                if g.dtype == torch.float32:
                    assert torch.equal(g, w)
                else:
                    assert (g.view(torch.uint8) != w.view(torch.uint8)).float().mean() < 1e-4


@CUDA
@pytest.mark.parametrize("dtype", [E4M3, E5M2, INT8])
def test_cuda_vectorised_quantize_equals_the_scalar_kernels(dtype, monkeypatch):
    x = rand(192, 1600, seed=15, device="cuda", dtype=torch.bfloat16)
    runs = {}
    for scalar in ("0", "1"):
        monkeypatch.setenv("TSCALE_QUANTIZE_SCALAR", scalar)
        runs[scalar] = [quantize(x, dtype, axis, transpose) for axis in (None, -1, 0) for transpose in (False, True)]
    for vec_out, scalar_out in zip(runs["0"], runs["1"]):
        for a, b in zip(vec_out, scalar_out):
            assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                               b.view(torch.uint8) if b.element_size() == 1 else b)


@CUDA
@pytest.mark.parametrize("name", list(TOLERANCE))
def test_cuda_function_matches_the_cpu_reference_path(name):
    x, w, g = rand(128, 256, seed=10), rand(192, 256, seed=11) * 0.05, rand(128, 192, seed=12)
    outs = {}
    for device in ("cpu", "cuda"):
        xa, wa = x.detach().to(device).requires_grad_(), w.detach().to(device).requires_grad_()  # fresh leaves
        y = lowprec_matmul(xa, wa, _recipe(name), torch.bfloat16)
        y.backward(g.to(device, torch.bfloat16))
        outs[device] = (y.float().cpu(), xa.grad.cpu(), wa.grad.cpu())
    for a, b in zip(outs["cuda"], outs["cpu"]):
        assert _rel(a, b) < 0.02  # same quantised operands; bf16 outputs and accumulation order differ


@CUDA
@pytest.mark.parametrize("name", ["int8_switchback", "fp8_switchback"])
def test_cuda_switchback_model_under_inductor_matches_eager(name):
    """Inductor folds the rowwise quantisation into its own kernels: same gradients as eager, up to rounding."""
    from tscale.config import ModelConfig
    from tscale.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gpt2", n_layer=2, n_head=2, d_model=128, seq_len=64, vocab_size=256,
                                    eos_id=0)).cuda()
    assert len(convert_linears(model, name)) == 8
    idx = torch.randint(0, 256, (4, 64), device="cuda")
    eager, compiled = _eager_and_compiled_grads(model, idx, backend="inductor")
    assert all(g.abs().sum() > 0 for g in compiled)
    # Inductor quantises the fp32 values inside its fused kernels where eager quantises their bf16 rounding
    # (it does not emulate the intermediate cast), so a value whose bf16 rounding crosses a rounding boundary
    # takes the neighbouring step. e4m3's steps are 2^-4 to 2^-3 of the value: ~2^-9 / 2^-4 = 3% of the values
    # move by one step, sqrt(0.03) x ~2^-3.5 = 1.5-2% of an operand's norm. int8's steps (1/127 of the row's
    # amax) are far finer. Measured on the H200 with fp8: 2.4%.
    bound = {"int8_switchback": 0.02, "fp8_switchback": 0.04}[name]
    for e, c in zip(eager, compiled):
        assert _rel(c, e) < bound


@CUDA
def test_cuda_fast_products_equal_the_references():
    a, b = rand(256, 768, seed=13, device="cuda"), rand(512, 768, seed=14, device="cuda")
    for dtype, mm, ref in ((E4M3, fp8_mm, lowprec.fp8_mm_reference), (INT8, int8_mm, lowprec.int8_mm_reference)):
        for axis in (None, -1):
            qa, sa = quantize(a, dtype, axis)
            qb, sb = quantize(b, dtype, axis)
            sb_t = sb if sb.dim() == 0 else sb.t()
            got = mm(qa, qb.t(), sa, sb_t, torch.bfloat16)
            assert _rel(got, ref(qa, qb.t(), sa, sb_t, torch.float32)) < 0.01
