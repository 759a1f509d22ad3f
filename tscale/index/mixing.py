"""Index lookups inside a model: input embeddings of the index's guess, and a learned output mixture.

Pure torch modules. Per token they take an IndexFeatures: what Index.lookup gives for the
context ending at that token, as tensors: match_len (B, T) int, next_tokens (B, T, K) int
(-1 where the index has fewer than K) and counts (B, T, K) int (0 there).

IndexInputs: embedding of the index's predicted next token (vocab_size + 1 rows, the last one
"none") plus an embedding of the match-length bucket (0, 1-3, 4-7, 8-15, 16-31, >=32), to be
added to the token embedding.

IndexMixer: p = (1 - g) p_model + g p_index in probability space, as log-probs (by default
the mixture's loss trains only the gate, the network keeps its own next-token loss). p_index
is add-delta smoothed top-K counts: (count(v) + delta) / (sum of counts + delta * V); with the
backoff distribution (tscale/index/distribution.py) the K entries are probabilities in units of
1 / WEIGHT_SCALE and the mass they leave is spread evenly over the other V - K tokens. The gate
is exactly 0 where the index has no match; elsewhere g = sigmoid(z) with the logit a sum of
cheap terms:

  z = w . h                                  the hidden state
    + length_bias[length bucket]             match length (edges above)
    + count_bias[count bucket]               sum of the top-K counts (same edges)
  and with gate_stats (index.gate_stats), three more tables, zero at the start:
    + share_bias[share bucket]               how peaked the index is: top-1 count / sum of the
                                             top-K counts, buckets none, <0.3, <0.5, <0.8, <1, =1
    + pair_bias[length bucket, share bucket] the two together (one token after a long match
                                             says more than one token after a short one)
    + agree_bias[agreement bucket]           the network's own probability of the index's top
                                             token (detached), buckets none, <0.01, <0.1, <0.3,
                                             <0.6, >=0.6

The top-1 token is the one with the largest count (the lookups list them most frequent first,
so it is the first; the max makes no assumption). Zero-initialised tables leave a fresh gate,
and a checkpoint saved without them (loaded with zeros), exactly the gate without them.
`forward` gives the whole (B, T, V) distribution; `nll` only the targets' negative
log-probability (B, T), without any (B, T, V) tensor beyond the logits (the agreement term
takes two gathers and the cross-entropy it already has): what training needs.
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from tscale.index.distribution import WEIGHT_SCALE

BUCKET_EDGES = (1, 4, 8, 16, 32)  # bucket b holds lengths in [edge[b - 1], edge[b]): 0, 1-3, 4-7, 8-15, 16-31, >=32
NUM_BUCKETS = len(BUCKET_EDGES) + 1


SHARE_EDGES = (0.3, 0.5, 0.8)  # share buckets: 0 none (no counts), 1 <0.3, 2 <0.5, 3 <0.8, 4 <1, 5 all on one token
NUM_SHARE_BUCKETS = len(SHARE_EDGES) + 3
AGREE_EDGES = (0.01, 0.1, 0.3, 0.6)  # agreement buckets: 0 none, 1 p<0.01, 2 <0.1, 3 <0.3, 4 <0.6, 5 >=0.6
NUM_AGREE_BUCKETS = len(AGREE_EDGES) + 2
GATE_STATS_TABLES = ("share_bias", "pair_bias", "agree_bias")  # IndexMixer's tables with gate_stats, zero = off


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

    def last(self, n: int) -> "IndexFeatures":
        """The features of the last n positions of each row: (B, n[, K])."""
        return IndexFeatures(*(t[:, -n:] for t in self))

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


def _log_rest(weights: torch.Tensor, c: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Backoff weights (B, T, K) and _valid_counts' c -> (B, T) log-probability of each token not listed: the mass
    the listed ones leave, in integers (it can be a few units of 2^30), spread over the other tokens."""
    valid = c > 0  # (B, T, K): the entries _valid_counts kept
    listed = torch.where(valid, weights, torch.zeros_like(weights)).long().sum(-1)  # (B, T)
    rest = (WEIGHT_SCALE - listed).clamp(min=1).double() / WEIGHT_SCALE  # (B, T)
    return (torch.log(rest) - torch.log((vocab_size - valid.sum(-1)).clamp(min=1).double())).float()


