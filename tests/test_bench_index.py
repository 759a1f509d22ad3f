"""The index quality benchmark's variant syntax: config overrides plus the choice of training features."""

import argparse
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
