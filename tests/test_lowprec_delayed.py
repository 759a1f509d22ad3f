"""fp8_tensorwise with delayed scaling: the quantize rules, the CUDA kernel against them, training and resuming."""

import shutil

import pytest
import safetensors.torch
import torch

from tscale.config import load_config
from tscale.errors import UserError
from tscale.ops import lowprec
from tscale.ops.lowprec import QMAX, quantize_delayed, quantize_delayed_reference, quantize_reference
from tscale.precision import convert_linears, get_recipe
from tscale.precision.delayed import load_precision_state, precision_state
from tscale.train.checkpoint import checkpoint_dirs, load_model

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def rand(*shape, seed=0, device="cpu", dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * scale
    x = torch.where(x.abs() < 1e-3, torch.full_like(x, 1e-3), x)
    return x.to(device=device, dtype=dtype)


def history(state: torch.Tensor) -> list[float]:
    return state.view(torch.float32)[:-2].tolist()


# ---- the rules, through the reference ------------------------------------------------------------------------


def test_first_call_scales_by_its_own_amax_then_the_history_decides():
    state = torch.zeros(4 + 2, dtype=torch.int32)
    x1 = rand(32, 48, seed=1)
    got = quantize_delayed_reference(x1, E4M3, state, transpose=True)
    want = quantize_reference(x1, E4M3, None, transpose=True)
    assert all(torch.equal(g.view(torch.uint8) if g.element_size() == 1 else g,
                           w.view(torch.uint8) if w.element_size() == 1 else w) for g, w in zip(got, want))
    a1 = x1.abs().max().item()
    assert history(state) == [a1, 0.0, 0.0, 0.0] and state[-2:].tolist() == [0, 0]

    x2 = rand(32, 48, seed=2, scale=0.5)  # smaller: scaled by x1's amax, not its own
    q2, s2 = quantize_delayed_reference(x2, E4M3, state)
    assert s2.item() == pytest.approx(a1 / QMAX[E4M3], rel=1e-6)
    assert not torch.equal(s2, quantize_reference(x2, E4M3)[1])
    torch.testing.assert_close(q2.float() * s2, x2, rtol=0.07, atol=s2.item() * 2 ** -9)
    assert history(state)[:3] == [x2.abs().max().item(), a1, 0.0]


def test_values_beyond_the_delayed_scale_saturate_and_the_history_forgets():
    state = torch.zeros(2 + 2, dtype=torch.int32)
    small, big = rand(8, 16, seed=3), rand(8, 16, seed=4, scale=10.0)
    quantize_delayed_reference(small, E4M3, state)
    q, s = quantize_delayed_reference(big, E4M3, state)
    assert q.float().abs().max().item() == QMAX[E4M3]  # saturated, not inf or nan
    assert (q.float().abs() == QMAX[E4M3]).float().mean() > 0.5
    quantize_delayed_reference(small, E4M3, state)
    quantize_delayed_reference(small, E4M3, state)  # two calls on: the big amax has left a history of 2
    assert max(history(state)) == small.abs().max().item()


def test_bad_state_is_refused():
    x = rand(4, 8)
    for state in (torch.zeros(6, dtype=torch.float32), torch.zeros(2, dtype=torch.int32),
                  torch.zeros(300, dtype=torch.int32)):
        with pytest.raises(ValueError, match="quantize_delayed: state"):
            quantize_delayed_reference(x, E4M3, state)


# ---- the layer ---------------------------------------------------------------------------------------------


def _layers(history=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.ReLU(), torch.nn.Linear(96, 32, bias=False))
    plain = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.ReLU(), torch.nn.Linear(96, 32, bias=False))
    plain.load_state_dict(model.state_dict())
    convert_linears(model, "fp8_tensorwise", exclude=(), delayed_history=history)
    return model, plain


def test_layer_tracks_each_operand_and_stays_close_to_fp32():
    model, plain = _layers()
    for step in range(3):
        x = rand(16, 64, seed=10 + step)
        y, yp = model(x), plain(x)
        y.square().mean().backward()
        yp.square().mean().backward()
        assert (y - yp).norm() / yp.norm() < 0.08
        for a, b in zip(model.parameters(), plain.parameters()):
            assert (a.grad - b.grad).norm() / b.grad.norm() < 0.25  # e5m2 gradients
    state = precision_state(model)
    assert sorted(state) == sorted(f"{i}.{b}" for i in (0, 2) for b in ("amax_x", "amax_w", "amax_g"))
    assert history(state["0.amax_x"])[:3] == pytest.approx([rand(16, 64, seed=12 - i).abs().max().item()
                                                            for i in range(3)])
    assert all(v > 0 for v in history(state["2.amax_g"])[:3]) and history(state["2.amax_g"])[3] == 0.0
    assert set(model.state_dict()) == {"0.weight", "2.weight"}  # the histories stay out of the weights


