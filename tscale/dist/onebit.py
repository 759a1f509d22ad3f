"""The gradient exchange of data parallel: a DDP communication hook, fp32 or 1-bit with error feedback.

`GradExchange` is the hook's state; `exchange_hook` is registered with
`DistributedDataParallel.register_comm_hook`. Until `warmup_steps` (and always with
compression "none") a bucket is averaged with a plain fp32 allreduce. After it, one bucket
of n gradients goes through two phases, each rank sending about n/8 bytes:

  (1-bit Adam: g := beta1 * u + (1 - beta1) * clamp(g / d) first, u = m / d the optimizer's
   synchronised momentum over its frozen denominator d = sqrt(v_hat) + eps: AdamW.fold_gradient;
   on CPU folded inside the worker's pass instead: onebit_adam_fold_pack_)
  pad the bucket to n_pad = a multiple of W * chunk; rank r is the "server" of slice r (S = n_pad / W)
  worker:  x = g + e_worker;  (bits, scales) = pack_signs(x, chunk);  e_worker = x - unpack(...)
           (one pass: pack_signs_feedback_add_)
  phase 1: all_to_all: slice r of every rank's packed x goes to rank r
  server:  y = mean over ranks of unpack(slice r) + e_server;  pack y;  e_server = y - unpack(...)
  phase 2: all_gather of the packed y slices; every rank unpacks all W into the bucket

On CPU (Gloo) the hook returns once phase 1 is on its way: the server's work, phase 2 and
the final unpacking run in completion callbacks while the backward goes on, so the link's
latency hides behind the remaining buckets' compute. Phase 2 has a process group of its own,
and the callbacks issue it in bucket order (a ticket per bucket), so every rank enqueues the
same collectives in the same order on each group. With NCCL both phases run before the hook
returns.

Every rank decodes the same bytes, so replicas stay identical. The residuals are kept per
bucket index with their sizes, saved in checkpoints (state_dict) and checked on reload, so a
bucket layout that changed is an error rather than silently misapplied feedback.
"""

import datetime
import threading

import torch
import torch.distributed as dist

from tscale.errors import UserError
from tscale.ops import (pack_signs_feedback_, pack_signs_feedback_add_, unpack_signs, unpack_signs_accumulate_,
                        unpack_signs_into_)
from tscale.ops.onebit_adam import onebit_adam_fold_pack_

