"""The token index inside a model: the optional input embeddings and output mixture any architecture can hold.

A model built with an enabled IndexConfig owns one IndexAdapter as `self.index` (weights
`index.inputs.*`, `index.mixer.*`) and takes an IndexFeatures per forward pass. Both parts
start as no-ops: the input embeddings are zero and the gate is small, so a fresh model with
the index computes nearly what the same model without it does and learns to use it.
"""

import torch
import torch.nn as nn

from tscale.config import IndexConfig
from tscale.index.mixing import IndexFeatures, IndexInputs, IndexMixer
from tscale.model.loss import token_losses


class IndexAdapter(nn.Module):
    def __init__(self, vocab_size: int, dim: int, cfg: IndexConfig):
        super().__init__()
        self.inputs = IndexInputs(vocab_size, dim) if cfg.inputs else None
        self.mixer = (IndexMixer(dim, vocab_size, cfg.delta, joint=cfg.mixer_joint, gate_stats=cfg.gate_stats,
                                 distribution=cfg.distribution) if cfg.mixer else None)
        if self.inputs is not None:
            nn.init.zeros_(self.inputs.next_token.weight)

    def embed(self, x: torch.Tensor, feats: IndexFeatures) -> torch.Tensor:
        """Token embeddings x (B, T, C) plus the index's input embeddings (when on)."""
        if self.inputs is None:
            return x
        return x + self.inputs(feats.next_tokens[..., 0], feats.match_len).to(x.dtype)  # (B, T, C)

    def output(self, hidden: torch.Tensor, logits: torch.Tensor, feats: IndexFeatures,
               targets: torch.Tensor | None) -> torch.Tensor:
        """Logits, or mixed log-probs (B, T, V); with targets, per-token losses (B, T) instead."""
        if self.mixer is None:
            return logits if targets is None else token_losses(logits, targets)
        if targets is None:
            return self.mixer(hidden, logits, *feats)
        return self.mixer.nll(hidden, logits, *feats, targets)


def embed_inputs(adapter: IndexAdapter | None, x: torch.Tensor, feats: IndexFeatures | None) -> torch.Tensor:
    """A model's token embeddings x (B, T, C), plus the index's input embeddings when it has them."""
    return x if adapter is None else adapter.embed(x, feats)


def head_output(adapter: IndexAdapter | None, hidden: torch.Tensor, logits: torch.Tensor,
                feats: IndexFeatures | None, targets: torch.Tensor | None) -> torch.Tensor:
    """The forward's result: logits (B, T, V), mixed log-probs with the mixer, per-token losses (B, T) with targets."""
    if adapter is None:
        return logits if targets is None else token_losses(logits, targets)
    return adapter.output(hidden, logits, feats, targets)


def last_positions(hidden: torch.Tensor, feats: IndexFeatures | None, targets: torch.Tensor | None,
                   last: int) -> tuple[torch.Tensor, IndexFeatures | None]:
    """hidden (B, T, C) and the features cut to their last `last` positions, the head's input for generation;
    unchanged when last is 0."""
    if not last:
        return hidden, feats
    if last < 0 or targets is not None:
        raise ValueError(f"last={last}: the logits of the last positions (last > 0), not with per-token losses")
    return hidden[:, -last:], (feats.last(last) if feats is not None else None)


def make_adapter(vocab_size: int, dim: int, cfg: IndexConfig | None) -> IndexAdapter | None:
    return IndexAdapter(vocab_size, dim, cfg) if cfg is not None and cfg.enabled else None


def check_features(adapter: IndexAdapter | None, feats: IndexFeatures | None) -> None:
    if adapter is not None and feats is None:
        raise ValueError("this model was built with the token index: pass index=IndexFeatures(...)")
    if adapter is None and feats is not None:
        raise ValueError("this model has no token index: do not pass index features")
