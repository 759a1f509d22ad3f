"""The `tscale` architecture: a GPT-style decoder with the modern token-efficiency changes, each switchable.

Against the gpt2 baseline: rotary positions (RoPE), no biases, RMS normalisation, QK
normalisation, squared-ReLU MLP, zero-initialised output projections, the embedding tied to
the head or not (tied by default: faster to converge at 124M), logit soft-capping, an
attention sink (softmax plus one), attention that never crosses a document boundary
(documents end with the eos token; the eos token opens the next document, like a BOS), and
hybrid attention: most layers see a sliding window, every `global_every`-th layer (counted
back from the last) the whole context. Every switch is a ModelConfig field.
Attention goes through tscale.ops.attention, or, for training steps given the batch's document
runs (`train.attention = "fa2"` / "cudnn"; "fa2_global" / "cudnn_global": the global layers only),
through tscale.ops.attention_runs (FlashAttention-2 / cuDNN). Built with an enabled IndexConfig, it also
holds the token index's input embeddings (added before the embedding normalisation) and/or
output mixture (tscale/model/index_adapter.py).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from tscale.config import IndexConfig, ModelConfig
from tscale.index.mixing import IndexFeatures
from tscale.model.block_region import train_block
from tscale.model.index_adapter import check_features, embed_inputs, head_output, last_positions, make_adapter
from tscale.model.kv_cache import KVCache
from tscale.model.loss import head_mean_loss, run_tail
from tscale.ops.attention import attention
from tscale.ops.attention_runs import attention_over_runs
from tscale.ops.doc_runs import DocRuns
from tscale.ops.qkv_prep import kernel_serves, qkv_prep

VOCAB_MULTIPLE = 64
NORM_EPS = 1e-6  # the gain-free normalisations' epsilon (QK norm, the embedding's)


def layer_window(cfg: ModelConfig, layer: int) -> int:
    """The attention window of `layer`: 0 means the whole context."""
    if cfg.window == 0:
        return 0
    if cfg.global_every and (cfg.n_layer - 1 - layer) % cfg.global_every == 0:
        return 0
    return cfg.window


def _norm(cfg: ModelConfig, dim: int) -> nn.Module:
    return nn.RMSNorm(dim, eps=1e-6) if cfg.norm == "rms" else nn.LayerNorm(dim, bias=cfg.bias)


def _plain_norm(cfg: ModelConfig, x: torch.Tensor) -> torch.Tensor:
    """Normalisation without learned gains over the last dimension."""
    return F.rms_norm(x, (x.shape[-1],), eps=NORM_EPS) if cfg.norm == "rms" else F.layer_norm(x, (x.shape[-1],))


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary angles' cos and sin as apply_rope takes them, each (T, D): [cos, cos] and [-sin, sin], the
    rotation's sign folded into sin's first half."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = angles.cos().float(), angles.sin().float()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + D/2) of x (B, T, H, D) by the angles of its positions, cos/sin (T, 1, D) of rope_tables.

    x cos + roll(x, D/2) sin = [x1 cos - x2 sin, x2 cos + x1 sin]: three element-wise ops and a roll, where
    slicing the halves and concatenating them took seven (decoding runs this twice a layer per token).
    """
    return x * cos.to(x.dtype) + x.roll(x.shape[-1] // 2, dims=-1) * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int):
        super().__init__()
        self.cfg, self.window = cfg, window
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        inner = cfg.n_head * cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * inner, bias=cfg.bias)
        self.proj = nn.Linear(inner, cfg.d_model, bias=cfg.bias)
        self.qkv_kernel = False  # train.qkv_kernel: the fused attention-input kernel where it serves

    def forward(self, x: torch.Tensor, rope: tuple | None, doc_ids: torch.Tensor | None, layer: int,
                cache: KVCache | None, runs: DocRuns | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        H, D = self.n_head, self.head_dim
        qkv = self.qkv(x).view(B, T, 3, H, D)  # (B, T, 3, H, D)
        if self._fused_inputs(qkv, rope, cache):  # norm, rotation and casts in one pass (tscale/ops/qkv_prep.py)
            q, k, v = qkv_prep(qkv, rope[0][:, 0], rope[1][:, 0], NORM_EPS, self.cfg.qk_norm, True)  # 3 x (B, T, H, D)
        else:
            q, k, v = qkv.unbind(2)  # 3 x (B, T, H, D)
            if self.cfg.qk_norm:
                q, k = _plain_norm(self.cfg, q), _plain_norm(self.cfg, k)
            if rope is not None:
                q, k = apply_rope(q, *rope), apply_rope(k, *rope)
            q, k = q.to(v.dtype), k.to(v.dtype)  # autocast runs the norms in float32; attention runs in v's dtype
        if runs is not None and runs.serves(self.window):  # FlashAttention-2 or cuDNN over the batch's runs
            y = attention_over_runs(q, k, v, runs, window=self.window, sink=self.cfg.sink, scale=D ** -0.5)
        else:
            y = self._attend(q, k, v, doc_ids, layer, cache).transpose(1, 2)  # (B, T, H, D)
        return F.dropout(self.proj(y.reshape(B, T, H * D)), self.cfg.dropout, self.training)

    def _fused_inputs(self, qkv: torch.Tensor, rope: tuple | None, cache: KVCache | None) -> bool:
        """Whether qkv_prep's kernel makes this training step's q, k, v: train.qkv_kernel, RoPE on, RMS (or no)
        QK normalisation, and inputs the kernel takes (CUDA, bf16, head dimension 64 or 128)."""
        return (self.qkv_kernel and cache is None and rope is not None
                and (not self.cfg.qk_norm or self.cfg.norm == "rms") and kernel_serves(qkv, rope[0]))

    def _attend(self, q, k, v, doc_ids, layer: int, cache: KVCache | None) -> torch.Tensor:
        """tscale.ops.attention on q, k, v (B, T, H, D), through the KV cache when decoding -> (B, H, T, D)."""
        T, D = q.shape[1], self.head_dim
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, pos+T, D)
            if self.window:  # keys older than window + T - 1 positions are out of every query's sight
                cut = max(0, k.shape[2] - (self.window + T - 1))
                k, v = k[:, :, cut:], v[:, :, cut:]
                doc_ids = doc_ids[:, cut:] if doc_ids is not None else None
        return attention(q, k.to(q.dtype), v.to(q.dtype), window=self.window, doc_ids=doc_ids, sink=self.cfg.sink,
                         scale=D ** -0.5)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # (B, T, 4C)
        h = F.relu(h).square() if self.cfg.mlp == "relu2" else F.gelu(h, approximate="tanh")
        return F.dropout(self.proj(h), self.cfg.dropout, self.training)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int):
        super().__init__()
        self.norm_1 = _norm(cfg, cfg.d_model)
        self.attn = Attention(cfg, window)
        self.norm_2 = _norm(cfg, cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, doc_ids, layer: int, cache: KVCache | None, runs: DocRuns | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), rope, doc_ids, layer, cache, runs)
        return x + self.mlp(self.norm_2(x))

    def train_forward(self, x, rope, doc_ids) -> torch.Tensor:
        """forward without a KV cache or document runs, for block_region.train_block."""
        return self.forward(x, rope, doc_ids, 0, None)


