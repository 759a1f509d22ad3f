"""Worker functions for tests/test_dist.py, run in Gloo processes started by torch.multiprocessing.spawn.

Also the pure-torch reference of the two-phase 1-bit average, written from the algorithm's
description without the packing ops, that the hook is checked against.
"""

import json
import os
import signal
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world: int, *args) -> None:
    mp.spawn(fn, args=(world, *args), nprocs=world, join=True)


def _join(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)


# ---- the two-phase algorithm, simulated for all ranks in one process ----------------------

def _sign_compress(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """x (m,) with m a multiple of chunk -> its 1-bit version: per chunk, mean |x| times the sign (0 -> +)."""
    blocks = x.view(-1, chunk)  # (m/chunk, chunk)
    scale = blocks.abs().mean(dim=1, keepdim=True)  # (m/chunk, 1)
    return torch.where(blocks >= 0, scale, -scale).view(-1)


class ReferenceExchange:
    """All W workers and W servers of one bucket, with their error feedback, in plain torch."""

    def __init__(self, world: int, chunk: int, n: int):
        unit = world * chunk
        self.world, self.chunk, self.n = world, chunk, n
        self.n_pad = -(-n // unit) * unit
        self.worker = torch.zeros(world, self.n_pad)  # (W, n_pad)
        self.server = torch.zeros(world, self.n_pad // world)  # (W, S)

    def step(self, grads: torch.Tensor) -> torch.Tensor:
        """grads (W, n), one row per rank -> the averaged (n,) every rank ends with."""
        W, S = self.world, self.n_pad // self.world
        sent = torch.zeros(W, self.n_pad)
        for r in range(W):
            x = self.worker[r].clone()
            x[: self.n] += grads[r]
            sent[r] = _sign_compress(x, self.chunk)
            self.worker[r] = x - sent[r]
            self.worker[r, self.n:] = 0
        result = torch.zeros(self.n_pad)
        for s in range(W):  # server s owns slice s
            y = sent[:, s * S:(s + 1) * S].mean(dim=0) + self.server[s]
            back = _sign_compress(y, self.chunk)
            self.server[s] = y - back
            result[s * S:(s + 1) * S] = back
        return result[: self.n]


def hook_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Feed random buckets through the real exchange and compare with ReferenceExchange, step by step."""
    from tscale.dist.onebit import GradExchange, allreduce_mean, onebit_mean

    _join(rank, world, port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    chunk, sizes = 16, {0: 200, 1: 37}
    state = GradExchange("onebit", chunk, warmup_steps=1)
    refs = {i: ReferenceExchange(world, chunk, n) for i, n in sizes.items()}
    report = {"max_err": 0.0, "bytes": [], "warmup_err": 0.0}
    report["overlap"] = state.overlap
    for step in range(4):
        state.step = step
        pending = []  # every bucket of the step is in flight before the first is awaited, as under DDP
        for index, n in sizes.items():
            g = torch.Generator().manual_seed(1000 * step + index)
            grads = torch.randn(world, n, generator=g) * torch.rand(world, 1, generator=g)  # (W, n)
            if step == 0:
                got = allreduce_mean(state, grads[rank].clone()).wait()
                report["warmup_err"] = max(report["warmup_err"], (got - grads.mean(0)).abs().max().item())
                continue
            pending.append((onebit_mean(state, index, grads[rank].clone()), refs[index].step(grads)))
        for fut, want in pending:
            report["max_err"] = max(report["max_err"], (fut.wait() - want).abs().max().item())
        report["bytes"].append(state.take_bytes())
    report["worker_err"] = max((state.worker[i] - refs[i].worker[rank]).abs().max().item() for i in sizes)
    report["server_err"] = max((state.server[i] - refs[i].server[rank]).abs().max().item() for i in sizes)
    Path(out_dir, f"hook{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


# ---- training runs ------------------------------------------------------------------------

def train_worker(rank: int, world: int, plan: list[dict]) -> None:
    """Run each planned train_run in turn: {port, out, overrides, resume, stop_at, sums}."""
    from tscale.config import load_config
    from tscale.train.loop import train_run

    from tscale.optim.schedule import lr_at

    for run in plan:
        _join(rank, world, run["port"])
        sums: list[float] = []
        updates: list[float] = []  # steps 2, 3, ...: max |change of a weight| / lr (run["updates"])
        before: list[torch.Tensor] = []

        def on_step(step: int, model: torch.nn.Module, run=run, sums=sums) -> None:
            sums.append(sum(p.detach().double().sum().item() for p in model.parameters()))
            if run.get("updates"):
                now = [p.detach().clone() for p in model.parameters()]
                if before:
                    lr = lr_at(step - 1, cfg.train.steps, cfg.optim)
                    updates.append(max((a - b).abs().max().item() for a, b in zip(now, before)) / lr)
                before[:] = now
            if rank == 0 and step == run.get("stop_at"):
                os.kill(os.getpid(), signal.SIGTERM)  # only rank 0 is told: the ranks must agree to stop

        source = Path(run["out"]) / "config.toml" if run.get("resume") else None
        cfg = load_config(source, run["overrides"])
        train_run(cfg, run["out"], resume=run.get("resume", False), quiet=True, on_step=on_step)
        Path(f"{run['out']}.sums{rank}.json").write_text(json.dumps(sums))
        if run.get("updates"):
            Path(f"{run['out']}.updates{rank}.json").write_text(json.dumps(updates))
