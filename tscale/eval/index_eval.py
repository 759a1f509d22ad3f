"""Evaluation against a token index: the val split's lookups (stored or made now) and the match-length breakdown.

For each `--index DIR`, every val token gets the index's lookup of the context before it:
from the index's stored features when the index was built (with --features) from exactly
this token folder with the same match cap and distribution, otherwise looked up now (matches
capped at the model's index.max_len, or --index-max-len for a model without the index; the
model's index.distribution, tscale/index/distribution.py; contexts
restart after eos; no exclusion, since validation documents are never in an index). A model
trained with the index is fed these lookups; any model's loss is broken down by the match-length
bucket of the context (0, 1-3, 4-7, 8-15, 16-31, >=32), so a raw and a decontaminated index can
be compared bucket by bucket (docs/index.md).
"""

import math
from pathlib import Path

import numpy as np

from tscale.data.loader import WindowFeatures
from tscale.data.shards import TokenFolder
from tscale.errors import UserError
from tscale.index import Index
from tscale.index.distribution import FeatureLookup
from tscale.index.features import (FEATURE_MAX_LEN, FEATURES_VERSION, StoredFeatures, fresh_features, same_tokens,
                                   stored_distribution, tokens_match)
from tscale.index.mixing import BUCKET_EDGES, bucket_labels

SHORT_MATCH = 16  # "below_16": tokens whose context matched fewer than this many tokens


def bucket_of(match_len: np.ndarray) -> np.ndarray:
    """Match lengths (n,) -> bucket ids (n,), as tscale.index.mixing.length_bucket."""
    return np.searchsorted(np.asarray(BUCKET_EDGES), match_len, side="right")


def val_features(index_path: str | Path, folder: TokenFolder, topk: int, max_tokens: int | None,
                 max_len: int = FEATURE_MAX_LEN, distribution: str = "counts") -> tuple[WindowFeatures, dict]:
    """The val split's lookups against the index at `index_path` (matches capped at `max_len`, the next-token
    `distribution` of tscale/index/distribution.py), and what the eval record says about the index."""
    index = Index(index_path)
    index.check_tokens(folder)
    m = index.manifest
    stored = m.get("features")
    usable = (bool(stored) and stored.get("version") == FEATURES_VERSION and stored["topk"] >= topk
              and stored.get("max_len", FEATURE_MAX_LEN) == max_len and stored_distribution(stored) == distribution
              and tokens_match(m, folder))
    if usable:
        records = StoredFeatures(index_path, folder, topk, max_len, distribution).shards("val")
        how = "stored features"
    else:
        records, left = [], max_tokens
        lookup = FeatureLookup(topk, max_len, distribution)
        for shard in folder.shards("val"):
            records.append(fresh_features(index, shard, lookup, None if left is None else left + 1))
            left = None if left is None else max(0, left - (len(shard.tokens) - 1))
        how = "looked up now"
    info = {"index": str(index.path), "lookups": how, "index_tokens": m["num_tokens"], "max_len": max_len,
            "distribution": distribution,
            "decontamination": m.get("decontamination")}
    d = info["decontamination"]
    if d:  # against these validation documents, or another folder's?
        info["decontaminated_against_this_split"] = same_tokens(d.get("against", m["tokens"]), folder)
    return WindowFeatures(records, topk, index.vocab_size), info


def bucket_summary(nats: np.ndarray, tokens: np.ndarray) -> dict:
    """Per-bucket {tokens, share, nats, loss, perplexity} plus the same for all tokens of matches below 16."""
    total = int(tokens.sum())

    def stats(n: float, t: int) -> dict:
        loss = n / t if t else None
        return {"tokens": int(t), "share": t / total if total else None, "nats": float(n), "loss": loss,
                "perplexity": math.exp(loss) if loss is not None else None}

    short = int(np.searchsorted(np.asarray(BUCKET_EDGES), SHORT_MATCH)) + 1  # buckets entirely below 16
    return {"by_match_len": {label: stats(nats[b], tokens[b]) for b, label in enumerate(bucket_labels())},
            f"below_{SHORT_MATCH}": stats(float(nats[:short].sum()), int(tokens[:short].sum()))}


def check_index_use(ckpt_path: Path, model_uses_index: bool, indexes: list) -> None:
    if model_uses_index and not indexes:
        raise UserError(f"{ckpt_path}: the model was trained with the token index (index.json); "
                        f"give --index INDEX_DIR to evaluate it")
    if len(set(map(str, indexes))) != len(indexes):
        raise UserError(f"--index: the same folder is given twice ({', '.join(map(str, indexes))})")


def lookup_max_len(ckpt, index_max_len: int | None) -> int:
    """The match cap of the val lookups: the model's own index.max_len if it was trained with the index (another
    --index-max-len is refused: it would feed the model lookups unlike its training), else --index-max-len or 64."""
    if ckpt.index_cfg is None:
        return FEATURE_MAX_LEN if index_max_len is None else index_max_len
    own = ckpt.index_cfg.max_len
    if index_max_len is not None and index_max_len != own:
        raise UserError(f"--index-max-len {index_max_len}: {ckpt.path} was trained with index.max_len = {own}; "
                        f"leave --index-max-len out (or give {own})")
    return own
