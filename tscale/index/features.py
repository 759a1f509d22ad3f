"""Per-token index features of a token folder: features-{split}-NNNNN.bin beside the index, written and read.

Each record is FEATURE_DTYPE, packed, one per token of the token shard of the same name,
about the context that ends at that token (the index's view of the token that follows it):

  len    uint8            longest match of the context in the index, capped at the features' max_len
                          (FEATURE_MAX_LEN unless built with --features-max-len; at most MAX_FEATURE_LEN)
  next   token dtype (k,) the k most frequent tokens that followed that context in the index,
                          most frequent first; `none_token` (= vocab_size) where there are fewer
  count  uint32 (k,)      how often each followed it (0 for none; ranges above FEATURE_MAX_SUPPORT
                          occurrences are sampled and scaled, see Index.lookup); with the backoff
                          distribution, the k most probable tokens instead and their probabilities
                          in units of 2^-30 (tscale/index/distribution.py)

so 1 + 2k + 4k bytes a record with uint16 tokens (25 for the default k = 4). Training tokens
are looked up leave-one-out: occurrences overlapping their own document do not count.
Validation documents are never in the index, so they need no exclusion. Contexts restart
after each eos. The manifest's "features" record (FEATURES_VERSION 2) gives k, the limits,
the dtype, none_token and the distribution ("counts" where the key is missing); version 1 (len
and top-1 next only) is refused when read.

Features belong to the token folder the index was built from; `StoredFeatures` refuses
another one. `fresh_features` computes the same records on the fly (for an index built
without --features, or from other tokens of the same tokenizer).
"""

import os
from pathlib import Path

import numpy as np
from rich.progress import Progress

from tscale.data.shards import Shard, TokenFolder
from tscale.errors import UserError
from tscale.fileio import sha256_file, write_text_atomic
from tscale.index.distribution import DISTRIBUTIONS, FeatureLookup
from tscale.index.lookup import INDEX_FORMAT, INDEX_VERSION, Index
from tscale.manifest import MANIFEST, load_manifest

FEATURES_VERSION = 2
# the default cap on a lookup's match length (index.max_len, --features-max-len)
FEATURE_MAX_LEN = FeatureLookup._field_defaults["max_len"]
MAX_FEATURE_LEN = 255  # the len field is one byte
FEATURE_MAX_SUPPORT = FeatureLookup._field_defaults["max_support"]  # ranges counted exactly
DEFAULT_TOPK = FeatureLookup._field_defaults["topk"]
MAX_TOPK = 64
BATCH_TOKENS = 1 << 22
COUNT_MAX = (1 << 32) - 1


def feature_dtype(token_dtype: np.dtype, topk: int) -> np.dtype:
    """The packed record: len u1, next (topk,) token dtype, count (topk,) u4."""
    return np.dtype([("len", "u1"), ("next", np.dtype(token_dtype).str, (topk,)), ("count", "<u4", (topk,))])


def feature_name(shard_name: str) -> str:
    return f"features-{shard_name}.bin"


def pack(lens: np.ndarray, nxt: np.ndarray, cnt: np.ndarray, dtype: np.dtype, none_token: int) -> np.ndarray:
    """Index.lookup's (N,), (N, k), (N, k) -> (N,) records of `dtype`."""
    rec = np.zeros(len(lens), dtype=dtype)
    rec["len"] = np.minimum(lens, 255)
    rec["next"] = np.where(nxt >= 0, nxt, none_token)
    rec["count"] = np.clip(cnt, 0, COUNT_MAX)
    return rec


