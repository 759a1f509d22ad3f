"""Synchronous data parallel under torchrun, with optional 1-bit gradient compression."""

from tscale.dist.ddp import Replicas
from tscale.dist.launch import DistEnv, init_dist

__all__ = ["DistEnv", "Replicas", "init_dist"]
