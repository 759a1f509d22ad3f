"""Training: loss goes down, exact resume after SIGTERM, checkpoints, config and data errors."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from tscale.config import load_config
from tscale.data.tokenize import tokenize_corpus
from tscale.errors import UserError
from tscale.train.checkpoint import checkpoint_dirs
from tscale.train.loop import train_run

TINY = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.seq_len=32", "train.batch_size=4",
        "train.eval_every=0", "train.ckpt_every=0", "train.log_every=1", "optim.warmup_steps=5", "optim.lr=3e-3"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, shakespeare_jsonl) -> Path:
    """Shakespeare (real text) with a 512-id BPE trained on its training split."""
    corpus = shakespeare_jsonl
    out = tmp_path_factory.mktemp("tok") / "tokens"
    tokenize_corpus([corpus], out, vocab_size=512, quiet=True)
    return out


def tiny_cfg(tokens: Path, *extra: str):
    return load_config(None, [*TINY, f'data.tokens="{tokens}"', *extra])


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_loss_goes_down_and_val_is_logged(tokens, tmp_path):
    cfg = tiny_cfg(tokens, "train.steps=40", "train.eval_every=20", "train.eval_batches=2")
    result = train_run(cfg, tmp_path / "run", quiet=True)
    curve = losses(tmp_path / "run")
    assert sorted(curve) == list(range(1, 41))
    assert sum(list(curve.values())[-5:]) / 5 < sum(list(curve.values())[:5]) / 5 - 0.5
    assert result.val_loss is not None and result.val_loss < 6.0
    saved = load_config(tmp_path / "run" / "config.toml")
    assert saved.model.vocab_size == 512 and saved.train.steps == 40


def _stop_when(run: Path, step: int) -> threading.Thread:
    """SIGTERM this process once metrics.jsonl shows `step`."""

    def watch():
        path = run / "metrics.jsonl"
        while not (path.exists() and len(path.read_text().splitlines()) >= step):
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_killed_and_resumed_run_matches_straight_run(tokens, tmp_path):
    steps = ["train.steps=150", "train.ckpt_every=50", "train.keep_last=2", "model.dropout=0.1"]
    straight = train_run(tiny_cfg(tokens, *steps), tmp_path / "a", quiet=True)

    run = tmp_path / "b"
    watcher = _stop_when(run, 60)
    first = train_run(tiny_cfg(tokens, *steps), run, quiet=True)
    watcher.join()
    assert first.stopped_early and 60 <= first.step < 150
    assert checkpoint_dirs(run)[-1][0] == first.step

    resumed = train_run(load_config(run / "config.toml"), run, resume=True, quiet=True)
    assert resumed.step == straight.step == 150
    assert losses(run) == losses(tmp_path / "a")
    a = safetensors.torch.load_file(str(straight.checkpoint / "model.safetensors"))
    b = safetensors.torch.load_file(str(resumed.checkpoint / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(checkpoint_dirs(run)) == 2  # keep_last


def test_time_limit_stops_with_checkpoint(tokens, tmp_path):
    result = train_run(tiny_cfg(tokens, "train.steps=100000", "train.time_limit_s=1"), tmp_path / "r", quiet=True)
    assert result.stopped_early and 0 < result.step < 100000
    assert checkpoint_dirs(tmp_path / "r")[-1][0] == result.step



def test_compile_mode_reaches_torch_compile(tokens, tmp_path, monkeypatch):
    modes = []

    def fake_compile(fn, mode=None):
        modes.append(mode)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)  # the loop's torch.compile: records the mode
    result = train_run(tiny_cfg(tokens, "train.steps=2", "train.compile=true", 'train.compile_mode="reduce-overhead"'),
                       tmp_path / "r", quiet=True)
    assert result.step == 2 and modes == ["reduce-overhead"]
    train_run(tiny_cfg(tokens, "train.steps=1", "train.compile=true"), tmp_path / "d", quiet=True)
    assert modes == ["reduce-overhead", None]  # "default" leaves torch's own default
    with pytest.raises(Exception, match="needs train.compile = true"):
        tiny_cfg(tokens, 'train.compile_mode="reduce-overhead"')
    with pytest.raises(Exception, match="cannot accumulate gradients.*train.grad_accum = 1"):
        tiny_cfg(tokens, "train.compile=true", 'train.compile_mode="reduce-overhead"', "train.grad_accum=2")


def test_compile_block_once_reaches_the_model(tokens, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: fn)
    seen = []
    cfg = tiny_cfg(tokens, "train.steps=2", "train.compile=true", "train.compile_block_once=true")
    train_run(cfg, tmp_path / "r", on_step=lambda step, model: seen.append(model.compile_block_once))
    assert seen == [True, True]
    printed = capsys.readouterr()
    assert "one block traced for all" in printed.err + printed.out
    train_run(tiny_cfg(tokens, "train.steps=1"), tmp_path / "p", quiet=True,
              on_step=lambda step, model: seen.append(model.compile_block_once))
    assert seen[-1] is False
    from tscale.model import block_region

    monkeypatch.setattr(block_region, "AVAILABLE", False)  # a torch without nested_compile_region
    with pytest.raises(UserError, match="nested_compile_region; set train.compile_block_once = false"):
        train_run(cfg, tmp_path / "old", quiet=True)


def test_rate_counts_the_wait_for_the_device(tokens, tmp_path, monkeypatch):
    """tokens/s is timed to the moment the device has finished the logged steps, not when the host queued them.

    Reading the logged loss is where the host waits for a device that runs behind it; a wait of
    0.2 s there (DistEnv.mean, just before the loss's .item()) must show in the rate of a one-step interval."""
    from tscale.dist import DistEnv

    mean = DistEnv.mean

    def slow_mean(self, t):
        time.sleep(0.2)  # a device still busy with the queued steps
        return mean(self, t)

    monkeypatch.setattr(DistEnv, "mean", slow_mean)
    cfg = tiny_cfg(tokens, "train.steps=3", "train.log_every=1")
    train_run(cfg, tmp_path / "r", quiet=True)
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    per_step = cfg.train.batch_size * cfg.model.seq_len
    assert all(r["tokens_per_s"] < per_step / 0.2 for r in records if "tokens_per_s" in r)

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", [
    ['model.arch="gpt2"'],
    ['model.arch="tscale"', 'optim.name="muon"', "model.window=8", "model.global_every=2"],
    ['model.arch="gpt2"', 'precision.recipe="int8_rowwise"'],
], ids=["gpt2", "tscale-muon", "gpt2-int8"])
def test_cuda_graphs_train_like_the_default_mode(tokens, tmp_path, arch):
    """train.compile_mode = "reduce-overhead" replays the step as CUDA graphs: same losses, evaluation after it works."""
    curves = {}
    for mode in ("default", "reduce-overhead"):
        cfg = tiny_cfg(tokens, *arch, "train.steps=8", "train.compile=true", f'train.compile_mode="{mode}"',
                       "train.eval_every=8", "train.eval_batches=2")
        result = train_run(cfg, tmp_path / mode, quiet=True)
        assert result.step == 8 and result.val_loss is not None
        curves[mode] = [losses(tmp_path / mode)[s] for s in range(1, 9)]
    assert curves["default"][-1] < curves["default"][0]
    torch.testing.assert_close(curves["reduce-overhead"], curves["default"], rtol=2e-2, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe", [
    ['precision.recipe="int8_rowwise"'],
    ['precision.recipe="int8_rowwise"', "precision.int8_backward=true"],
    ['precision.recipe="fp8_tensorwise"'],
], ids=["int8", "int8-bwd", "fp8"])
def test_cuda_graphs_update_every_weight_as_the_default_mode(tokens, tmp_path, recipe):
    """Under CUDA graphs every parameter of a low-precision model still gets its gradient and moves, as in default mode.

    Products at M = 8 x 64 = 512 rows, K = N = 128..512, the kernels' large-M path. A graph that skipped a
    product's backward would leave its weight where it started while the loss still went down; one that
    multiplied garbage would move it elsewhere."""
    shape = ['model.arch="gpt2"', "model.d_model=128", "model.n_head=2", "model.seq_len=64", "train.batch_size=8"]
    start, after = {}, {}
    for mode in ("default", "reduce-overhead"):
        cfg = tiny_cfg(tokens, *shape, *recipe, "train.steps=5", "train.compile=true", f'train.compile_mode="{mode}"')

        def keep(step, model, mode=mode):
            if step == 2:  # CUDA graphs are recorded by now and replayed from here on
                start[mode] = {n: p.detach().clone() for n, p in model.named_parameters()}
            after[mode] = {n: p.detach().clone() for n, p in model.named_parameters()}

        train_run(cfg, tmp_path / mode, quiet=True, on_step=keep)
    for mode in after:
        frozen = [n for n, p in after[mode].items() if torch.equal(p, start[mode][n])]
        assert not frozen, f"{mode}: parameters that did not move after step 2: {frozen}"
    for name in after["default"]:  # Adam's steps: the same way and distance in both modes, whatever rounding differs
        moved = {mode: (after[mode][name] - start[mode][name]).flatten().double() for mode in after}
        graph, default = moved["reduce-overhead"], moved["default"]
        assert graph.norm().item() == pytest.approx(default.norm().item(), rel=0.1), name
        assert torch.nn.functional.cosine_similarity(graph, default, dim=0).item() > 0.9, name


