"""Index lookups inside a model: input embeddings of the index's guess, and a learned output mixture.

Pure torch modules. Per token they take an IndexFeatures: what Index.lookup gives for the
context ending at that token, as tensors: match_len (B, T) int, next_tokens (B, T, K) int
(-1 where the index has fewer than K) and counts (B, T, K) int (0 there).

IndexInputs: embedding of the index's predicted next token (vocab_size + 1 rows, the last one
"none") plus an embedding of the match-length bucket (0, 1-3, 4-7, 8-15, 16-31, >=32), to be
added to the token embedding.

IndexMixer: p = (1 - g) p_model + g p_index in probability space, as log-probs (by default
the mixture's loss trains only the gate, the network keeps its own next-token loss). The gate
g = sigmoid(w . h + b[length bucket] + c[count bucket]) comes from the hidden state, the
match-length bucket and the bucket of the summed top-K counts (same edges), and is exactly 0
where the index has no match. p_index is add-delta smoothed top-K counts:
(count(v) + delta) / (sum of counts + delta * V). `forward` gives the whole (B, T, V)
distribution; `nll` only the targets' negative log-probability (B, T), without any (B, T, V)
tensor beyond the logits: what training needs.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

BUCKET_EDGES = (1, 4, 8, 16, 32)  # bucket b holds lengths in [edge[b - 1], edge[b]): 0, 1-3, 4-7, 8-15, 16-31, >=32
NUM_BUCKETS = len(BUCKET_EDGES) + 1


def bucket_labels() -> list[str]:
    """Names of the buckets: "0", "1-3", "4-7", "8-15", "16-31", ">=32"."""
    lo = (0, *BUCKET_EDGES)
    return [str(a) if b - a == 1 else f"{a}-{b - 1}" for a, b in zip(lo, BUCKET_EDGES)] + [f">={BUCKET_EDGES[-1]}"]


def length_bucket(match_len: torch.Tensor) -> torch.Tensor:
    """Match length (or count) -> bucket id in [0, NUM_BUCKETS): how many edges it reaches (no tensor of edges to copy)."""
    bucket = torch.zeros_like(match_len, dtype=torch.long)
    for edge in BUCKET_EDGES:
        bucket += match_len >= edge
    return bucket


class IndexFeatures(NamedTuple):
    """The index's lookups for a batch of positions."""

    match_len: torch.Tensor  # (B, T) int
    next_tokens: torch.Tensor  # (B, T, K) int, -1 = none
    counts: torch.Tensor  # (B, T, K) int

    def to(self, device, non_blocking: bool = False) -> "IndexFeatures":
        return IndexFeatures(*(t.to(device, non_blocking=non_blocking) for t in self))

    def pin_memory(self) -> "IndexFeatures":
        return IndexFeatures(*(t.pin_memory() for t in self))

    def drop_windows(self, p: float) -> "IndexFeatures":
        """Each window (row) independently, with probability p, as if the index had no match anywhere in it."""
        keep = torch.rand(self.match_len.shape[0], 1, device=self.match_len.device) >= p  # (B, 1)
        return IndexFeatures(self.match_len * keep, torch.where(keep.unsqueeze(-1), self.next_tokens, -1),
                             self.counts * keep.unsqueeze(-1))

    @staticmethod
    def empty(batch: int, seq_len: int, topk: int, device=None) -> "IndexFeatures":
        """No match anywhere: what a model sees where the index knows nothing."""
        return IndexFeatures(torch.zeros(batch, seq_len, dtype=torch.long, device=device),
                             torch.full((batch, seq_len, topk), -1, dtype=torch.long, device=device),
                             torch.zeros(batch, seq_len, topk, dtype=torch.long, device=device))


class IndexInputs(nn.Module):
    """Embeddings of the index's next-token guess and match-length bucket, (B, T) -> (B, T, dim)."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.next_token = nn.Embedding(vocab_size + 1, dim)
        self.bucket = nn.Embedding(NUM_BUCKETS, dim)
        nn.init.normal_(self.next_token.weight, std=0.02)
        nn.init.zeros_(self.bucket.weight)

    def forward(self, next_token: torch.Tensor, match_len: torch.Tensor) -> torch.Tensor:
        none = (next_token < 0) | (next_token >= self.vocab_size)
        ids = torch.where(none, torch.full_like(next_token, self.vocab_size), next_token)
        return self.next_token(ids) + self.bucket(length_bucket(match_len))


def _valid_counts(next_tokens: torch.Tensor, counts: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, K) ids (0 where invalid) and float counts (0 where invalid)."""
    valid = (next_tokens >= 0) & (next_tokens < vocab_size) & (counts > 0)
    ids = torch.where(valid, next_tokens, torch.zeros_like(next_tokens)).long()
    c = torch.where(valid, counts, torch.zeros_like(counts)).float()
    return ids, c


