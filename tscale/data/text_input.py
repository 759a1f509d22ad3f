"""Text inputs as a lazy stream of documents: .txt files, .jsonl / .jsonl.xz lines, folders of them.

A plain-text file is one document: source = the input argument's name (file stem, or folder
name for a folder argument), doc = its path relative to the folder (its file name for a file
argument). A JSON line gives `text` and optionally `source` and `doc`; without `source` it
gets the input name, without `doc` its line number (prefixed by the file's path inside the
folder when the file was found in a folder, so doc names stay unique within a source).
Folders are walked recursively in sorted order; hidden files and folders are skipped.
"""

import json
import lzma
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tscale.errors import UserError

SUFFIXES = (".txt", ".jsonl", ".jsonl.xz")
_BOM = "\ufeff"


@dataclass(frozen=True)
class Document:
    source: str
    doc: str
    text: str


@dataclass(frozen=True)
class InputFile:
    """One file to read: where it is, the input name it belongs to, and its path inside its input."""

    path: Path
    input_name: str
    rel: str  # path relative to the folder argument ("" for a file argument)


def kind_of(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in (".jsonl.xz", ".jsonl", ".txt"):
        if name.endswith(suffix):
            return suffix
    return None


def input_name(path: Path) -> str:
    """The default source of an input argument: a folder's name, or a file's name without its suffix."""
    name = path.resolve().name if path.is_dir() else path.name
    suffix = kind_of(path)
    return name[: -len(suffix)] if suffix and not path.is_dir() else name


def list_inputs(paths: list[str | os.PathLike]) -> list[InputFile]:
    """Resolve input arguments into the files to read, checking they exist and have a known type."""
    if not paths:
        raise UserError("no input given: name one or more .txt / .jsonl / .jsonl.xz files or folders")
    files: list[InputFile] = []
    for arg in paths:
        p = Path(arg)
        if not p.exists():
            raise UserError(f"{p}: no such file or folder")
        if p.is_dir():
            name = input_name(p)
            found = sorted(
                (f for f in p.rglob("*") if f.is_file() and kind_of(f) and not _hidden(f.relative_to(p))),
                key=lambda f: f.relative_to(p).as_posix(),
            )
            if not found:
                raise UserError(f"{p}: folder has no {', '.join(SUFFIXES)} files")
            files += [InputFile(f, name, f.relative_to(p).as_posix()) for f in found]
        elif kind_of(p):
            files.append(InputFile(p, input_name(p), ""))
        else:
            raise UserError(f"{p}: unknown input type (expected {', '.join(SUFFIXES)} or a folder)")
    return files


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def iter_documents(files: list[InputFile]) -> Iterator[Document]:
    """Yield the documents of `files` in order, reading lazily; bad input raises UserError."""
    for f in files:
        if kind_of(f.path) == ".txt":
            yield read_text_file(f)
        else:
            yield from read_jsonl(f)


def read_text_file(f: InputFile) -> Document:
    data = f.path.read_bytes()
    nul = data.find(b"\0")
    if nul >= 0:
        raise UserError(f"{f.path}: looks binary (NUL byte at offset {nul}); give text files only")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{f.path}: not valid UTF-8 at byte offset {e.start}; convert it to UTF-8") from None
    return Document(f.input_name, f.rel or f.path.name, text.removeprefix(_BOM))


def read_jsonl(f: InputFile) -> Iterator[Document]:
    xz = kind_of(f.path) == ".jsonl.xz"
    try:
        with (lzma.open(f.path, "rb") if xz else open(f.path, "rb")) as fh:
            for lineno, raw in enumerate(fh, start=1):
                doc = _parse_line(f, lineno, raw)
                if doc is not None:
                    yield doc
    except (lzma.LZMAError, EOFError) as e:
        raise UserError(f"{f.path}: corrupt or truncated xz file ({e}); re-download or re-compress it") from None


def _parse_line(f: InputFile, lineno: int, raw: bytes) -> Document | None:
    where = f"{f.path}:{lineno}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not valid UTF-8 at byte {e.start} of the line") from None
    if lineno == 1:
        line = line.removeprefix(_BOM)
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); each line must be one JSON object") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise UserError(f'{where}: needs a string "text" field (each line: {{"text": ..., "source": ..., "doc": ...}})')
    source = obj.get("source", f.input_name)
    doc = obj.get("doc")
    if doc is None:
        doc = f"{f.rel}:{lineno}" if f.rel else str(lineno)
    if not isinstance(source, str) or not isinstance(doc, (str, int)) or isinstance(doc, bool):
        raise UserError(f'{where}: "source" must be a string and "doc" a string or integer')
    return Document(source, str(doc), obj["text"])
