"""Benchmark: how much the token index lowers validation perplexity, raw and decontaminated (docs/bench/index.json).

Given a token folder (on the GPU machine: ../shared/data/mix.jsonl.xz + code-slice.jsonl.xz,
GPT-2 BPE, made by `tscale tokenize`), it runs the real stages as subprocesses:

1. `tscale build-index --features`: the raw index of all training documents, with the
   per-token lookups training needs (leave-one-out for training tokens);
2. `tscale build-index --decontaminate N` for each N of --decontaminate (default 32, then 13):
   the same minus every training document that shares an N-token span with a validation one;
3. `tscale train` from the same config, seed and token budget, so all models read the same
   windows, each at most once (one pass): without the index, and once per --variant with it
   (features of the raw index; default: one variant "mixer" = index.mixer, the gate-only mixture).
   A variant with the item `features=folds` trains on training features looked up in K fold
   indexes decontaminated against their fold at the first N (`tscale build-index --features
   --features-folds K`, K = --features-folds, default 4; the index itself is the raw one).
   A variant with the item `features=backoff` trains on the raw index's features of the
   backoff distribution (`--features-distribution backoff`, as many next tokens as the backoff
   variants' largest index.topk; index.distribution = "backoff" for the model:
   tscale/index/distribution.py), and is evaluated with it;
4. `tscale eval --index RAW --index DEC...` of every model on every validation token.

ppl_reduction_X = 1 - ppl(model with index, lookups in index X) / ppl(model without index).
The headline `ppl_reduction_*` metrics are the first variant's; every other variant's are
recorded as `quality_variant_<name>_<metric>`. The headline `ppl_reduction_decontaminated`
uses the first N. Why 32 and not the GPT-3 / lm-eval
"13-gram" rule: decontamination here drops whole documents, and on mix + code-slice a 13-gram
shared with validation occurs in 97.5% of the training tokens' documents (kernel files share
license headers and include lists; the dictionary's letter files share entry markup), which
would leave a 3M-token index and measure index size rather than leakage. A 32-token exact match
"almost always means a copied page" (docs/research index_anchors.md §4), is TScale's own look-back
limit, and drops 68% of the training tokens on this corpus (64: 34%); with N = 32 no validation
context can match 32 tokens or more in the index, so the ">=32" bucket, which copies fill, is
empty. 13 is reported too (`*_decontaminated_13`). Per-bucket reductions and token shares are
recorded for each index. Stages whose output is complete are kept, so a run stopped by a time
limit continues where it stopped when started again (--fresh starts over).

  python scripts/bench/index_quality.py TOKENS [--train-tokens 65536000] [--work .cache/bench-index-quality]
      [--variant NAME=KEY=VALUE[,KEY=VALUE...]]...   e.g. --variant mixer=index.mixer=true
      [--features-folds 4]                           e.g. --variant folds=features=folds,index.mixer=true
                                                     e.g. --variant backoff=features=backoff,index.mixer=true
      [--extra-index NAME=INDEX]...                  e.g. --extra-index linux=INDEX-OF-A-LARGER-CORPUS
      [--index-max-len L]                            every lookup's match capped at L tokens (features, models, eval)
  python scripts/bench/index_quality.py TOKENS --tiny      # CPU, tiny model, minutes; writes under --work
"""

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402

from tscale.data.shards import TokenFolder  # noqa: E402
from tscale.index.mixing import bucket_labels  # noqa: E402
from tscale.train.checkpoint import checkpoint_dirs  # noqa: E402

TINY = ["model.arch=\"gpt2\"", "model.n_layer=2", "model.n_head=2", "model.d_model=64", "model.seq_len=64",
        "train.batch_size=8", "train.compile=false", "train.device=\"cpu\"", "train.eval_batches=4", "optim.lr=3e-3"]
QUALITY_KEYS = ("quality_", "ppl_reduction_")
BUCKET_KEYS = dict(zip(bucket_labels(), ["0", "1_3", "4_7", "8_15", "16_31", "ge32"]))


