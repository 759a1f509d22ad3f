"""The documents an index of a larger corpus holds beyond a smaller corpus, as JSONL: what makes it larger.

    python scripts/bench/index_extra_docs.py INDEX CORPUS_FILE... --minus SMALL_FILE... -o EXTRA.jsonl.xz

INDEX was built (`tscale build-index`, usually with --decontaminate N --decontaminate-against
SMALL_TOKENS) from the token folder that `tscale tokenize CORPUS_FILE...` made. Its document
table names the training documents it kept by their position in that folder; reading the
corpus files again in the tokenizer's order (tscale.data.text_input) finds each one's JSON line.
Written: the kept documents whose source/doc no SMALL_FILE holds, lines as they were, so their
names, and with them the split rule's verdict (training), stay. `tscale tokenize SMALL_FILE...
EXTRA.jsonl.xz` then makes a folder whose validation split is the small corpus's and whose
training split adds exactly the larger index's extra documents: a file small enough to carry
to an offline machine where the whole larger corpus is not. Each document's UTF-8 length is
checked against the token folder's record of it, so a corpus read in another order is refused.
"""

import argparse
import json
import lzma
import sys
from pathlib import Path

from tscale.data.shards import TokenFolder
from tscale.data.text_input import iter_documents, list_inputs
from tscale.data.tokenize import is_validation
from tscale.index import Index


def kept_training_docs(index: Index) -> set[tuple[int, int]]:
    """(train shard number, document index in it) of every document the index holds."""
    return {(int(shard_no), int(doc)) for s in index.shards for _, shard_no, doc in s.docs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("index", type=Path)
    ap.add_argument("corpus", nargs="+", help="the files the index's token folder was tokenized from, in that order")
    ap.add_argument("--minus", nargs="+", required=True, help="corpus files whose documents are left out (by source/doc)")
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    if args.out.exists():
        sys.exit(f"{args.out}: exists; choose another --out or remove it")
    index = Index(args.index)
    folder = TokenFolder(index.manifest["tokens"]["path"], verify=False)
    modulus = folder.manifest["split_rule"]["modulus"]
    shards = folder.shards("train")
    lengths = [s.doc_lengths for s in shards]  # tokens per document
    kept = kept_training_docs(index)
    known = {(d.source, d.doc) for d in iter_documents(list_inputs(args.minus))}
    shard_no, doc_no, written, tokens = 0, 0, 0, 0
    tmp = args.out.with_name(args.out.name + ".tmp")  # renamed when complete: a stopped run leaves no partial file
    try:
        with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as out:
            for d in iter_documents(list_inputs(args.corpus)):
                if not d.text or is_validation(d.source, d.doc, modulus):  # tokenize skips empty documents
                    continue
                while doc_no >= len(shards[shard_no].docs):  # the next training document is in the next shard
                    shard_no, doc_no = shard_no + 1, 0
                row = shards[shard_no].docs[doc_no]  # (start, source, text bytes)
                if int(row[2]) != len(d.text.encode("utf-8")):
                    sys.exit(f"{d.source}/{d.doc}: {len(d.text.encode('utf-8'))} bytes, but training document "
                             f"{doc_no} of shard {shard_no} of {folder.path} has {int(row[2])}: give the corpus "
                             "files in the order they were tokenized")
                if (shard_no, doc_no) in kept and (d.source, d.doc) not in known:
                    line = json.dumps({"source": d.source, "doc": d.doc, "text": d.text}, ensure_ascii=False)
                    out.write(line + "\n")
                    written += 1
                    tokens += int(lengths[shard_no][doc_no])
                doc_no += 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(args.out)
    print(f"{written:,} documents, {tokens:,} tokens of {folder.path} -> {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
