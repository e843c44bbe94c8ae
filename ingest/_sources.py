"""Input: paths, globs, directories, gzip/zstd files and stdin, read in bounded chunks.

Whatever the input, memory stays bounded: files are read ``chunk_bytes`` at a time
and a line longer than ``max_line_bytes`` is cut there (the rest of it is dropped
and the line is counted as truncated). Compression is recognised by its magic
bytes, not the file name. stdin is copied to a temporary file first so it can be read
twice (once to estimate clock offsets, once to ingest), except in follow mode.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from jobtrace.errors import ConfigError

__all__ = ["FileIdentity", "Source", "expand_paths", "identity_from_name"]

_SKIP_SUFFIXES: Final = (".json", ".jsonl", ".pt", ".pth", ".bin", ".safetensors", ".npz", ".npy", ".png", ".jpg",
                         ".pkl", ".ckpt", ".so", ".pyc", ".db", ".parquet", ".arrow")
_GZIP: Final = b"\x1f\x8b"
_ZSTD: Final = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What a file's path says about who wrote it."""

    node: str | None = None
    rank: int | None = None
    local_rank: int | None = None


_TORCHRUN_DIR: Final = re.compile(r"attempt_\d+[/\\](\d+)[/\\](?:stdout|stderr)\.log")
_RANK_NAME: Final = re.compile(r"(?i)(?:^|[^a-z])rank[_\-.]?(\d+)")
_NODE_NAME: Final = re.compile(r"(?i)(?:^|[^a-z0-9])((?:node|host|worker)[-_]?[a-z0-9][a-z0-9-]*)")


def identity_from_name(path: str, pattern: re.Pattern[str] | None = None) -> FileIdentity:
    """Rank/node from a file name: a user regex (groups ``rank``, ``node``, ``local_rank``, or one
    unnamed group = rank), else ``.../attempt_N/<local_rank>/stdout.log``, ``rank3``, ``node-a``."""
    norm = path.replace("\\", "/")
    if pattern is not None:
        m = pattern.search(norm)
        if m:
            g = m.groupdict()
            if g:
                def num(v: str | None) -> int | None:
                    return int(v) if v is not None and v.isdigit() else None

                return FileIdentity(g.get("node"), num(g.get("rank")), num(g.get("local_rank")))
            if m.groups() and m.group(1) and m.group(1).isdigit():
                return FileIdentity(None, int(m.group(1)), None)
        return FileIdentity()
    t = _TORCHRUN_DIR.search(norm)
    if t:
        return FileIdentity(None, int(t.group(1)), int(t.group(1)))
    name = os.path.basename(norm)
    rank = None
    r = _RANK_NAME.search(name)
    if r:
        rank = int(r.group(1))
    node = None
    n = _NODE_NAME.search(name.split(".")[0])
    if n:
        node = n.group(1)
    return FileIdentity(node, rank, None)


class Source:
    """One input: a file (plain or compressed) or stdin."""

    def __init__(self, path: str, *, display: str | None = None, temp: bool = False) -> None:
        self.path = path
        self.display = display or path
        self.temp = temp
        self.is_stdin = path == "-"
        self._fh: BinaryIO | None = None
        self.compressed = False
        self.size = 0
        if not self.is_stdin:
            try:
                self.size = os.path.getsize(path)
            except OSError:
                self.size = 0

    def mtime_ns(self) -> int | None:
        if self.is_stdin:
            return None
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def open(self) -> BinaryIO:
        if self.is_stdin:
            return sys.stdin.buffer
        try:
            raw = open(self.path, "rb")  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            raise ConfigError(f"cannot read {self.display}: {exc.strerror}") from exc
        magic = raw.read(4)
        raw.seek(0)
        if magic[:2] == _GZIP:
            gz = gzip.GzipFile(fileobj=raw)
            try:
                gz.peek(1)
            except (OSError, EOFError):
                # Two bytes that only look like gzip (a text log can start with anything):
                # read the file as it is, so its lines are parsed or counted, not lost.
                raw.seek(0)
                return raw
            self.compressed = True
            return gz  # type: ignore[return-value]
        if magic == _ZSTD:
            self.compressed = True
            return _zstd_reader(raw, self.display)
        return raw

    def chunks(self, fh: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
        """Chunks until EOF; a corrupt compressed stream ends the file (reported by the caller)."""
        while True:
            data = fh.read(chunk_bytes)
            if not data:
                return
            yield data


def _zstd_reader(raw: BinaryIO, name: str) -> BinaryIO:
    try:
        import zstandard
    except ImportError:
        raise ConfigError(f"{name} is zstd-compressed: pip install zstandard (jobtrace[ingest]) to read it") from None
    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)


def _walk(directory: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if f.startswith(".") or f.lower().endswith(_SKIP_SUFFIXES):
                continue
            out.append(os.path.join(root, f))
    return out


def expand_paths(paths: list[str]) -> list[str]:
    """Files for ``paths``: ``-`` (stdin), files, directories (recursively) and globs, in a stable order."""
    out: list[str] = []
    seen: set[str] = set()
    for p in paths:
        if p == "-":
            candidates = ["-"]
        elif os.path.isdir(p):
            candidates = _walk(p)
        elif glob.has_magic(p):
            candidates = []
            for g in sorted(glob.glob(p, recursive=True)):
                candidates += _walk(g) if os.path.isdir(g) else [g]
            if not candidates:  # a typo must not drop a rank's files (or the whole job) silently
                raise ConfigError(f"no file matches {p!r}")
        elif os.path.exists(p):
            candidates = [p]
        else:
            raise ConfigError(f"no such file or directory: {p}")
        for c in candidates:
            key = c if c == "-" else os.path.abspath(c)
            if key not in seen:
                seen.add(key)
                out.append(c)
    if not out:
        raise ConfigError("no input files in " + ", ".join(repr(p) for p in paths))
    return out


def spool_stdin(chunk_bytes: int = 1 << 22) -> str:
    """Copy stdin to a temporary file (removed by the caller) so it can be read twice."""
    fd, path = tempfile.mkstemp(prefix="jobtrace-ingest-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(sys.stdin.buffer, out, chunk_bytes)
    return path


def display_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path
