"""Per-token index features of a token folder: features-{split}-NNNNN.bin beside the index.

Each record is FEATURE_DTYPE, packed, one per token of the token shard of the same name:
`len` (uint8) is the longest match of the context ending at that token (capped at
FEATURE_MAX_LEN) and `next` the most frequent token that followed it in the index (vocab_size
where there is none), i.e. the index's guess for the following token. Training tokens are
looked up leave-one-out: occurrences overlapping their own document do not count. Validation
documents are never in the index, so they need no exclusion. Contexts restart after each eos.
"""

from pathlib import Path

import numpy as np
from rich.progress import Progress

from tscale.data.shards import Shard, TokenFolder
from tscale.errors import UserError
from tscale.index.lookup import Index

FEATURE_MAX_LEN = 64
BATCH_TOKENS = 1 << 22


def feature_dtype(token_dtype: np.dtype) -> np.dtype:
    return np.dtype([("len", "u1"), ("next", np.dtype(token_dtype).str)])  # packed: 3 or 5 bytes


def feature_name(shard_name: str) -> str:
    return f"features-{shard_name}.bin"


def write_features(index: Index, folder: TokenFolder, out: Path, progress: Progress | None = None) -> dict:
    """Write features for every shard of `folder` into `out`; return {"files": [...], "record": {...}}."""
    index.check_tokens(folder)
    own = index.doc_ranges()
    dtype = feature_dtype(folder.dtype)
    files = []
    task = progress.add_task("writing features", total=folder.num_tokens("train") + folder.num_tokens("val")) if progress else None
    for split in ("train", "val"):
        for k, (name, shard) in enumerate(zip(folder.manifest["splits"][split]["shards"], folder.shards(split))):
            rec = np.zeros(len(shard.tokens), dtype=dtype)
            for s, e, excl in doc_batches(shard, k, own if split == "train" else None):
                lens, nxt, _ = index.lookup(shard.tokens[s:e], excl, max_len=FEATURE_MAX_LEN, topk=1)
                rec["len"][s:e] = lens
                rec["next"][s:e] = np.where(nxt[:, 0] >= 0, nxt[:, 0], index.vocab_size)
                if progress:
                    progress.advance(task, e - s)
            rec.tofile(out / feature_name(name))
            files.append(feature_name(name))
    record = {"max_len": FEATURE_MAX_LEN, "dtype": [list(f) for f in dtype.descr], "none_token": index.vocab_size,
              "leave_one_out": "train tokens ignore occurrences overlapping their own document"}
    return {"files": files, "record": record}


def doc_batches(shard: Shard, shard_no: int, own: dict | None):
    """Whole-document batches (s, e, exclude ranges or None) of about BATCH_TOKENS tokens."""
    starts = shard.docs[:, 0].astype(np.int64)
    ends = shard.doc_ends
    d0 = 0
    while d0 < len(starts):
        d1 = int(np.searchsorted(starts, starts[d0] + BATCH_TOKENS, side="left"))
        d1 = max(d1, d0 + 1)
        s, e = int(starts[d0]), int(ends[d1 - 1])
        excl = None
        if own is not None:
            ranges = np.array([own.get((shard_no, d), (-1, -1)) for d in range(d0, d1)], dtype=np.int64).reshape(-1, 2)
            excl = np.repeat(ranges, ends[d0:d1] - starts[d0:d1], axis=0)
        yield s, e, excl
        d0 = d1


def read_features(index_path: str | Path, shard_name: str, token_dtype: np.dtype) -> np.ndarray:
    """Memory-map features-{shard_name}.bin of an index folder as a FEATURE_DTYPE array."""
    path = Path(index_path) / feature_name(shard_name)
    if not path.is_file():
        raise UserError(f"{path}: missing; build the index with --features")
    return np.memmap(path, dtype=feature_dtype(token_dtype), mode="r")
