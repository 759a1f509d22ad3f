"""Text generation with the KV cache: prefill the prompt, decode token by token, stream text, stop.

One prompt at a time: `Engine.stream(prompt, params)` returns a `TextStream`, an iterator of
text pieces in the order they are decoded; once exhausted, its `completion` holds the whole
text, why it ended ("eos", "stop" or "length") and the token count. Pieces never split a
multi-byte UTF-8 character (a decoded tail of U+FFFD is held back until its bytes complete)
and never show a stop string or the part of one that may still be completed, so the pieces
joined are exactly the final text. Batch files (JSONL in, JSONL out) are in `tscale.infer.batch`.

A model trained with the token index is fed its lookups at every position (IndexLookups):
the prompt's all at once, then, for each new token, the longest match of the context's last
index.max_len tokens (exactly what the whole context gives, as matches are capped there).

With a drafter (tscale/infer/draft.py; any model, `--draft-index`), each forward pass also
scores tokens an index proposes as the continuation, and the accepted ones come out of the same
pass: greedy output is unchanged, sampled output keeps its distribution, fewer passes are run.
"""

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
from tokenizers import Tokenizer

from tscale.data.tokenizer import EOS, REPLACEMENT, GrowingText, eos_id, load_tokenizer
from tscale.errors import UserError
from tscale.fileio import sha256_file
from tscale.index.distribution import FeatureLookup
from tscale.index.lookup import Index
from tscale.index.mixing import IndexFeatures
from tscale.infer.draft import DraftStats, IndexDrafter, accept
from tscale.infer.sampling import SamplingParams, SettingError, make_generator, sample_next

FINISH_REASONS = ("eos", "stop", "length")


@dataclass(frozen=True)
class GenerationParams:
    """What to generate: at most max_new_tokens, sampled with `sampling`, cut at the first stop string."""

    max_new_tokens: int = 200
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    seed: int | None = 0

    def check(self, where: str = "", spell: Callable[[str], str] = str) -> "GenerationParams":
        """Raise SettingError naming the bad value as `spell` writes its field (prefixed by `where`, e.g. a file:line)."""
        at = f"{where}: " if where else ""
        if self.max_new_tokens < 0:
            raise SettingError("max_new_tokens",
                               f"{at}{spell('max_new_tokens')} {self.max_new_tokens}: must be >= 0")
        if any(not s for s in self.stop):
            raise SettingError("stop", f"{at}{spell('stop')}: a stop string is empty")
        self.sampling.check(where, spell)
        return self


@dataclass
class Completion:
    prompt: str
    text: str
    finish_reason: str  # "eos" | "stop" | "length"
    tokens: int  # tokens sampled, the eos or the ones spelling a stop string included
    passes: int = 0  # forward passes of the model, the prompt's included
    drafted: int = 0  # draft tokens checked (with a drafter)
    accepted: int = 0  # of those, kept


class IndexLookups:
    """Lookups of a growing token sequence in an index, as the IndexFeatures a model takes."""

    def __init__(self, index: Index, lookup: FeatureLookup, device: torch.device):
        self.index, self.lookup, self.device = index, lookup, device

    def last(self, ids: list[int], n: int) -> IndexFeatures:
        """Features (1, n[, K]) of the last n positions of `ids`."""
        ctx = np.asarray(ids[-(n + self.lookup.max_len - 1):], dtype=np.int64)
        lens, nxt, cnt = self.lookup(self.index, ctx)
        parts = (lens[-n:].astype("int64"), nxt[-n:], cnt[-n:])  # (n,), (n, K), (n, K)
        return IndexFeatures(*(torch.from_numpy(a).unsqueeze(0) for a in parts)).to(self.device)


def open_index_for(ckpt, index_path: str | os.PathLike | None) -> Index | None:
    """The index a checkpoint's model needs (None for a model without one); one-line errors otherwise."""
    if ckpt.index_cfg is None:
        if index_path is not None:
            raise UserError(f"--index {index_path}: the model of {ckpt.path} was trained without the token index; "
                            f"drop --index")
        return None
    if index_path is None:
        raise UserError(f"{ckpt.path}: the model was trained with the token index (index.json); "
                        f"give --index INDEX_DIR")
    return open_index_of_tokenizer(ckpt, index_path, "--index")


