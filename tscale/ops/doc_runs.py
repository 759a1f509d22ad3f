"""The document runs of a training batch: the variable-length layout that FlashAttention-2 and cuDNN attend over.

A run is a stretch of one batch row inside one document; the runs of a (B, T) batch, laid end to
end, are the batch's B * T tokens, so the offsets of their starts describe the whole mask of
documents (tscale/ops/attention_fa2.py and attention_cudnn.py take them). They are computed on
the host from the batch's token ids before it goes to the GPU, so no step waits on a
device-to-host copy, and padded with empty runs to a slot count that few batches change (RunSlots), so
torch.compile, cuDNN's graphs and CUDA graphs see few shapes.
"""

import math
import os
from dataclasses import dataclass

import torch

# Slot counts are multiples of this. Empty slots are not free: cuDNN's backward reduces dO . O over every
# sequence slot at its full length (0.14 ms a layer at T 4096 for 64 slots against ~16 runs; docs/BENCHMARKS.md).
RUN_BUCKET = 8


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def run_bucket() -> int:
    """The bucket run counts are padded to: TSCALE_RUN_BUCKET when set (a benchmark's A/B), else RUN_BUCKET."""
    value = os.environ.get("TSCALE_RUN_BUCKET", "")
    if not value:
        return RUN_BUCKET
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"TSCALE_RUN_BUCKET={value!r}: must be a positive integer (or unset for {RUN_BUCKET})")
    return int(value)


@dataclass
class DocRuns:
    """The runs of a (B, T) batch as varlen offsets: cu (N + 1,) int32, and the bound on their length the
    kernels size their grids by: T, whatever the batch (a per-batch value would make
    torch.compile specialise on it and recompile every step). `windowed`: whether the sliding-window layers take
    the runs' attention too (False: only the global layers do, the windowed ones keep tscale.ops.attention).
    `backend`: which attention runs over them: "fa2" (tscale.ops.attention_fa2) or "cudnn" (attention_cudnn)."""

    cu: torch.Tensor
    max_len: int
    windowed: bool = True
    backend: str = "fa2"

    def serves(self, window: int) -> bool:
        """Whether a layer of this window (0: the whole context) runs the runs' attention (not tscale.ops.attention)."""
        return self.windowed or not window

    def to(self, device, non_blocking: bool = False) -> "DocRuns":
        """On `device`; non_blocking to a GPU copies from pinned memory (from pageable memory CUDA would first wait
        for the stream's queued work, and the host could no longer run ahead of the GPU)."""
        cu = self.cu.pin_memory() if non_blocking and torch.device(device).type == "cuda" else self.cu
        return DocRuns(cu.to(device, non_blocking=non_blocking), self.max_len, self.windowed, self.backend)


class RunSlots:
    """The slot count a training run pads its batches' runs to: a high-water mark, starting at `initial`
    (rounded up to the bucket). A batch with more runs than the slots raises them to its count plus
    `headroom`, rounded up to the bucket. Each new count costs a recompile of the step (about as long as the
    first compile) and new cuDNN graphs, so the first mark should hold for the whole run: see expected_slots."""

    def __init__(self, bucket: int | None = None, headroom: float = 0.25, initial: int = 0):
        self.bucket, self.headroom = bucket or run_bucket(), headroom
        self.slots = _round_up(initial, self.bucket)

    def __call__(self, n: int) -> int:
        """The slots for a batch of n runs (at least n)."""
        if n > self.slots:
            self.slots = _round_up(math.ceil(n * (1 + self.headroom)), self.bucket)
        return self.slots


def expected_slots(B: int, T: int, docs: int, tokens: int) -> int:
    """A first high-water mark for RunSlots that few batches exceed: the B row starts, plus twice the document
    starts a (B, T) batch holds on average (lam = B T docs / tokens) and four standard deviations of a Poisson
    count (windows drawn from stretches of short documents hold more than their share), plus 4."""
    lam = B * T * docs / max(tokens, 1)
    return B + math.ceil(2 * lam + 4 * math.sqrt(lam)) + 4


def doc_runs(opens: torch.Tensor | None, B: int, T: int, bucket: int | None = None, windowed: bool = True,
             backend: str = "fa2", slots: RunSlots | None = None) -> DocRuns:
    """The runs of a (B, T) batch: opens (B, T) bool, True where a document opens (the model's rule: at an
    eos token, which opens the next document), on the host; None: one run per row. Every row opens a run
    at 0. Offsets padded with empty runs to slots(n) slots when `slots` is given, else to a multiple of `bucket`
    (None: run_bucket()); max_len is T; windowed, backend as DocRuns."""
    new = torch.zeros(B, T, dtype=torch.bool)
    new[:, 0] = True
    if opens is not None:
        new |= opens.cpu()
    starts = new.flatten().nonzero().flatten()  # (N,)
    n = starts.numel()
    count = slots(n) if slots is not None else _round_up(n, bucket or run_bucket())
    cu = torch.full((count + 1,), B * T, dtype=torch.int32)
    cu[:n] = starts.to(torch.int32)
    return DocRuns(cu, T, windowed, backend)


def runs_of_doc_ids(doc_ids: torch.Tensor | None, B: int, T: int, backend: str = "fa2") -> DocRuns:
    """doc_runs of document ids (B, T) as tscale.ops.attention takes them (None: one run per row): a run
    opens where the id changes."""
    opens = None
    if doc_ids is not None:
        opens = torch.zeros(B, T, dtype=torch.bool)
        opens[:, 1:] = (doc_ids[:, 1:] != doc_ids[:, :-1]).cpu()
    return doc_runs(opens, B, T, backend=backend)


__all__ = ["RUN_BUCKET", "DocRuns", "RunSlots", "doc_runs", "expected_slots", "run_bucket", "runs_of_doc_ids"]
