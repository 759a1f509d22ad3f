"""cuDNN's attention under the tscale mask: documents as a ragged batch, the window, and an exact sink on top.

An alternative to the fused kernel of csrc/attention for training steps on Hopper and newer
(`train.attention = "cudnn_global"`: the global layers; "cudnn": every layer), through the cuDNN
frontend's graph API (the `nvidia-cudnn-frontend` package, `pip install -e ".[hopper]"`), which
runs cuDNN's wgmma kernels. The mask maps onto it as:
  documents  a ragged batch: one sequence per document run of the batch (tscale.ops.doc_runs'
             DocRuns, built on the host), the packed (tokens, H, D) tensors addressed through
             per-sequence offsets, the lengths as a padding mask; the empty runs that pad the
             run count to a bucket are sequences of length 0;
  causal     the diagonal band's right bound 0;
  window     its left bound = window (a query sees itself and the window - 1 keys before it);
  sink       y = o * sigmoid(lse) forward, and the backward run with s * dy and y in place of o,
             as for FlashAttention-2 (docs/architecture.md): cuDNN's own sink token needs
             cuDNN 9.26 or newer with ragged batches (torch 2.11 ships 9.19).
The graphs are built once per problem (sequence count, length, heads, head dim, window, scale,
direction) and kept. `cudnn_forward` / `cudnn_backward` are the custom ops' doors (module-level
names, so a test can stand a reference in for them on the CPU).
"""

import functools

import torch

from tscale.ops.doc_runs import DocRuns


def cudnn_unusable_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why attention_cudnn cannot run here, or None."""
    if device.type != "cuda":
        return "it needs a CUDA GPU"
    if torch.cuda.get_device_capability(device) < (9, 0):
        return "cuDNN's attention over ragged batches needs a Hopper or newer GPU (compute capability 9.0+)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"it needs bfloat16 or float16 activations, not {dtype}"
    if head_dim % 8 or head_dim > 256:
        return f"head dimension {head_dim}: cuDNN's attention takes multiples of 8 up to 256"
    try:
        import cudnn  # noqa: F401
    except ImportError:
        return 'the cuDNN frontend is not installed (pip install -e ".[hopper]", or pip install nvidia-cudnn-frontend)'
    return None


@functools.cache
def _handle(device_index: int):
    import cudnn

    with torch.cuda.device(device_index):
        return cudnn.create_handle()


class _Plan:
    """One built cuDNN graph (forward or backward) and the graph tensors its variant pack names."""

    def __init__(self, n: int, T: int, H: int, D: int, window: int, scale: float, dtype: torch.dtype,
                 backward: bool, tokens: int, device_index: int):
        import cudnn

        io = cudnn.data_type.BFLOAT16 if dtype == torch.bfloat16 else cudnn.data_type.HALF
        self.handle = _handle(device_index)
        g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        dims, strides = [n, H, T, D], [T * H * D, D, H * D, 1]  # (sequences, H, T, D) over packed (tokens, H, D)
        stat_dims, stat_strides = [n, H, T, 1], [H * T, T, 1, 1]
        t = {"off": g.tensor(name="off", dim=[n + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64),
             "lens": g.tensor(name="lens", dim=[n, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)}
        for name in ("q", "k", "v"):
            t[name] = g.tensor(name=name, dim=dims, stride=strides, data_type=io).set_ragged_offset(t["off"])
        mask = dict(attn_scale=scale, use_padding_mask=True, seq_len_q=t["lens"], seq_len_kv=t["lens"],
                    diagonal_band_right_bound=0, diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT)
        if window:
            mask["diagonal_band_left_bound"] = window
        if not backward:
            t["o"], t["stats"] = g.sdpa(name="attention", q=t["q"], k=t["k"], v=t["v"], generate_stats=True, **mask)
            t["o"].set_output(True).set_dim(dims).set_stride(strides).set_ragged_offset(t["off"])
            t["stats"].set_output(True).set_data_type(cudnn.data_type.FLOAT).set_dim(stat_dims).set_stride(stat_strides)
        else:
            for name in ("o", "dO"):
                t[name] = g.tensor(name=name, dim=dims, stride=strides, data_type=io).set_ragged_offset(t["off"])
            t["stats"] = g.tensor(name="stats", dim=stat_dims, stride=stat_strides, data_type=cudnn.data_type.FLOAT)
            total = -(-tokens // 64) * 64  # the packed tokens, rounded up: the size of dQ's accumulator
            t["dq"], t["dk"], t["dv"] = g.sdpa_backward(name="attention_backward", q=t["q"], k=t["k"], v=t["v"],
                                                        o=t["o"], dO=t["dO"], stats=t["stats"],
                                                        max_total_seq_len_q=total, max_total_seq_len_kv=total, **mask)
            for name in ("dq", "dk", "dv"):
                t[name].set_output(True).set_dim(dims).set_stride(strides).set_ragged_offset(t["off"])
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.graph, self.tensors = g, t
        self.workspace_bytes = g.get_workspace_size()

    def run(self, device: torch.device, **tensors: torch.Tensor) -> None:
        """Execute on the current stream, the graph tensors bound by name. An eager forward + backward of one
        layer costs the host about 1.25 ms (scripts/bench/cudnn_host_cost.py; the frontend's ordered form with its
        cached metadata measured slower): the GPU hides it in a training step, not in a step of attention alone."""
        import cudnn

        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream(device).cuda_stream)
        workspace = torch.empty(max(1, self.workspace_bytes), device=device, dtype=torch.uint8)
        self.graph.execute({self.tensors[name]: t for name, t in tensors.items()}, workspace, handle=self.handle)


@functools.cache
def _plan(n: int, T: int, H: int, D: int, window: int, scale: float, dtype: torch.dtype, backward: bool,
          tokens: int, device_index: int) -> _Plan:
    return _Plan(n, T, H, D, window, scale, dtype, backward, tokens, device_index)


def _ragged(cu: torch.Tensor, H: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Run offsets cu (n + 1,) int32 -> element offsets (n + 1, 1, 1, 1) int64 and lengths (n, 1, 1, 1) int32."""
    n = cu.numel() - 1
    return (cu.long() * (H * D)).view(n + 1, 1, 1, 1), (cu[1:] - cu[:-1]).view(n, 1, 1, 1).contiguous()


