"""Static key/value cache for incremental decoding: one preallocated (B, H, T_max, D) pair per layer."""

import torch


class KVCache:
    """Keys and values of the tokens seen so far; `pos` is how many positions are filled."""

    def __init__(self, n_layer: int, batch: int, n_head: int, max_len: int, head_dim: int, device, dtype):
        shape = (batch, n_head, max_len, head_dim)
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.docs: torch.Tensor | None = None  # document id per position, for models that mask documents
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

    def doc_ids(self, starts: torch.Tensor) -> torch.Tensor:
        """Document ids of all positions up to pos+T, given which of the T new tokens start a document (B, T).

        Ids count document starts from the first cached position on, so they continue across calls.
        """
        batch, t = starts.shape
        end = self.pos + t
        if self.docs is None:
            self.docs = torch.zeros(batch, self.max_len, dtype=torch.long, device=starts.device)  # (B, T_max)
        before = self.docs[:, self.pos - 1:self.pos] if self.pos else 0
        self.docs[:, self.pos:end] = before + starts.long().cumsum(1)
        return self.docs[:, :end]

    def advance(self, t: int) -> None:
        self.pos += t

    def truncate(self, pos: int) -> None:
        """Forget the positions from `pos` on (a speculative draft's rejected tokens); later calls overwrite them."""
        if not 0 <= pos <= self.pos:
            raise ValueError(f"cannot truncate a KV cache of {self.pos} positions to {pos}")
        self.pos = pos
