"""Read side of an index folder: opens the shards memory-mapped and answers longest-match lookups.

An index folder (written by `tscale build-index`, see tscale/index/build.py) holds

  manifest.json          format "tscale-index" v1: the token folder it was built from (its
                         manifest's and tokenizer's sha256), dtype, shards, decontamination,
                         features, files with checksums
  shard-NNNNN.tok        the shard's tokens (training documents, each ending in eos), like a .bin
  shard-NNNNN.sa         its suffix array: little-endian uint32 start offsets (shards < 2^32 tokens)
  shard-NNNNN.docs       little-endian uint64 (D, 3): per document its start in the shard, the
                         token folder's train shard number and the document's index in that shard
  features-{split}-NNNNN.bin  optional per-token lookups (tscale/index/features.py)

Positions are global: shard k's tokens follow shard k-1's. A lookup searches every shard and
merges: the match length is the longest over shards, and next-token counts are summed over the
shards that reach it (each shard contributes its top MERGE_TOPK tokens).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tscale.data.shards import TokenFolder
from tscale.errors import UserError
from tscale.fileio import sha256_file
from tscale.manifest import MANIFEST, load_manifest
from tscale.ops import index as ops

INDEX_FORMAT = "tscale-index"
INDEX_VERSION = 1
SA_BYTES = 4
DOC_COLUMNS = 3  # start in shard, train shard number, doc index in that shard
DEFAULT_MAX_LEN = 64
DEFAULT_MAX_SUPPORT = 64
MERGE_TOPK = 16


@dataclass
class IndexShard:
    """One memory-mapped index shard: tokens (n,), suffix array (n,) uint32, docs (D, 3), global offset."""

    name: str
    offset: int
    tokens: np.ndarray
    sa: np.ndarray
    docs: np.ndarray
    _tables: ops.LookupTables | None = None

    def tables(self, vocab_size: int) -> ops.LookupTables:
        """First-token and token-pair block starts, computed on first use (one pass over the suffix array)."""
        if self._tables is None:
            self._tables = ops.lookup_tables(self.tokens, self.sa, vocab_size)
        return self._tables


def tokens_identity(folder: TokenFolder) -> dict:
    """What an index records about its token folder, to refuse lookups from another tokenizer."""
    return {
        "path": str(folder.path.resolve()),
        "manifest_sha256": sha256_file(folder.path / MANIFEST),
        "tokenizer_sha256": sha256_file(folder.tokenizer_path),
    }


class Index:
    """An index folder opened for lookups. `verify` re-hashes every file (sizes are always checked)."""

    def __init__(self, path: str | os.PathLike, verify: bool = False):
        self.path = Path(path)
        self.manifest = load_manifest(self.path, INDEX_FORMAT, (INDEX_VERSION,), verify=verify)
        m = self.manifest
        if m["sa_bytes"] != SA_BYTES:
            raise UserError(f"{self.path / MANIFEST}: sa_bytes {m['sa_bytes']} is not supported (only {SA_BYTES})")
        self.vocab_size: int = m["vocab_size"]
        self.eos_id: int = m["eos_id"]
        self.dtype = np.dtype(m["dtype"])
        self.shards: list[IndexShard] = []
        offset = 0
        for rec in m["shards"]:
            self.shards.append(self._open(rec["name"], offset, rec["tokens"]))
            offset += rec["tokens"]
        self.num_tokens = offset

    def _open(self, name: str, offset: int, n: int) -> IndexShard:
        paths = {ext: self.path / f"{name}.{ext}" for ext in ("tok", "sa", "docs")}
        for p in paths.values():
            if not p.is_file():
                raise UserError(f"{p}: missing; the index {self.path} is incomplete (rebuild it)")
        tokens = np.memmap(paths["tok"], dtype=self.dtype, mode="c") if n else np.zeros(0, self.dtype)
        sa = np.memmap(paths["sa"], dtype="<u4", mode="c") if n else np.zeros(0, np.uint32)
        if len(tokens) != n or len(sa) != n:
            raise UserError(f"{paths['sa']}: {len(sa)} entries for {len(tokens)} tokens, manifest says {n} (corrupt index)")
        docs = np.fromfile(paths["docs"], dtype="<u8").reshape(-1, DOC_COLUMNS)
        return IndexShard(name, offset, tokens, sa, docs)

    def check_tokens(self, folder: TokenFolder) -> None:
        """Refuse a token folder whose tokenizer differs from the one this index was built with."""
        want = self.manifest["tokens"]["tokenizer_sha256"]
        have = sha256_file(folder.tokenizer_path)
        if have != want:
            raise UserError(f"{folder.tokenizer_path}: tokenizer sha256 {have[:12]}… differs from the one index "
                            f"{self.path} was built with ({want[:12]}…); rebuild the index from these tokens")

    def lookup(self, tokens, exclude_ranges=None, max_len: int = DEFAULT_MAX_LEN, topk: int = 4,
               max_support: int = DEFAULT_MAX_SUPPORT, reset_at_eos: bool = True):
        """Longest match and next-token counts for every position of `tokens` (N,).

        exclude_ranges: optional (N, 2) int64 global [start, end) per position; occurrences whose
        matched tokens or next token fall inside it do not count (leave-one-out). SA ranges above
        max_support entries are sampled. Returns match_len (N,) int32, next_tokens (N, topk) int64
        (-1 where none) and next_counts (N, topk) int64.
        """
        lens, nxt, cnt = self.lookup_levels(tokens, exclude_ranges, (max_len,), topk, max_support, reset_at_eos)
        return lens[0], nxt[0], cnt[0]

    def lookup_levels(self, tokens, exclude_ranges=None, caps=(DEFAULT_MAX_LEN,), topk: int = 4,
                      max_support: int = DEFAULT_MAX_SUPPORT, reset_at_eos: bool = True):
        """`lookup` with the match capped at each of `caps` (strictly descending), in one pass over `tokens`.

        Returns match_len (C, N) int32, next_tokens (C, N, topk) int64 and next_counts (C, N, topk) int64;
        level c equals lookup(..., max_len=caps[c]).
        """
        query = np.ascontiguousarray(np.asarray(tokens), dtype=np.int64)
        if query.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {query.shape}")
        if len(query) and (query.min() < 0 or query.max() >= self.vocab_size):
            raise UserError(f"token ids must lie in [0, {self.vocab_size}) for index {self.path}")
        if exclude_ranges is not None:
            exclude_ranges = np.asarray(exclude_ranges, dtype=np.int64)
            if exclude_ranges.shape != (len(query), 2):
                raise ValueError(f"exclude_ranges must have shape ({len(query)}, 2), got {exclude_ranges.shape}")
        eos = self.eos_id if reset_at_eos else -1
        live = [s for s in self.shards if len(s.tokens)]
        per_topk = topk if len(live) == 1 else max(topk, MERGE_TOPK)
        results = []
        for shard in live:
            excl = None if exclude_ranges is None else _local_ranges(exclude_ranges, shard.offset, len(shard.tokens))
            results.append(ops.index_lookup_levels(shard.tokens, shard.sa, shard.tables(self.vocab_size), query, excl,
                                                   eos, caps, per_topk, max_support))
        if not results:
            c, n = len(caps), len(query)
            return np.zeros((c, n), np.int32), np.full((c, n, topk), -1, np.int64), np.zeros((c, n, topk), np.int64)
        if len(results) == 1:
            return results[0]
        merged = [merge_shards([tuple(r[j][c] for j in range(3)) for r in results], topk) for c in range(len(caps))]
        return tuple(np.stack([m[j] for m in merged]) for j in range(3))

    def doc_ranges(self) -> dict[tuple[int, int], tuple[int, int]]:
        """(train shard number, doc index) -> global [start, end) of that document in the index."""
        out = {}
        for s in self.shards:
            ends = np.append(s.docs[1:, 0], len(s.tokens)).astype(np.int64)
            for (start, shard_no, doc), end in zip(s.docs.astype(np.int64), ends):
                out[(int(shard_no), int(doc))] = (s.offset + int(start), s.offset + int(end))
        return out


def _local_ranges(ranges: np.ndarray, offset: int, n: int) -> np.ndarray:
    """Global [s, e) per position -> this shard's coordinates; ranges missing the shard become (-1, -1)."""
    loc = np.clip(ranges - offset, 0, n)
    empty = loc[:, 0] >= loc[:, 1]
    loc[empty] = ops.NO_RANGE
    return loc


