"""Shared test fixtures: the real-data folder, a tiny corpus made by the test, and a CLI runner."""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]

# Sentences written for these tests; documents are built from them in a fixed order.
SENTENCES = [
    "The ferry left the harbour a little after six, carrying mail, two bicycles and a crate of lemons.",
    "Nobody on the island could remember when the lighthouse keeper had last taken a day off.",
    "She wrote the measurements in pencil, then again in ink once the numbers stopped changing.",
    "By noon the fog had lifted and the whole bay was bright enough to hurt the eyes.",
    "A loaf of rye bread, still warm, sat on the table beside an unopened letter from the council.",
    "The old road follows the river for nine miles before it climbs towards the quarry.",
    "He argued that the bridge should be repaired before winter, and for once the meeting agreed.",
    "Rain came in sideways off the sea, rattling the windows of the schoolhouse all afternoon.",
    "Café owners along the quay put out chairs as soon as the first tourists appeared — naïvely early.",
    "In the archive, every box was labelled twice: once by year and once by the name of the family.",
]


def make_text(i: int, n: int = 3) -> str:
    """A short paragraph-like document, different for every i."""
    lines = [SENTENCES[(i * 7 + k * 3) % len(SENTENCES)] for k in range(n)]
    return f"Note {i}\n\n" + "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real-data folder: $TSCALE_DATA, else ../shared/data, else .cache/demo/data (from `make demo`)."""
    candidates = [os.environ.get("TSCALE_DATA"), REPO.parent / "shared" / "data", REPO / ".cache" / "demo" / "data"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    pytest.skip("no data folder (set TSCALE_DATA or run `make demo`)")


@pytest.fixture(scope="session")
def shakespeare_jsonl(data_dir: Path) -> Path:
    path = data_dir / "shakespeare.jsonl.xz"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(scope="session")
def gpt2_bpe(data_dir: Path) -> Path:
    path = data_dir / "gpt2-bpe"
    if not (path / "encoder.json").is_file():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """tmp/corpus/ with notes/ (three .txt, one in a subfolder) and articles.jsonl (40 lines, two sources)."""
    root = tmp_path / "corpus"
    notes = root / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "harbour.txt").write_text(make_text(1, 4), encoding="utf-8")
    (notes / "quarry.txt").write_text(make_text(2, 2), encoding="utf-8")
    (notes / "sub" / "archive.txt").write_text(make_text(3, 5), encoding="utf-8")
    with open(root / "articles.jsonl", "w", encoding="utf-8") as f:
        for i in range(40):
            rec = {"text": make_text(10 + i, 1 + i % 4)}
            if i % 2 == 0:
                rec["source"] = "island-news"
            if i % 3 != 0:
                rec["doc"] = f"article-{i:03d}"
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return root


@pytest.fixture
def run_cli():
    """Call `tscale ARGS...` in-process; returns (exit_code, output) with stdout and stderr mixed."""
    from tscale.cli.main import main

    def run(*args) -> tuple[int, str]:
        result = CliRunner().invoke(main, [str(a) for a in args])
        return result.exit_code, result.output

    return run