def index_log_probs(next_tokens: torch.Tensor, counts: torch.Tensor, vocab_size: int, delta: float,
                    distribution: str = "counts") -> torch.Tensor:
    """(B, T, K) top-k tokens and counts (or backoff weights) -> (B, T, V) log-probabilities."""
    ids, c = _valid_counts(next_tokens, counts, vocab_size)
    dense = torch.zeros(*ids.shape[:-1], vocab_size, device=ids.device).scatter_add_(-1, ids, c)  # (B, T, V)
    if distribution == "backoff":
        rest = _log_rest(counts, c, vocab_size).unsqueeze(-1)  # (B, T, 1)
        return torch.where(dense > 0, torch.log(dense / WEIGHT_SCALE), rest)
    total = c.sum(-1, keepdim=True)  # (B, T, 1)
    return torch.log(dense + delta) - torch.log(total + delta * vocab_size)


def index_target_log_probs(next_tokens: torch.Tensor, counts: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                           delta: float, distribution: str = "counts") -> torch.Tensor:
    """The same log-probability, of the targets (B, T) only -> (B, T)."""
    ids, c = _valid_counts(next_tokens, counts, vocab_size)
    hit = (c * (ids == targets.unsqueeze(-1))).sum(-1)  # (B, T)
    if distribution == "backoff":
        return torch.where(hit > 0, torch.log(hit / WEIGHT_SCALE), _log_rest(counts, c, vocab_size))
    return torch.log(hit + delta) - torch.log(c.sum(-1) + delta * vocab_size)


class IndexTop(NamedTuple):
    """The index's most frequent next token at each position, and how much of the top-K counts it holds."""

    token: torch.Tensor  # (B, T) long, 0 where there is none
    share_bucket: torch.Tensor  # (B, T) long in [0, NUM_SHARE_BUCKETS), 0 where there is none

    @property
    def found(self) -> torch.Tensor:
        return self.share_bucket > 0  # (B, T) bool


def index_top(next_tokens: torch.Tensor, counts: torch.Tensor, vocab_size: int) -> IndexTop:
    """(B, T, K) top-k tokens and counts -> the top token and the bucket of its share of the counts."""
    valid = (next_tokens >= 0) & (next_tokens < vocab_size) & (counts > 0)  # (B, T, K)
    c = torch.where(valid, counts, torch.zeros_like(counts)).long()  # (B, T, K), integer: "all on one" is exact
    top_count, arg = c.max(-1)  # (B, T), (B, T)
    total = c.sum(-1)  # (B, T)
    ids = torch.where(valid, next_tokens, torch.zeros_like(next_tokens)).long()  # (B, T, K)
    token = ids.gather(-1, arg.unsqueeze(-1)).squeeze(-1)  # (B, T)
    share = top_count.float() / total.clamp(min=1).float()  # (B, T)
    bucket = torch.ones_like(total)
    for edge in SHARE_EDGES:
        bucket += share >= edge
    bucket += top_count == total  # all counts on the top token: the last bucket
    return IndexTop(token, torch.where(total > 0, bucket, torch.zeros_like(bucket)))


def agree_bucket(top_logp: torch.Tensor, found: torch.Tensor) -> torch.Tensor:
    """The network's log-probability of the index's top token (B, T) -> bucket (B, T) long, 0 where none."""
    bucket = torch.ones_like(top_logp, dtype=torch.long)
    for edge in AGREE_EDGES:
        bucket += top_logp >= math.log(edge)
    return torch.where(found, bucket, torch.zeros_like(bucket))


