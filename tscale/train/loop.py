"""The training loop: data, model, AdamW, schedule, evaluation, checkpoints, signals, resume.

`train_run` composes the pieces and owns no math. A run folder holds config.toml (resolved),
metrics.jsonl and ckpt/. `--resume` restores weights, optimizer, loader position and RNG
state from the newest checkpoint, so a run killed and resumed matches one that never
stopped. SIGTERM and SIGINT end the current step, save a checkpoint and return.

Under torchrun (tscale/dist) every rank runs this loop on its share of the data; rank 0
alone reads and writes the run folder, and the ranks agree on when to stop.

With the token index on (config [index]), the loader reads the index's stored per-token
features beside every training and validation window, the model takes them, and the loss is
the model's per-token loss (with index.mixer: the NLL of the mixed distribution).
"""

import math
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from tscale.config import CUDA_GRAPH_MODES, RunConfig, settle_added_keys, to_toml
from tscale.data.loader import TrainLoader, WindowFeatures, val_batches
from tscale.data.shards import TokenFolder
from tscale.devices import peak_flops, resolve_autocast_dtype, resolve_device
from tscale.dist import DistEnv, Replicas, init_dist
from tscale.errors import UserError
from tscale.fileio import write_text_atomic
from tscale.index.features import StoredFeatures
from tscale.index.mixing import IndexFeatures
from tscale.model import block_region, build_model
from tscale.model.loss import mean_loss
from tscale.ops import backend as ops_backend
from tscale.ops import attention_runs
from tscale.ops.doc_runs import DocRuns, RunSlots, doc_runs, expected_slots
from tscale.optim import build_optimizer
from tscale.optim.schedule import lr_at
from tscale.precision import convert_linears_as_configured
from tscale.precision.delayed import load_precision_state, precision_state
from tscale.train.checkpoint import checkpoint_dirs, load_train_state, load_weights, open_checkpoint, save_checkpoint
from tscale.train.cpu_allocator import reuse_freed_blocks
from tscale.train.metrics import MetricsLog, NullLog, ProgressLine


@dataclass
class TrainResult:
    step: int
    last_loss: float | None
    val_loss: float | None
    checkpoint: Path | None
    stopped_early: bool
    rank: int = 0


class _StopFlag:
    """Set by SIGTERM / SIGINT; the loop checks it between steps."""

    def __init__(self):
        self.signal: int | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.signal = signum

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def prepare_run_dir(run_dir: Path, cfg: RunConfig, resume: bool) -> None:
    """Create the run folder; refuse one that holds anything else, or, to resume, one without a run."""
    if resume:
        if not (run_dir / "config.toml").is_file():
            raise UserError(f"{run_dir}: no run to resume (config.toml missing)")
        return
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir}: already holds files (another run?); pass --resume to continue "
                        f"that run, or choose another --out")
    run_dir.mkdir(parents=True, exist_ok=True)


def resolve_data(cfg: RunConfig) -> TokenFolder:
    """Open the token folder and take the vocabulary size from it."""
    if not cfg.data.tokens:
        raise UserError("data.tokens is not set: give the token folder in the config or with --set data.tokens=DIR")
    folder = TokenFolder(cfg.data.tokens)
    if cfg.model.vocab_size == 0:
        cfg.model.vocab_size = folder.vocab_size
    elif cfg.model.vocab_size < folder.vocab_size:
        raise UserError(f"model.vocab_size = {cfg.model.vocab_size} is smaller than the token folder's "
                        f"vocabulary ({folder.vocab_size}); remove the key to take it from the data")
    if cfg.model.eos_id < 0:
        cfg.model.eos_id = folder.eos_id
    return folder


def open_features(cfg: RunConfig, folder: TokenFolder) -> tuple[WindowFeatures, WindowFeatures] | None:
    """The index's (train, val) feature records for the run's token folder, or None without an index."""
    if not cfg.index.enabled:
        return None
    stored = StoredFeatures(cfg.index.path, folder, cfg.index.topk, cfg.index.max_len, cfg.index.distribution)
    return tuple(WindowFeatures(stored.shards(split), cfg.index.topk, stored.none_token) for split in ("train", "val"))


