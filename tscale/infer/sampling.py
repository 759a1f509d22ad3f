"""Next-token choice from logits: greedy, temperature, top-k, top-p (nucleus), with a seeded generator.

Sampling runs on the CPU in float32 with a `torch.Generator` the caller seeds, so a seed gives
the same tokens whatever the device the logits came from (as long as the logits agree).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tscale.errors import UserError


class SettingError(UserError):
    """A generation setting out of range; `key` is its field name (max_new_tokens, temperature, ...)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def flag_name(key: str) -> str:
    """A setting's command-line flag: top_p -> --top-p."""
    return "--" + key.replace("_", "-")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off."""

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0

    def check(self, where: str = "", spell: Callable[[str], str] = str) -> "SamplingParams":
        """Raise SettingError naming the bad value as `spell` writes its field (prefixed by `where`, e.g. a file:line)."""
        at = f"{where}: " if where else ""
        if not self.temperature >= 0:
            raise SettingError("temperature", f"{at}{spell('temperature')} {self.temperature}: must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise SettingError("top_k", f"{at}{spell('top_k')} {self.top_k}: must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise SettingError("top_p", f"{at}{spell('top_p')} {self.top_p}: must be in (0, 1] (1 = off)")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (B, V); the rest become -inf. k <= 0 or >= V: unchanged."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep per row (B, V) the minimal set of most likely tokens whose probability sums to >= p.

    A token is dropped when the tokens ranked above it already reach p; the top token is always kept.
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V) each
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # (B, V) mass ranked strictly above each token
    drop_sorted = before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def next_token_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution (B, V) that sampling draws from, for float32 CPU logits (B, V): temperature, top-k, top-p."""
    logits = logits / params.temperature
    logits = filter_top_k(logits, params.top_k)
    logits = filter_top_p(logits, params.top_p)
    return torch.softmax(logits, dim=-1)


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Token ids (B,) chosen from last-position logits (B, V)."""
    logits = logits.detach().float().cpu()  # (B, V)
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    return torch.multinomial(next_token_probs(logits, params), 1, generator=generator).squeeze(-1)


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with `seed` (None: seeded from the OS, not reproducible)."""
    g = torch.Generator(device="cpu")
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g
