"""Test builders for infer and eval: a small tokenizer, a tiny checkpoint, a hand-made token folder."""

from pathlib import Path

import numpy as np
import torch

from tscale.config import ModelConfig
from tscale.data.shards import TOKENS_FORMAT, TOKENS_VERSION, ShardWriter, token_dtype
from tscale.data.tokenizer import eos_id, save_tokenizer, train_tokenizer, vocab_size
from tscale.manifest import write_manifest
from tscale.model import build_model
from tscale.train.checkpoint import save_checkpoint

TEXT = [
    "The tide came in over the flats while the gulls argued about a crab.",
    "A kettle whistled somewhere down the corridor, then stopped.",
    "Café tables lined the square; naïve visitors paid twice — once in euros, once in patience.",
    "Numbers 12, 345 and 6789 were painted on the doors of the sheds.",
]


def make_tokenizer(folder: Path, size: int = 300, texts=None) -> Path:
    """Train a byte-level BPE of `size` ids on a few sentences; write folder/tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer((texts or TEXT) * 20, size)
    path = folder / "tokenizer.json"
    save_tokenizer(tok, path)
    return path


def tiny_config(vocab: int, seq_len: int = 32) -> ModelConfig:
    return ModelConfig(arch="gpt2", n_layer=2, n_head=2, d_model=32, seq_len=seq_len, vocab_size=vocab)


def make_checkpoint(run_dir: Path, tokenizer_path: Path, seq_len: int = 32, step: int = 5, seed: int = 0) -> Path:
    """A randomly initialised tiny gpt2 saved as run_dir/ckpt/step-NNNNNNN; returns that folder."""
    from tscale.data.tokenizer import load_tokenizer

    cfg = tiny_config(vocab_size(load_tokenizer(tokenizer_path)), seq_len)
    torch.manual_seed(seed)
    model = build_model(cfg)
    return save_checkpoint(run_dir, step, model, cfg, tokenizer_path, {"step": step}, keep_last=3)


def make_token_folder(folder: Path, tokenizer_path: Path, splits: dict, sources: list[str], shard_tokens: int = 64) -> Path:
    """A token folder from {split: [(source index, ids without eos, text bytes)]}; eos is appended to each doc."""
    from tscale.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_path)
    vocab, eos = vocab_size(tok), eos_id(tok)
    dtype = token_dtype(vocab)
    folder.mkdir(parents=True)
    save_tokenizer(tok, folder / "tokenizer.json")
    info, files = {}, ["tokenizer.json"]
    for split in ("train", "val"):
        w = ShardWriter(folder, split, dtype, shard_tokens)
        for src, ids, nbytes in splits.get(split, []):
            w.add(np.append(np.asarray(ids, dtype=np.int64), eos), src, nbytes)
        info[split] = w.close()
        files += w.files()
    write_manifest(folder, TOKENS_FORMAT, TOKENS_VERSION, files, vocab_size=vocab, eos_id=eos, dtype=dtype.str,
                   tokenizer="tokenizer.json", sources=sources, splits=info)
    return folder


def random_docs(rng: np.random.Generator, n: int, n_sources: int, vocab: int, eos: int) -> list:
    """n documents of 1..30 random non-eos ids, cycling through sources, with made-up byte counts."""
    docs = []
    for i in range(n):
        ids = rng.integers(0, vocab, size=int(rng.integers(1, 31)))
        ids[ids == eos] = (eos + 1) % vocab
        docs.append((i % n_sources, ids, int(len(ids) * 3 + rng.integers(0, 5))))
    return docs