_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class GradExchange:
    """Hook state: compression choice, current step, error-feedback residuals, byte counters."""

    def __init__(self, compression: str, chunk: int, warmup_steps: int, group=None,
                 timeout: datetime.timedelta | None = None):
        self.compression, self.chunk, self.warmup_steps = compression, chunk, warmup_steps
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.step = 0  # set by the training loop before each step's backward
        self.optimizer: torch.optim.Optimizer | None = None  # set: exchange momentum (1-bit Adam)
        self.passthrough = False  # True: leave buckets local, no communication (bucket priming)
        self.worker: dict[int, torch.Tensor] = {}  # bucket index -> (n_pad,) residual
        self.server: dict[int, torch.Tensor] = {}  # bucket index -> (n_pad / W,) residual
        self.sizes: dict[int, int] = {}  # bucket index -> n (unpadded)
        self.bytes_sent = 0  # bytes this rank sent since the last take_bytes()
        self.bytes_fp32 = 0  # what a ring fp32 allreduce of the same buckets would send
        self.overlap = compression == "onebit" and dist.get_backend(group) == "gloo"
        # phase 2's own group (new_group is collective: every rank makes it here, in the same order)
        self.gather_group = dist.new_group(backend="gloo", timeout=timeout) if self.overlap else None
        self._turn = threading.Condition()
        self._tickets = 0  # buckets whose phase 1 this rank issued (in bucket order, on the backward's thread)
        self._gathers = 0  # buckets whose phase 2 it issued (in the same order, from callbacks)
        self._failed: BaseException | None = None  # the first failed exchange: the buckets after it give up

    @property
    def compressing(self) -> bool:
        return self.compression == "onebit" and self.step >= self.warmup_steps

    def take_bytes(self) -> tuple[int, int]:
        """(bytes sent, fp32 allreduce bytes) since the last call."""
        out = (self.bytes_sent, self.bytes_fp32)
        self.bytes_sent = self.bytes_fp32 = 0
        return out

    def padded(self, n: int) -> int:
        unit = self.world * self.chunk
        return -(-n // unit) * unit

    def worker_slice(self, n: int) -> int:
        """S: the values of a bucket of n gradients that each rank serves."""
        return self.padded(n) // self.world

    def residuals(self, index: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The (worker, server) residuals of bucket `index`, created as zeros on first use."""
        if index not in self.sizes:
            n_pad = self.padded(n)
            self.sizes[index] = n
            self.worker[index] = torch.zeros(n_pad, device=device)
            self.server[index] = torch.zeros(n_pad // self.world, device=device)
        elif self.sizes[index] != n:
            raise RuntimeError(f"1-bit exchange: bucket {index} has {n} gradients but its error-feedback state "
                               f"was made for {self.sizes[index]} (the DDP bucket layout changed)")
        self.worker[index] = self.worker[index].to(device)  # a checkpoint's residuals come on the CPU
        self.server[index] = self.server[index].to(device)
        return self.worker[index], self.server[index]

    def state_dict(self) -> dict:
        """This rank's residuals on the CPU (each rank's differ; the checkpoint keeps one per rank)."""
        return {"world": self.world, "chunk": self.chunk, "sizes": dict(self.sizes),
                "worker": {i: t.cpu() for i, t in self.worker.items()},
                "server": {i: t.cpu() for i, t in self.server.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state["world"] != self.world or state["chunk"] != self.chunk:
            raise UserError(f"the checkpoint's 1-bit state is for {state['world']} processes and dist.chunk = "
                            f"{state['chunk']}; this run has {self.world} and {self.chunk}: resume with the same values")
        self.sizes = dict(state["sizes"])
        self.worker = dict(state["worker"])
        self.server = dict(state["server"])


def _packed_bytes(bits: torch.Tensor, scales: torch.Tensor, parts: int) -> torch.Tensor:
    """(parts, bytes per part) uint8: each part's sign bytes followed by its float32 scales."""
    return torch.cat([bits.view(parts, -1), scales.view(torch.uint8).view(parts, -1)], dim=1)


def _split_packed(row: torch.Tensor, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One packed part back into (bits (numel/8,), scales); the scales are copied to realign them."""
    bits = row[: numel // 8]
    scales = row[numel // 8:].clone().view(torch.float32)
    return bits, scales


def allreduce_mean(state: GradExchange, buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """Plain fp32 averaging of one flat bucket, counted as a ring allreduce."""
    fp32 = 2 * (state.world - 1) * buffer.numel() * 4 // state.world
    state.bytes_sent += fp32
    state.bytes_fp32 += fp32
    buffer.div_(state.world)
    work = dist.all_reduce(buffer, group=state.group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def onebit_mean(state: GradExchange, index: int, buffer: torch.Tensor,
                fold: tuple | None = None) -> torch.futures.Future[torch.Tensor]:
    """The two-phase 1-bit average of one flat bucket (n,); the future holds the bucket, averaged.

    fold: 1-bit Adam's fold of the bucket's gradients, done in the worker's packing pass (see
    `_fused_fold`). The residuals are updated in place: a step allocates nothing of the bucket's size.
    """
    W, chunk, n = state.world, state.chunk, buffer.numel()
    worker, server = state.residuals(index, n, buffer.device)
    if fold is None:  # x = e_worker + g; (n_pad/8,), (n_pad/chunk,)
        bits, scales = pack_signs_feedback_add_(worker, buffer, chunk)
    else:  # x = e_worker + u, u the fold of g
        ms, inv_ds, offsets, beta1, bound = fold
        bits, scales = onebit_adam_fold_pack_(worker, buffer, ms, inv_ds, offsets, beta1, bound, chunk)
    worker[n:].zero_()  # worker = x - decoded; padding carries nothing over
    send = _packed_bytes(bits, scales, W).reshape(-1)  # (W * part,), part = S/8 + 4 S/chunk
    part = send.numel() // W
    state.bytes_sent += 2 * (W - 1) * part
    state.bytes_fp32 += 2 * (W - 1) * n * 4 // W
    recv = torch.empty_like(send)  # (W * part,) every rank's packed version of my slice
    if not state.overlap:
        dist.all_to_all_single(recv, send, group=state.group)
        gathered = torch.empty_like(send)  # (W * part,)
        _all_gather_flat(gathered, _serve(state, server, recv, W, part), group=state.group)
        _unpack_average(state, buffer, gathered, W, part)
        return _done(buffer)

    with state._turn:
        ticket = state._tickets
        state._tickets += 1
    result: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def phase2(done: torch.futures.Future) -> None:  # a Gloo thread, once every rank's slice reached this rank
        try:
            done.value()  # raises if phase 1 failed
            mine = _serve(state, server, recv, W, part)
            gathered = torch.empty_like(send)
            with state._turn:  # phase 2 in bucket order on every rank
                state._turn.wait_for(lambda: state._gathers == ticket or state._failed is not None)
                if state._failed is not None:
                    raise RuntimeError("1-bit exchange: an earlier bucket's exchange failed") from state._failed
                work = _all_gather_flat(gathered, mine, group=state.gather_group, async_op=True)
                state._gathers += 1
                state._turn.notify_all()
            work.get_future().then(lambda _f: _finish(result, _f, state, buffer, gathered, W, part))
        except Exception as e:  # noqa: BLE001 - handed to DDP through the future; later buckets stop waiting
            with state._turn:
                state._failed = state._failed or e
                state._turn.notify_all()
            result.set_exception(e)

    dist.all_to_all_single(recv, send, group=state.group, async_op=True).get_future().then(phase2)
    return result


def _finish(result: torch.futures.Future, done: torch.futures.Future, state: GradExchange, buffer: torch.Tensor,
            gathered: torch.Tensor, W: int, part: int) -> None:
    try:
        done.value()  # raises if phase 2 failed
        _unpack_average(state, buffer, gathered, W, part)
        result.set_result(buffer)
    except Exception as e:  # noqa: BLE001 - handed to DDP through the future
        result.set_exception(e)


def _serve(state: GradExchange, server: torch.Tensor, recv: torch.Tensor, W: int, part: int) -> torch.Tensor:
    """This rank's slice of the average from every rank's packed version of it, packed (part,) with feedback."""
    S, chunk = server.numel(), state.chunk
    for row in recv.view(W, part):  # y = e_server + mean over ranks, accumulated into the residual
        row_bits, row_scales = _split_packed(row, S)
        unpack_signs_accumulate_(server, row_bits, row_scales.div_(W), chunk)
    y_bits, y_scales = pack_signs_feedback_(server, chunk)  # (S/8,), (S/chunk,); server = y - decoded
    return _packed_bytes(y_bits, y_scales, 1).reshape(-1)


def _unpack_average(state: GradExchange, buffer: torch.Tensor, gathered: torch.Tensor, W: int, part: int) -> None:
    """Every rank's packed slice of the average (W * part,) -> the bucket (n,)."""
    n, chunk = buffer.numel(), state.chunk
    S = state.worker_slice(n)
    for r, row in enumerate(gathered.view(W, part)):  # slice r of the average, straight into the bucket
        lo, hi = r * S, min((r + 1) * S, n)
        if hi <= lo:
            break
        bits_r, scales_r = _split_packed(row, S)
        if buffer.dtype == torch.float32:  # the slice's first L values (chunks start at lo): a short last slice too
            L = hi - lo
            unpack_signs_into_(buffer[lo:hi], bits_r[: -(-L // 8)], scales_r[: -(-L // chunk)], chunk)
        else:
            buffer[lo:hi] = unpack_signs(bits_r, scales_r, S, chunk)[: hi - lo]


def _done(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def _fold_into_momentum(optimizer: torch.optim.Optimizer, bucket: dist.GradBucket) -> None:
    """In place in the bucket: each gradient becomes this rank's next preconditioned momentum m / d.

    Not m itself: a chunk's one scale (mean |x|) is given to every value in it, and the
    frozen denominators d of one chunk can differ by orders of magnitude (the key bias, whose
    gradient is ~0; rows of rare tokens), so m's scale divided by a tiny d made steps of
    thousands of lr. m / d is Adam's step direction, O(1) in every coordinate.
    """
    for p, g in zip(bucket.parameters(), bucket.gradients()):  # g: a view into bucket.buffer()
        optimizer.fold_gradient(p, g)


def _fused_fold(optimizer: torch.optim.Optimizer, bucket: dist.GradBucket) -> tuple | None:
    """(m's, 1 / d's, offsets in the bucket, beta1, bound) for folding the bucket while packing it
    (CPU float32 buckets whose parameters share one fold), or None: fold first, then pack."""
    buffer = bucket.buffer()
    if buffer.device.type != "cpu" or buffer.dtype != torch.float32:
        return None
    terms = optimizer.fold_terms(bucket.parameters())
    if terms is None:
        return None
    ms, inv_ds, beta1, bound = terms
    offsets = [(g.data_ptr() - buffer.data_ptr()) // buffer.element_size() for g in bucket.gradients()]
    order = sorted(range(len(offsets)), key=offsets.__getitem__)
    return [ms[k] for k in order], [inv_ds[k] for k in order], [offsets[k] for k in order], beta1, bound


def exchange_hook(state: GradExchange, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages bucket.buffer() across ranks (fp32 or 1-bit)."""
    buffer = bucket.buffer()
    if state.passthrough:
        return _done(buffer)
    if state.compressing:
        fold = None
        if state.optimizer is not None:
            fold = _fused_fold(state.optimizer, bucket)
            if fold is None:
                _fold_into_momentum(state.optimizer, bucket)
        return onebit_mean(state, bucket.index(), buffer, fold)
    return allreduce_mean(state, buffer)
