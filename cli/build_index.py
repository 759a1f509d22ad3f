"""`tscale build-index`: tokens/ -> index/ (options only; the work is tscale.index.build)."""

import click

from tscale import terminal
from tscale.index.build import DEFAULT_FEATURES_SPAN, DEFAULT_MAX_MEMORY_GB, build_index as build
from tscale.index.distribution import DISTRIBUTIONS
from tscale.index.features import DEFAULT_TOPK, FEATURE_MAX_LEN


@click.command("build-index")
@click.argument("tokens", type=click.Path())
@click.option("-o", "--out", type=click.Path(), required=True, help="Index folder to create (must not exist).")
@click.option("--max-memory-gb", type=float, default=DEFAULT_MAX_MEMORY_GB, show_default=True,
              help="Memory for sorting suffix arrays (all workers together); bounds the shard size.")
@click.option("--shard-tokens", type=int, help="At most this many tokens per index shard (default: from --max-memory-gb).")
@click.option("--decontaminate", type=int, metavar="N",
              help="Leave out training documents that share an N-token span with a validation document.")
@click.option("--decontaminate-against", type=click.Path(), metavar="TOKENS",
              help="With --decontaminate: check the spans against this token folder's validation documents (the "
              "ones a model will be scored on) instead of TOKENS' own; same tokenizer.")
@click.option("--features", is_flag=True, help="Also write per-token lookups (features-{split}-NNNNN.bin) for the token folder.")
@click.option("--features-topk", type=int, default=DEFAULT_TOPK, show_default=True,
              help="Next tokens (with their counts) stored per position in the features.")
@click.option("--features-max-len", type=int, default=FEATURE_MAX_LEN, show_default=True, metavar="L",
              help="Cap every lookup's match at L tokens (a model reads the features with index.max_len = L).")
@click.option("--features-distribution", type=click.Choice(DISTRIBUTIONS), default="counts", show_default=True,
              help="What the features say about the next token: the longest match's counts, or the Witten-Bell "
              "backoff over the matches capped at 32, 16, 8, 4, 2 and 1 token as well (one lookup per cap; a model "
              "reads it with index.distribution = \"backoff\").")
@click.option("--features-folds", type=int, metavar="K",
              help="Look up the training features in K fold indexes, each of the other folds minus the documents "
              "sharing a --features-span span with the fold (as the decontaminated evaluation index); "
              "default: leave-one-out in this index.")
@click.option("--features-span", type=int, default=DEFAULT_FEATURES_SPAN, show_default=True, metavar="N",
              help="With --features-folds: the span length that decontaminates each fold's index.")
@click.option("--workers", type=int, help="Shards sorted at once, one thread each, within --max-memory-gb together "
              "(default: all cores; used when the corpus needs several shards).")
@click.option("-q", "--quiet", is_flag=True, help="No progress display.")
def build_index(tokens, out, max_memory_gb, shard_tokens, decontaminate, decontaminate_against, features,
                features_topk, features_max_len, features_distribution, features_folds, features_span, workers, quiet) -> None:
    """Build the suffix-array index of the training documents of token folder TOKENS into OUT."""
    m = build(tokens, out, max_memory_gb=max_memory_gb, decontaminate=decontaminate, features=features,
              shard_tokens=shard_tokens, quiet=quiet, workers=workers, features_topk=features_topk,
              features_folds=features_folds, features_span=features_span, decontaminate_against=decontaminate_against,
              features_max_len=features_max_len, features_distribution=features_distribution)
    console = terminal.console()
    b = m["build"]
    console.print(f"{m['num_tokens']:,} tokens, {m['num_docs']:,} documents in {len(m['shards'])} shard(s), "
                  f"{m['bytes_per_token']} bytes/token, {b['seconds']:.1f} s -> {out}")
    if m["decontamination"]:
        d = m["decontamination"]
        against = f" (against the validation documents of {d['against']['path']})" if "against" in d else ""
        console.print(f"decontamination ({d['ngram']}-grams){against}: dropped {d['dropped_docs']:,} documents, "
                      f"{d['dropped_tokens']:,} tokens")
    if m["features"]:
        f = m["features"]
        what = "counts" if f["distribution"] == "counts" else "backoff probabilities"
        console.print(f"features written for train and val: match length (max {f['max_len']}), top-{f['topk']} next "
                      f"tokens and {what}, {f['record_bytes']} bytes/token")
        if "train_lookups" in f:
            t = f["train_lookups"]
            sizes = ", ".join(f"{p['index_tokens']:,}" for p in t["per_fold"])
            console.print(f"training features from {t['folds']} fold indexes decontaminated at {t['span']} tokens "
                          f"({sizes} tokens)")
