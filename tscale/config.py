"""Typed run configuration: TOML file + `--set key.path=value` overrides, validated, saved resolved.

Every field has a default, so a TOML file only says what differs. Unknown keys and values of
the wrong type are errors that name the file and the key. The resolved configuration (after
overrides and after values taken from the data, such as the vocabulary size) is written to
the run folder as config.toml, which `--resume` reads back.
"""

import difflib
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tscale.errors import UserError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    """The transformer's shape; the switches below `dropout` apply to arch "tscale" only.

    `vocab_size` 0 and `eos_id` -1 mean: take them from the token folder. `n_head` 0 and
    `head_dim` 0 are derived from `d_model` (head_dim 128 for tscale, 64 for gpt2). `window`
    0 means every layer sees the whole context; otherwise every `global_every`-th layer,
    counted back from the last, does (0: none) and the others see `window` tokens.
    `logit_softcap` 0 switches soft-capping off. `tie_embeddings`: the head is the token embedding's
    matrix (the default: at 124M it reached gpt2's loss in fewer tokens than the untied pair,
    docs/BENCHMARKS.md, "Tied embedding and head").
    """

    arch: Literal["gpt2", "tscale"] = "tscale"
    n_layer: int = Field(12, ge=1)
    n_head: int = Field(0, ge=0)
    head_dim: int = Field(0, ge=0)
    d_model: int = Field(768, ge=8)
    seq_len: int = Field(1024, ge=2)
    vocab_size: int = Field(0, ge=0)
    eos_id: int = Field(-1, ge=-1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    rope: bool = True
    rope_theta: float = Field(10000.0, gt=0)
    norm: Literal["rms", "layer"] = "rms"
    qk_norm: bool = True
    bias: bool = False
    mlp: Literal["relu2", "gelu"] = "relu2"
    zero_init: bool = True
    tie_embeddings: bool = True
    logit_softcap: float = Field(30.0, ge=0)
    sink: bool = True
    doc_mask: bool = True
    window: int = Field(128, ge=0)
    global_every: int = Field(4, ge=0)

    @model_validator(mode="after")
    def _resolve_heads(self) -> "ModelConfig":
        n_head, head_dim, width = self.n_head, self.head_dim, self.d_model
        if not n_head:
            head_dim = head_dim or (128 if self.arch == "tscale" else 64)
            if width % head_dim:
                raise ValueError(f"model.d_model {width} is not a multiple of model.head_dim {head_dim}; "
                                 f"set model.n_head")
            n_head = width // head_dim
        elif not head_dim:
            if width % n_head:
                raise ValueError(f"model.d_model {width} is not a multiple of model.n_head {n_head}")
            head_dim = width // n_head
        if self.arch == "gpt2" and n_head * head_dim != width:
            raise ValueError(f"arch gpt2 needs model.n_head * model.head_dim == model.d_model "
                             f"({n_head} * {head_dim} != {width})")
        if self.arch == "tscale" and self.rope and head_dim % 2:
            raise ValueError(f"model.rope needs an even model.head_dim (got {head_dim})")
        if 0 < self.vocab_size <= self.eos_id:
            raise ValueError(f"model.eos_id {self.eos_id} is outside the vocabulary of {self.vocab_size}")
        object.__setattr__(self, "n_head", n_head)  # resolved in place, without re-validating
        object.__setattr__(self, "head_dim", head_dim)
        return self


class OptimConfig(_Section):
    """The optimizer and the learning-rate schedule.

    name "adamw": AdamW on everything at `lr`. name "muon": Muon (`muon_lr`, `muon_momentum`)
    on the hidden matrices, AdamW on the embedding (`embed_lr`), the head (`head_lr`) and
    vectors such as norm gains (`scalar_lr`). Schedule: linear warmup, then cosine or linear
    decay to min_lr_ratio, or "trapezoid": constant, then linear decay over the last
    `decay_frac` of the steps. It scales every rate alike. `compile_step` runs Muon's update
    (momentum, Newton-Schulz, the parameter update) through torch.compile, its elementwise
    passes fused; the same arithmetic up to rounding. "auto" does so on a GPU with Triton (124M
    on an H200: Muon's step 6.46 -> 4.98 ms, training +1.7-2.0% tokens/s) and not on a CPU,
    where compiling costs more than it saves in short runs.
    """

    name: Literal["adamw", "muon"] = "adamw"
    lr: float = Field(6e-4, gt=0)
    muon_lr: float = Field(0.02, gt=0)
    muon_momentum: float = Field(0.95, ge=0, lt=1)
    embed_lr: float = Field(0.01, gt=0)
    head_lr: float = Field(0.004, gt=0)
    scalar_lr: float = Field(0.01, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(100, ge=0)
    decay: Literal["cosine", "linear", "trapezoid"] = "cosine"
    decay_frac: float = Field(0.3, gt=0, le=1)
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0)
    compile_step: Literal["auto"] | bool = "auto"


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the torch.compile modes that replay CUDA graphs


class TrainConfig(_Section):
    """The loop: steps, batch, device, evaluation, checkpoints, logging."""

    steps: int = Field(1000, ge=1)
    batch_size: int = Field(8, ge=1)
    grad_accum: int = Field(1, ge=1)
    seed: int = 1337
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    compile: bool = False
    # torch.compile's mode; "reduce-overhead" replays each step's kernels as CUDA graphs, so a step whose
    # layers launch many small kernels from Python (the low-precision recipes) no longer waits on the CPU
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    # the training steps' attention (tscale architecture): "auto" is tscale.ops.attention's choice (the fused
    # kernel on a GPU); "fa2" is torch's FlashAttention-2 over the batch's document runs (tscale/ops/attention_fa2.py);
    # "fa2_global" FlashAttention-2 in the global layers only, the windowed ones keeping "auto"'s choice;
    # "cudnn" / "cudnn_global" the same with cuDNN's attention (Hopper and newer, tscale/ops/attention_cudnn.py;
    # its kernels are faster than the fused kernel's in every layer, but each call costs the host ~1.25 ms, which
    # a training step hides for the 3 global layers of the 124M preset: docs/BENCHMARKS.md)
    attention: Literal["auto", "fa2", "fa2_global", "cudnn", "cudnn_global"] = "auto"
    # torch.compile traces one transformer block and reuses its compiled code for every block
    # (tscale/model/block_region.py): compile time no longer grows with the depth; nothing fuses across blocks
    compile_block_once: bool = False
    # the step's loss straight from the head's input, a chunk of tokens of logits at a time, none of them kept
    # (tscale/ops/fused_loss.py): less memory; models without the token index; the head must stay a plain layer
    fused_loss: bool = False
    # the step's loss and its gradient w.r.t. the logits made in the forward pass, for models without the token
    # index whose head is a plain layer: on a GPU with bf16 autocast in one pass over the logits
    # (tscale/ops/head_loss.py, a CUDA kernel; 124M on an H200: gpt2 +6.4%, tscale +8.0% tokens/s; peak memory
    # gpt2 +3.1 GB, tscale -3.0 GB), on a CPU a chunk of tokens at a time as train.fused_loss does, in buffers
    # small enough to be reused (a 50,257-token head's loss about 2.4x faster than the logits path on 2 cores);
    # the logits path elsewhere and when false (docs/BENCHMARKS.md)
    loss_kernel: bool = True
    # the tscale architecture's attention inputs from its qkv product in one CUDA pass each way (QK norm, RoPE, the
    # casts and v's copy; tscale/ops/qkv_prep.py) where it serves (bf16 on a GPU, RMS or no QK norm, RoPE, head
    # dimension 64 or 128); the model's own ops, which torch.compile fuses, elsewhere and when false. Off:
    # under torch.compile inductor's kernels for the same ops were faster inside the step (docs/BENCHMARKS.md)
    qkv_kernel: bool = False
    eval_every: int = Field(200, ge=0)
    eval_batches: int = Field(20, ge=1)
    ckpt_every: int = Field(500, ge=0)
    keep_last: int = Field(3, ge=1)
    log_every: int = Field(10, ge=1)
    time_limit_s: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _check_compile_mode(self) -> "TrainConfig":
        if self.compile_mode != "default" and not self.compile:
            raise ValueError(f'compile_mode "{self.compile_mode}" needs train.compile = true')
        if self.compile_mode in CUDA_GRAPH_MODES and self.grad_accum > 1:
            # torch's CUDA-graph trees hand each replay's gradients back in memory that the next micro-batch's
            # replay overwrites, so accumulated gradients would be wrong (pytorch/pytorch#169545)
            raise ValueError(f'compile_mode "{self.compile_mode}" replays CUDA graphs, which cannot accumulate '
                             f'gradients over micro-batches: set train.grad_accum = 1 (a larger train.batch_size) '
                             f'or compile_mode = "default"')
        if self.compile_block_once and not self.compile:
            raise ValueError("train.compile_block_once needs train.compile = true")
        if self.compile_block_once and self.attention != "auto":
            raise ValueError(f'train.compile_block_once works with train.attention = "auto" (got "{self.attention}"; '
                             f'the document-run paths compile each block)')
        return self


class DataConfig(_Section):
    """Where the token folder is (relative paths are relative to the working directory)."""

    tokens: str = ""


class DistConfig(_Section):
    """Data parallel under torchrun: the process-group backend and the gradient exchange.

    compression "onebit" sends sign bits with one scale per `chunk` values, with error
    feedback, after `onebit_warmup_steps` steps of plain fp32 allreduce. `onebit_what`
    "momentum" is 1-bit Adam (AdamW momentum exchanged, variance frozen after the warm-up);
    "gradient" compresses the raw gradients (worse with AdamW: docs/distributed.md).
    """

    backend: Literal["auto", "nccl", "gloo"] = "auto"
    compression: Literal["none", "onebit"] = "none"
    onebit_what: Literal["momentum", "gradient"] = "momentum"
    chunk: int = Field(2048, ge=8, multiple_of=8)
    onebit_warmup_steps: int = Field(100, ge=0)
    bucket_cap_mb: float = Field(25.0, gt=0)
    timeout_s: float = Field(1800.0, gt=0)


class PrecisionConfig(_Section):
    """Low-precision linear layers in training (docs/lowprec.md).

    recipe "bf16" keeps nn.Linear under train.dtype; "fp8_tensorwise", "fp8_rowwise" and
    "int8_rowwise" run the products of every linear layer not named in `exclude` in fp8 / int8
    with fp32 master weights; "int8_switchback" and "fp8_switchback" run the forward and
    input-gradient products in int8 / fp8 (rowwise scales, quantised by torch ops that
    torch.compile fuses into the neighbouring kernels) and the weight gradient in train.dtype
    (tscale/precision/recipes.py). `int8_backward` runs int8_rowwise's backward products in int8
    too (default: bf16). `fp8_fast_accum` uses the fp8 tensor cores' fast accumulation in the
    forward product of an fp8 recipe (the two backward products keep exact fp32 sums).
    `quantize_in_graph` (fp8_tensorwise only) writes the quantisation as plain torch ops and the
    products as torch._scaled_mm instead of the custom op, so torch.compile can fuse the casts
    with neighbouring kernels (tscale/precision/graph_matmul.py). `scaling = "delayed"`
    (fp8_tensorwise only) scales each operand by the largest amax of its last `amax_history` calls
    instead of its own, so its cast reads it once (tscale/precision/delayed.py). A name in `exclude`
    matches any part of a module name; a glob (*, ?) matches the whole name.
    """

    recipe: Literal["bf16", "fp8_tensorwise", "fp8_rowwise", "int8_rowwise", "int8_switchback",
                    "fp8_switchback"] = "bf16"
    int8_backward: bool = False
    fp8_fast_accum: bool = False
    quantize_in_graph: bool = False
    scaling: Literal["dynamic", "delayed"] = "dynamic"
    amax_history: int = Field(16, ge=1, le=256)
    exclude: list[str] = Field(default_factory=lambda: ["wte", "lm_head"])

    @model_validator(mode="after")
    def _check_backward(self) -> "PrecisionConfig":
        if self.int8_backward and self.recipe != "int8_rowwise":
            raise ValueError(f'precision.int8_backward needs precision.recipe = "int8_rowwise" (got "{self.recipe}")')
        if self.fp8_fast_accum and not self.recipe.startswith("fp8"):
            raise ValueError(f'precision.fp8_fast_accum needs an fp8 recipe (got "{self.recipe}")')
        if self.quantize_in_graph and self.recipe != "fp8_tensorwise":
            raise ValueError(f'precision.quantize_in_graph needs precision.recipe = "fp8_tensorwise" '
                             f'(got "{self.recipe}"; the switchback recipes always quantise in the graph)')
        if self.scaling == "delayed" and (self.recipe != "fp8_tensorwise" or self.quantize_in_graph):
            raise ValueError(f'precision.scaling = "delayed" needs precision.recipe = "fp8_tensorwise" without '
                             f'precision.quantize_in_graph (got "{self.recipe}")')
        return self


class IndexConfig(_Section):
    """The token index consulted at every token (docs/index.md); each switch works alone.

    `path` is an index folder built from data.tokens with `tscale build-index --features` ("" =
    no index). `inputs` adds embeddings of the index's most frequent next token and of the
    match-length bucket to the token embedding. `mixer` mixes the index's next-token
    distribution (its top `topk` next tokens and counts, add-`delta` smoothed) into the model's
    with a learned gate; the loss is then the negative log-likelihood of the mixture, which
    trains the gate, while the network trains on its own next-token loss (`mixer_joint = true`:
    the mixture's loss trains the network too, which measured worse; docs/index.md). `dropout`
    is the share of training windows that see no lookups at all (every position "no match"),
    so the network also learns to predict on its own instead of leaning on the index.
    `max_len` caps the match of every lookup at that many tokens; the index's features must have
    been built with the same `--features-max-len` (a cap well below the span an evaluation index was
    decontaminated at keeps the near-copies it left out from deciding the lookup: docs/index.md).
    `gate_stats` gives the mixer's gate three more inputs: how much of the top-K counts the
    index's top token holds, that share together with the match length, and the network's own
    probability of that token (tscale/index/mixing.py). They start at zero, so the gate starts
    as it would without them; a checkpoint saved without them loads with them at zero, and a run
    saved before the key existed resumes without them (`ADDED_KEYS`).
    `distribution` is what the index says about the next token (tscale/index/distribution.py):
    "counts", the longest match's top-`topk` counts, or "backoff", Witten-Bell interpolation over
    that match and the shorter ones capped at 32, 16, 8, 4, 2 and 1 token, its `topk` most probable
    tokens and the rest spread evenly; the features must hold the same (`--features-distribution`).
    """

    path: str = ""
    inputs: bool = False
    mixer: bool = False
    topk: int = Field(4, ge=1, le=64)
    max_len: int = Field(64, ge=1, le=255)
    delta: float = Field(1e-5, gt=0, le=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    mixer_joint: bool = False
    gate_stats: bool = True
    distribution: Literal["counts", "backoff"] = "counts"

    @property
    def enabled(self) -> bool:
        return self.inputs or self.mixer

    @model_validator(mode="after")
    def _check_path(self) -> "IndexConfig":
        if self.enabled and not self.path:
            raise ValueError("index.inputs and index.mixer need index.path (an index folder built with --features)")
        if self.path and not self.enabled:
            raise ValueError(f"index.path is {self.path!r} but neither index.inputs nor index.mixer is true; "
                             f"turn one on or remove index.path")
        return self


class RunConfig(_Section):
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()
    dist: DistConfig = DistConfig()
    precision: PrecisionConfig = PrecisionConfig()
    index: IndexConfig = IndexConfig()


def _parse_value(text: str) -> Any:
    """A --set value is read as a TOML value; anything TOML can't read is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _known_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, _known_keys(RunConfig), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown key {key}{hint}"


def apply_override(tree: dict, assignment: str) -> None:
    """Apply one `a.b.c=value` to a nested dict."""
    if "=" not in assignment:
        raise UserError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set train.steps=100")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"--set {key}: {part} is not a section")
    node[parts[-1]] = _parse_value(text.strip())


def validate(tree: dict, origin: str) -> RunConfig:
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise UserError(f"{origin}: {_unknown_key_message(key)}") from None
        if err["type"] == "value_error" and len(err["loc"]) == 1:  # a section's own check across keys
            raise UserError(f"{origin}: {err['ctx']['error']}") from None
        raise UserError(f"{origin}: {key}: {err['msg']} (got {err.get('input')!r})") from None


def load_config(path: str | os.PathLike | None, overrides: list[str] = ()) -> RunConfig:
    """Read a TOML file (or start from defaults), apply overrides, validate."""
    tree: dict = {}
    origin = "defaults"
    if path is not None:
        origin = str(path)
        try:
            tree = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{path}: no such config file") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: not valid TOML ({e})") from None
    for assignment in overrides:
        apply_override(tree, assignment)
    if overrides:
        origin += " + --set"
    return validate(tree, origin)


ADDED_KEYS = {"index.gate_stats": False}  # keys added after runs were saved -> what such a run had


def settle_added_keys(cfg: RunConfig, saved: str | os.PathLike) -> None:
    """For resuming: keys that a run's saved config.toml lacks take the value the run was trained with."""
    tree = tomllib.loads(Path(saved).read_text(encoding="utf-8"))
    for key, before in ADDED_KEYS.items():
        section, name = key.split(".")
        if name not in tree.get(section, {}):
            setattr(getattr(cfg, section), name, before)


def to_toml(cfg: RunConfig) -> str:
    """The resolved config as TOML text (every key written, so a run is self-describing)."""
    lines = []
    for section, values in cfg.model_dump().items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
