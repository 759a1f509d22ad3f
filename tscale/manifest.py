"""manifest.json of every output folder: format, version, inputs, files with checksums, command.

A stage writes its manifest last, after all its files are in place, so a folder with a
valid manifest is complete. A stage that reads a folder calls `load_manifest`, which refuses
a missing manifest, an unknown format or version, and files whose bytes differ from it.
"""

import datetime
import json
import os
import shlex
import sys
from pathlib import Path

from tscale.errors import UserError
from tscale.fileio import sha256_file, write_json_atomic

MANIFEST = "manifest.json"


def file_record(path: str | os.PathLike) -> dict:
    """Size and sha256 of one file, as stored in a manifest."""
    return {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}


def command_line() -> str:
    return shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


def write_manifest(folder: str | os.PathLike, fmt: str, version: int, files: list[str], **fields) -> dict:
    """Write folder/manifest.json describing `files` (names relative to folder) and `fields`."""
    folder = Path(folder)
    manifest = {
        "format": fmt,
        "version": version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
        **fields,
        "files": {name: file_record(folder / name) for name in files},
    }
    write_json_atomic(folder / MANIFEST, manifest)
    return manifest


def manifest_fields(manifest: dict) -> dict:
    """The `fields` a manifest was written with (what write_manifest adds itself left out)."""
    return {k: v for k, v in manifest.items() if k not in ("format", "version", "created", "command", "files")}


def load_manifest(folder: str | os.PathLike, fmt: str, versions: tuple[int, ...], verify: bool = True) -> dict:
    """Read and check folder/manifest.json; raise UserError naming the file and the problem."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder")
    path = folder / MANIFEST
    if not path.is_file():
        raise UserError(f"{path}: missing; {folder} is not a complete {fmt} folder (re-run the stage that makes it)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if manifest.get("format") != fmt:
        raise UserError(f"{path}: format is {manifest.get('format')!r}, expected {fmt!r}")
    if manifest.get("version") not in versions:
        raise UserError(f"{path}: format version {manifest.get('version')!r} is not supported (known: {list(versions)})")
    for name, rec in manifest.get("files", {}).items():
        fpath = folder / name
        if not fpath.is_file():
            raise UserError(f"{fpath}: listed in {path} but missing")
        size = os.path.getsize(fpath)
        if size != rec["bytes"]:
            raise UserError(f"{fpath}: {size} bytes, manifest says {rec['bytes']} (truncated or changed; re-run the stage)")
        if verify and sha256_file(fpath) != rec["sha256"]:
            raise UserError(f"{fpath}: checksum differs from {path} (corrupt or changed; re-run the stage)")
    return manifest
