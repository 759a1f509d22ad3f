"""Atomic file writes and checksums: every output goes to a temporary name, then is renamed.

A folder that takes long to build goes through `resumable_dir`, kept when interrupted.
"""

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from tscale.errors import UserError


def _umask_mode(mode: int) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, _umask_mode(0o666))
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


@contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temporary folder beside `path`; on success rename it to `path` (must not exist)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, _umask_mode(0o777))
    try:
        yield tmp
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


RESUME_KEY = "resume-key.json"


def partial_dir(path: str | os.PathLike) -> Path:
    """Where resumable_dir builds `path`: `.NAME.partial` beside it."""
    path = Path(path)
    return path.parent / f".{path.name}.partial"


@contextmanager
def resumable_dir(path: str | os.PathLike, key: dict):
    """Yield (work folder beside `path`, whether it holds an interrupted run with the same `key`).

    The folder is partial_dir(path). On success it is renamed to `path` (which must
    not exist); on KeyboardInterrupt it is kept, so the same build can continue from what it
    finished; on any other error it is removed. A partial folder of another key (another build
    into the same `path`) is replaced; a folder of that name without a key was not made here and
    is refused.
    """
    path = Path(path)
    work = partial_dir(path)
    key = json.loads(json.dumps(key))  # tuples become lists, as they read back
    key_file = work / RESUME_KEY
    resumed = False
    if work.exists():
        if not key_file.is_file():
            raise UserError(f"{work}: exists and is not a partial build of {path}; move or delete it")
        resumed = json.loads(key_file.read_text(encoding="utf-8")) == key
        if not resumed:
            shutil.rmtree(work)
    if not resumed:
        path.parent.mkdir(parents=True, exist_ok=True)
        work.mkdir()
        os.chmod(work, _umask_mode(0o777))
        write_json_atomic(key_file, key)
    try:
        yield work, resumed
        key_file.unlink()
        os.rename(work, path)
    except KeyboardInterrupt:
        raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
