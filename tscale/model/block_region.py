"""The transformer block as one compile region: traced and compiled once, its code reused by every block of the model.

Under torch.compile a model of L identical blocks is traced L times and its graph grows with L,
so compile time does too (minutes at 48 layers). With `train.compile_block_once` the models call
their blocks through `train_block`, a torch.compiler.nested_compile_region: the first block is
traced and compiled, and every later block with the same structure (the same guards: its
window, its dtypes and shapes) reuses that code with its own parameters. Nothing fuses across
a block boundary (the residual add of one block and the norm of the next stay two kernels),
which is the price. Outside torch.compile the call is a plain call. Training steps only: a
decoding step (KV cache) calls the blocks directly.
"""

import re

import torch
import torch.nn as nn

_nested_compile_region = getattr(torch.compiler, "nested_compile_region", None)
AVAILABLE = _nested_compile_region is not None  # whether this torch can compile a region once


def _major_minor(version: str) -> tuple[int, int]:
    """(2, 13) of "2.13.0+cpu" or "2.13.0.dev20261101": the release a build belongs to, pre-releases included."""
    major, minor = (re.match(r"\d*", part).group() or "0" for part in version.split(".")[:2])
    return int(major), int(minor)


# Whether a region may hold a torch.autograd.Function (the traced low-precision recipes): torch 2.11's
# dynamo fails with KeyError 'example_value' when it compares a later block's region with the first's;
# torch 2.13 compiles it (tests/test_block_region.py). 2.12 is untried, so it counts as failing.
HOLDS_AUTOGRAD_FUNCTIONS = AVAILABLE and _major_minor(torch.__version__) >= (2, 13)


def _train_block(block: nn.Module, *args) -> torch.Tensor:
    """block.train_forward(*args): the block's training-step forward, compiled once per block structure."""
    return block.train_forward(*args)


train_block = _nested_compile_region(_train_block) if AVAILABLE else _train_block
