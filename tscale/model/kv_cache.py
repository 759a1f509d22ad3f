"""Static key/value cache for incremental decoding: one preallocated (B, H, T_max, D) pair per layer."""

import torch


class KVCache:
    """Keys and values of the tokens seen so far; `pos` is how many positions are filled."""

    def __init__(self, n_layer: int, batch: int, n_head: int, max_len: int, head_dim: int, device, dtype):
        shape = (batch, n_head, max_len, head_dim)
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.max_len = max_len
        self.pos = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H, T, D) at positions pos..pos+T; return all keys and values up to there."""
        t = k.shape[2]
        end = self.pos + t
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions, asked for {end}")
        self.k[layer][:, :, self.pos:end] = k
        self.v[layer][:, :, self.pos:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, t: int) -> None:
        self.pos += t
