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

import torch
import torch.nn as nn

_nested_compile_region = getattr(torch.compiler, "nested_compile_region", None)
AVAILABLE = _nested_compile_region is not None  # whether this torch can compile a region once


def _train_block(block: nn.Module, *args) -> torch.Tensor:
    """block.train_forward(*args): the block's training-step forward, compiled once per block structure."""
    return block.train_forward(*args)


train_block = _nested_compile_region(_train_block) if AVAILABLE else _train_block
