"""Shared by the attention-path tests (tests/test_attention_fa2.py, tests/test_attention_cudnn.py,
tests/test_bench_architecture.py): the comparison of an attention over document runs with attention_reference,
a tiny tscale model trained once per train.attention choice, and the inputs of the step benchmark's tests."""

import torch

from tscale.ops import attention_fa2, doc_runs
from tscale.ops.attention import attention_reference


def compare_over_runs(window, docs, sink, device="cpu", dtype=torch.float64, tol=1e-5, over_runs=None, backend="fa2",
             B=2, H=3, T=12, D=8, doc_rate=0.25, seed=0):
    """over_runs (attention_fa2 by default; its runs built for `backend`) against attention_reference on random
    q, k, v (B, T, H, D) and documents opening at `doc_rate` per token: output and gradients."""
    over_runs = over_runs or attention_fa2.attention_fa2
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(4))
    opens = torch.rand(B, T, generator=g) < doc_rate if docs else None
    runs = doc_runs.doc_runs(opens, B, T, bucket=4, backend=backend).to(device)
    leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    out = over_runs(*leaves, runs, window=window, sink=sink, scale=D ** -0.5)  # (B, T, H, D)
    got = (out, *torch.autograd.grad(out, leaves, do.to(device, dtype)))
    ref_leaves = [t.transpose(1, 2).clone().requires_grad_() for t in (q, k, v)]  # (B, H, T, D)
    doc_ids = opens.long().cumsum(1) if docs else None
    ref = attention_reference(*ref_leaves, window=window, doc_ids=doc_ids, sink=sink, scale=D ** -0.5)
    want = (ref, *torch.autograd.grad(ref, ref_leaves, do.transpose(1, 2)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a.cpu().double(), b.transpose(1, 2).double(), rtol=tol, atol=tol, msg=name)


def tiny_tscale_args(tmp_path, shakespeare_jsonl) -> list[str]:
    """A 2-layer tscale model on Shakespeare whose eos is the most frequent token (many documents per window)."""
    import numpy as np

    from tscale.data.shards import TokenFolder
    from tscale.data.tokenize import tokenize_corpus

    tokens = tmp_path / "tokens"
    tokenize_corpus([shakespeare_jsonl], tokens, vocab_size=512, quiet=True)
    train_ids = TokenFolder(tokens).shards("train")[0].tokens
    frequent = int(np.bincount(train_ids[:200_000]).argmax())
    return ['model.arch="tscale"', "model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.head_dim=16",
            "model.seq_len=64", "model.window=8", "model.global_every=2", f"model.eos_id={frequent}",
            "train.batch_size=4", "model.zero_init=false", "optim.warmup_steps=0", "optim.lr=3e-3",
            "train.eval_every=0", "train.ckpt_every=0", "train.log_every=1", "train.steps=4", f'data.tokens="{tokens}"']


def losses(run) -> list[float]:
    import json

    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def train_each(args: list[str], tmp_path, impls, seen: list | None = None) -> tuple[dict, dict]:
    """Train the tiny model once per train.attention choice: (losses by choice, set(seen) after each run by choice),
    `seen` being a list the test's stand-in appends to (emptied before each run)."""
    from tscale.config import load_config
    from tscale.train.loop import train_run

    seen = [] if seen is None else seen
    curves, served = {}, {}
    for impl in impls:
        seen.clear()
        train_run(load_config(None, [*args, f'train.attention="{impl}"']), tmp_path / impl, quiet=True)
        curves[impl], served[impl] = losses(tmp_path / impl), set(seen)
    return curves, served


def tiny_step_benchmark_inputs() -> tuple[torch.nn.Module, torch.Tensor]:
    """A 2-layer tscale model (one windowed layer of 8, one global) and a batch idx (2, 32) for attention_step_cost."""
    from tscale.config import load_config
    from tscale.model import build_model

    cfg = load_config(None, ['model.arch="tscale"', "model.n_layer=2", "model.n_head=2", "model.d_model=32",
                             "model.head_dim=16", "model.seq_len=32", "model.window=8", "model.global_every=2",
                             "model.vocab_size=64", "model.eos_id=5"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    idx = torch.randint(0, 64, (2, 32))
    return model, idx
