"""`tscale tokenize`: text inputs -> token folder (options only; the work is tscale.data.tokenize)."""

import click

from tscale import terminal
from tscale.data.tokenize import DEFAULT_SHARD_TOKENS, DEFAULT_VAL_MODULUS, tokenize_corpus


@click.command("tokenize")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--out", type=click.Path(), required=True, help="Token folder to create (must not exist, or be empty).")
@click.option("--tokenizer", type=click.Path(), help="tokenizer.json, or a folder / encoder.json with GPT-2 encoder.json + vocab.bpe.")
@click.option("--vocab-size", type=int, help="Train a byte-level BPE of this many ids on the training split instead.")
@click.option("--val-modulus", type=int, default=DEFAULT_VAL_MODULUS, show_default=True,
              help="A document is validation iff crc32(source/doc) % this == 0.")
@click.option("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, show_default=True, help="Tokens per shard file (at most).")
@click.option("-q", "--quiet", is_flag=True, help="No progress display.")
def tokenize(inputs, out, tokenizer, vocab_size, val_modulus, shard_tokens, quiet) -> None:
    """Tokenize INPUTS (.txt, .jsonl, .jsonl.xz files or folders of them) into the token folder OUT."""
    m = tokenize_corpus(list(inputs), out, tokenizer=tokenizer, vocab_size=vocab_size,
                        val_modulus=val_modulus, shard_tokens=shard_tokens, quiet=quiet)
    console = terminal.console()
    for split in ("train", "val"):
        s = m["splits"][split]
        console.print(f"{split:5s} {s['docs']:>9,} docs {s['tokens']:>14,} tokens in {len(s['shards'])} shard(s)")
    console.print(f"vocabulary {m['vocab_size']:,} ({m['dtype']}), eos {m['eos_id']}, "
                  f"{len(m['sources'])} source(s) -> {out}")