def open_index_of_tokenizer(ckpt, index_path: str | os.PathLike, option: str) -> Index:
    """The index at `index_path`, refused in one line unless it was built with the tokenizer of ckpt's model."""
    index = Index(index_path)
    want, have = index.manifest["tokens"]["tokenizer_sha256"], sha256_file(ckpt.tokenizer_path)
    if want != have:
        raise UserError(f"{option} {index_path}: built with another tokenizer than the model of {ckpt.path} "
                        f"(sha256 {want[:12]}… vs {have[:12]}…); use an index of the model's token folder")
    return index


def autocast_dtype(device: torch.device | str) -> torch.dtype | None:
    """The dtype the engine runs a model in under autocast on `device`: bf16 on a GPU; none (float32) on a CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else None


class Engine:
    """A model in eval mode, its tokenizer and device: turns prompts into completions."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, device: torch.device | str = "cpu",
                 lookups: IndexLookups | None = None, drafter: IndexDrafter | None = None):
        self.model = model
        self.lookups = lookups
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.eos = eos_id(tokenizer)
        self.seq_len: int = model.cfg.seq_len
        dtype = autocast_dtype(self.device)
        self.cache_dtype = dtype or torch.float32
        self._autocast = (lambda: torch.autocast(self.device.type, dtype=dtype)) if dtype else contextlib.nullcontext

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, device: torch.device | str = "cpu",
                        precision: str = "bf16", index: str | os.PathLike | None = None,
                        draft_index: str | os.PathLike | None = None, draft_tokens: int = 8,
                        draft_min_match: int = 4, draft_dominance: float = 4.0, quantize_head: bool = False) -> "Engine":
        """precision: "bf16" (as trained), or int8 / fp8 weights ("int8-w", "fp8-w") and activations ("int8", "fp8").

        quantize_head: convert the head too (tscale.train.checkpoint.load_model).
        index: the index folder a model trained with the token index looks its contexts up in.
        draft_index: an index (of the model's tokenizer) to draft up to draft_tokens tokens a pass
        from, while the context's match there is at least draft_min_match tokens long and its most
        frequent continuation at least draft_dominance times as frequent as the runner-up.
        """
        from tscale.train.checkpoint import load_model, open_checkpoint

        opened_ckpt = open_checkpoint(path)
        opened = open_index_for(opened_ckpt, index)
        drafter = None
        if draft_index is not None:
            drafter = IndexDrafter(open_index_of_tokenizer(opened_ckpt, draft_index, "--draft-index"), draft_tokens,
                                   draft_min_match, draft_dominance)
        # linear weights stored as the engine's autocast casts them
        model, ckpt = load_model(path, device, precision, linears_dtype=autocast_dtype(device),
                                 quantize_head=quantize_head)
        lookups = None
        if opened is not None:
            c = ckpt.index_cfg
            lookups = IndexLookups(opened, FeatureLookup(c.topk, c.max_len, c.distribution), torch.device(device))
        return cls(model, load_tokenizer(ckpt.tokenizer_path), device, lookups, drafter)

    def encode_prompt(self, prompt: str, where: str = "prompt") -> list[int]:
        """Prompt ids; an empty prompt starts from eos. `<|endoftext|>` in the text is the eos token."""
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids if prompt else [self.eos]
        if len(ids) > self.seq_len:
            raise UserError(f"{where}: {len(ids)} tokens, more than the model's context of {self.seq_len} "
                            f"(shorten it; the model sees at most model.seq_len tokens)")
        return ids

    def _logits(self, x: torch.Tensor, cache, ids: list[int], last: int) -> torch.Tensor:
        """Logits (1, last, V) of the last `last` positions of x (1, n), the last n tokens of `ids`, continuing the
        cache (the head skips the positions before them: a prompt's prefill makes one row of logits, not n)."""
        with self._autocast():
            if self.lookups is None:
                return self.model(x, cache, last=last)
            return self.model(x, cache, index=self.lookups.last(ids, x.shape[1]), last=last)

    @torch.no_grad()
    def token_stream(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
                     generator: torch.Generator | None, stats: DraftStats | None = None) -> Iterator[int]:
        """Sampled ids; ends after max_new_tokens, or once the context is full. `stats` counts the passes.

        One forward pass per id, or with a drafter one per accepted draft plus the model's token
        after it. Lazy: the next forward pass runs only when the consumer asks for an id past
        those already decided, so a consumer that stops (eos, stop string) costs nothing more.
        """
        stats = stats if stats is not None else DraftStats()
        if max_new_tokens <= 0:
            return
        if self.drafter is not None:
            yield from self._drafted_stream(prompt_ids, max_new_tokens, sampling, generator, stats)
            return
        cache = self.model.new_cache(1, self.seq_len, self.device, self.cache_dtype)
        ids = list(prompt_ids)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)  # (1, P)
        for i in range(max_new_tokens):
            logits = self._logits(x, cache, ids, 1)[:, -1]  # (1, V)
            stats.passes += 1
            tok = int(sample_next(logits, sampling, generator)[0])
            yield tok
            if cache.pos >= self.seq_len:  # the next token would have no position left
                return
            ids.append(tok)
            x = torch.tensor([[tok]], dtype=torch.long, device=self.device)  # (1, 1)

    def _drafted_stream(self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
                        generator: torch.Generator | None, stats: DraftStats) -> Iterator[int]:
        """token_stream with drafts: each pass runs the tokens not yet cached plus a draft, and keeps what it accepts."""
        cache = self.model.new_cache(1, self.seq_len, self.device, self.cache_dtype)
        ids, pending, made = list(prompt_ids), list(prompt_ids), 0  # pending: ids not in the cache yet
        while True:
            room = min(self.seq_len - cache.pos - len(pending), max_new_tokens - made - 1)
            draft = self.drafter.draft(ids, room) if room > 0 else []
            start = cache.pos
            x = torch.tensor([pending + draft], dtype=torch.long, device=self.device)  # (1, p + n)
            # (n + 1, V): from the last pending id's position on
            logits = self._logits(x, cache, ids + draft, len(draft) + 1)[0]
            kept, tok = accept(logits, draft, sampling, generator)
            stats.passes += 1
            stats.drafted += len(draft)
            stats.accepted += kept
            cache.truncate(start + len(pending) + kept)  # forget the rejected draft tokens' keys and values
            new = [*draft[:kept], tok]
            ids += new
            made += len(new)
            yield from new
            if made >= max_new_tokens or cache.pos >= self.seq_len:
                return
            pending = [tok]

    def stream(self, prompt: str, params: GenerationParams, prompt_ids: list[int] | None = None) -> "TextStream":
        params.check()
        ids = self.encode_prompt(prompt) if prompt_ids is None else prompt_ids
        return TextStream(self, prompt, ids, params)

    def generate(self, prompt: str, params: GenerationParams, prompt_ids: list[int] | None = None) -> Completion:
        s = self.stream(prompt, params, prompt_ids)
        for _ in s:
            pass
        return s.completion


