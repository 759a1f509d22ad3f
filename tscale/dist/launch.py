"""Process-group setup and teardown under torchrun, rank facts, and the few collectives the loop needs.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `init_dist` reads
them and joins the group (NCCL between GPUs, Gloo on CPU, or as `dist.backend` says). A plain
`tscale train` (no WORLD_SIZE, or 1) gets a world of one, where every helper is a no-op, so
the loop is the same code with or without torchrun.
"""

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from tscale.config import DistConfig
from tscale.errors import UserError


@dataclass
class DistEnv:
    """Where this process stands: rank, world size, local rank on its host, backend, device."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on at least one (stop signals, time limits)."""
        if not self.active:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The average of `t` over ranks (a copy; logging only)."""
        if not self.active:
            return t
        t = t.detach().clone()
        dist.all_reduce(t)
        return t / self.world

    def gather_to_main(self, obj: Any) -> list | None:
        """Every rank's `obj`, as a list indexed by rank, on rank 0 (None elsewhere)."""
        if not self.active:
            return [obj]
        out = [None] * self.world if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def on_main(self, fn: Callable, *args) -> Any:
        """Run `fn` on rank 0 only and hand its result to every rank; a UserError there is raised everywhere."""
        result, error = None, None
        if self.is_main:
            try:
                result = fn(*args)
            except UserError as e:
                error = str(e)
        if self.active:
            box = [(result, error)]
            dist.broadcast_object_list(box, src=0)
            result, error = box[0]
        if error is not None:
            raise UserError(error)
        return result

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise UserError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


def pick_backend(cfg: DistConfig, device: torch.device) -> str:
    backend = cfg.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise UserError("dist.backend = \"nccl\" needs CUDA GPUs; use \"gloo\" (or \"auto\") on CPU")
    return backend


def init_dist(cfg: DistConfig, device: torch.device) -> DistEnv:
    """Join the process group torchrun described, or return a world of one when not launched by it."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return DistEnv(device=device)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible; "
                            f"lower torchrun --nproc-per-node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = pick_backend(cfg, device)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise UserError(f"WORLD_SIZE={world} but {name} is not set; launch with torchrun")
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=cfg.timeout_s),
                            device_id=device if device.type == "cuda" else None)
    return DistEnv(rank=rank, world=world, local_rank=local_rank, backend=backend, device=device)
