"""Document layouts for the attention tests: (B, T) document ids, non-decreasing along each row."""

import torch

START_PROB = {"sparse": 0.02, "random": 0.15, "short": 0.5}  # chance that a position opens a new document


def doc_ids(B: int, T: int, layout: str, g: torch.Generator) -> torch.Tensor | None:
    """None (no documents), "one", "each" (every token its own), or random starts with START_PROB[layout]."""
    if layout == "none":
        return None
    if layout == "one":
        return torch.zeros(B, T, dtype=torch.long)
    if layout == "each":
        return torch.arange(T).expand(B, T).clone()
    return (torch.rand(B, T, generator=g) < START_PROB[layout]).long().cumsum(1)
