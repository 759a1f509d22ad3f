"""Benchmark: which next-token distribution of the index serves a small model's mixer best, on this CPU.

A small gpt2 (4 x 192, seq 256) trains 600 steps of 4,096 tokens (2.5M tokens, one pass) on a
token folder (docs/index.md section 17 used mix.jsonl.xz in a BPE of 8,192 ids: `tscale tokenize
../shared/data/mix.jsonl.xz -o TOKENS --vocab-size 8192`) with the gate-only mixer, once per
distribution of tscale/index/distribution.py:

  counts4    the longest match's top-4 counts (the default)
  backoff4   the Witten-Bell backoff's 4 most probable tokens
  backoff16  its 16 most probable tokens

Each model is scored on every validation token against the raw index and the index
decontaminated at N = 32 (validation lookups made now, in the model's distribution), and
with its lookups hidden (the network alone). Same seed and windows for every model. Stages
already done in --work are kept, so a stopped run continues. Records:
docs/index-quality/cpu-distribution-<variant>.json; metrics cpu_check_distribution_* merged
into docs/bench/index.json.

  python scripts/bench/index_distribution_check.py TOKENS [--work .cache/index-distribution]
"""

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402
from index_quality import build, evaluate, train  # noqa: E402

STEPS = 600
MODEL = ['model.arch="gpt2"', "model.n_layer=4", "model.n_head=4", "model.d_model=192", "model.seq_len=256",
         "train.batch_size=16", f"train.steps={STEPS}", "optim.lr=3e-3", "optim.warmup_steps=60", "train.eval_every=0",
         "train.compile=false", 'train.device="cpu"', "index.mixer=true"]
VARIANTS = {"counts4": ("counts", 4), "backoff4": ("backoff", 4), "backoff16": ("backoff", 16)}
FEATURE_INDEX = {"counts4": "idx-raw", "backoff4": "idx-raw-backoff", "backoff16": "idx-raw-backoff16"}


def feature_args(distribution: str, topk: int) -> list:
    return ["--features", "--features-distribution", distribution, "--features-topk", topk]


def variant_metrics(name: str, result: dict) -> dict:
    """ppl of the network alone and with the raw and the decontaminated index; the reductions and nats saved."""
    alone = result["without_index"]["perplexity"]
    p = f"cpu_check_distribution_{name}_"
    m = {p + "ppl_network_alone": round(alone, 2)}
    for split, entry in zip(("raw", "decontaminated"), result["indexes"]):
        ppl = entry["perplexity"]
        m.update({p + f"ppl_{split}": round(ppl, 2), p + f"ppl_reduction_{split}": round(1 - ppl / alone, 4),
                  p + f"nats_saved_{split}": round(math.log(alone / ppl), 4)})
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path, help="token folder (tscale tokenize)")
    ap.add_argument("--work", type=Path, default=Path(".cache/index-distribution"), help="scratch folder (kept)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench", help="folder of index.json")
    ap.add_argument("--records", type=Path, default=REPO / "docs" / "index-quality", help="folder of the eval records")
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    for name, (distribution, topk) in VARIANTS.items():
        build(args.tokens, work / FEATURE_INDEX[name], log, feature_args(distribution, topk))
    dec = work / "idx-dec32"
    build(args.tokens, dec, log, ["--decontaminate", 32])
    metrics, results = {}, {}
    for name, (distribution, topk) in VARIANTS.items():
        sets = [*MODEL, f'index.path="{work / FEATURE_INDEX[name]}"', f'index.distribution="{distribution}"',
                f"index.topk={topk}"]
        run = work / f"run-{name}"
        train(None, sets, args.tokens, run, STEPS, log)
        results[name] = evaluate(run, args.tokens, [work / "idx-raw", dec], work / f"eval-{name}.json", log,
                                 ["--device", "cpu"])
        shutil.copyfile(work / f"eval-{name}.json", args.records / f"cpu-distribution-{name}.json")
        metrics.update(variant_metrics(name, results[name]))
    for name in ("backoff4", "backoff16"):
        for split, k in (("raw", 0), ("decontaminated", 1)):
            ours, base = results[name]["indexes"][k]["perplexity"], results["counts4"]["indexes"][k]["perplexity"]
            metrics[f"cpu_check_distribution_{name}_vs_counts4_{split}"] = round(1 - ours / base, 4)
    tokens = results["counts4"]["val_tokens"]
    notes = ("cpu_check_distribution (index_distribution_check.py): NOT the 124M measurement. gpt2 4 x 192, seq 256, "
             f"{STEPS} steps of 4,096 tokens from {args.tokens} (one pass, same seed and windows), the gate-only mixer "
             "(gate_stats on) trained on the raw index's leave-one-out features of each distribution: counts4 (the longest "
             "match's top 4), backoff4 and backoff16 (Witten-Bell over the matches capped at 64, 32, 16, 8, 4, 2 and 1 "
             "token, its 4 or 16 most probable tokens; tscale/index/distribution.py). Scored on all "
             f"{tokens:,} validation tokens against the raw index and the index decontaminated at N = 32, lookups made "
             "now in the model's distribution; ppl_network_alone is the same model with its lookups hidden (the networks "
             "differ a little between runs: the gate's gradients share the global clipping norm). *_vs_counts4_*: 1 - "
             "ppl / counts4's ppl; *_nats_saved_*: ln(ppl alone / ppl with the index). Records: "
             "docs/index-quality/cpu-distribution-*.json; docs/index.md section 17.")
    print(json.dumps(metrics, indent=1))
    print(f"-> {merge_metrics('index', metrics, notes, args.out, drop_prefixes=('cpu_check_distribution_',))}")


if __name__ == "__main__":
    main()