def write_features(index: Index, folder: TokenFolder, out: Path, progress: Progress | None = None,
                   lookup: FeatureLookup = FeatureLookup(), splits: tuple[str, ...] = ("train", "val")) -> dict:
    """Write features for every shard of `splits` of `folder` into `out`; return {"files": [...], "record": {...}}."""
    check_lookup(lookup)
    index.check_tokens(folder)
    own = index.doc_ranges()
    dtype = feature_dtype(folder.dtype, lookup.topk)
    files = []
    task = progress.add_task("writing features", total=sum(folder.num_tokens(s) for s in splits)) if progress else None
    for split in splits:
        for k, (name, shard) in enumerate(zip(folder.manifest["splits"][split]["shards"], folder.shards(split))):
            batches = doc_batches(shard, k, own if split == "train" else None)
            _write_shard_features(out / feature_name(name), len(shard.tokens), dtype, batches,
                                  lambda tokens, excl: pack(*lookup(index, tokens, excl), dtype, index.vocab_size),
                                  shard.tokens, (lambda n: progress.advance(task, n)) if progress else None)
            files.append(feature_name(name))
    record = {"version": FEATURES_VERSION, "topk": lookup.topk, "max_len": lookup.max_len,
              "max_support": lookup.max_support, **lookup.record(), "dtype": [list(f) for f in dtype.descr],
              "record_bytes": dtype.itemsize, "none_token": index.vocab_size,
              "leave_one_out": "train tokens ignore occurrences overlapping their own document"}
    return {"files": files, "record": record}


def _write_shard_features(path: Path, n: int, dtype: np.dtype, batches, records, tokens, advance) -> None:
    """Write one shard's n records to `path`, batch by batch, so that an interrupted write continues.

    Records go into PATH.part; PATH.done holds how many leading tokens are written. A later call
    skips those batches (doc_batches yields the same ones again), and a finished file is kept.
    """
    part, done_file = path.with_name(path.name + ".part"), path.with_name(path.name + ".done")
    if path.is_file() and path.stat().st_size == n * dtype.itemsize:
        if advance:
            advance(n)
        return
    if n == 0:
        path.write_bytes(b"")
        return
    resume = part.is_file() and part.stat().st_size == n * dtype.itemsize and done_file.is_file()
    done = int(done_file.read_text()) if resume else 0
    rec = np.memmap(part, dtype=dtype, mode="r+" if resume else "w+", shape=(n,))
    for s, e, excl in batches:
        if e > done:
            rec[s:e] = records(tokens[s:e], excl)
            rec.flush()
            write_text_atomic(done_file, str(e))
        if advance:
            advance(e - s)
    del rec
    os.replace(part, path)
    done_file.unlink(missing_ok=True)


def doc_batches(shard: Shard, shard_no: int, own: dict | None, limit: int | None = None):
    """Whole-document batches (s, e, exclude ranges or None) of about BATCH_TOKENS tokens, up to `limit` tokens."""
    starts = shard.docs[:, 0].astype(np.int64)
    ends = shard.doc_ends
    d0 = 0
    while d0 < len(starts) and (limit is None or starts[d0] < limit):
        d1 = int(np.searchsorted(starts, starts[d0] + BATCH_TOKENS, side="left"))
        d1 = max(d1, d0 + 1)
        s, e = int(starts[d0]), int(ends[d1 - 1])
        excl = None
        if own is not None:
            ranges = np.array([own.get((shard_no, d), (-1, -1)) for d in range(d0, d1)], dtype=np.int64).reshape(-1, 2)
            excl = np.repeat(ranges, ends[d0:d1] - starts[d0:d1], axis=0)
        yield s, e, excl
        d0 = d1


def check_max_len(max_len: int, what: str) -> None:
    if not 1 <= max_len <= MAX_FEATURE_LEN:
        raise UserError(f"{what} {max_len}: must be between 1 and {MAX_FEATURE_LEN}")


def check_lookup(lookup: FeatureLookup) -> None:
    """One-line errors for the build-index options a FeatureLookup comes from."""
    if not 1 <= lookup.topk <= MAX_TOPK:
        raise UserError(f"--features-topk {lookup.topk}: must be between 1 and {MAX_TOPK}")
    check_max_len(lookup.max_len, "--features-max-len")
    if lookup.distribution not in DISTRIBUTIONS:
        raise UserError(f"--features-distribution {lookup.distribution}: must be one of {', '.join(DISTRIBUTIONS)}")


