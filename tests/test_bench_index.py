"""The index quality benchmark: variant syntax (config overrides plus the choice of training features), extra indexes."""

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
import index_quality  # noqa: E402


def test_variant_items_and_feature_source():
    name, sets = index_quality.parse_variant("folds=features=folds,index.mixer=true")
    assert name == "folds" and index_quality.feature_source(sets) == ("folds", ["index.mixer=true"])
    assert index_quality.feature_source(index_quality.parse_variant("m=index.mixer=true")[1]) == ("loo", ["index.mixer=true"])
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