def merge_shards(results: list[tuple[np.ndarray, np.ndarray, np.ndarray]], topk: int):
    """Longest length over shards; next-token counts summed over the shards that reach it."""
    lens = np.stack([r[0] for r in results])  # (S, N)
    best = lens.max(axis=0)
    reach = lens == best  # (S, N)
    toks = np.concatenate([np.where(reach[s][:, None], r[1], -1) for s, r in enumerate(results)], axis=1)
    cnts = np.concatenate([np.where(reach[s][:, None], r[2], 0) for s, r in enumerate(results)], axis=1)
    order = np.argsort(toks, axis=1, kind="stable")
    toks = np.take_along_axis(toks, order, axis=1)
    cnts = np.take_along_axis(cnts, order, axis=1)
    for j in range(1, toks.shape[1]):  # fold runs of equal tokens into their last entry
        same = (toks[:, j] == toks[:, j - 1]) & (toks[:, j] >= 0)
        cnts[same, j] += cnts[same, j - 1]
        cnts[same, j - 1] = 0
    cnts[toks < 0] = 0
    key = -cnts * (1 << 33) + (toks + 1)
    order = np.argsort(key, axis=1, kind="stable")[:, :topk]
    toks = np.take_along_axis(toks, order, axis=1)
    cnts = np.take_along_axis(cnts, order, axis=1)
    toks[cnts == 0] = -1
    return best.astype(np.int32), toks, cnts