def fresh_features(index: Index, shard: Shard, lookup: FeatureLookup, limit: int | None = None) -> np.ndarray:
    """Records of a shard without exclusion (validation), looked up now; only the first `limit` tokens are filled."""
    dtype = feature_dtype(shard.tokens.dtype, lookup.topk)
    rec = np.zeros(len(shard.tokens), dtype=dtype)
    rec["next"] = index.vocab_size
    for s, e, _ in doc_batches(shard, 0, None, limit):
        looked = lookup(index, shard.tokens[s:e])
        rec[s:e] = pack(*looked, dtype, index.vocab_size)
    return rec


def unpack(rec: np.ndarray, topk: int, none_token: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Records (..., ) -> match_len (...) int64, next_tokens (..., topk) int64 (-1 = none), counts (..., topk) int64."""
    nxt = rec["next"][..., :topk].astype(np.int64)
    cnt = rec["count"][..., :topk].astype(np.int64)
    nxt[(nxt == none_token) | (cnt == 0)] = -1
    return rec["len"].astype(np.int64), nxt, cnt


def stored_distribution(record: dict) -> str:
    """The distribution a features record holds (records written before the key existed hold counts)."""
    return record.get("distribution", "counts")


def tokens_match(manifest: dict, folder: TokenFolder) -> bool:
    """Whether an index manifest says it was built from exactly this token folder (its manifest's sha256)."""
    return same_tokens(manifest["tokens"], folder)


def same_tokens(identity: dict, folder: TokenFolder) -> bool:
    """Whether a token folder's identity record (tscale.index.lookup.tokens_identity) is this folder's."""
    return identity["manifest_sha256"] == sha256_file(folder.path / MANIFEST)


class StoredFeatures:
    """The features an index folder holds for its own token folder, memory-mapped per split and shard."""

    def __init__(self, index_path: str | Path, folder: TokenFolder, topk: int, max_len: int = FEATURE_MAX_LEN,
                 distribution: str = "counts"):
        self.path = Path(index_path)
        m = load_manifest(self.path, INDEX_FORMAT, (INDEX_VERSION,), verify=False)
        where = self.path / MANIFEST
        record = m.get("features")
        if not record:
            raise UserError(f"{where}: the index has no per-token features; build it with "
                            f"`tscale build-index {folder.path} -o DIR --features`")
        if record.get("version") != FEATURES_VERSION:
            raise UserError(f"{where}: features of version {record.get('version', 1)} (no next-token counts); "
                            f"rebuild the index with --features (version {FEATURES_VERSION})")
        if not tokens_match(m, folder):
            raise UserError(f"{where}: the index was built from token folder {m['tokens']['path']}, not {folder.path} "
                            f"(manifest sha256 differs); rebuild it from {folder.path} with --features")
        if topk > record["topk"]:
            raise UserError(f"index.topk {topk}: {self.path} stores only {record['topk']} next tokens per position; "
                            f"lower index.topk or rebuild with --features-topk {topk}")
        built = record.get("max_len", FEATURE_MAX_LEN)
        if built != max_len:
            raise UserError(f"index.max_len {max_len}: the features in {self.path} were looked up with matches capped at "
                            f"{built} tokens; set index.max_len = {built} or rebuild with --features-max-len {max_len}")
        made = stored_distribution(record)
        if made != distribution:
            raise UserError(f"index.distribution {distribution!r}: the features in {self.path} hold the {made!r} "
                            f"distribution; set index.distribution = {made!r} or rebuild with "
                            f"--features-distribution {distribution}")
        self.record, self.topk = record, topk
        self.none_token: int = record["none_token"]
        self.dtype = feature_dtype(folder.dtype, record["topk"])
        self.folder = folder

    def shards(self, split: str) -> list[np.ndarray]:
        """(N,) records per shard of `split`, aligned with the shard's tokens."""
        out = []
        for name, shard in zip(self.folder.manifest["splits"][split]["shards"], self.folder.shards(split)):
            path = self.path / feature_name(name)
            if not path.is_file():
                raise UserError(f"{path}: missing; rebuild the index {self.path} with --features")
            rec = np.memmap(path, dtype=self.dtype, mode="r") if len(shard.tokens) else np.zeros(0, self.dtype)
            if len(rec) != len(shard.tokens):
                raise UserError(f"{path}: {len(rec)} records for {len(shard.tokens)} tokens (corrupt features)")
            out.append(rec)
        return out
