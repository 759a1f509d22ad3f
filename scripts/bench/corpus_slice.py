"""A small slice of JSONL corpora for the benchmarks' --tiny plumbing runs: whole documents, spread over each file.

    python scripts/bench/corpus_slice.py IN.jsonl.xz [IN2 ...] -o OUT.jsonl.xz [--chars 1000000]

From every input, documents are taken at an even stride (every one of the file's sources is
visited, since files are grouped by source) until that input's share of --chars is reached;
each document is cut to at most --doc-chars characters. Lines are copied as they are, so
source/doc names, and with them the train/validation split, are the original ones.
"""

import argparse
import json
import lzma
from pathlib import Path


def count_lines(path: Path) -> int:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return sum(1 for _ in f)


def slice_file(path: Path, chars: int, doc_chars: int, stride_docs: int) -> list[str]:
    """Every stride-th document of `path`, cut to doc_chars, until `chars` characters are taken."""
    out, taken = [], 0
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i % stride_docs or taken >= chars:
                continue
            doc = json.loads(line)
            doc["text"] = doc["text"][:doc_chars]
            taken += len(doc["text"])
            out.append(json.dumps(doc, ensure_ascii=False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--chars", type=int, default=1_000_000, help="characters in all (shared equally by the inputs)")
    ap.add_argument("--doc-chars", type=int, default=20_000, help="at most this many characters of a document")
    args = ap.parse_args()
    share = args.chars // len(args.inputs)
    lines = []
    for path in args.inputs:
        docs_wanted = max(1, share // (args.doc_chars // 2))  # assume documents fill half of --doc-chars
        lines += slice_file(path, share, args.doc_chars, max(1, count_lines(path) // docs_wanted))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(args.out, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} documents -> {args.out}")


if __name__ == "__main__":
    main()
