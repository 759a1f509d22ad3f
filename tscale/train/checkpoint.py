"""Checkpoints: run/ckpt/step-NNNNNNN/ with weights, model config, tokenizer and training state.

  model.safetensors   weights (tied tensors stored once)
  model.json          the ModelConfig the weights belong to
  index.json          only for a model built with the token index: its IndexConfig (eval and
                      infer then need an index folder; see docs/index.md)
  tokenizer.json      the tokenizer of the token folder the model was trained on
  train_state.pt      optimizer, loader position, RNG states, step (only for --resume)
  manifest.json       format "tscale-checkpoint" v1, step, checksums

A checkpoint is built in a temporary folder and renamed into place, never overwritten; the
oldest are removed beyond `keep_last`.
"""

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
import torch.nn as nn

from tscale.config import IndexConfig, ModelConfig
from tscale.errors import UserError
from tscale.fileio import atomic_dir
from tscale.index.mixing import GATE_STATS_TABLES
from tscale.manifest import load_manifest, write_manifest

CKPT_FORMAT = "tscale-checkpoint"
CKPT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{7,})$")


@dataclass
class Checkpoint:
    path: Path
    step: int
    model_cfg: ModelConfig
    manifest: dict
    index_cfg: IndexConfig | None = None

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"

    @property
    def weights_path(self) -> Path:
        return self.path / "model.safetensors"

    @property
    def state_path(self) -> Path:
        return self.path / "train_state.pt"


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "ckpt"
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / "manifest.json").is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def save_checkpoint(run_dir: str | os.PathLike, step: int, model: nn.Module, model_cfg: ModelConfig,
                    tokenizer_path: str | os.PathLike, train_state: dict, keep_last: int,
                    index_cfg: IndexConfig | None = None) -> Path:
    path = Path(run_dir) / "ckpt" / f"step-{step:07d}"
    if path.exists():
        return path
    with atomic_dir(path) as tmp:
        safetensors.torch.save_model(model, str(tmp / "model.safetensors"))
        (tmp / "model.json").write_text(model_cfg.model_dump_json(indent=1) + "\n", encoding="utf-8")
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        torch.save(train_state, tmp / "train_state.pt")
        files = ["model.safetensors", "model.json", "tokenizer.json", "train_state.pt"]
        if index_cfg is not None and index_cfg.enabled:
            (tmp / "index.json").write_text(index_cfg.model_dump_json(indent=1) + "\n", encoding="utf-8")
            files.append("index.json")
        write_manifest(tmp, CKPT_FORMAT, CKPT_VERSION, files, step=step)
    for _, old in checkpoint_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old)
    return path


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """A checkpoint folder, or a run folder (then its newest checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint or run folder")
    if not (path / "manifest.json").is_file() and (path / "ckpt").is_dir():
        found = checkpoint_dirs(path)
        if not found:
            raise UserError(f"{path}: run folder has no complete checkpoint yet")
        path = found[-1][1]
    manifest = load_manifest(path, CKPT_FORMAT, (CKPT_VERSION,))
    try:
        model_cfg = ModelConfig.model_validate(json.loads((path / "model.json").read_text(encoding="utf-8")))
    except Exception as e:
        raise UserError(f"{path / 'model.json'}: not a valid model config ({e})") from None
    index_cfg = None
    if "index.json" in manifest.get("files", {}):
        try:
            index_cfg = IndexConfig.model_validate(json.loads((path / "index.json").read_text(encoding="utf-8")))
        except Exception as e:
            raise UserError(f"{path / 'index.json'}: not a valid index config ({e})") from None
    return Checkpoint(path=path, step=manifest["step"], model_cfg=model_cfg, manifest=manifest, index_cfg=index_cfg)


def load_weights(model: nn.Module, ckpt: Checkpoint) -> None:
    """Load the checkpoint's weights into `model`, refusing one of another shape with a clear error."""
    stored = safetensors.torch.load_file(str(ckpt.weights_path))
    own = model.state_dict()
    for name, tensor in stored.items():
        if name not in own:
            raise UserError(f"{ckpt.path}: checkpoint has weight {name!r} that this model lacks (another architecture?)")
        if own[name].shape != tensor.shape:
            raise UserError(
                f"{ckpt.path}: weight {name} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(own[name].shape)} (checkpoint of a different model shape)")
    missing, _ = safetensors.torch.load_model(model, str(ckpt.weights_path), strict=False)
    missing = [name for name in missing if not _zero_if_new_gate_table(model, name)]
    if missing:
        raise UserError(f"{ckpt.path}: checkpoint lacks weights {sorted(missing)[:3]} (another architecture?)")


def _zero_if_new_gate_table(model: nn.Module, name: str) -> bool:
    """A missing index.mixer gate-stats table (checkpoints from before index.gate_stats) is zeroed: the old gate."""
    owner, _, leaf = name.rpartition(".")
    if leaf != "weight" or not owner.endswith(tuple(f"index.mixer.{t}" for t in GATE_STATS_TABLES)):
        return False
    with torch.no_grad():
        model.get_submodule(owner).weight.zero_()
    return True


def load_train_state(ckpt: Checkpoint) -> dict:
    return torch.load(ckpt.state_path, map_location="cpu", weights_only=True)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", precision: str = "bf16",
               linears_dtype: torch.dtype | None = None, quantize_head: bool = False) -> tuple[nn.Module, Checkpoint]:
    """Build the checkpoint's model, load its weights, put it in eval mode on `device`.

    precision: an inference mode of `--precision` (tscale.precision.inference). The model is built and loaded on
    the CPU and each converted layer is quantised on `device` in turn, so the device holds the full-precision
    weights of one layer at a time, not the whole model's.
    quantize_head: convert the head as well (a head tied to the embedding gets its own quantised copy; the
    embedding stays as trained).
    linears_dtype: the dtype the linear layers left in full precision are stored in (tscale.precision.
    store_linears_in; for a model run under autocast to it), before the model moves to `device`.
    """
    from tscale.model import build_model
    from tscale.precision import quantize_for_inference, store_linears_in

    if quantize_head and precision == "bf16":
        raise UserError("--quantize-head: goes with --precision int8-w, fp8-w, int8 or fp8 (bf16 keeps every layer "
                        "as trained)")
    ckpt = open_checkpoint(path)
    model = build_model(ckpt.model_cfg, ckpt.index_cfg)
    load_weights(model, ckpt)
    quantize_for_inference(model, precision, exclude=("wte",) if quantize_head else ("wte", "lm_head"), device=device)
    if linears_dtype is not None:
        store_linears_in(model, linears_dtype)
    return model.to(device).eval(), ckpt