def test_evaluation_quantises_dynamically_and_leaves_the_histories_alone():
    model, dynamic = _layers()  # the second: the same weights, converted below with dynamic scaling
    convert_linears(dynamic, "fp8_tensorwise", exclude=())
    model(rand(16, 64, seed=15)).square().mean().backward()  # one training step: one entry per history
    before = precision_state(model)
    x = rand(16, 64, seed=16, scale=8.0)  # beyond the histories: delayed scales would saturate it
    with torch.no_grad():
        in_train_mode = model(x)
    model.eval()
    in_eval_mode = model(x)
    assert all(torch.equal(precision_state(model)[k], v) for k, v in before.items())
    want = dynamic(x)
    assert torch.equal(in_train_mode, want) and torch.equal(in_eval_mode, want)
    model.train()
    with_grad = model(x)
    assert not torch.equal(with_grad, want)  # the training path takes the (smaller) delayed scales


def test_precision_state_round_trips_and_refuses_another_layout():
    model, _ = _layers()
    model(rand(8, 64, seed=20)).sum().backward()
    saved = precision_state(model)
    fresh, _ = _layers()
    load_precision_state(fresh, saved, "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(precision_state(fresh).values(), saved.values()))
    other, _ = _layers(history=8)
    with pytest.raises(UserError, match="amax_history"):
        load_precision_state(other, saved, "ckpt")
    load_precision_state(other, {}, "ckpt")  # a checkpoint of dynamic scaling: histories start empty
    assert all(int(v.abs().sum()) == 0 for v in precision_state(other).values())


def test_delayed_scaling_needs_fp8_tensorwise():
    with pytest.raises(UserError, match="delayed"):
        get_recipe("int8_rowwise", delayed_history=16)
    with pytest.raises(UserError, match="delayed"):
        get_recipe("fp8_tensorwise", quantize_in_graph=True, delayed_history=16)
    with pytest.raises(UserError, match="delayed"):
        load_config(None, ['precision.recipe="fp8_rowwise"', 'precision.scaling="delayed"'])
    assert get_recipe("fp8_tensorwise", delayed_history=16).name == "fp8_tensorwise+delayed16"


def test_compiled_layer_matches_eager_and_updates_the_same_histories():
    model, _ = _layers()
    twin, _ = _layers()
    compiled = torch.compile(twin, backend="aot_eager")
    for step in range(3):
        x = rand(16, 64, seed=30 + step)
        model(x).square().mean().backward()
        compiled(x).square().mean().backward()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)
    for key, value in precision_state(model).items():
        assert torch.equal(precision_state(twin)[key], value), key


def test_priming_a_onebit_exchange_leaves_the_histories_as_they_were():
    from types import SimpleNamespace

    from tscale.dist.ddp import Replicas

    model, _ = _layers()
    model(rand(8, 64, seed=25)).sum().backward()  # histories with one entry each
    before = precision_state(model)
    replicas = Replicas(model, SimpleNamespace(active=False, device=torch.device("cpu")),
                        SimpleNamespace(compression="onebit"))
    replicas.exchange = SimpleNamespace(passthrough=False)  # what prime switches; no process group needed
    ran = []
    replicas.prime(lambda: ran.append(model(rand(8, 64, seed=26, scale=5.0)).sum().backward()))
    assert ran and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(precision_state(model)[k], v) for k, v in before.items())
    assert history(before["0.amax_x"])[0] > 0 and history(before["0.amax_x"])[1] == 0.0  # priming would add one


# ---- training ----------------------------------------------------------------------------------------------

TINY = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.seq_len=32", "train.batch_size=4",
        "train.eval_every=0", "train.log_every=1", "optim.warmup_steps=3", "optim.lr=1e-2",
        'precision.recipe="fp8_tensorwise"', 'precision.scaling="delayed"', "precision.amax_history=4"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, shakespeare_jsonl):
    from tscale.data.tokenize import tokenize_corpus

    out = tmp_path_factory.mktemp("delayed") / "tokens"
    tokenize_corpus([shakespeare_jsonl], out, vocab_size=512, quiet=True)
    return out


