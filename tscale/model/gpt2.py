"""The `gpt2` architecture: the plain GPT-2 transformer, kept forever as the baseline.

Pre-LayerNorm blocks, GELU MLP of width 4C, learned absolute positions, biases, tied input
embedding and output head, GPT-2 initialisation (residual projections scaled by 1/sqrt(2L)).
The embedding table is padded to a multiple of 64 rows for fast matrix shapes; the logits
are cut back to the real vocabulary, so padded ids never get probability. Built with an
enabled IndexConfig, it also holds the token index's input embeddings and/or output mixture
(tscale/model/index_adapter.py).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tscale.config import IndexConfig, ModelConfig
from tscale.index.mixing import IndexFeatures
from tscale.model.block_region import train_block
from tscale.model.index_adapter import check_features, embed_inputs, head_output, last_positions, make_adapter
from tscale.model.kv_cache import KVCache
from tscale.model.loss import head_mean_loss, run_tail

VOCAB_MULTIPLE = 64


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.d_model % cfg.n_head == 0, "d_model must be divisible by n_head"
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, layer: int, cache: KVCache | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        dropout = self.dropout if self.training else 0.0
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        else:
            k, v = cache.update(layer, k, v)  # (B, H, pos+T, D)
            # query i sits at absolute position pos+i and sees keys 0..pos+i
            mask = torch.ones(T, k.shape[2], dtype=torch.bool, device=x.device).tril(k.shape[2] - T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return F.dropout(self.proj(y), dropout, self.training)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, layer: int, cache: KVCache | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), layer, cache)
        return x + self.mlp(self.ln_2(x))

    def train_forward(self, x: torch.Tensor) -> torch.Tensor:
        """forward without a KV cache (the layer number only addresses the cache), for block_region.train_block."""
        return self.forward(x, 0, None)


class GPT2(nn.Module):
    def __init__(self, cfg: ModelConfig, index: IndexConfig | None = None):
        super().__init__()
        self.cfg = cfg
        padded_vocab = -(-cfg.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        self.wte = nn.Embedding(padded_vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, padded_vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        self.index = make_adapter(cfg.vocab_size, cfg.d_model, index)
        self.compile_block_once = False  # set by the training loop (train.compile_block_once; block_region.py)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def new_cache(self, batch: int, max_len: int, device, dtype) -> KVCache:
        c = self.cfg
        return KVCache(c.n_layer, batch, c.n_head, max_len, c.d_model // c.n_head, device, dtype)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, index: IndexFeatures | None = None,
                targets: torch.Tensor | None = None, loss_targets: torch.Tensor | None = None,
                head_loss: str = "kernel", last: int = 0) -> torch.Tensor:
        """Logits (B, T, V) for token ids idx (B, T); with a cache, idx continues the cached positions.
        last > 0: the logits of the last `last` positions only, (B, last, V) (generation needs no others).

        index: the token index's features of these positions (models built with the index need
        them; with its mixer the result is mixed log-probs). targets (B, T): return per-token
        losses (B, T) in nats instead (on a CPU made a chunk of tokens at a time:
        tscale.model.loss.token_losses_in_chunks). loss_targets (B, T): return the mean loss (a scalar), the
        head's logits never kept: reduced with their gradient in one pass (head_loss "kernel") or
        made in chunks ("chunked", `train.fused_loss`); models without the index.
        """
        check_features(self.index, index)
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.cfg.seq_len:
            raise ValueError(f"sequence of {start + T} positions exceeds model.seq_len {self.cfg.seq_len}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.wte(idx)  # (B, T, C)
        x = embed_inputs(self.index, x, index)
        x = x + self.wpe(pos)
        x = F.dropout(x, self.cfg.dropout, self.training)
        once = self.compile_block_once and cache is None
        for i, block in enumerate(self.blocks):
            x = train_block(block, x) if once else block(x, i, cache)
        if cache is not None:
            cache.advance(T)
        hidden = self.ln_f(x)  # (B, T, C)
        if loss_targets is not None:
            return head_mean_loss(self.lm_head, hidden, loss_targets, self.cfg.vocab_size, 0.0, self.index,
                                  head_loss)
        hidden, index = last_positions(hidden, index, targets, last)
        return run_tail(self._tail, hidden, index, targets, self.cfg.vocab_size)

    def _tail(self, hidden: torch.Tensor, index: IndexFeatures | None, targets: torch.Tensor | None) -> torch.Tensor:
        """hidden (B, T, C) -> logits (B, T, V), mixed by the index's mixer, or per-token losses (B, T) with targets."""
        logits = self.lm_head(hidden)[..., : self.cfg.vocab_size]  # (B, T, V)
        return head_output(self.index, hidden, logits, index, targets)

    def matmul_params(self) -> int:
        """Parameters that take part in matrix products per token (embedding lookups excluded, head included)."""
        return sum(p.numel() for n, p in self.named_parameters() if n.endswith("weight") and p.dim() == 2 and "wpe" not in n)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6N for the matrices plus 12 L C T for attention scores and values."""
        c = self.cfg
        return 6 * self.matmul_params() + 12 * c.n_layer * c.d_model * seq_len
