"""The token folder format: flat token shards, document tables, and their manifest.

A token folder (written by `tscale tokenize`) holds

  manifest.json        format "tscale-tokens" v1: dtype, vocab_size, eos_id, sources,
                       splits {train, val} -> shard names and counts, files with checksums
  tokenizer.json       the tokenizer (Hugging Face `tokenizers` format)
  {split}-NNNNN.bin    little-endian uint16 (uint32 when vocab_size > 65536) token ids;
                       every document is followed by one eos_id token
  {split}-NNNNN.idx    little-endian uint64, shape (D, 3): per document its first token
                       offset in the shard, its source (index into manifest "sources") and
                       its UTF-8 text bytes; a document ends where the next one starts

Documents never cross a shard. Readers memory-map the shards.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tscale.errors import UserError
from tscale.manifest import load_manifest

TOKENS_FORMAT = "tscale-tokens"
TOKENS_VERSION = 1
SPLITS = ("train", "val")
IDX_COLUMNS = 3  # start, source, text bytes


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass
class Shard:
    """One memory-mapped shard: tokens (N,) and docs (D, 3) = start, source, text bytes."""

    path: Path
    tokens: np.ndarray
    docs: np.ndarray

    @property
    def doc_ends(self) -> np.ndarray:
        return np.append(self.docs[1:, 0], len(self.tokens)).astype(np.int64)

    @property
    def doc_lengths(self) -> np.ndarray:
        """(D,) int64 tokens per document (its eos included)."""
        return self.doc_ends - self.docs[:, 0].astype(np.int64)


class TokenFolder:
    """Read side of a token folder: checks the manifest, then memory-maps the shards."""

    def __init__(self, path: str | os.PathLike, verify: bool = True):
        self.path = Path(path)
        self.manifest = load_manifest(self.path, TOKENS_FORMAT, (TOKENS_VERSION,), verify=verify)
        m = self.manifest
        self.vocab_size: int = m["vocab_size"]
        self.eos_id: int = m["eos_id"]
        self.sources: list[str] = m["sources"]
        self.dtype = np.dtype(m["dtype"])
        self.tokenizer_path = self.path / m["tokenizer"]
        self._shards: dict[str, list[Shard]] = {}

    def num_tokens(self, split: str) -> int:
        return self.manifest["splits"][split]["tokens"]

    def doc_tokens(self, split: str, chosen: list[np.ndarray]) -> int:
        """Tokens in the documents `chosen` of `split` (per shard, a bool (D,) mask)."""
        return sum(int(s.doc_lengths[c].sum()) for s, c in zip(self.shards(split), chosen))

    def shards(self, split: str) -> list[Shard]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}")
        if split not in self._shards:
            self._shards[split] = [self._open(name) for name in self.manifest["splits"][split]["shards"]]
        return self._shards[split]

    def _open(self, name: str) -> Shard:
        bin_path = self.path / f"{name}.bin"
        idx_path = self.path / f"{name}.idx"
        tokens = np.memmap(bin_path, dtype=self.dtype, mode="r")
        raw = np.fromfile(idx_path, dtype="<u8")
        if raw.size % IDX_COLUMNS:
            raise UserError(f"{idx_path}: size is not a whole number of document records (corrupt shard)")
        docs = raw.reshape(-1, IDX_COLUMNS)
        starts = docs[:, 0]
        if len(docs) and (starts[0] != 0 or np.any(np.diff(starts.astype(np.int64)) <= 0) or starts[-1] >= len(tokens)):
            raise UserError(f"{idx_path}: document offsets do not fit {bin_path.name} (corrupt shard)")
        if len(docs) and docs[:, 1].max() >= len(self.sources):
            raise UserError(f"{idx_path}: source index out of range (corrupt shard)")
        if len(tokens) and int(tokens.max()) >= self.vocab_size:
            raise UserError(f"{bin_path}: token id >= vocab_size {self.vocab_size} (corrupt shard)")
        return Shard(path=bin_path, tokens=tokens, docs=docs)


class ShardWriter:
    """Append documents to {split}-NNNNN.bin/.idx files, starting a new shard every `shard_tokens`."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.names: list[str] = []
        self.tokens = self.docs = self.text_bytes = 0
        self._bin = None
        self._idx: list[tuple[int, int, int]] = []
        self._pos = 0

    def add(self, ids: np.ndarray, source: int, text_bytes: int) -> None:
        """Append one document's ids (eos included) to the current shard."""
        if self._bin is None or (self._pos and self._pos + len(ids) > self.shard_tokens):
            self._roll()
        self._idx.append((self._pos, source, text_bytes))
        self._bin.write(np.asarray(ids, dtype=self.dtype).tobytes())
        self._pos += len(ids)
        self.tokens += len(ids)
        self.docs += 1
        self.text_bytes += text_bytes

    def _roll(self) -> None:
        self._flush()
        name = f"{self.split}-{len(self.names):05d}"
        self.names.append(name)
        self._bin = open(self.folder / f"{name}.bin", "wb")
        self._idx, self._pos = [], 0

    def _flush(self) -> None:
        if self._bin is None:
            return
        self._bin.close()
        np.asarray(self._idx, dtype="<u8").reshape(-1, IDX_COLUMNS).tofile(self.folder / f"{self.names[-1]}.idx")
        self._bin = None

    def close(self) -> dict:
        self._flush()
        return {"shards": self.names, "tokens": self.tokens, "docs": self.docs, "text_bytes": self.text_bytes}

    def files(self) -> list[str]:
        return [f"{n}.{ext}" for n in self.names for ext in ("bin", "idx")]
