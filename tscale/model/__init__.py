"""The transformer architectures (pure torch modules) and the registry that builds them by name."""

import torch.nn as nn

from tscale.config import IndexConfig, ModelConfig
from tscale.model.gpt2 import GPT2
from tscale.model.kv_cache import KVCache
from tscale.model.tscale_lm import TScaleLM

ARCHITECTURES: dict[str, type[nn.Module]] = {"gpt2": GPT2, "tscale": TScaleLM}


def build_model(cfg: ModelConfig, index: IndexConfig | None = None) -> nn.Module:
    """A freshly initialised model of the configured architecture, with the token index's modules when enabled."""
    if cfg.vocab_size <= 0:
        raise ValueError("model.vocab_size must be resolved (from the token folder) before building")
    return ARCHITECTURES[cfg.arch](cfg, index)


__all__ = ["ARCHITECTURES", "KVCache", "build_model"]
