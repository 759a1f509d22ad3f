"""The index quality benchmark: variant syntax (config overrides plus the choice of training features), extra indexes."""

import argparse
import json
import lzma
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
import index_distribution_check  # noqa: E402
import index_quality  # noqa: E402

from tscale.data.tokenize import is_validation, tokenize_corpus  # noqa: E402
from tscale.index import Index, build_index  # noqa: E402


def test_variant_items_and_feature_source():
    name, sets = index_quality.parse_variant("folds=features=folds,index.mixer=true")
    assert name == "folds" and index_quality.feature_source(sets) == ("folds", ["index.mixer=true"])
    assert index_quality.feature_source(index_quality.parse_variant("m=index.mixer=true")[1]) == ("loo", ["index.mixer=true"])
    backoff = index_quality.parse_variant("b=features=backoff,index.mixer=true")[1]
    assert index_quality.feature_source(backoff) == ("backoff", ["index.mixer=true", 'index.distribution="backoff"'])
    assert index_quality.stored_topk([backoff]) == 4
    assert index_quality.stored_topk([backoff, ["index.mixer=true", "index.topk=16"]]) == 16
    with pytest.raises(argparse.ArgumentTypeError, match="features=kfold"):
        index_quality.parse_variant("x=features=kfold,index.mixer=true")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME not 'base'"):
        index_quality.parse_variant("base=index.mixer=true")


def test_extra_index_argument_and_evaluations_kept_only_for_the_same_indexes(tmp_path, monkeypatch):
    name, path = index_quality.parse_extra_index(f"linux={tmp_path / 'big'}")
    assert name == "linux" and path == (tmp_path / "big").resolve()
    for bad in ("two words=/x", "x="):
        with pytest.raises(argparse.ArgumentTypeError):
            index_quality.parse_extra_index(bad)
    calls = []

    def fake_tscale(args, log):  # what `tscale eval --out OUT --index ...` writes, reduced to the index list
        calls.append(args)
        given = [str(a) for a, flag in zip(args[1:], args) if flag == "--index"]
        Path(args[args.index("--out") + 1]).write_text(json.dumps({"indexes": [{"index": i} for i in given]}))
        return 1.0

    monkeypatch.setattr(index_quality, "tscale", fake_tscale)
    out, raw, big = tmp_path / "eval.json", tmp_path / "raw", tmp_path / "big"
    index_quality.evaluate(tmp_path / "run", tmp_path / "tok", [raw], out, tmp_path / "log", [])
    index_quality.evaluate(tmp_path / "run", tmp_path / "tok", [raw], out, tmp_path / "log", [])
    assert len(calls) == 1  # the same indexes: the earlier evaluation is kept
    r = index_quality.evaluate(tmp_path / "run", tmp_path / "tok", [raw, big], out, tmp_path / "log", [])
    assert len(calls) == 2 and [e["index"] for e in r["indexes"]] == [str(raw), str(big)]


def test_a_capped_run_is_recorded_beside_the_headline_not_over_it(tmp_path):
    from common import merge_metrics

    def record(metrics, cap):
        named, part, drop = index_quality.record_part(metrics, cap)
        merge_metrics("index", named, f"{part}: run at cap {cap}", tmp_path, drop_prefixes=drop, stamp="s", command="c")
        return json.loads((tmp_path / "index.json").read_text())

    record({"ppl_reduction_decontaminated": 0.11, "quality_ppl_without_index": 9.02}, None)
    r = record({"ppl_reduction_decontaminated": 0.10, "quality_ppl_without_index": 9.00}, 16)
    assert r["metrics"]["ppl_reduction_decontaminated"] == 0.11  # the headline stays the default configuration's
    assert r["metrics"]["cap16_ppl_reduction_decontaminated"] == 0.10
    r = record({"ppl_reduction_decontaminated": 0.12}, 16)  # a later run at the same cap replaces that run only
    assert "cap16_quality_ppl_without_index" not in r["metrics"] and r["metrics"]["quality_ppl_without_index"] == 9.02
    assert r["metrics"]["cap16_ppl_reduction_decontaminated"] == 0.12
    assert [p.split(":")[0] for p in r["notes"].split("\n\n")] == ["quality (index_quality.py)",
                                                                    "quality, matches capped at 16 (index_quality.py)"]


def _write_jsonl(path: Path, docs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"source": "notes", "doc": d, "text": t}) + "\n" for d, t in docs))
    return path