@torch.no_grad()
def evaluate(model, folder: TokenFolder, cfg: RunConfig, device, autocast, features: WindowFeatures | None = None) -> float:
    model.eval()
    total, count = 0.0, 0
    for batch in val_batches(folder, cfg.model.seq_len, cfg.train.batch_size, cfg.train.eval_batches, features):
        x, y = batch[0].to(device), batch[1].to(device)
        index = batch[2].to(device) if features is not None else None
        with autocast():  # per-token losses: on a CPU made a chunk of logits at a time
            loss = model(x, index=index, targets=y).mean()
        total += loss.item() * y.numel()
        count += y.numel()
    model.train()
    return total / count


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _restore_rng(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _read_resume_state(run_dir: Path, model: torch.nn.Module, world: int) -> dict | None:
    """Rank 0: load the newest checkpoint's weights into `model` and return its training state."""
    if not checkpoint_dirs(run_dir):
        return None
    ckpt = open_checkpoint(run_dir)
    load_weights(model, ckpt)
    state = load_train_state(ckpt)
    saved = state.get("world", 1)
    if saved != world:
        raise UserError(f"{ckpt.path}: checkpoint of a run on {saved} process(es), this launch has {world}; "
                        f"resume with the same number of processes (torchrun --nnodes x --nproc-per-node)")
    return state


StepHook = Callable[[int, torch.nn.Module], None]


def train_run(cfg: RunConfig, run_dir: str | os.PathLike, resume: bool = False, quiet: bool = False,
              on_step: StepHook | None = None) -> TrainResult:
    """Train as cfg says; under torchrun this process is one rank. `on_step(step, model)` runs after each step."""
    folder = resolve_data(cfg)
    env = init_dist(cfg.dist, resolve_device(cfg.train.device))
    try:
        return _train(cfg, Path(run_dir), folder, env, resume, quiet or not env.is_main, on_step)
    finally:
        env.close()


def _train(cfg: RunConfig, run_dir: Path, folder: TokenFolder, env: DistEnv, resume: bool, quiet: bool,
           on_step: StepHook | None) -> TrainResult:
    env.on_main(prepare_run_dir, run_dir, cfg, resume)
    device = env.device
    if device.type == "cpu":
        reuse_freed_blocks()  # a step's large tensors reuse the last step's pages instead of faulting in new ones
    amp_dtype = resolve_autocast_dtype(cfg.train.dtype, device)

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext()

    if resume and (run_dir / "config.toml").is_file():
        settle_added_keys(cfg, run_dir / "config.toml")  # a run saved before a key keeps the model it had
    features = open_features(cfg, folder)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, cfg.index).to(device)
    if cfg.train.compile_block_once and not block_region.AVAILABLE:
        raise UserError(f"train.compile_block_once: this torch ({torch.__version__}) has no "
                        f"torch.compiler.nested_compile_region; set train.compile_block_once = false")
    model.compile_block_once = cfg.train.compile_block_once  # traced once, reused by every block (block_region.py)
    if cfg.train.qkv_kernel:
        if not hasattr(model, "use_qkv_kernel"):
            raise UserError(f'train.qkv_kernel applies to the tscale architecture (model.arch is "{cfg.model.arch}"): '
                            f"set train.qkv_kernel = false")
        if cfg.train.compile_block_once and device.type == "cuda" and not block_region.HOLDS_AUTOGRAD_FUNCTIONS:
            raise UserError(f"train.qkv_kernel with train.compile_block_once needs torch >= 2.13 (this torch, "
                            f"{torch.__version__}, cannot compile the kernel's autograd function once per block): set "
                            f"one of them to false")
        model.use_qkv_kernel(True)
    converted = convert_linears_as_configured(model, cfg.precision)
    traced = bool(converted) and model.get_submodule(converted[0]).recipe.in_graph  # one recipe for every layer
    if cfg.train.compile_block_once and traced and not block_region.HOLDS_AUTOGRAD_FUNCTIONS:
        raise UserError(f'train.compile_block_once with precision.recipe = "{cfg.precision.recipe}" needs torch >= 2.13 '
                        f"(this torch, {torch.__version__}, cannot compile its traced products once per block): "
                        "set train.compile_block_once = false")
    if cfg.train.fused_loss and cfg.index.enabled:
        raise UserError("train.fused_loss does not apply to a model with the token index (its loss is the "
                        "mixture's): set train.fused_loss = false")
    if cfg.train.fused_loss and "lm_head" in converted:
        raise UserError(f'train.fused_loss needs the head as a plain layer, but precision.recipe = '
                        f'"{cfg.precision.recipe}" converts lm_head: keep "head" in precision.exclude')
    if env.active:
        torch.manual_seed(cfg.train.seed + 1000 * env.rank)  # own dropout masks per rank
    loader = TrainLoader(folder, cfg.model.seq_len, cfg.train.batch_size, cfg.train.seed, env.rank, env.world,
                         features=features[0] if features else None)
    state = env.on_main(_read_resume_state, run_dir, model, env.world) if resume else None
    replicas = Replicas(model, env, cfg.dist)  # broadcasts rank 0's weights to the other ranks
    optimizer = build_optimizer(model, cfg.optim, device, freeze_variance_at=replicas.freeze_variance_at())
    replicas.attach(optimizer)
    step = 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        mine = state["ranks"][env.rank]
        _restore_rng(mine["rng"], device)
        load_precision_state(model, mine.get("precision", {}), f"{run_dir}'s newest checkpoint")
        replicas.load_local_state(mine)
        step = state["step"]
    if env.is_main:
        write_text_atomic(run_dir / "config.toml", to_toml(cfg))
    metrics = MetricsLog(run_dir / "metrics.jsonl", resume_step=step if resume else None) if env.is_main else NullLog()

    one_pass = cfg.train.loss_kernel and not cfg.index.enabled and "lm_head" not in converted
    head_loss = "chunked" if cfg.train.fused_loss else (_one_pass_loss(device, amp_dtype) if one_pass else None)

    def forward_loss(x: torch.Tensor, y: torch.Tensor, feats: IndexFeatures | None = None,
                     runs: DocRuns | None = None) -> torch.Tensor:
        """(B, T) ids [+ index features] [+ document runs] -> scalar; one graph under compile, logits never kept."""
        extra = {"runs": runs} if runs is not None else {}
        if feats is None:
            if head_loss:
                return replicas.module(x, loss_targets=y, head_loss=head_loss, **extra)
            return mean_loss(replicas.module(x, **extra), y)
        if cfg.index.dropout:
            feats = feats.drop_windows(cfg.index.dropout)
        return replicas.module(x, index=feats, targets=y, **extra).mean()

    over_runs = cfg.train.attention != "auto"  # FlashAttention-2 or cuDNN over each batch's document runs
    runs_backend, runs_windowed = attention_runs.parse_choice(cfg.train.attention)
    if over_runs:
        why = ("it needs model.arch = \"tscale\"" if cfg.model.arch != "tscale" else
               attention_runs.unusable_reason(runs_backend, device, amp_dtype or torch.float32, cfg.model.head_dim))
        if why:
            raise UserError(f'train.attention = "{cfg.train.attention}": {why}; use train.attention = "auto"')

    run_slots, batches_seen = None, 0
    if over_runs:  # one high-water mark of the batches' run counts for the whole run
        split = folder.manifest["splits"]["train"]
        run_slots = RunSlots(initial=expected_slots(cfg.train.batch_size, cfg.model.seq_len,
                                                    split["docs"] if cfg.model.doc_mask else 0, split["tokens"]))

    def batch_runs(x: torch.Tensor) -> DocRuns | None:
        """The document runs of a host batch x (B, T), on the device; None under train.attention = "auto"."""
        nonlocal batches_seen
        if not over_runs:
            return None
        opens = (x == cfg.model.eos_id) if cfg.model.doc_mask else None
        before = run_slots.slots
        runs = doc_runs(opens, *x.shape, windowed=runs_windowed, backend=runs_backend, slots=run_slots)
        if run_slots.slots != before and batches_seen:
            progress.note(f"step {step}: a batch has more document runs than the {before} slots so far; "
                          f"{run_slots.slots} from now on (a new shape: the compiled step and cuDNN's graphs are "
                          "built again)")
        batches_seen += 1
        return runs.to(device, non_blocking=True)

    mode = cfg.train.compile_mode  # "default" is torch's own default
    step_loss = torch.compile(forward_loss, mode=None if mode == "default" else mode) if cfg.train.compile else forward_loss
    graphs = cfg.train.compile and mode in CUDA_GRAPH_MODES and device.type == "cuda"

    tokens_per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len * env.world
    flops_per_token = model.flops_per_token(cfg.model.seq_len)
    peak = peak_flops(device)
    last_ckpt: Path | None = None
    last_loss = val_loss = None
    t_start = time.time()

    def checkpoint() -> Path | None:
        ranks = env.gather_to_main({"rng": _rng_state(device), "precision": precision_state(model),
                                    **replicas.local_state()})
        if not env.is_main:
            return None
        state = {"step": step, "optimizer": optimizer.state_dict(), "loader": loader.state_dict(),
                 "world": env.world, "ranks": ranks}
        return save_checkpoint(run_dir, step, model, cfg.model, folder.tokenizer_path, state, cfg.train.keep_last,
                               index_cfg=cfg.index)

    progress = ProgressLine(cfg.train.steps, step, quiet=quiet)
    progress.note(f"training {cfg.model.arch}: {sum(p.numel() for p in model.parameters()):,} parameters "
                  f"on {device}{' (bf16 autocast)' if amp_dtype else ''}, {tokens_per_step:,} tokens/step, "
                  f"steps {step}..{cfg.train.steps}{replicas.describe()}; ops: {ops_backend()}{_attention_note(cfg)}"
                  f"{_index_note(cfg)}")
    if cfg.train.compile:
        progress.note(f"torch.compile ({cfg.train.compile_mode} mode, "
                      f"{'one block traced for all' if cfg.train.compile_block_once else 'every block traced'}): "
                      f"the first step includes compiling it")

    def zeros() -> torch.Tensor:
        return torch.zeros(cfg.train.batch_size, cfg.model.seq_len, dtype=torch.long, device=device)  # (B, T)

    def no_match() -> IndexFeatures | None:
        return IndexFeatures.empty(cfg.train.batch_size, cfg.model.seq_len, cfg.index.topk, device) if features else None

    prime_runs = None
    if over_runs:
        prime_runs = doc_runs(None, cfg.train.batch_size, cfg.model.seq_len, windowed=runs_windowed,
                              backend=runs_backend, slots=run_slots).to(device)
    replicas.prime(lambda: step_loss(zeros(), zeros(), no_match(), runs=prime_runs).backward())
    stopped_early = False
    with _StopFlag() as stop, progress:
        t_log, step_at_log = time.time(), step
        loss_sum = torch.zeros((), device=device)
        while step < cfg.train.steps:
            lr = lr_at(step, cfg.train.steps, cfg.optim)
            for group in optimizer.param_groups:
                group["lr"] = lr
            replicas.begin_step(step)
            for micro in range(cfg.train.grad_accum):
                host = loader.next_batch(pin=device.type == "cuda")
                runs = batch_runs(host[0])  # from the host's ids: the step never waits on the device for them
                batch = [t.to(device, non_blocking=True) for t in host]
                with replicas.sync_unless(micro < cfg.train.grad_accum - 1):
                    if graphs:  # a new forward + backward: the previous replay's outputs are done with
                        torch.compiler.cudagraph_mark_step_begin()
                    with autocast():
                        loss = step_loss(*batch, runs=runs) / cfg.train.grad_accum
                    loss.backward()
                loss_sum += loss.detach()
            clip = cfg.optim.grad_clip if replicas.clips() else 0.0
            final = step + 1 == cfg.train.steps
            log_now = (step + 1) % cfg.train.log_every == 0 or final
            grad_norm = None
            if clip:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            elif log_now and replicas.clips():  # only logged: a pass over the gradients on logging steps alone;
                # none while 1-bit Adam's p.grad hold the exchanged momentum, whose norm is no gradient norm
                grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if on_step is not None:
                on_step(step, model)

            if log_now:
                # .item() waits for the device to finish every queued step; only then is the clock read, or a
                # host running steps ahead of the device would be timed instead of the steps themselves
                last_loss = env.mean(loss_sum).item() / (step - step_at_log)
                now = time.time()
                tps = tokens_per_step * (step - step_at_log) / max(now - t_log, 1e-9)
                norm = grad_norm.item() if grad_norm is not None else None
                record = {"step": step, "loss": last_loss, "lr": lr, "grad_norm": norm,
                          "tokens_per_s": tps, "mfu": tps * flops_per_token / peak / env.world if peak else None,
                          "tokens": step * tokens_per_step, "elapsed_s": now - t_start,
                          "mem_gb": _memory_gb(device)}
                if env.active:
                    sent, fp32 = replicas.take_bytes()
                    record.update(comm_bytes=sent / (step - step_at_log), comm_bytes_fp32=fp32 / (step - step_at_log))
                if not math.isfinite(last_loss):
                    raise UserError(f"loss became {last_loss} at step {step}; lower optim.lr or raise "
                                    f"optim.warmup_steps (last checkpoint: {last_ckpt or 'none'})")
                metrics.write(record)
                progress.update(step, record)
                t_log, step_at_log = time.time(), step
                loss_sum.zero_()
            if env.is_main and cfg.train.eval_every and (step % cfg.train.eval_every == 0 or final):
                t_eval = time.time()
                val_loss = evaluate(model, folder, cfg, device, autocast, features[1] if features else None)
                metrics.write({"step": step, "val_loss": val_loss})
                progress.note(f"step {step}: val loss {val_loss:.4f}")
                t_log += time.time() - t_eval  # throughput counts training time only
            out_of_time = bool(cfg.train.time_limit_s) and time.time() - t_start > cfg.train.time_limit_s
            if env.any(stop.signal is not None or out_of_time):
                stopped_early = not final
                last_ckpt = checkpoint()
                why = (f"signal {signal.Signals(stop.signal).name}" if stop.signal is not None
                       else "train.time_limit_s" if out_of_time else "another rank's stop")
                progress.note(f"stopped by {why} at step {step}; checkpoint {last_ckpt}")
                break
            if final or (cfg.train.ckpt_every and step % cfg.train.ckpt_every == 0):
                t_ckpt = time.time()
                last_ckpt = checkpoint()
                t_log += time.time() - t_ckpt
    metrics.close()
    return TrainResult(step=step, last_loss=last_loss, val_loss=val_loss, checkpoint=last_ckpt,
                       stopped_early=stopped_early, rank=env.rank)