class TextStream:
    """Iterate for text pieces; afterwards `completion` is set."""

    def __init__(self, engine: Engine, prompt: str, prompt_ids: list[int], params: GenerationParams):
        self.engine, self.prompt, self.prompt_ids, self.params = engine, prompt, prompt_ids, params
        self.completion: Completion | None = None

    def __iter__(self) -> Iterator[str]:
        eng, stops = self.engine, self.params.stop
        generator = make_generator(self.params.seed)
        stats = DraftStats()
        growing = GrowingText(eng.tokenizer)
        text, emitted, sampled, reason = "", 0, 0, "length"
        for tok in eng.token_stream(self.prompt_ids, self.params.max_new_tokens, self.params.sampling, generator,
                                    stats):
            sampled += 1
            if tok == eng.eos:
                reason = "eos"
                break
            text = growing.append(tok)
            stable = len(text) - _trailing_replacements(text)
            cut = _find_stop(text[:stable], stops, emitted)
            if cut is not None:
                text, reason = text[:cut], "stop"
                break
            safe = stable - _held_stop_prefix(text[:stable], stops)
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
        if reason != "stop":
            cut = _find_stop(text, stops, emitted)
            if cut is not None:
                text, reason = text[:cut], "stop"
        if len(text) > emitted:
            yield text[emitted:]
        self.completion = Completion(self.prompt, text, reason, sampled, stats.passes, stats.drafted, stats.accepted)


def _trailing_replacements(text: str) -> int:
    n = 0
    while n < len(text) and text[len(text) - 1 - n] == REPLACEMENT:
        n += 1
    return n


def _find_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    """Index of the earliest stop string in text[start:] (as an index into text), or None."""
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else None


def _held_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is the start of a stop string (it may still become one)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


__all__ = ["EOS", "FINISH_REASONS", "Completion", "Engine", "GenerationParams", "IndexLookups", "TextStream",
           "open_index_of_tokenizer",
           "open_index_for"]
