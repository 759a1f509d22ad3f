"""Time of all attention in one training step: the tscale model's own attention op vs full causal SDPA per layer.

The inputs are the model's own: one forward pass of the tscale model over a real batch of
training windows records every call of its attention op (q, k, v as the layer makes them,
under the same autocast as training; the layer's window; the document ids from the batch's
real document boundaries; sink; scale). The recorded calls are then timed forward + backward
twice on the same q, k, v: through the op the model calls (whatever tscale.ops picks: the
path it reported is returned), in the dtype the model hands it, and through
F.scaled_dot_product_attention(is_causal=True) in the autocast dtype (bf16 on CUDA: the flash
kernel GPT-2 runs), the "same model with full causal attention in every layer". Both are
wrapped in torch.compile on CUDA, as in training; CUDA events time them, two ways:
  step      (tscale_s, sdpa_s: the headline) all calls as a training step runs them, every
            forward in layer order and then one backward through all of them, so the host
            queues the step ahead of the GPU as it does in training;
  per call  (tscale_per_call_s, sdpa_per_call_s) each call's forward + backward timed alone and
            summed; each call then pays the host's dispatch of its own backward, which a step
            hides, so this sum is the larger and noisier one.
With impl "fa2" or "cudnn" the model's side runs tscale.ops.attention_fa2 or attention_cudnn
instead (`train.attention = "fa2"` / "cudnn"; "_global": in the global layers only), on the (B,
T, H, D) layout the layer makes and over the document runs of the recorded ids, built outside
the timing as the training loop builds them before a step.
"""

import logging
from collections import Counter, defaultdict
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import tscale.model.tscale_lm as tscale_lm
from common import time_per_call
from tscale.ops.doc_runs import DocRuns, runs_of_doc_ids
from tscale.ops.attention_runs import DESCRIBED, attention_over_runs, parse_choice


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def record_attention_calls(model: torch.nn.Module, idx: torch.Tensor, amp_dtype) -> list[dict]:
    """Every attention call of one forward pass over idx (B, T): its q, k, v and keyword arguments.

    The op itself is not run here (its output is replaced by zeros, so nothing is compiled
    for inference shapes); with zero-initialised projections that is exactly the model's
    forward at initialisation, and timing does not depend on the values anyway.
    """
    calls: list[dict] = []
    original = tscale_lm.attention

    def recorder(q, k, v, **kwargs):
        calls.append({"q": q, "k": k, "v": v, **kwargs})
        return q.new_zeros(*q.shape[:-1], v.shape[-1])

    tscale_lm.attention = recorder
    amp = torch.autocast(idx.device.type, dtype=amp_dtype) if amp_dtype else nullcontext()
    try:
        with torch.no_grad(), amp:
            model(idx)
    finally:
        tscale_lm.attention = original
    return calls


def op_path(call: dict) -> str:
    """What tscale.ops says it runs for this call (it says so once per process, on the first eager call)."""
    messages, ops_log = _Messages(), logging.getLogger("tscale.ops")
    old_level = ops_log.level
    ops_log.addHandler(messages)
    ops_log.setLevel(logging.INFO)
    n = min(128, call["q"].shape[2])
    try:
        with torch.no_grad():
            q, k, v = (call[name][:1, :, :n] for name in ("q", "k", "v"))
            docs = call["doc_ids"][:1, :n] if call["doc_ids"] is not None else None
            tscale_lm.attention(q, k, v, window=call["window"], doc_ids=docs, sink=call["sink"], scale=call["scale"])
    finally:
        ops_log.removeHandler(messages)
        ops_log.setLevel(old_level)
    return "; ".join(m.removeprefix("ops: ") for m in messages.lines if "attention" in m)


def _tscale_op(q, k, v, doc_ids, window: int, sink: bool, scale: float):
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, T, H, D) leaves -> (B, H, T, D), as the layer passes them
    return tscale_lm.attention(q, k, v, window=window, doc_ids=doc_ids, sink=sink, scale=scale)


def _runs_op(q, k, v, runs_or_doc_ids, window: int, sink: bool, scale: float):
    """Attention over document runs for a call given them (FlashAttention-2 or cuDNN by runs.backend, on the
    (B, T, H, D) layout the layer makes), the default op for one given document ids."""
    if isinstance(runs_or_doc_ids, DocRuns):
        return attention_over_runs(q, k, v, runs_or_doc_ids, window=window, sink=sink, scale=scale)  # (B, T, H, D)
    return _tscale_op(q, k, v, runs_or_doc_ids, window, sink, scale)


