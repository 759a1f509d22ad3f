"""Benchmark: backoff features looked up as one capped lookup per level against one pass over all levels.

    python scripts/bench/index_backoff_speed.py TOKENS [--lookup-tokens 1000000] [--repeats 3]

Builds the index of TOKENS' training split (or reuses --work), then streams validation tokens
through the backoff distribution (k = 16, caps 64 .. 1) twice per repeat, interleaved: "separate"
makes one Index.lookup per cap (the path before Index.lookup_levels), "one pass" is FeatureLookup
itself. Both must give the same records. Merges its part "backoff levels" into docs/bench/index.json.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402

from tscale.data.shards import TokenFolder  # noqa: E402
from tscale.index import Index, build_index  # noqa: E402
from tscale.index.distribution import CHUNK, LEVEL_TOPK, WEIGHT_SCALE, FeatureLookup, backoff_caps  # noqa: E402
from tscale.ops import index as ops  # noqa: E402


def separate_lookups(index: Index, tokens: np.ndarray, lookup: FeatureLookup) -> tuple[np.ndarray, np.ndarray]:
    """The backoff records from one Index.lookup per cap, chunked as FeatureLookup chunks."""
    tops, weights = [], []
    for s in range(0, len(tokens), CHUNK):
        w = max(0, s - (lookup.max_len - 1))
        part = tokens[w:s + CHUNK]
        levels = [index.lookup(part, None, max_len=c, topk=LEVEL_TOPK) for c in backoff_caps(lookup.max_len)]
        lens, nxt, cnt = (np.stack([lv[j][s - w:] for lv in levels]) for j in range(3))  # (C, n[, LEVEL_TOPK])
        top, weight = ops.index_backoff(lens, nxt, cnt, index.vocab_size, lookup.topk, WEIGHT_SCALE)
        tops.append(top)
        weights.append(weight)
    return np.concatenate(tops), np.concatenate(weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path, help="token folder")
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench-index-backoff", help="the index (built if missing)")
    ap.add_argument("--lookup-tokens", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    if not (args.work / "manifest.json").is_file():
        build_index(args.tokens, args.work, quiet=True)
    index = Index(args.work)
    val = np.asarray(TokenFolder(args.tokens, verify=False).shards("val")[0].tokens[: args.lookup_tokens])
    index.lookup(val[:20000])  # warm-up: tables, page cache
    lookup = FeatureLookup(16, distribution="backoff")
    separate, one_pass = [], []
    for _ in range(args.repeats):  # interleaved: a shared machine's load shifts between runs
        t0 = time.perf_counter()
        want = separate_lookups(index, val, lookup)
        separate.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = lookup(index, val, None)
        one_pass.append(time.perf_counter() - t0)
        if not (np.array_equal(got[1], want[0]) and np.array_equal(got[2], want[1])):
            sys.exit("index_backoff_speed.py: the one-pass records differ from the separate lookups'")
    cores = torch.get_num_threads()
    rate = lambda times: round(len(val) / float(np.median(times)) / cores)  # noqa: E731
    metrics = {"backoff_levels_separate_tokens_per_s_per_core": rate(separate),
               "backoff_levels_one_pass_tokens_per_s_per_core": rate(one_pass),
               "backoff_levels_speedup": round(float(np.median(separate) / np.median(one_pass)), 3)}
    note = (f"backoff levels (index_backoff_speed.py): backoff features (k = 16, caps {list(backoff_caps(64))}) of "
            f"{len(val):,} validation tokens against the {index.num_tokens:,}-token index of {args.tokens.name}, "
            f"{cores} threads, median of {args.repeats} interleaved runs; separate = one Index.lookup per cap, "
            "one pass = Index.lookup_levels (FeatureLookup); identical records.")
    merge_metrics("index", metrics, note, args.out)
    print(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    main()
