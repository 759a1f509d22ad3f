"""Index lookups inside a model: input embeddings of the index's guess, and a learned output mixture.

Pure torch modules, not wired into a training loop. Per token they take what Index.lookup gives:
match_len (B, T) int, and either the top next token (B, T) (vocab_size = none) or the top-k
next tokens and counts (B, T, K) (-1 / 0 where fewer).

IndexInputs: embedding of the index's predicted next token (vocab_size + 1 rows, the last one
"none") plus an embedding of the match-length bucket (0, 1-3, 4-7, 8-15, 16-31, >=32), to be
added to the token embedding.

IndexMixer: p = (1 - g) p_model + g p_index in probability space, returned as log-probs. The
gate g = sigmoid(w . h + b[bucket]) comes from the hidden state and the match-length bucket
and is exactly 0 where the index has no match. p_index is add-delta smoothed top-k counts:
(count(v) + delta) / (sum of counts + delta * V).
"""

import torch
import torch.nn.functional as F
from torch import nn

BUCKET_EDGES = (1, 4, 8, 16, 32)  # bucket b holds lengths in [edge[b - 1], edge[b]): 0, 1-3, 4-7, 8-15, 16-31, >=32
NUM_BUCKETS = len(BUCKET_EDGES) + 1


def length_bucket(match_len: torch.Tensor) -> torch.Tensor:
    """Match length -> bucket id in [0, NUM_BUCKETS)."""
    edges = torch.tensor(BUCKET_EDGES, device=match_len.device, dtype=match_len.dtype)
    return torch.bucketize(match_len, edges, right=True)


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


def index_log_probs(next_tokens: torch.Tensor, counts: torch.Tensor, vocab_size: int, delta: float) -> torch.Tensor:
    """(B, T, K) top-k tokens and counts -> (B, T, V) add-delta smoothed log-probabilities."""
    valid = (next_tokens >= 0) & (next_tokens < vocab_size) & (counts > 0)
    ids = torch.where(valid, next_tokens, torch.zeros_like(next_tokens)).long()
    c = torch.where(valid, counts, torch.zeros_like(counts)).float()
    dense = torch.zeros(*ids.shape[:-1], vocab_size, device=ids.device).scatter_add_(-1, ids, c)
    total = c.sum(-1, keepdim=True)
    return torch.log(dense + delta) - torch.log(total + delta * vocab_size)


class IndexMixer(nn.Module):
    """Gate between the model's and the index's next-token distributions; returns mixed log-probs (B, T, V)."""

    def __init__(self, dim: int, vocab_size: int, delta: float = 0.01, init_bias: float = -2.0):
        super().__init__()
        self.vocab_size = vocab_size
        self.delta = delta
        self.proj = nn.Linear(dim, 1, bias=False)
        self.bucket_bias = nn.Embedding(NUM_BUCKETS, 1)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.constant_(self.bucket_bias.weight, init_bias)

    def gate_logit(self, hidden: torch.Tensor, match_len: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1) + self.bucket_bias(length_bucket(match_len)).squeeze(-1)

    def forward(self, hidden: torch.Tensor, logits: torch.Tensor, match_len: torch.Tensor, next_tokens: torch.Tensor,
                counts: torch.Tensor) -> torch.Tensor:
        model = F.log_softmax(logits.float(), dim=-1)
        index = index_log_probs(next_tokens, counts, self.vocab_size, self.delta)
        z = self.gate_logit(hidden.float(), match_len)
        matched = match_len > 0
        log_g = torch.where(matched, F.logsigmoid(z), torch.full_like(z, float("-inf")))
        log_keep = torch.where(matched, F.logsigmoid(-z), torch.zeros_like(z))
        return torch.logaddexp(model + log_keep.unsqueeze(-1), index + log_g.unsqueeze(-1))