class TScaleLM(nn.Module):
    def __init__(self, cfg: ModelConfig, index: IndexConfig | None = None):
        super().__init__()
        if cfg.doc_mask and cfg.eos_id < 0:
            raise ValueError("model.eos_id must be resolved (from the token folder) before building with doc_mask")
        self.cfg = cfg
        padded_vocab = -(-cfg.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
        self.wte = nn.Embedding(padded_vocab, cfg.d_model)
        self.wpe = None if cfg.rope else nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, layer_window(cfg, i)) for i in range(cfg.n_layer))
        self.norm_f = _norm(cfg, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, padded_vocab, bias=False)
        if cfg.rope:
            cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)  # (T, D)
            self.register_buffer("rope_sin", sin, persistent=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.index = make_adapter(cfg.vocab_size, cfg.d_model, index)
        self.compile_block_once = False  # set by the training loop (train.compile_block_once; block_region.py)

    def _init_weights(self) -> None:
        """Matrices ~ N(0, 0.5 / sqrt(fan_in)); embeddings ~ N(0, 1) (they are normalised); projections zero.

        A token embedding tied to the head is N(0, 1 / d_model) instead, so that the first logits
        are of order 1 (with N(0, 1) they would be of order sqrt(d_model), deep in the soft-cap).
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.5 * module.in_features ** -0.5)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=1.0)
        if self.cfg.tie_embeddings:
            nn.init.normal_(self.wte.weight, std=self.cfg.d_model ** -0.5)
        if self.cfg.zero_init:
            for block in self.blocks:
                nn.init.zeros_(block.attn.proj.weight)
                nn.init.zeros_(block.mlp.proj.weight)
            if not self.cfg.tie_embeddings:
                nn.init.zeros_(self.lm_head.weight)

    def use_qkv_kernel(self, on: bool) -> None:
        """train.qkv_kernel: every layer's q, k, v from the fused kernel where it serves (Attention._fused_inputs)."""
        for block in self.blocks:
            block.attn.qkv_kernel = on

    def new_cache(self, batch: int, max_len: int, device, dtype) -> KVCache:
        c = self.cfg
        return KVCache(c.n_layer, batch, c.n_head, max_len, c.head_dim, device, dtype)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, index: IndexFeatures | None = None,
                targets: torch.Tensor | None = None, runs: DocRuns | None = None,
                loss_targets: torch.Tensor | None = None, head_loss: str = "kernel", last: int = 0) -> torch.Tensor:
        """Logits (B, T, V) for token ids idx (B, T); with a cache, idx continues the cached positions.
        last > 0: the logits of the last `last` positions only, (B, last, V) (generation needs no others).

        runs: idx's document runs (tscale.ops.doc_runs.doc_runs, by the model.doc_mask rule),
        to run attention through FlashAttention-2 or cuDNN (runs.backend) in the layers they serve (all, or
        the global ones);
        training steps only (no cache).

        index: the token index's features of these positions (models built with the index need
        them; with its mixer the result is mixed log-probs). targets (B, T): return per-token
        losses (B, T) in nats instead (on a CPU made a chunk of tokens at a time:
        tscale.model.loss.token_losses_in_chunks). loss_targets (B, T): return the mean loss (a scalar), the
        head's soft-capped logits never kept: reduced with their gradient in one pass (head_loss
        "kernel") or made in chunks ("chunked", `train.fused_loss`); models without the index.
        """
        check_features(self.index, index)
        B, T = idx.shape
        c = self.cfg
        start = cache.pos if cache is not None else 0
        if start + T > c.seq_len:
            raise ValueError(f"sequence of {start + T} positions exceeds model.seq_len {c.seq_len}")
        x = self.wte(idx)  # (B, T, C)
        x = embed_inputs(self.index, x, index)
        x = _plain_norm(c, x)
        rope = None
        if c.rope:
            rope = (self.rope_cos[start:start + T, None], self.rope_sin[start:start + T, None])  # 2 x (T, 1, D)
        else:
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
        x = F.dropout(x, c.dropout, self.training)
        if runs is not None and cache is not None:
            raise ValueError("document runs (FlashAttention-2, cuDNN) are for training steps, not cached decoding")
        doc_ids = None
        if c.doc_mask and (runs is None or not runs.windowed):
            starts = idx == c.eos_id  # (B, T): eos ends a document and opens the next
            doc_ids = cache.doc_ids(starts) if cache is not None else starts.cumsum(1, dtype=torch.int32)  # (B, pos+T)
        once = self.compile_block_once and cache is None and runs is None
        for i, block in enumerate(self.blocks):
            x = train_block(block, x, rope, doc_ids) if once else block(x, rope, doc_ids, i, cache, runs)
        if cache is not None:
            cache.advance(T)
        hidden = self.norm_f(x)  # (B, T, C)
        if loss_targets is not None:
            return head_mean_loss(self.lm_head, hidden, loss_targets, c.vocab_size, c.logit_softcap, self.index,
                                  head_loss)
        hidden, index = last_positions(hidden, index, targets, last)
        return run_tail(self._tail, hidden, index, targets, c.vocab_size)

    def _tail(self, hidden: torch.Tensor, index: IndexFeatures | None, targets: torch.Tensor | None) -> torch.Tensor:
        """hidden (B, T, C) -> logits (B, T, V) through the head and the soft-cap, mixed by the index's mixer, or
        per-token losses (B, T) with targets."""
        c = self.cfg
        logits = self.lm_head(hidden)  # (B, T, V_padded)
        if c.logit_softcap:
            logits = c.logit_softcap * torch.tanh(logits.float() / c.logit_softcap)
        logits = logits[..., : c.vocab_size]  # (B, T, V)
        return head_output(self.index, hidden, logits, index, targets)

    def matmul_params(self) -> int:
        """Parameters that take part in matrix products per token: the blocks' matrices and the head."""
        blocks = sum(p.numel() for p in self.blocks.parameters() if p.dim() == 2)
        return blocks + self.lm_head.weight.numel()

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6N for the matrices plus 12 H D min(window, T) per layer for attention."""
        c = self.cfg
        seen = sum(min(layer_window(c, i) or seq_len, seq_len) for i in range(c.n_layer))
        return 6 * self.matmul_params() + 12 * c.n_head * c.head_dim * seen