def test_extra_docs_are_the_larger_index_documents_the_smaller_corpus_lacks(tmp_path):
    rng = np.random.default_rng(5)
    words = ("tide wind cliff path field sheep wall gate door key lamp oil rope sail mast harbour ferry lemon crate "
             "bicycle mail island lighthouse keeper pencil ink fog bay bread letter council road river quarry").split()
    docs = [(f"d{i}", " ".join(rng.choice(words, int(rng.integers(20, 60))))) for i in range(80)]
    val_of_small = [i for i in range(30) if is_validation("notes", f"d{i}", 4)]
    for i in range(40, 80, 5):  # some documents beyond the small corpus copy a span of its validation text
        src = docs[val_of_small[i % len(val_of_small)]][1].split()
        docs[i] = (f"d{i}", docs[i][1] + " " + " ".join(src[:20]))
    small = _write_jsonl(tmp_path / "small.jsonl", docs[:30])
    big = _write_jsonl(tmp_path / "big.jsonl", docs)
    tokenize_corpus([big], tmp_path / "tok-big", vocab_size=300, val_modulus=4, quiet=True)
    tokenize_corpus([small], tmp_path / "tok-small", tokenizer=tmp_path / "tok-big" / "tokenizer.json", val_modulus=4,
                    quiet=True)
    m = build_index(tmp_path / "tok-big", tmp_path / "index", decontaminate=40,
                    decontaminate_against=tmp_path / "tok-small", quiet=True)
    assert 0 < m["decontamination"]["dropped_docs"] and m["num_docs"] > 0
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "index_extra_docs.py"
    out = tmp_path / "extra.jsonl.xz"
    subprocess.run([sys.executable, str(script), str(tmp_path / "index"), str(big), "--minus", str(small), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    got = [json.loads(line) for line in lzma.open(out, "rt", encoding="utf-8")]
    texts = {d: t for d, t in docs}
    small_names = {d for d, _ in docs[:30]}
    assert got and all(g["doc"] not in small_names and g["text"] == texts[g["doc"]] for g in got)
    copied = set(range(40, 80, 5))  # dropped: they share a span with the small corpus's validation text
    want = {f"d{i}" for i in range(30, 80) if i not in copied and not is_validation("notes", f"d{i}", 4)}
    assert {g["doc"] for g in got} == want and len(got) == len(want)
    indexed = sum(len(s.docs) for s in Index(tmp_path / "index").shards)
    assert indexed == len(want) + 30 - len(val_of_small)  # and the small corpus's training documents
    shuffled = _write_jsonl(tmp_path / "shuffled.jsonl", docs[::-1])
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "index"), str(shuffled), "--minus", str(small),
                          "-o", str(tmp_path / "bad.jsonl.xz")], capture_output=True, text=True)
    assert bad.returncode != 0 and "in the order they were tokenized" in bad.stderr
    assert not (tmp_path / "bad.jsonl.xz").exists() and not (tmp_path / "bad.jsonl.xz.tmp").exists()
    again = subprocess.run([sys.executable, str(script), str(tmp_path / "index"), str(big), "--minus", str(small), "-o",
                            str(out)], capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr  # an earlier output is never overwritten


def test_lookup_stats_compare_caps_on_the_same_positions(tmp_path):
    """index_lookup_stats.py --max-len: every cap is scored on the buckets of the match at 64 tokens."""
    import index_lookup_stats as stats

    rng = np.random.default_rng(6)
    words = "tide wind cliff path field sheep wall gate door key lamp oil rope sail mast harbour ferry lemon".split()
    docs = [(f"d{i}", " ".join(rng.choice(words, int(rng.integers(30, 80))))) for i in range(60)]
    val = [i for i in range(60) if is_validation("notes", f"d{i}", 4)]
    for k, i in enumerate(i for i in range(60) if i not in val):  # training copies of validation text: long matches
        if k % 3 == 0:
            docs[i] = (f"d{i}", docs[i][1] + " " + docs[val[k % len(val)]][1])
    tokenize_corpus([_write_jsonl(tmp_path / "c.jsonl", docs)], tmp_path / "tok", vocab_size=300, val_modulus=4,
                    quiet=True)
    build_index(tmp_path / "tok", tmp_path / "index", quiet=True)
    folder, index = stats.TokenFolder(tmp_path / "tok"), Index(tmp_path / "index")
    tokens, sources = stats.val_stream(folder)
    at64 = index.lookup(tokens, max_len=64, topk=1)[0]
    full = stats.lookup_stats(index, tokens, sources, folder.manifest["sources"], 64, at64)
    capped = stats.lookup_stats(index, tokens, sources, folder.manifest["sources"], 4, at64)
    assert (full["max_len"], capped["max_len"]) == (64, 4)
    assert [b["share"] for b in full["by_match_len"].values()] == [b["share"] for b in capped["by_match_len"].values()]
    assert full["by_match_len"][">=32"]["share"] > 0 and full["by_match_len"][">=32"]["top1"] > 0.9  # the copies
    assert capped["mean_match_len"] <= 4 < full["mean_match_len"]
    assert 0 <= capped["top1"] <= capped["top4"] <= 1 and full["top1"] != capped["top1"]
    reused = stats.lookup_stats(index, tokens, sources, folder.manifest["sources"], 64, at64,
                                stats.timed_lookup(index, tokens, 64))  # the buckets' own lookup, made once
    assert {k: v for k, v in reused.items() if k != "lookup_s"} == {k: v for k, v in full.items() if k != "lookup_s"}


def test_distribution_check_metrics_are_the_eval_records_perplexities():
    result = {"without_index": {"perplexity": 100.0}, "indexes": [{"perplexity": 50.0}, {"perplexity": 80.0}]}
    m = index_distribution_check.variant_metrics("backoff16", result)
    p = "cpu_check_distribution_backoff16_"
    assert (m[p + "ppl_raw"], m[p + "ppl_decontaminated"], m[p + "ppl_network_alone"]) == (50.0, 80.0, 100.0)
    assert m[p + "ppl_reduction_raw"] == 0.5 and m[p + "ppl_reduction_decontaminated"] == 0.2
    assert m[p + "nats_saved_raw"] == round(np.log(2.0), 4) and m[p + "nats_saved_decontaminated"] == round(np.log(1.25), 4)
    assert index_distribution_check.feature_args("backoff", 16) == ["--features", "--features-distribution", "backoff",
                                                                     "--features-topk", 16]
