"""The tokenizer: load (tokenizer.json or GPT-2 encoder.json + vocab.bpe), train a byte-level BPE, save, decode.

Every tokenizer TScale uses is a Hugging Face `tokenizers.Tokenizer` whose end-of-text token
is `<|endoftext|>` (EOS). The token folder keeps it as tokenizer.json; train and infer load it
from there with `load_tokenizer`.
"""

import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tscale.errors import UserError
from tscale.fileio import write_text_atomic

EOS = "<|endoftext|>"
SPECIAL_TOKENS = (EOS,)
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # every byte + the special tokens

REPLACEMENT = "\ufffd"  # what decoding shows for bytes that are not (yet) a whole UTF-8 character

# GPT-2 style vocabulary / merges pairs, under the names OpenAI and Hugging Face use.
_BPE_PAIRS = (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt"))


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer from a tokenizer.json, a GPT-2 encoder.json (vocab.bpe beside it), or a folder of either."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: tokenizer not found (give a tokenizer.json or a folder with encoder.json + vocab.bpe)")
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return _from_json(path / "tokenizer.json")
        for vocab, merges in _BPE_PAIRS:
            if (path / vocab).is_file() and (path / merges).is_file():
                return _from_bpe_files(path / vocab, path / merges)
        raise UserError(f"{path}: folder holds neither tokenizer.json nor encoder.json + vocab.bpe")
    for vocab, merges in _BPE_PAIRS:
        if path.name == vocab and (path.parent / merges).is_file():
            return _from_bpe_files(path, path.parent / merges)
    return _from_json(path)


def _from_json(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception for unreadable / malformed files
        raise UserError(f"{path}: not a readable tokenizer.json ({_first_line(e)})") from None


def _from_bpe_files(vocab: Path, merges: Path) -> Tokenizer:
    """A GPT-2 byte-level BPE from its vocabulary and merges, with EOS as a special token."""
    try:
        model = models.BPE.from_file(str(vocab), str(merges))
    except Exception as e:
        raise UserError(f"{vocab} + {merges}: not a readable BPE vocabulary/merges pair ({_first_line(e)})") from None
    tok = _byte_level(model)
    if tok.token_to_id(EOS) is None:
        raise UserError(f"{vocab}: has no {EOS} token (needed as end-of-text)")
    tok.add_special_tokens([EOS])  # already in the vocabulary: keeps its id (50256 for GPT-2)
    return tok


def _byte_level(model) -> Tokenizer:
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of at most `vocab_size` ids on `texts` (streamed); id 0 is EOS."""
    check_vocab_size(vocab_size)
    tok = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size < MIN_VOCAB_SIZE:
        raise UserError(
            f"--vocab-size {vocab_size} is too small: a byte-level BPE needs at least {MIN_VOCAB_SIZE} "
            f"(256 bytes + {len(SPECIAL_TOKENS)} special token); use e.g. 4096 or more"
        )
    if vocab_size > 1 << 32:
        raise UserError(f"--vocab-size {vocab_size} is too large (at most 2**32)")


def vocab_size(tok: Tokenizer) -> int:
    """Number of ids (one more than the largest id), added tokens included."""
    return max(tok.get_vocab_size(with_added_tokens=True), max(tok.get_vocab(with_added_tokens=True).values()) + 1)


def eos_id(tok: Tokenizer) -> int:
    """The id of `<|endoftext|>`; UserError if the tokenizer lacks it."""
    i = tok.token_to_id(EOS)
    if i is None:
        raise UserError(f"the tokenizer has no {EOS} token (needed to mark document ends)")
    return i


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> None:
    """Write tok as tokenizer.json (atomically)."""
    write_text_atomic(path, tok.to_str(pretty=True))


def decode(tok: Tokenizer, ids) -> str:
    """Text of `ids` (special tokens kept as text); ids may be any integer sequence or numpy array."""
    return tok.decode([int(i) for i in ids], skip_special_tokens=False)


class GrowingText:
    """The text of an id sequence that grows one id at a time, as `decode` gives it, in time that does not grow with
    the sequence: a byte-level BPE decodes piecewise at a character boundary, so only the ids since the last point
    where the text ended on a whole character are decoded again. Other decoders (a tokenizer.json may bring one that
    strips or merges across tokens) decode the whole sequence each time."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.piecewise = isinstance(tok.decoder, decoders.ByteLevel)
        self.ids: list[int] = []
        self.settled_text, self.settled_ids = "", 0  # the text of ids[:settled_ids], which ends on a whole character

    def append(self, i: int) -> str:
        """Add one id; the text of all the ids so far."""
        self.ids.append(int(i))
        if not self.piecewise:
            return decode(self.tok, self.ids)
        tail = decode(self.tok, self.ids[self.settled_ids:])
        text = self.settled_text + tail
        if tail and not tail.endswith(REPLACEMENT):
            self.settled_text, self.settled_ids = text, len(self.ids)
        return text


def decode_documents(tok: Tokenizer, ids, eos: int) -> list[str]:
    """Split `ids` at each eos and decode every piece; a trailing piece without eos is included."""
    out, cur = [], []
    for i in ids:
        i = int(i)
        if i == eos:
            out.append(decode(tok, cur))
            cur = []
        else:
            cur.append(i)
    if cur:
        out.append(decode(tok, cur))
    return out


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__
