"""Speculative decoding with drafts from the token index: the corpus's continuation of the context, checked by the model.

Drafting: the context's longest match in the index (capped at max_len tokens) proposes the token
that most often followed it there, if it followed at least `dominance` times as often as the
runner-up; that token is appended and looked up in turn, so a draft follows the corpus for as
long as the match stays at least `min_match` tokens long and its continuation clear, up to
`max_tokens` tokens. No model runs to draft.

Checking (`accept`): the model scores the draft in the same forward pass that yields its next
token (tscale/infer/engine.py), giving its distribution at every draft position. Greedy
decoding keeps the draft's longest prefix that equals the model's own choices and adds the
model's choice after it, so the tokens are those of decoding one at a time. Sampling accepts
draft token d with the model's probability p(d) and otherwise samples from p with d removed
(renormalised): the standard speculative-sampling rule for a draft that is certain of its
token, which leaves every token distributed exactly as p (after temperature, top-k, top-p).
The random draws differ from one-at-a-time sampling, so a seed gives other (equally likely)
text than without drafts.
"""

from dataclasses import dataclass

import numpy as np
import torch

from tscale.errors import UserError
from tscale.index.features import FEATURE_MAX_LEN, FEATURE_MAX_SUPPORT
from tscale.index.lookup import Index
from tscale.infer.sampling import SamplingParams, next_token_probs


@dataclass
class DraftStats:
    """Forward passes over one generation, and what drafting proposed and kept."""

    passes: int = 0  # forward passes of the model (the prompt's included)
    drafted: int = 0  # draft tokens the model checked
    accepted: int = 0  # of those, kept


class IndexDrafter:
    """Draft tokens for a context from an index built with the model's tokenizer."""

    def __init__(self, index: Index, max_tokens: int = 8, min_match: int = 4, dominance: float = 4.0,
                 max_len: int = FEATURE_MAX_LEN):
        if max_tokens < 1:
            raise UserError(f"--draft-tokens {max_tokens}: must be at least 1")
        if not 1 <= min_match <= max_len:
            raise UserError(f"--draft-min-match {min_match}: must be in [1, {max_len}]")
        if not dominance >= 1:
            raise UserError(f"--draft-dominance {dominance}: must be at least 1 (1 = any most frequent token)")
        self.index, self.max_tokens, self.min_match, self.max_len = index, max_tokens, min_match, max_len
        self.dominance = dominance

    def draft(self, ids: list[int], limit: int | None = None) -> list[int]:
        """Up to min(max_tokens, limit) tokens the corpus continues `ids` with (the context's last max_len count)."""
        n = self.max_tokens if limit is None else min(self.max_tokens, limit)
        ctx = list(ids[-self.max_len:])
        out: list[int] = []
        window = self.max_len  # tokens of context to look up: a match one token longer than the last at most
        while len(out) < n and ctx:
            lens, nxt, cnt = self.index.lookup(np.asarray(ctx[-window:], dtype=np.int64), None,
                                               max_len=self.max_len, topk=2, max_support=FEATURE_MAX_SUPPORT)
            if lens[-1] < self.min_match or nxt[-1, 0] < 0 or cnt[-1, 0] < self.dominance * cnt[-1, 1]:
                break
            out.append(int(nxt[-1, 0]))
            ctx.append(out[-1])
            window = min(self.max_len, int(lens[-1]) + 1)
        return out


def accept(logits: torch.Tensor, draft: list[int], params: SamplingParams,
           generator: torch.Generator | None) -> tuple[int, int]:
    """(draft tokens kept, the model's token after them) from logits (len(draft) + 1, V) at the draft's positions.

    Row j is the model's prediction for draft[j] (the last row: for the token after a fully kept draft).
    """
    logits = logits.detach().float().cpu()  # (n + 1, V)
    if params.greedy:
        choice = torch.argmax(logits, dim=-1).tolist()  # (n + 1,)
        kept = 0
        while kept < len(draft) and draft[kept] == choice[kept]:
            kept += 1
        return kept, choice[kept]
    probs = next_token_probs(logits, params)  # (n + 1, V)
    for j, d in enumerate(draft):
        if float(torch.rand((), generator=generator)) < float(probs[j, d]):
            continue
        rest = probs[j].clone()  # (V,)
        rest[d] = 0.0  # p(d) < 1 here, so mass remains
        return j, int(torch.multinomial(rest, 1, generator=generator))
    return len(draft), int(torch.multinomial(probs[len(draft)], 1, generator=generator))


__all__ = ["DraftStats", "IndexDrafter", "accept"]