def _one_pass_loss(device: torch.device, amp_dtype: torch.dtype | None) -> str | None:
    """train.loss_kernel's path here: the CUDA kernel for bf16 GPU steps, the chunked torch loss on a CPU (its
    buffers stay small enough to be reused; about 2.4x faster than the logits path for a 50,257-token head on 2 cores),
    the logits path elsewhere (the kernel's torch reference is slower than it on a GPU without bf16)."""
    if device.type == "cuda":
        return "kernel" if amp_dtype == torch.bfloat16 else None
    return "chunked" if device.type == "cpu" else None


def _attention_note(cfg: RunConfig) -> str:
    """What train.attention puts in place of the default attention, for the run's first line ("" for "auto")."""
    if cfg.train.attention == "auto":
        return ""
    backend, windowed = attention_runs.parse_choice(cfg.train.attention)
    where = "every layer" if windowed else "the global layers"
    return (f"; attention in {where}: {attention_runs.DESCRIBED[backend]} over the batch's document runs "
            f"(train.attention = {cfg.train.attention})")


def _index_note(cfg: RunConfig) -> str:
    if not cfg.index.enabled:
        return ""
    parts = [name for name, on in (("inputs", cfg.index.inputs), ("mixer", cfg.index.mixer)) if on]
    return f"; token index {cfg.index.path} ({' + '.join(parts)}, top-{cfg.index.topk})"


def _memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