def test_training_lowers_the_loss_and_a_resumed_run_matches_a_straight_one(tokens, tmp_path):
    from tscale.train.loop import train_run

    cfg = load_config(None, [*TINY, f'data.tokens="{tokens}"', "train.steps=12", "train.ckpt_every=6",
                             "train.keep_last=2"])
    straight = train_run(cfg, tmp_path / "a", quiet=True)
    losses = [float(line.split('"loss": ')[1].split(",")[0]) for line in
              (tmp_path / "a" / "metrics.jsonl").read_text().splitlines() if '"loss": ' in line]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(checkpoint_dirs(tmp_path / "b")[-1][1])  # back to the step-6 checkpoint
    resumed = train_run(cfg, tmp_path / "b", resume=True, quiet=True)
    assert resumed.step == straight.step == 12
    a = safetensors.torch.load_file(str(straight.checkpoint / "model.safetensors"))
    b = safetensors.torch.load_file(str(resumed.checkpoint / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    plain, _ = load_model(straight.checkpoint)  # the weights load into a plain model
    assert type(plain.blocks[0].mlp.fc) is torch.nn.Linear


# ---- the CUDA kernel ---------------------------------------------------------------------------------------


@CUDA
@pytest.mark.parametrize("dtype", [E4M3, E5M2, INT8])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(37, 53), (256, 768), (100, 72), (30, 64), (1024, 1600)])
def test_cuda_quantize_delayed_equals_reference(dtype, in_dtype, shape):
    """Odd shapes (scalar kernels), model-like and partial tiles (vectorised), M not a multiple of 4;
    four calls with and without the transposed copy: the seeding call, then the history's scale, one
    call saturating."""
    assert lowprec._quantize_kernel_on("cuda", "quantize_delayed"), "tscale._C lacks the CUDA quantize_delayed"
    for transpose in (False, True):
        state = torch.zeros(3 + 2, dtype=torch.int32, device="cuda")
        ref_state = state.cpu()
        for call, scale in enumerate((1.0, 0.5, 3.0, 1.0)):
            x = rand(*shape, seed=40 + call, device="cuda", dtype=in_dtype, scale=scale)
            got = quantize_delayed(x, dtype, state, transpose)
            want = quantize_delayed_reference(x.cpu(), dtype, ref_state, transpose)
            for g, w in zip(got, want):
                g = g.cpu()
                if g.dtype == torch.float32:
                    assert torch.equal(g, w), (call, g, w)
                else:
                    assert (g.view(torch.uint8) != w.view(torch.uint8)).float().mean() < 1e-4, call
            assert torch.equal(state.cpu(), ref_state), (call, history(state.cpu()), history(ref_state))


@CUDA
def test_cuda_quantize_delayed_replays_in_a_cuda_graph():
    x = rand(512, 1024, seed=50, device="cuda", dtype=torch.bfloat16)
    state = torch.zeros(4 + 2, dtype=torch.int32, device="cuda")
    quantize_delayed(x, E4M3, state, True)  # seeded outside the graph
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        q, s, q_t = quantize_delayed(x, E4M3, state, True)
    ref_state = state.cpu()
    for call in range(3):
        x.copy_(rand(512, 1024, seed=51 + call, device="cuda", dtype=torch.bfloat16, scale=1 + call))
        graph.replay()
        want = quantize_delayed_reference(x.cpu(), E4M3, ref_state, True)
        assert torch.equal(s.cpu(), want[1]) and torch.equal(state.cpu(), ref_state), call
        assert (q.cpu().view(torch.uint8) != want[0].view(torch.uint8)).float().mean() < 1e-4


@CUDA
def test_cuda_layer_matches_the_cpu_reference_path():
    model, _ = _layers()
    twin, _ = _layers()
    twin.cuda()
    for step in range(3):
        x = rand(128, 64, seed=60 + step)
        model(x).square().mean().backward()
        twin(x.cuda()).square().mean().backward()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert (b.grad.cpu() - a.grad).norm() / a.grad.norm() < 0.02
    for key, value in precision_state(model).items():
        torch.testing.assert_close(precision_state(twin)[key].view(torch.float32), value.view(torch.float32),
                                   rtol=1e-2, atol=0)


@CUDA
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_layer_under_inductor_updates_the_histories_as_eager(mode):
    """Inductor's graphs, and their CUDA-graph replays, must run every quantize call once and keep its history.

    As in the training loop, each step starts from no gradients (a replay reuses the memory of the last one's
    outputs, the gradients among them) and, under CUDA graphs, with cudagraph_mark_step_begin."""
    eager, _ = _layers()
    twin, _ = _layers()
    eager.cuda()
    twin.cuda()
    torch._dynamo.reset()
    compiled = torch.compile(twin, mode=None if mode == "default" else mode)
    for step in range(4):
        x = rand(128, 64, seed=70 + step, device="cuda", scale=1 + step)
        eager.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
        eager(x).square().mean().backward()
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        compiled(x).square().mean().backward()
    for a, b in zip(eager.parameters(), twin.parameters()):
        assert (b.grad - a.grad).norm() / a.grad.norm() < 0.02
    for key, value in precision_state(eager).items():
        torch.testing.assert_close(precision_state(twin)[key].view(torch.float32), value.view(torch.float32),
                                   rtol=1e-2, atol=0)
        assert history(value)[3] > 0, key  # four calls: the history is full