def index_log_probs(next_tokens: torch.Tensor, counts: torch.Tensor, vocab_size: int, delta: float) -> torch.Tensor:
    """(B, T, K) top-k tokens and counts -> (B, T, V) add-delta smoothed log-probabilities."""
    ids, c = _valid_counts(next_tokens, counts, vocab_size)
    dense = torch.zeros(*ids.shape[:-1], vocab_size, device=ids.device).scatter_add_(-1, ids, c)  # (B, T, V)
    total = c.sum(-1, keepdim=True)  # (B, T, 1)
    return torch.log(dense + delta) - torch.log(total + delta * vocab_size)


def index_target_log_probs(next_tokens: torch.Tensor, counts: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                           delta: float) -> torch.Tensor:
    """The same smoothed log-probability, of the targets (B, T) only -> (B, T)."""
    ids, c = _valid_counts(next_tokens, counts, vocab_size)
    hit = (c * (ids == targets.unsqueeze(-1))).sum(-1)  # (B, T)
    return torch.log(hit + delta) - torch.log(c.sum(-1) + delta * vocab_size)


class IndexMixer(nn.Module):
    """Gate between the model's and the index's next-token distributions; returns mixed log-probs."""

    def __init__(self, dim: int, vocab_size: int, delta: float = 1e-5, init_bias: float = -2.0, joint: bool = False):
        super().__init__()
        self.vocab_size = vocab_size
        self.delta = delta
        self.joint = joint
        self.gate_weight = nn.Parameter(torch.zeros(dim))
        self.length_bias = nn.Embedding(NUM_BUCKETS, 1)
        self.count_bias = nn.Embedding(NUM_BUCKETS, 1)
        nn.init.constant_(self.length_bias.weight, init_bias)
        nn.init.zeros_(self.count_bias.weight)

    def gate_logit(self, hidden: torch.Tensor, match_len: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """(B, T, C), (B, T), (B, T, K) -> (B, T) gate logits."""
        total = counts.clamp(min=0).sum(-1)  # (B, T)
        return (hidden.float() @ self.gate_weight.float() + self.length_bias(length_bucket(match_len)).squeeze(-1)
                + self.count_bias(length_bucket(total)).squeeze(-1))

    def _log_gates(self, hidden, match_len, counts) -> tuple[torch.Tensor, torch.Tensor]:
        """log g and log (1 - g), each (B, T); g is 0 where there is no match."""
        z = self.gate_logit(hidden, match_len, counts)
        matched = match_len > 0
        log_g = torch.where(matched, F.logsigmoid(z), torch.full_like(z, float("-inf")))
        log_keep = torch.where(matched, F.logsigmoid(-z), torch.zeros_like(z))
        return log_g, log_keep

    def forward(self, hidden: torch.Tensor, logits: torch.Tensor, match_len: torch.Tensor, next_tokens: torch.Tensor,
                counts: torch.Tensor) -> torch.Tensor:
        """Mixed log-probs (B, T, V); they are normalised, so they serve as logits anywhere."""
        model = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
        index = index_log_probs(next_tokens, counts, self.vocab_size, self.delta)  # (B, T, V)
        log_g, log_keep = self._log_gates(hidden, match_len, counts)
        return torch.logaddexp(model + log_keep.unsqueeze(-1), index + log_g.unsqueeze(-1))

    def nll(self, hidden: torch.Tensor, logits: torch.Tensor, match_len: torch.Tensor, next_tokens: torch.Tensor,
            counts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """-log p_mixed(target), (B, T) in nats: forward(...) gathered at the targets, computed sparsely.

        Unless `joint`, only the value is the mixture's: its gradient trains the gate alone (the
        network's log-probs and hidden state enter it detached), and the network gets the gradient
        of its own next-token loss, as without the index. Trained jointly, the network
        leaves to the index what the index already predicts and ends up a weaker model wherever the
        index is unsure (docs/index.md, section 7).
        """
        B, T, V = logits.shape
        model = -F.cross_entropy(logits.float().reshape(B * T, V), targets.reshape(B * T), reduction="none").view(B, T)
        index = index_target_log_probs(next_tokens, counts, targets, self.vocab_size, self.delta)  # (B, T)
        if self.joint:
            log_g, log_keep = self._log_gates(hidden, match_len, counts)
            return -torch.logaddexp(model + log_keep, index + log_g)
        log_g, log_keep = self._log_gates(hidden.detach(), match_len, counts)
        mixed = -torch.logaddexp(model.detach() + log_keep, index + log_g)  # (B, T): trains the gate
        return mixed - (model - model.detach())  # value: mixed; gradient: + the network's own loss
