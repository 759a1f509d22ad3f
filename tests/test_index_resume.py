"""An interrupted build-index keeps its finished index and feature batches; the same build continues from them."""

import json
import os
import signal

import numpy as np
import pytest

import tscale.index.build as build_module
import tscale.index.features as feats
from helpers_index import write_token_folder
from tscale.errors import UserError
from tscale.fileio import RESUME_KEY
from tscale.index import build_index
from tscale.index.lookup import INDEX_FORMAT, INDEX_VERSION
from tscale.manifest import load_manifest


@pytest.fixture
def tokens(tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    motifs = [list(rng.integers(0, 39, 6)) for _ in range(4)]
    docs = [[int(t) for _ in range(int(rng.integers(2, 6))) for t in motifs[int(rng.integers(0, 4))]] +
            [int(t) for t in rng.integers(0, 39, int(rng.integers(3, 15)))] for _ in range(40)]
    val = [[int(t) for t in motifs[i % 4] + list(rng.integers(0, 39, 8))] for i in range(6)]
    monkeypatch.setattr(feats, "BATCH_TOKENS", 20)  # several batches a shard (the folder's shards hold 60 tokens)
    return write_token_folder(tmp_path / "tokens", docs, val)


def _counting(monkeypatch, module, name, stop_at=None, error=KeyboardInterrupt):
    """Wrap module.name: count its calls, raise `error` on call number `stop_at`."""
    real, calls = getattr(module, name), []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if stop_at is not None and len(calls) == stop_at:
            raise error()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != "manifest.json"}


def test_an_interrupted_features_pass_continues_where_it_stopped(tokens, tmp_path, monkeypatch):
    reference = tmp_path / "reference"
    with monkeypatch.context() as m:
        batches = _counting(m, feats, "pack")
        build_index(tokens, reference, features=True, quiet=True)
    total = len(batches)
    assert total > 6

    out = tmp_path / "index"
    with monkeypatch.context() as m:
        _counting(m, feats, "pack", stop_at=5)
        with pytest.raises(KeyboardInterrupt):
            build_index(tokens, out, features=True, quiet=True)
    partial = tmp_path / ".index.partial"
    assert not out.exists() and (partial / "manifest.json").is_file()
    assert list(partial.glob("features-*")) and (partial / RESUME_KEY).is_file()

    with monkeypatch.context() as m:
        sorts = _counting(m, build_module.ops, "suffix_array")
        batches = _counting(m, feats, "pack")
        manifest = build_index(tokens, out, features=True, quiet=True)
    assert sorts == []  # the index was kept
    assert len(batches) == total - 4  # the four finished batches were not looked up again
    assert not partial.exists() and not list(out.glob("*.part")) and not list(out.glob("*.done"))
    assert not (out / RESUME_KEY).exists() and set(manifest["files"]) == set(_files(out))
    assert _files(out) == _files(reference)
    stored = load_manifest(out, INDEX_FORMAT, (INDEX_VERSION,))  # every file's hash checked
    assert stored["features"] == load_manifest(reference, INDEX_FORMAT, (INDEX_VERSION,))["features"]


def test_a_build_with_other_options_starts_again(tokens, tmp_path, monkeypatch):
    out = tmp_path / "index"
    with monkeypatch.context() as m:
        _counting(m, feats, "pack", stop_at=3)
        with pytest.raises(KeyboardInterrupt):
            build_index(tokens, out, features=True, quiet=True)
    with monkeypatch.context() as m:
        sorts = _counting(m, build_module.ops, "suffix_array")
        manifest = build_index(tokens, out, features=True, features_topk=2, quiet=True)
    assert len(sorts) == 1 and manifest["features"]["topk"] == 2
    assert not (tmp_path / ".index.partial").exists()


def test_an_error_other_than_an_interrupt_leaves_nothing(tokens, tmp_path, monkeypatch):
    _counting(monkeypatch, feats, "pack", stop_at=2, error=RuntimeError)
    with pytest.raises(RuntimeError):
        build_index(tokens, tmp_path / "index", features=True, quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]


def test_a_partial_folder_not_made_by_a_build_is_refused(tokens, tmp_path):
    (tmp_path / ".index.partial").mkdir()
    (tmp_path / ".index.partial" / "mine.txt").write_text("keep")
    with pytest.raises(UserError, match=r"\.index\.partial: exists and is not a partial build"):
        build_index(tokens, tmp_path / "index", quiet=True)
    assert (tmp_path / ".index.partial" / "mine.txt").read_text() == "keep"


def test_sigterm_stops_a_build_as_an_interrupt(tokens, tmp_path, monkeypatch):
    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt")

    monkeypatch.setattr(feats, "pack", terminated)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        build_index(tokens, tmp_path / "index", features=True, quiet=True)
    assert (tmp_path / ".index.partial" / "manifest.json").is_file()
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_build_says_how_to_continue_and_that_it_continued(tokens, tmp_path, monkeypatch, capsys):
    with monkeypatch.context() as m:
        _counting(m, feats, "pack", stop_at=3)
        with pytest.raises(KeyboardInterrupt):
            build_index(tokens, tmp_path / "index", features=True, quiet=True)
    assert "run the same command again to continue" in capsys.readouterr().err
    build_index(tokens, tmp_path / "index", features=True)
    assert "continuing the interrupted build" in capsys.readouterr().err


def test_fold_features_interrupted_continue_with_the_next_fold(tokens, tmp_path, monkeypatch):
    import tscale.index.folds as folds
    from tscale.data.shards import TokenFolder

    reference = tmp_path / "reference"
    build_index(tokens, reference, features=True, features_folds=3, quiet=True)
    shards = len(TokenFolder(tokens).shards("train"))
    with monkeypatch.context() as m:  # stopped in fold 1, after fold 0's lookups in every shard
        _counting(m, folds, "_look_up_fold", stop_at=shards + 2)
        with pytest.raises(KeyboardInterrupt):
            build_index(tokens, tmp_path / "index", features=True, features_folds=3, quiet=True)
    partial = tmp_path / ".index.partial"
    assert not list(partial.glob(".fold-*"))  # the fold indexes are scratch
    assert json.loads((partial / folds.FOLDS_DONE).read_text())["done"] == [0]
    (partial / ".fold-1").mkdir()  # as a build killed with SIGKILL would leave it
    with monkeypatch.context() as m:
        sorts = _counting(m, build_module.ops, "suffix_array")
        lookups = _counting(m, folds, "_look_up_fold")
        build_index(tokens, tmp_path / "index", features=True, features_folds=3, quiet=True)
    assert len(sorts) == 2  # the indexes of folds 1 and 2; the index itself and fold 0's features were kept
    assert len(lookups) == 2 * shards
    assert _files(tmp_path / "index") == _files(reference)  # no FOLDS_DONE left, every record the same
    kept = load_manifest(tmp_path / "index", INDEX_FORMAT, (INDEX_VERSION,))["features"]["train_lookups"]
    assert kept == load_manifest(reference, INDEX_FORMAT, (INDEX_VERSION,))["features"]["train_lookups"]