class Stopped(Exception):
    """SIGTERM / SIGINT reached this script (e.g. a time limit): the running stage is stopped first."""


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def tscale(args: list, log: Path) -> float:
    """Run `python -m tscale ARGS` with its output in `log`; seconds taken. A failure shows the log's tail.

    Stopped by a signal, the stage gets SIGTERM too (training then saves a checkpoint), so the
    same command run again continues from there.
    """
    t0 = time.perf_counter()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ tscale {' '.join(map(str, args))}\n")
        f.flush()
        proc = subprocess.Popen([sys.executable, "-m", "tscale", *map(str, args)], stdout=f, stderr=subprocess.STDOUT,
                                cwd=REPO)
        try:
            proc.wait()
        except Stopped as e:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            sys.exit(f"stopped by {e} during tscale {args[0]}; run the same command again to continue")
    if proc.returncode:
        tail = log.read_text(encoding="utf-8").splitlines()[-15:]
        sys.exit(f"tscale {args[0]} failed (exit {proc.returncode}); end of {log}:\n" + "\n".join(tail))
    seconds = time.perf_counter() - t0
    print(f"  tscale {args[0]} {args[1] if len(args) > 1 else ''}: {seconds:.1f} s", flush=True)
    return seconds


def build(tokens: Path, out: Path, log: Path, extra: list) -> float:
    if (out / "manifest.json").is_file():
        return 0.0
    shutil.rmtree(out, ignore_errors=True)
    return tscale(["build-index", tokens, "-o", out, "-q", *extra], log)


def train(config: Path | None, overrides: list, tokens: Path, run: Path, steps: int, log: Path) -> float:
    """Train to `steps` in `run`; a finished run is kept, a stopped one resumed from its checkpoint."""
    done = checkpoint_dirs(run)
    if done and done[-1][0] == steps:
        return 0.0
    sets = [a for s in overrides for a in ("--set", s)]
    if done:
        return tscale(["train", "-o", run, "--resume", "--quiet"], log)
    shutil.rmtree(run, ignore_errors=True)
    return tscale(["train", *([config] if config else []), *sets, "--tokens", tokens, "-o", run, "--quiet"], log)


def evaluate(run: Path, tokens: Path, indexes: list[Path], out: Path, log: Path, extra: list) -> dict:
    """`tscale eval` of `run` against `indexes`; an earlier result is kept if it scored the same indexes."""
    if out.is_file() and [e["index"] for e in json.loads(out.read_text())["indexes"]] != [str(i) for i in indexes]:
        out.unlink()
    if not out.is_file():
        tscale(["eval", run, "--tokens", tokens, "--out", out, *[a for i in indexes for a in ("--index", i)], *extra], log)
    return json.loads(out.read_text())


def last_rate(run: Path) -> float | None:
    rates = [r["tokens_per_s"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if "tokens_per_s" in r]
    return rates[-1] if rates else None


def record_part(metrics: dict, cap: int | None) -> tuple[dict, str, tuple[str, ...]]:
    """(metrics, part name, prefixes to drop) of a run in docs/bench/index.json.

    The headline keys belong to the default configuration; a run with --index-max-len L is a
    variant of it, so its metrics are named capL_* and its notes paragraph is its own, and it
    replaces only an earlier run at the same cap.
    """
    if cap is None:
        return metrics, "quality (index_quality.py)", QUALITY_KEYS
    prefix = f"cap{cap}_"
    return ({prefix + k: v for k, v in metrics.items()}, f"quality, matches capped at {cap} (index_quality.py)",
            tuple(prefix + k for k in QUALITY_KEYS))


FEATURE_SOURCES = ("features=loo", "features=folds", "features=backoff")  # a variant's training features (not a config key)


def parse_variant(text: str) -> tuple[str, list[str]]:
    """"NAME=KEY=VALUE,KEY=VALUE" -> (NAME, ["KEY=VALUE", ...])."""
    name, _, sets = text.partition("=")
    if not name.isidentifier() or name == "base" or not sets:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...], NAME not 'base'")
    items = sets.split(",")
    odd = [i for i in items if i.startswith("features=") and i not in FEATURE_SOURCES]
    if odd:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: {odd[0]}: expected one of {', '.join(FEATURE_SOURCES)}")
    return name, items


