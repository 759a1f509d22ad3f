"""Token folders written directly from token lists, for the index tests."""

from pathlib import Path

import numpy as np


from tscale.data.shards import TOKENS_FORMAT, TOKENS_VERSION, ShardWriter
from tscale.manifest import write_manifest


def write_token_folder(folder: Path, train_docs: list[list[int]], val_docs: list[list[int]], vocab: int = 40,
                       tokenizer_text: str = "{}") -> Path:
    """A token folder written directly (docs given as token lists; eos = vocab - 1 appended)."""
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(tokenizer_text)
    splits, files = {}, ["tokenizer.json"]
    for split, docs in (("train", train_docs), ("val", val_docs)):
        w = ShardWriter(folder, split, np.dtype("<u2"), 60)
        for d in docs:
            w.add(np.array(d + [vocab - 1]), 0, len(d))
        splits[split] = w.close()
        files += w.files()
    write_manifest(folder, TOKENS_FORMAT, TOKENS_VERSION, files, vocab_size=vocab, eos_id=vocab - 1, dtype="<u2",
                   tokenizer="tokenizer.json", sources=["test"], splits=splits)
    return folder
