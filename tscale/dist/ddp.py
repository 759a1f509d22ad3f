"""The model as this rank trains it: DistributedDataParallel with the gradient-exchange hook, or bare.

DDP lays gradients out in buckets twice: by parameter order for the first backward, then by
the order gradients became ready. The 1-bit residuals are per bucket, so with compression on,
`prime` runs one backward with communication switched off before training (RNG and fp8 amax
histories restored, no data consumed): every real step of every (re)started process then sees the
same buckets.
"""

import datetime
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from tscale.config import DistConfig
from tscale.dist.launch import DistEnv
from tscale.errors import UserError
from tscale.dist.onebit import GradExchange, exchange_hook
from tscale.precision.delayed import load_precision_state, precision_state


class Replicas:
    """`module` is what the loop calls forward on; `model` is the bare model (eval, checkpoints)."""

    def __init__(self, model: nn.Module, env: DistEnv, cfg: DistConfig):
        self.model, self.env, self.cfg = model, env, cfg
        self.module: nn.Module = model
        self.exchange: GradExchange | None = None
        if env.active:
            device_ids = [env.device.index] if env.device.type == "cuda" else None
            # gradients are views into DDP's buckets: no copy into the bucket and back each step
            self.module = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=cfg.bucket_cap_mb,
                                                  gradient_as_bucket_view=True)
            self.exchange = GradExchange(cfg.compression, cfg.chunk, cfg.onebit_warmup_steps,
                                         timeout=datetime.timedelta(seconds=cfg.timeout_s))
            self.module.register_comm_hook(self.exchange, exchange_hook)

    @property
    def exchanges_momentum(self) -> bool:
        return self.exchange is not None and self.cfg.compression == "onebit" and self.cfg.onebit_what == "momentum"

    def freeze_variance_at(self) -> int | None:
        """The step from which AdamW keeps its variance frozen (1-bit Adam), or None."""
        if not self.exchanges_momentum:
            return None
        if self.cfg.onebit_warmup_steps < 1:
            raise UserError("dist.onebit_warmup_steps must be at least 1 with dist.onebit_what = \"momentum\" "
                            "(AdamW's variance is frozen at the end of the warm-up)")
        return self.cfg.onebit_warmup_steps

    def attach(self, optimizer) -> None:
        """Give the 1-bit Adam exchange the optimizer whose momentum it folds gradients into."""
        if self.exchanges_momentum:
            self.exchange.optimizer = optimizer

    def clips(self) -> bool:
        """Whether the current step's p.grad are gradients (to clip), not an exchanged momentum."""
        return not (self.exchanges_momentum and self.exchange.compressing)

    def describe(self) -> str:
        if not self.env.active:
            return ""
        how = (f"1-bit exchange (chunk {self.cfg.chunk}, fp32 for the first {self.cfg.onebit_warmup_steps} steps)"
               if self.cfg.compression == "onebit" else "fp32 allreduce")
        return f", data parallel over {self.env.world} processes ({self.env.backend}, {how})"

    def begin_step(self, step: int) -> None:
        if self.exchange is not None:
            self.exchange.step = step

    def sync_unless(self, accumulating: bool):
        """A context for one micro-batch's backward: no gradient exchange while still accumulating."""
        return self.module.no_sync() if self.env.active and accumulating else nullcontext()

    def take_bytes(self) -> tuple[int, int]:
        """(bytes this rank sent, bytes of fp32 allreduce) since the last call; (0, 0) alone."""
        return self.exchange.take_bytes() if self.exchange is not None else (0, 0)

    def prime(self, backward: Callable[[], None]) -> None:
        """Let DDP settle its buckets with one local backward (1-bit only; see the module docstring).

        It leaves no trace: gradients, RNG and the amax histories of delayed fp8 scaling are as before."""
        if self.exchange is None or self.cfg.compression != "onebit":
            return
        histories = precision_state(self.model)
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state(self.env.device) if self.env.device.type == "cuda" else None
        self.exchange.passthrough = True
        try:
            backward()
        finally:
            self.exchange.passthrough = False
        self.model.zero_grad(set_to_none=True)
        load_precision_state(self.model, histories, "the priming step")
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, self.env.device)

    def local_state(self) -> dict:
        """This rank's own part of a checkpoint (the error-feedback residuals)."""
        return {"exchange": self.exchange.state_dict()} if self.exchange is not None else {}

    def load_local_state(self, state: dict) -> None:
        if self.exchange is not None and "exchange" in state:
            self.exchange.load_state_dict(state["exchange"])
