"""Resumable batch loaders over a token folder: shuffled training windows, fixed validation windows.

Training: every shard is cut into windows of seq_len + 1 tokens (stride seq_len, so inputs
and next-token targets share one read). Each epoch visits all windows once in an order drawn
from (seed, epoch); the loader's whole state is (epoch, cursor), so a resumed run reads the
same batches as an uninterrupted one. With several ranks, rank r takes windows r, r + W, ...
of the shared order.

With the token index's features (tscale/index/features.py: one record per token, memory-mapped
like the tokens), a batch also carries an IndexFeatures of the B x T input positions: the
records of the window's first T tokens, i.e. of the contexts that predict the targets.
"""

from collections.abc import Sequence

import numpy as np
import torch

from tscale.data.shards import TokenFolder
from tscale.errors import UserError
from tscale.index.features import unpack
from tscale.index.mixing import IndexFeatures


class WindowFeatures:
    """Per-token index feature records of a split's shards (aligned with their tokens) and how to read them."""

    def __init__(self, shards: Sequence[np.ndarray], topk: int, none_token: int):
        self.shards, self.topk, self.none_token = list(shards), topk, none_token

    def gather(self, rows: Sequence[tuple[int, int]], seq_len: int) -> IndexFeatures:
        """IndexFeatures (B, T[, K]) of the windows starting at (shard, start) for `rows`."""
        recs = np.stack([self.shards[k][s: s + seq_len] for k, s in rows])  # (B, T) records
        return IndexFeatures(*(torch.from_numpy(a) for a in unpack(recs, self.topk, self.none_token)))


def _window_table(lengths: list[int], seq_len: int) -> np.ndarray:
    """(W, 2) int64 rows of (shard index, start offset) for every full window of every shard."""
    rows = []
    for i, n in enumerate(lengths):
        count = max(0, (n - 1) // seq_len)
        starts = np.arange(count, dtype=np.int64) * seq_len
        rows.append(np.stack([np.full(count, i, dtype=np.int64), starts], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 2), dtype=np.int64)


class TrainLoader:
    """Batches (x, y) of shape (B, T) from the training split, in a seeded order, resumable."""

    def __init__(self, folder: TokenFolder, seq_len: int, batch_size: int, seed: int,
                 rank: int = 0, world: int = 1, split: str = "train", features: WindowFeatures | None = None):
        self.shards = [s.tokens for s in folder.shards(split)]
        self.features = features
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world = rank, world
        self.windows = _window_table([len(s) for s in self.shards], seq_len)
        if len(self.windows) < batch_size * world:
            raise UserError(
                f"{folder.path}: the {split} split has {len(self.windows)} windows of {seq_len + 1} tokens, "
                f"fewer than one batch ({batch_size} x {world} ranks); use more data or a smaller "
                f"model.seq_len / train.batch_size")
        self.epoch, self.cursor = 0, 0
        self._order = self._draw_order()

    def _draw_order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.windows))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "windows": len(self.windows), "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        if state["windows"] != len(self.windows):
            raise UserError(f"the token folder changed since the checkpoint ({state['windows']} windows then, "
                            f"{len(self.windows)} now); resume needs the same data")
        self.epoch, self.cursor = state["epoch"], state["cursor"]
        self._order = self._draw_order()

    def next_batch(self, pin: bool = False) -> tuple:
        """The next (inputs, targets), each (B, T) int64, plus IndexFeatures when the loader has features.

        Pinned for an asynchronous copy with pin=True.
        """
        per_step = self.batch_size * self.world
        if self.cursor + per_step > len(self._order):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._draw_order()
        picked = self._order[self.cursor + self.rank: self.cursor + per_step: self.world]
        self.cursor += per_step
        T = self.seq_len
        buf = np.empty((self.batch_size, T + 1), dtype=np.int64)
        for row, w in enumerate(picked):
            shard, start = self.windows[w]
            buf[row] = self.shards[shard][start: start + T + 1]
        data = torch.from_numpy(buf)  # (B, T + 1)
        x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()  # (B, T) each
        out = (x, y)
        if self.features is not None:
            out += (self.features.gather([tuple(self.windows[w]) for w in picked], T),)
        return tuple(t.pin_memory() for t in out) if pin else out


def val_batches(folder: TokenFolder, seq_len: int, batch_size: int, max_batches: int,
                features: WindowFeatures | None = None):
    """At most `max_batches` batches of validation windows spread evenly over the whole split.

    The same windows every time, so in-training validation losses are comparable across steps,
    and drawn from every part of the split rather than from its first source only. Yields
    (x, y), or (x, y, IndexFeatures) with `features` of the val split.
    """
    shards = [s.tokens for s in folder.shards("val")]
    windows = _window_table([len(s) for s in shards], seq_len)
    if len(windows) == 0:
        raise UserError(f"{folder.path}: the val split has no window of {seq_len + 1} tokens; "
                        f"lower model.seq_len or add validation documents")
    wanted = min(len(windows), batch_size * max_batches)
    picked = windows[np.linspace(0, len(windows) - 1, wanted).round().astype(np.int64)]
    for b in range(0, wanted, batch_size):
        rows = picked[b: b + batch_size]
        data = torch.from_numpy(np.stack([shards[s][o: o + seq_len + 1].astype(np.int64) for s, o in rows]))
        if features is None:
            yield data[:, :-1], data[:, 1:]  # (B, T), (B, T)
        else:
            yield data[:, :-1], data[:, 1:], features.gather([(int(s), int(o)) for s, o in rows], seq_len)