def _sdpa_op(q, k, v, doc_ids, window: int, sink: bool, scale: float):
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def _leaf(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A fresh (B, T, H, D) leaf whose transpose has the recorded (B, H, T, D) tensor's values and layout."""
    return t.detach().transpose(1, 2).to(dtype or t.dtype).contiguous().requires_grad_()


def _inputs(op, call: dict, dtype: torch.dtype | None):
    """Leaves q, k, v of one recorded call (cast to `dtype` if given), the op's other arguments and a fixed dO."""
    leaves = [_leaf(call[n], dtype) for n in ("q", "k", "v")]
    args = (call.get("runs", call["doc_ids"]), call["window"], call["sink"], call["scale"])
    return leaves, args, torch.randn_like(op(*leaves, *args))


def time_call(op, call: dict, device: torch.device, repeats: int, warmup: int = 3,
              dtype: torch.dtype | None = None) -> float:
    """Seconds for forward + backward of one recorded call through `op`, its q, k, v cast to `dtype` if given."""
    leaves, args, grad = _inputs(op, call, dtype)

    def step():
        out = op(*leaves, *args)
        torch.autograd.grad(out, leaves, grad)

    return time_per_call(step, device, repeats, warmup=warmup)


def step_of(op, calls: list[dict], dtype: torch.dtype | None = None):
    """All recorded calls as a training step runs them: every forward in layer order, then one backward
    through all of them (a single autograd call), so the host queues the whole step ahead of the GPU."""
    inputs = [_inputs(op, call, dtype) for call in calls]
    leaves = [t for call_leaves, _, _ in inputs for t in call_leaves]
    grads = [grad for _, _, grad in inputs]

    def step():
        outs = [op(*call_leaves, *args) for call_leaves, args, _ in inputs]
        torch.autograd.grad(outs, leaves, grads)

    return step


def time_step(op, calls: list[dict], device: torch.device, repeats: int, warmup: int = 3,
              dtype: torch.dtype | None = None) -> float:
    """Seconds for all recorded calls as a training step runs them (step_of)."""
    return time_per_call(step_of(op, calls, dtype), device, repeats, warmup=warmup)


def kernel_times(run, steps: int, device: torch.device, warmup: int = 3) -> dict[str, float]:
    """Milliseconds per call of `run` in each kernel it launches, by name, largest first: GPU time under
    torch.profiler on CUDA, the ops' own CPU time elsewhere (where a test can check the plumbing)."""
    for _ in range(warmup):
        run()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
        if cuda:
            torch.cuda.synchronize(device)
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if cuda and event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:90]] += event.device_time / 1000.0 / steps
        elif not cuda and event.device_type == torch.autograd.DeviceType.CPU:
            totals[event.name[:90]] += event.self_cpu_time_total / 1000.0 / steps
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def attention_step_cost(model: torch.nn.Module, idx: torch.Tensor, amp_dtype, repeats: int,
                        compile_ops: bool, warmup: int = 3, impl: str = "auto", profile_steps: int = 0) -> dict:
    """Seconds of all attention (forward + backward) in one step over idx (B, T): tscale op vs causal SDPA.

    impl "auto": the op the model calls by default; "fa2" / "cudnn": tscale.ops.attention_fa2 / attention_cudnn in
    every layer (train.attention = "fa2" / "cudnn"); "fa2_global" / "cudnn_global": in the global layers, the
    default op in the windowed ones. warmup=1, repeats=1 only compiles (fills the Inductor cache for a later timed
    run). profile_steps > 0 also profiles that many steps of each side: tscale_kernels_ms / sdpa_kernels_ms,
    kernel name -> ms per step.
    """
    device = idx.device
    calls = record_attention_calls(model, idx, amp_dtype)
    op = _tscale_op if impl == "auto" else _runs_op
    if impl == "auto":
        said = op_path(calls[0])
    else:
        backend, windowed = parse_choice(impl)
        for call in calls:  # built as the training loop builds them, outside the timing
            if windowed or not call["window"]:
                call["runs"] = runs_of_doc_ids(call["doc_ids"], *idx.shape, backend=backend).to(device)
        said = f"{DESCRIBED[backend]} over the document runs (tscale.ops.attention_runs)"
        if not windowed:
            said += f" in the global layers, {op_path(calls[0]) or 'the default op'} elsewhere"
    ours = torch.compile(op, dynamic=False) if compile_ops else op
    sdpa = torch.compile(_sdpa_op, dynamic=False) if compile_ops else _sdpa_op
    per_layer = []
    for call in calls:
        per_layer.append({"window": call["window"], "tscale_s": time_call(ours, call, device, repeats, warmup),
                          "sdpa_s": time_call(sdpa, call, device, repeats, warmup, dtype=amp_dtype)})
    q = calls[0]["q"]
    docs = calls[0]["doc_ids"]
    return {
        "path": said or "not reported by tscale.ops (reported earlier in this process)",
        "tscale_s": time_step(ours, calls, device, repeats, warmup),
        "sdpa_s": time_step(sdpa, calls, device, repeats, warmup, dtype=amp_dtype),
        "tscale_per_call_s": sum(p["tscale_s"] for p in per_layer),
        "sdpa_per_call_s": sum(p["sdpa_s"] for p in per_layer),
        "per_layer": per_layer,
        "windows": dict(Counter(str(p["window"]) for p in per_layer)),
        "shape": list(q.shape), "dtype": str(q.dtype).replace("torch.", ""),
        "sdpa_dtype": str(amp_dtype or q.dtype).replace("torch.", ""),
        "docs_per_row": float(docs[:, -1].float().mean() + 1 - docs[:, 0].float().mean()) if docs is not None else 1.0,
        "sink": bool(calls[0]["sink"]),
        **({"tscale_kernels_ms": kernel_times(step_of(ours, calls), profile_steps, device),
            "sdpa_kernels_ms": kernel_times(step_of(sdpa, calls, amp_dtype), profile_steps, device)}
           if profile_steps else {}),
    }