def _cli(run_cli, *args):
    code, out = run_cli("train", *args)
    return code, out.strip().splitlines()


def test_cli_errors(tokens, tmp_path, run_cli):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[train]\nstepz = 3\n")
    code, lines = _cli(run_cli, cfg, "-o", tmp_path / "r1", "--tokens", tokens)
    assert code == 2 and lines == [f"tscale train: error: {cfg}: unknown key train.stepz (did you mean train.steps?)"]

    code, lines = _cli(run_cli, "--set", "train.steps=many", "-o", tmp_path / "r1", "--tokens", tokens)
    assert code == 2 and len(lines) == 1 and "train.steps" in lines[0] and "'many'" in lines[0]

    code, lines = _cli(run_cli, tmp_path / "nope.toml", "-o", tmp_path / "r1")
    assert code == 2 and "no such config file" in lines[0]

    code, lines = _cli(run_cli, "-o", tmp_path / "r1", "--tokens", tmp_path / "missing")
    assert code == 2 and "no such folder" in lines[0]


def test_cli_refuses_existing_run_and_other_shape(tokens, tmp_path, run_cli):
    run = tmp_path / "run"
    args = [a for s in TINY for a in ("--set", s)] + ["--set", "train.steps=3", "--tokens", tokens, "-o", run, "--quiet"]
    code, out = run_cli("train", *args)
    assert code == 0, out
    code, lines = _cli(run_cli, *args)
    assert code == 2 and "already holds files" in lines[0] and "--resume" in lines[0]

    code, lines = _cli(run_cli, "-o", run, "--resume", "--set", "model.d_model=64", "--set", "train.steps=6")
    assert code == 2 and len(lines) == 1 and "different model shape" in lines[0]

    code, out = run_cli("train", "-o", run, "--resume", "--set", "train.steps=6", "--quiet")
    assert code == 0 and "step 6" in out
    assert sorted(losses(run)) == list(range(1, 7))


def test_truncated_shard_is_refused(tokens, tmp_path, run_cli):
    import shutil

    broken = tmp_path / "tokens"
    shutil.copytree(tokens, broken)
    shard = broken / "train-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-100])
    code, lines = _cli(run_cli, "--tokens", broken, "-o", tmp_path / "r")
    assert code == 2 and len(lines) == 1 and "train-00000.bin" in lines[0] and "truncated" in lines[0]


def test_progress_notes_are_printed_as_given(capsys):
    """Off a terminal a note is one line as given: brackets in a path are not read as markup, long lines not wrapped."""
    from tscale.train.metrics import ProgressLine

    text = "checkpoint runs/[exp 1]/ckpt/step-0000020 " + "x" * 150
    with ProgressLine(10, 0) as progress:
        progress.note(text)
        progress.update(1, {"loss": 2.5, "lr": 1e-3, "tokens_per_s": 1000.0})
    assert capsys.readouterr().err.splitlines() == [text, "step 1: loss 2.5000  lr 1.00e-03  1,000 tok/s"]
