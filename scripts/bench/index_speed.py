"""Benchmark: token-index build and streaming lookup speed on this machine's CPU cores.

Tokenizes nothing itself: give it a token folder (e.g. ../shared/data/mix.jsonl.xz through
`tscale tokenize --tokenizer ../shared/data/gpt2-bpe`). Builds the index once (SA-IS over the
training tokens), then streams validation tokens (no exclusion) and training tokens
(leave-one-out) through Index.lookup. Merges its part "speed (index_speed.py)" into
OUT/index.json (default docs/bench), keeping the record's other parts.
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402

from tscale.data.shards import TokenFolder  # noqa: E402
from tscale.index import Index, build_index  # noqa: E402
from tscale.index.distribution import FeatureLookup  # noqa: E402
from tscale.index.features import doc_batches  # noqa: E402


def lookup_rate(index: Index, tokens: np.ndarray, excl, lookup: FeatureLookup) -> float:
    t0 = time.perf_counter()
    lookup(index, tokens, excl)
    return len(tokens) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path, help="token folder")
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench-index", help="scratch folder for the index")
    ap.add_argument("--lookup-tokens", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5, help="lookup timings; the median is recorded, the range in the notes")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    cores = torch.get_num_threads()
    shutil.rmtree(args.work, ignore_errors=True)
    t0 = time.perf_counter()
    m = build_index(args.tokens, args.work, quiet=True)
    build_s = time.perf_counter() - t0
    index = Index(args.work)
    folder = TokenFolder(args.tokens, verify=False)
    val = np.asarray(folder.shards("val")[0].tokens[: args.lookup_tokens])
    t0 = time.perf_counter()
    index.lookup(val[:20000])  # warm-up: per-shard first-token and token-pair tables, page cache
    tables_s = time.perf_counter() - t0
    own = index.doc_ranges()
    s, e, excl = next(doc_batches(folder.shards("train")[0], 0, own))
    n = min(e - s, args.lookup_tokens)
    train = np.asarray(folder.shards("train")[0].tokens[s:s + n])
    val_rates, train_rates, backoff_rates = [], [], []
    for _ in range(args.repeats):  # interleaved: a shared machine's load shifts between runs
        val_rates.append(lookup_rate(index, val, None, FeatureLookup(4)))
        train_rates.append(lookup_rate(index, train, excl[:n], FeatureLookup(1)))
        backoff_rates.append(lookup_rate(index, val, None, FeatureLookup(4, distribution="backoff")))
    val_rate, train_rate = float(np.median(val_rates)), float(np.median(train_rates))
    lens = index.lookup(val, topk=1)[0]
    workers = m["build"].get("workers", 1)
    metrics = {
        "build_tokens_per_s_per_core": round(m["num_tokens"] / m["build"]["suffix_array_seconds"] / workers, 0),
        "build_stage_tokens_per_s_per_core": round(m["num_tokens"] / build_s / cores, 0),
        "lookup_tokens_per_s_per_core": round(val_rate / cores, 0),
        "lookup_train_leave_one_out_tokens_per_s_per_core": round(train_rate / cores, 0),
        "lookup_tokens_per_s_per_core_min": round(min(val_rates) / cores, 0),
        "lookup_tokens_per_s_per_core_max": round(max(val_rates) / cores, 0),
        "lookup_backoff_tokens_per_s_per_core": round(float(np.median(backoff_rates)) / cores, 0),
        "lookup_table_seconds": round(tables_s, 3),
        "bytes_per_token": m["bytes_per_token"],
        "index_tokens": m["num_tokens"],
        "val_mean_match_len": round(float(lens.mean()), 3),
        "cores": cores,
    }
    notes = (f"speed (index_speed.py): CPU, {cores} threads shared with other processes. Each shard's suffix array "
             "(SA-IS) is sorted by one "
             f"thread, {workers} shard(s) at once, so build_tokens_per_s_per_core = index tokens / (sort-phase seconds x "
             "shards sorted at once); build_stage_* is the whole stage (reading, SA, writing) per core. Lookup: "
             f"validation tokens streamed with max_len 64, top-4, max_support 64, all cores, median of {args.repeats} runs "
             "(min/max given); the train figure is leave-one-out, top-1 (the --features path); the backoff figure is "
             "the same validation tokens' features of the backoff distribution (seven capped lookups of 16 next tokens "
             "each, combined; tscale/index/distribution.py). "
             "lookup_table_seconds: first lookup, which builds the token-pair table. bytes_per_token: 2 (uint16 "
             "tokens) + 4 (uint32 SA) + the document table on disk; the pair table (8 bytes per distinct token pair) "
             "is built in memory on open.")
    print(json.dumps(metrics, indent=1))
    print(f"-> {merge_metrics('index', metrics, notes, args.out)}")


if __name__ == "__main__":
    main()