def parse_extra_index(text: str) -> tuple[str, Path]:
    """"NAME=PATH" -> (NAME, PATH)."""
    name, _, path = text.partition("=")
    if not name.isidentifier() or not path:
        raise argparse.ArgumentTypeError(f"--extra-index {text!r}: expected NAME=PATH (NAME a word)")
    return name, Path(path).resolve()


def feature_source(sets: list[str]) -> tuple[str, list[str]]:
    """("loo", "folds" or "backoff", the config overrides without the features item, plus what backoff needs)."""
    picked = [s.partition("=")[2] for s in sets if s in FEATURE_SOURCES]
    source = picked[-1] if picked else "loo"
    rest = [s for s in sets if s not in FEATURE_SOURCES]
    return source, rest + (['index.distribution="backoff"'] if source == "backoff" else [])


def stored_topk(variant_sets: list[list[str]], default: int = 4) -> int:
    """The most next tokens any of these variants reads (their index.topk items), for the features they share."""
    return max([default, *(int(s.partition("=")[2]) for sets in variant_sets for s in sets if s.startswith("index.topk="))])


def quality_metrics(base: dict, idx: dict, names: list[str]) -> dict:
    """ppl reductions overall, below 16 and per bucket, and bucket shares, for each index name (in eval order)."""
    m = {"quality_ppl_without_index": round(base["perplexity"], 4), "quality_val_tokens": base["val_tokens"]}
    if "without_index" in idx:  # the index model's network alone (its lookups switched off), against the baseline
        m["quality_ppl_index_model_lookups_off"] = round(idx["without_index"]["perplexity"], 4)
    for name, b, i in zip(names, base["indexes"], idx["indexes"]):
        m[f"ppl_reduction_{name}"] = round(1 - i["perplexity"] / b["perplexity"], 4)
        m[f"quality_ppl_with_index_{name}"] = round(i["perplexity"], 4)
        m[f"quality_ppl_reduction_below16_{name}"] = round(1 - i["below_16"]["perplexity"] / b["below_16"]["perplexity"], 4)
        for label, bk in BUCKET_KEYS.items():
            bb, ib = b["by_match_len"][label], i["by_match_len"][label]
            m[f"quality_share_{bk}_{name}"] = round(bb["share"], 4)
            if bb["tokens"]:
                m[f"quality_ppl_reduction_{bk}_{name}"] = round(1 - ib["perplexity"] / bb["perplexity"], 4)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path, help="token folder (tscale tokenize)")
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench-index-quality", help="scratch folder")
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "gpt2-124m.toml", help="model and optimizer")
    ap.add_argument("--train-tokens", type=int, default=65_536_000, help="tokens each model trains on (one pass)")
    ap.add_argument("--decontaminate", type=int, nargs="+", default=[32, 13], help="span lengths N; the first is the headline")
    ap.add_argument("--max-memory-gb", type=float, default=24.0, help="for sorting suffix arrays")
    ap.add_argument("--eval-batch-size", type=int, default=32)
    ap.add_argument("--max-eval-tokens", type=int, help="score at most this many val tokens")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="extra config override, every run")
    ap.add_argument("--variant", dest="variants", action="append", type=parse_variant,
                    help="NAME=KEY=VALUE[,...]: a model trained with the index and these overrides (repeatable; "
                         "the first is the headline) [default: mixer=index.mixer=true]")
    ap.add_argument("--features-folds", type=int, default=4, help="K of the variants with features=folds")
    ap.add_argument("--extra-index", dest="extras", action="append", type=parse_extra_index, default=[],
                    metavar="NAME=PATH", help="one more index every model is scored against (repeatable), e.g. of a "
                    "larger corpus: tscale build-index --decontaminate 32 --decontaminate-against TOKENS; metrics "
                    "ppl_reduction_extra_NAME and quality_*_extra_NAME")
    ap.add_argument("--index-max-len", type=int, help="cap every lookup's match at this many tokens (the features' "
                    "--features-max-len, every model's index.max_len, eval's --index-max-len; default 64); give each "
                    "value its own --work")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU; results go to --work, not docs/")
    ap.add_argument("--fresh", action="store_true", help="delete --work first")
    ap.add_argument("--out", type=Path, help="folder of index.json [default: docs/bench, or --work with --tiny]")
    args = ap.parse_args()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    out = args.out or (args.work if args.tiny else REPO / "docs" / "bench")
    tokens = args.tokens.resolve()
    if args.fresh:
        shutil.rmtree(args.work, ignore_errors=True)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"

    from tscale.config import load_config

    capped = args.index_max_len is not None
    overrides = [*(TINY if args.tiny else []), *args.overrides, *([f"index.max_len={args.index_max_len}"] if capped else [])]
    cap_build = ["--features-max-len", args.index_max_len] if capped else []
    cfg = load_config(None if args.tiny else args.config, overrides)
    per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len
    steps = max(1, args.train_tokens // per_step)
    folder = TokenFolder(tokens, verify=False)
    windows = sum(max(0, (len(s.tokens) - 1) // cfg.model.seq_len) for s in folder.shards("train"))  # as TrainLoader
    if steps * cfg.train.batch_size * cfg.train.grad_accum > windows:
        sys.exit(f"--train-tokens {args.train_tokens:,}: more than one pass over the {windows:,} training windows "
                 f"of {tokens}; lower it")
    run_sets = [*overrides, f"train.steps={steps}", f"optim.warmup_steps={max(1, steps // 10)}",
                f"train.eval_every={steps}", f"train.ckpt_every={max(1, steps // 4)}", "train.keep_last=1"]
    print(f"{tokens}: {windows:,} training windows; {steps:,} steps of {per_step:,} tokens per model", flush=True)

    t_index = time.perf_counter()
    raw = work / "index-raw"
    build(tokens, raw, log, ["--features", *cap_build, "--max-memory-gb", args.max_memory_gb])
    decs = []
    for n in args.decontaminate:
        decs.append(work / f"index-dec{n}")
        build(tokens, decs[-1], log, ["--decontaminate", n, "--max-memory-gb", args.max_memory_gb])
    variants = dict(args.variants or [("mixer", ["index.mixer=true"])])
    sources = {name: feature_source(sets) for name, sets in variants.items()}
    feature_index = {"loo": raw, "folds": work / f"index-folds{args.features_folds}", "backoff": work / "index-raw-backoff"}
    if any(src == "folds" for src, _ in sources.values()):
        build(tokens, feature_index["folds"], log, ["--features", *cap_build, "--features-folds", args.features_folds,
                                                    "--features-span", args.decontaminate[0],
                                                    "--max-memory-gb", args.max_memory_gb])
    backoff_sets = [sets for src, sets in sources.values() if src == "backoff"]
    if backoff_sets:
        build(tokens, feature_index["backoff"], log, ["--features", *cap_build, "--features-distribution", "backoff",
                                                      "--features-topk", stored_topk(backoff_sets),
                                                      "--max-memory-gb", args.max_memory_gb])
    index_s = time.perf_counter() - t_index

    config = None if args.tiny else args.config
    head = next(iter(variants))
    runs = {**{name: work / f"run-{name}" for name in variants}, "base": work / "run-base"}
    seconds = {name: train(config, [*run_sets, f'index.path="{feature_index[src]}"', *sets], tokens, runs[name], steps, log)
               for name, (src, sets) in sources.items()}
    seconds["base"] = train(config, run_sets, tokens, runs["base"], steps, log)
    extra = ["--batch-size", args.eval_batch_size, *(["--max-tokens", args.max_eval_tokens] if args.max_eval_tokens else []),
             *(["--device", "cpu"] if args.tiny else []), *(["--index-max-len", args.index_max_len] if capped else [])]
    indexes = [raw, *decs, *(path for _, path in args.extras)]
    evals = {k: evaluate(run, tokens, indexes, work / f"eval-{k}.json", log, extra) for k, run in runs.items()}

    names = ["raw", "decontaminated", *[f"decontaminated_{n}" for n in args.decontaminate[1:]],
             *(f"extra_{name}" for name, _ in args.extras)]
    metrics = quality_metrics(evals["base"], evals[head], names)
    for name in variants:
        if name != head:
            metrics.update({f"quality_variant_{name}_{k}": v for k, v in quality_metrics(evals["base"], evals[name], names).items()
                            if k not in ("quality_ppl_without_index", "quality_val_tokens") and "_share_" not in k})
    manifests = [json.loads((d / "manifest.json").read_text()) for d in decs]
    for name, m in zip(names[1:], manifests):
        metrics[f"quality_{name}_ngram"] = m["decontamination"]["ngram"]
        metrics[f"quality_{name}_dropped_token_share"] = round(m["decontamination"]["dropped_tokens"] / folder.num_tokens("train"), 4)
    extra_manifests = {name: json.loads((path / "manifest.json").read_text()) for name, path in args.extras}
    for name, m in extra_manifests.items():
        metrics[f"quality_extra_{name}_index_tokens"] = m["num_tokens"]
    rates = {k: last_rate(run) for k, run in runs.items()}
    metrics.update({
        "quality_train_tokens_per_model": steps * per_step,
        "quality_train_windows_available": windows,
        "quality_train_tokens_per_s_with_index": round(rates[head] or 0),
        "quality_train_tokens_per_s_without_index": round(rates["base"] or 0),
        "quality_index_stage_seconds": round(index_s, 1),
    })
    if all(seconds.values()):
        metrics["quality_train_seconds_all"] = round(sum(seconds.values()), 1)
    arch = cfg.model.arch
    notes = (f"{arch} {cfg.model.n_layer}x{cfg.model.d_model}, seq_len {cfg.model.seq_len}, {steps} steps x {per_step} tokens "
             f"({steps * per_step:,} tokens, one pass: no window read twice), same seed and windows with and without "
             f"the index; with it (top-{cfg.index.topk}, delta {cfg.index.delta}, matches capped at {cfg.index.max_len} "
             f"tokens, trained on the raw index's leave-one-out "
             f"features, or with features=folds on lookups in {args.features_folds} fold indexes decontaminated against "
             f"their fold at N = {args.decontaminate[0]}), variants {', '.join(f'{n}: ' + ' '.join(v) for n, v in variants.items())}; headline metrics: "
             f"{head}, the others under quality_variant_<name>_*. Evaluated on {metrics['quality_val_tokens']:,} validation tokens, "
             f"lookups against the raw index and the indexes decontaminated at N = {args.decontaminate} (whole training "
             f"documents sharing an N-token span with validation dropped). ppl_reduction = 1 - ppl_with / ppl_without; "
             f"quality_ppl_reduction_<bucket>_<index>: the same on the tokens whose context matched that many tokens; "
             f"quality_share_*: those tokens' share. Why N = 32 first: see the script's docstring.")
    for name, path in args.extras:
        m = extra_manifests[name]
        d = m.get("decontamination") or {}
        against = d.get("against", m["tokens"])["path"]
        notes += (f" Extra index {name}: {path} ({m['num_tokens']:,} tokens, built from {m['tokens']['path']}, "
                  + (f"decontaminated at N = {d['ngram']} against the validation documents of {against})" if d else "raw)"))
    if args.tiny:
        notes = "TINY CPU RUN (a smoke test, not a measurement). " + notes
    metrics, part, drop = record_part(metrics, args.index_max_len)
    path = merge_metrics("index", metrics, f"{part}: {notes}", Path(out), drop_prefixes=drop)
    print(json.dumps({k: v for k, v in metrics.items() if "ppl_reduction" in k}, indent=1))
    print(f"-> {path}")


if __name__ == "__main__":
    main()