class IndexMixer(nn.Module):
    """Gate between the model's and the index's next-token distributions; returns mixed log-probs."""

    def __init__(self, dim: int, vocab_size: int, delta: float = 1e-5, init_bias: float = -2.0, joint: bool = False,
                 gate_stats: bool = False, distribution: str = "counts"):
        super().__init__()
        self.vocab_size = vocab_size
        self.delta = delta
        self.distribution = distribution
        self.joint = joint
        self.gate_stats = gate_stats
        self.gate_weight = nn.Parameter(torch.zeros(dim))
        self.length_bias = nn.Embedding(NUM_BUCKETS, 1)
        self.count_bias = nn.Embedding(NUM_BUCKETS, 1)
        nn.init.constant_(self.length_bias.weight, init_bias)
        nn.init.zeros_(self.count_bias.weight)
        if gate_stats:
            self.share_bias = nn.Embedding(NUM_SHARE_BUCKETS, 1)
            self.pair_bias = nn.Embedding(NUM_BUCKETS * NUM_SHARE_BUCKETS, 1)
            self.agree_bias = nn.Embedding(NUM_AGREE_BUCKETS, 1)
            for name in GATE_STATS_TABLES:
                nn.init.zeros_(getattr(self, name).weight)

    def gate_logit(self, hidden: torch.Tensor, match_len: torch.Tensor, counts: torch.Tensor,
                   top: IndexTop | None = None, top_logp: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, C), (B, T), (B, T, K) -> (B, T) gate logits.

        With gate_stats, also top = index_top(...) and top_logp (B, T): the network's log-probability
        of top.token, which enters only as a bucket (no gradient reaches the network through it).
        """
        total = counts.clamp(min=0).sum(-1)  # (B, T)
        lengths = length_bucket(match_len)  # (B, T)
        z = (hidden.float() @ self.gate_weight.float() + self.length_bias(lengths).squeeze(-1)
             + self.count_bias(length_bucket(total)).squeeze(-1))  # (B, T)
        if not self.gate_stats:
            return z
        share = top.share_bucket  # (B, T)
        return (z + self.share_bias(share).squeeze(-1) + self.pair_bias(lengths * NUM_SHARE_BUCKETS + share).squeeze(-1)
                + self.agree_bias(agree_bucket(top_logp.detach(), top.found)).squeeze(-1))

    def _log_gates(self, hidden, match_len, counts, top=None, top_logp=None) -> tuple[torch.Tensor, torch.Tensor]:
        """log g and log (1 - g), each (B, T); g is 0 where there is no match."""
        z = self.gate_logit(hidden, match_len, counts, top, top_logp)
        matched = match_len > 0
        log_g = torch.where(matched, F.logsigmoid(z), torch.full_like(z, float("-inf")))
        log_keep = torch.where(matched, F.logsigmoid(-z), torch.zeros_like(z))
        return log_g, log_keep

    def forward(self, hidden: torch.Tensor, logits: torch.Tensor, match_len: torch.Tensor, next_tokens: torch.Tensor,
                counts: torch.Tensor) -> torch.Tensor:
        """Mixed log-probs (B, T, V); they are normalised, so they serve as logits anywhere."""
        model = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
        index = index_log_probs(next_tokens, counts, self.vocab_size, self.delta, self.distribution)  # (B, T, V)
        top = top_logp = None
        if self.gate_stats:
            top = index_top(next_tokens, counts, self.vocab_size)
            top_logp = model.detach().gather(-1, top.token.unsqueeze(-1)).squeeze(-1)  # (B, T)
        log_g, log_keep = self._log_gates(hidden, match_len, counts, top, top_logp)
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
        index = index_target_log_probs(next_tokens, counts, targets, self.vocab_size, self.delta,
                                       self.distribution)  # (B, T)
        top = top_logp = None
        if self.gate_stats:
            top = index_top(next_tokens, counts, self.vocab_size)
            with torch.no_grad():  # log p(top) = logit[top] - logsumexp, and logsumexp = logit[target] - log p(target)
                picked = logits.gather(-1, torch.stack([top.token, targets], -1)).float()  # (B, T, 2)
                top_logp = picked[..., 0] - picked[..., 1] + model  # (B, T)
        if self.joint:
            log_g, log_keep = self._log_gates(hidden, match_len, counts, top, top_logp)
            return -torch.logaddexp(model + log_keep, index + log_g)
        log_g, log_keep = self._log_gates(hidden.detach(), match_len, counts, top, top_logp)
        mixed = -torch.logaddexp(model.detach() + log_keep, index + log_g)  # (B, T): trains the gate
        return mixed - (model - model.detach())  # value: mixed; gradient: + the network's own loss