@torch.library.custom_op("tscale::cudnn_attention", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, window: int,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, v (tokens, H, D) contiguous, cu (n + 1,) int32 -> o (tokens, H, D), stats (n, H, max_len, 1) float32."""
    tokens, H, D = q.shape
    n = cu.numel() - 1
    plan = _plan(n, max_len, H, D, window, scale, q.dtype, False, tokens, q.device.index)
    off, lens = _ragged(cu, H, D)
    o = torch.empty_like(q)
    stats = torch.empty(n, H, max_len, 1, device=q.device, dtype=torch.float32)
    plan.run(q.device, q=q, k=k, v=v, o=o, stats=stats, off=off, lens=lens)
    return o, stats


@_forward_op.register_fake
def _forward_fake(q, k, v, cu, max_len, window, scale):
    return torch.empty_like(q), q.new_empty(cu.shape[0] - 1, q.shape[1], max_len, 1, dtype=torch.float32)


@torch.library.custom_op("tscale::cudnn_attention_backward", mutates_args=())
def _backward_op(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 stats: torch.Tensor, cu: torch.Tensor, max_len: int, window: int,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients dq, dk, dv (tokens, H, D) for the output gradient g and output o (tokens, H, D)."""
    tokens, H, D = q.shape
    plan = _plan(cu.numel() - 1, max_len, H, D, window, scale, q.dtype, True, tokens, q.device.index)
    off, lens = _ragged(cu, H, D)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    plan.run(q.device, q=q, k=k, v=v, o=o, dO=g, stats=stats, dq=dq, dk=dk, dv=dv, off=off, lens=lens)
    return dq, dk, dv


@_backward_op.register_fake
def _backward_fake(g, q, k, v, o, stats, cu, max_len, window, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def cudnn_forward(q, k, v, cu, max_len: int, window: int, scale: float):
    """tscale::cudnn_attention: -> o (tokens, H, D), stats (n, H, max_len, 1) float32 (log-sum-exp per query)."""
    return _forward_op(q, k, v, cu, max_len, window, scale)


def cudnn_backward(g, q, k, v, o, stats, cu, max_len: int, window: int, scale: float):
    """tscale::cudnn_attention_backward: -> dq, dk, dv (tokens, H, D)."""
    return _backward_op(g, q, k, v, o, stats, cu, max_len, window, scale)


def tokens_lse(stats: torch.Tensor, cu: torch.Tensor, tokens: int) -> torch.Tensor:
    """The log-sum-exp of each packed token (tokens, H) float32, from cuDNN's per-sequence stats (n, H, T, 1)."""
    index = torch.arange(tokens, device=cu.device)
    seq = torch.searchsorted(cu, index.to(cu.dtype), right=True) - 1  # (tokens,): the run each token is in
    return stats[seq, :, index - cu[seq].long(), 0]


class _CudnnMasked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, window, sink, scale):
        B, T, H, D = q.shape
        q2, k2, v2 = (t.reshape(B * T, H, D).contiguous() for t in (q, k, v))  # (tokens, H, D)
        out, stats = cudnn_forward(q2, k2, v2, cu, max_len, window, scale)
        gate = torch.sigmoid(tokens_lse(stats, cu, B * T)).unsqueeze(-1) if sink else None  # (tokens, H, 1)
        y = out * gate.to(out.dtype) if sink else out  # (tokens, H, D)
        ctx.save_for_backward(q2, k2, v2, y, stats, cu, *([gate] if sink else []))
        ctx.args = (B, T, H, D, max_len, window, sink, scale)
        return y.view(B, T, H, D)

    @staticmethod
    def backward(ctx, dy):
        q2, k2, v2, y, stats, cu, *gate = ctx.saved_tensors
        B, T, H, D, max_len, window, sink, scale = ctx.args
        g = dy.reshape(B * T, H, D)  # (tokens, H, D)
        if sink:
            g = g * gate[0].to(g.dtype)
        dq, dk, dv = cudnn_backward(g.contiguous(), q2, k2, v2, y, stats, cu, max_len, window, scale)
        return dq.view(B, T, H, D), dk.view(B, T, H, D), dv.view(B, T, H, D), None, None, None, None, None


def attention_cudnn(q, k, v, runs: DocRuns, *, window: int, sink: bool, scale: float) -> torch.Tensor:
    """Causal attention of q, k, v (B, T, H, D) within the runs (documents), window and sink -> (B, T, H, D)."""
    return _CudnnMasked.apply(q, k, v, runs.cu, runs.max_len, window, sink, scale)


__all__ = ["attention_cudnn", "cudnn_unusable_reason", "tokens_lse"]
