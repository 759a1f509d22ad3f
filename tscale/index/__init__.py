"""The token index: suffix arrays over the training tokens, longest-match lookups, per-token features.

build_index(tokens, out, ...)  the build-index stage (tscale/index/build.py)
Index(path).lookup(tokens, exclude_ranges=None, max_len=64, topk=4)
    -> match_len (N,), next_tokens (N, k), next_counts (N, k)  (tscale/index/lookup.py)
StoredFeatures, write_features: per-token lookups (top-k next tokens and counts) on disk (tscale/index/features.py)
IndexFeatures, IndexInputs, IndexMixer: the lookups as model inputs and as an output mixture (tscale/index/mixing.py)
"""

from tscale.index.build import build_index
from tscale.index.lookup import Index

__all__ = ["Index", "build_index"]
