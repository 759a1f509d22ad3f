"""Merge a benchmark record measured on another machine into docs/bench/NAME.json, keeping its provenance.

    python scripts/bench/merge_record.py RECORD.json [--only PREFIX ...] [--note TEXT] [--out-dir docs/bench]

A GPU run writes its record with `--out-dir` into a folder that comes back to this machine; this
merges it part by part (each paragraph of its notes is one part, named by the words before the
first ":"), like the benchmark itself would have on that machine: the parts' metrics replace the
same names, each paragraph is stamped with the source record's date, GPU, torch and commit, and
its command joins the target's. --only keeps the source's metrics whose names start with one of
the prefixes; --note appends a sentence to every merged paragraph (what the run shared the machine
with, say).
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402


def parts(notes: str) -> list[str]:
    """The paragraphs of a record's notes, each one part."""
    return [p for p in notes.split("\n\n") if p.strip()]


def merge_record(source: Path, out_dir: Path, only: tuple[str, ...] = (), note: str = "") -> Path:
    """Merge `source` (a record in the schema of DESIGN.md) into out_dir/<its benchmark>.json."""
    try:
        record = json.loads(source.read_text())
        name, metrics = record["benchmark"], record["metrics"]
        stamp = f"{record['date']}, {record['gpu']}, torch {record['torch']}, commit {record['commit']}"
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"{source}: not a benchmark record ({e}); expected the JSON a benchmark's --out-dir holds")
    if only:
        metrics = {k: v for k, v in metrics.items() if k.startswith(only)}
    path = out_dir / f"{name}.json"
    if not path.is_file():  # the first record of its kind: the source as it is
        out_dir.mkdir(parents=True, exist_ok=True)
        record["metrics"] = metrics
        path.write_text(json.dumps(record, indent=1) + "\n")
        return path
    paragraphs = parts(record.get("notes", "")) or [f"{source.stem}: measured elsewhere"]
    for i, paragraph in enumerate(paragraphs):
        text = f"{paragraph} {note}".strip() if note else paragraph
        path = merge_metrics(name, metrics if i == 0 else {}, text, out_dir, stamp=stamp, command=record.get("command"))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path, help="a record written by a benchmark's --out-dir")
    ap.add_argument("--only", nargs="+", default=(), help="merge only the metrics starting with these prefixes")
    ap.add_argument("--note", default="", help="a sentence appended to each merged paragraph")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    print(f"-> {merge_record(args.record, args.out_dir, tuple(args.only), args.note)}")


if __name__ == "__main__":
    main()
