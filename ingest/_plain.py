"""Plain log lines straight from bytes: the fast path for the lines no parser wants.

Most lines of a training log are Python ``logging`` lines (``2026-01-05 12:00:00,250 -
INFO - trainer.data - message``), possibly behind an ``srun -l`` label, that trigger no
parser. The general path decodes each one, splits the launcher prefix into a
:class:`~._prefix.Prefix`, runs the head layouts (regexes with look-aheads that only
Python's ``re`` supports) and JSON-encodes the message: about 8 µs a line.

This module recognises the strict form of such a line with one anchored ``bytes``
regex, takes the timestamp from a per-second cache and copies the message into the
event as it is when it is printable ASCII without quotes or backslashes (the JSON
encoding of such text is the text itself), which costs a third of that.

The strict form is chosen so that whenever it matches, the general path would have
found exactly the same prefix, timestamp, level, logger and message (see
:data:`_HEAD`); anything else (another layout, an odd character right after the
head, a message to truncate, a bad date, invalid UTF-8) is left to the general path,
which therefore stays the reference. ``tests/ingest/test_plain.py`` compares the two
paths' output byte for byte.

Why not a columnar library (Polars, PyArrow) over a whole chunk: measured on the
benchmark's mixed log, building a column from the chunk's lines and extracting the
head with a Rust regex cost more per line (about 4 µs) than this whole path, because
every line still has to come back to Python to be routed to its stream in order.
"""

from __future__ import annotations

import re
from re import Pattern
from typing import Final

import orjson

from ._prefix import PrefixMode
from ._timestamps import LEVELS, TzSpec, _epoch_day_iso, _hms

__all__ = ["PlainLines"]

# The Python ``logging`` head the ``iso`` layout reads, in the one shape where its
# optional parts cannot be read another way: date, space, time with a fraction, then
# `` - LEVEL - logger - `` and a message that starts with a printable ASCII character
# (``\s+-\s+`` of the general layout would eat any further white space) or is empty.
# The logger is ASCII so that ``\w`` cannot differ, and at most 201 characters as there.
_HEAD: Final = (rb"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)[.,](\d{1,9}) - "
                rb"(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|NOTICE) - "
                rb"([A-Za-z_<][A-Za-z0-9_.<>]{0,200}) - (?=[!-~]|$)")
# ``srun -l`` label as :data:`._prefix._SRUN` reads it; its group is the stream key.
_SRUN_LABEL: Final = rb"( *\d{1,6}): "

_MODES: Final[dict[str, Pattern[bytes]]] = {
    PrefixMode.NONE: re.compile(rb"()" + _HEAD),
    PrefixMode.SRUN: re.compile(_SRUN_LABEL + _HEAD),
}

# Text whose JSON string is the text itself: printable ASCII but ``"`` and ``\``.
_VERBATIM: Final = re.compile(rb'[ !#-\[\]-~]*')
_FRAC_SCALE: Final = (0, 100_000_000, 10_000_000, 1_000_000, 100_000, 10_000, 1_000, 100, 10, 1)
_LEVEL_NAMES: Final = {k.encode(): v for k, v in LEVELS.items() if len(k) > 1}
_LEVEL_BYTES: Final = {k: v.encode() for k, v in _LEVEL_NAMES.items()}
_STAMP_CACHE_MAX: Final = 4096


class PlainLines:
    """Recognises and encodes the strict plain log lines of one ingest (one time zone).

    ``match(raw)`` gives groups ``(label, date, time, frac, level, logger)``: ``label`` is
    the ``srun`` label (``b""`` without a prefix) and the message starts at ``m.end()``.
    """

    __slots__ = ("_stamps", "tz")

    def __init__(self, tz: TzSpec) -> None:
        self.tz = tz
        self._stamps: dict[tuple[bytes, bytes], tuple[int, int] | None] = {}

    @staticmethod
    def pattern(mode: str | None) -> Pattern[bytes] | None:
        """The strict line pattern for a prefix mode; ``None`` where there is none (pdsh)."""
        return _MODES.get(mode or PrefixMode.NONE)

    def stamp(self, date: bytes, tod: bytes) -> tuple[int, int] | None:
        """``(UTC ns of the second, epoch day)`` of a naive ``date tod``; ``None`` for an invalid one.

        Computed as :class:`._timestamps.HeadParser` does, once per distinct second.
        """
        key = (date, tod)
        try:
            return self._stamps[key]
        except KeyError:
            pass
        try:
            day = _epoch_day_iso(date.decode())
            sod = _hms(tod.decode())
            hit: tuple[int, int] | None = ((day * 86400 + sod - self.tz.offset_s(day, sod)) * 1_000_000_000, day)
        except (ValueError, TypeError, OverflowError):
            hit = None
        if len(self._stamps) >= _STAMP_CACHE_MAX:
            self._stamps.clear()
        self._stamps[key] = hit
        return hit


def frac_ns(frac: bytes) -> int:
    """Nanoseconds of a fraction of a second written with 1 to 9 digits."""
    return int(frac) * _FRAC_SCALE[len(frac)]


def level_bytes(level: bytes) -> bytes:
    """The canonical level of a strict head's level word (``WARN`` → ``WARNING``)."""
    return _LEVEL_BYTES[level]


def level_name(level: bytes) -> str:
    """The canonical level of a strict head's level word, as :class:`._timestamps.Head` carries it."""
    return _LEVEL_NAMES[level]


def msg_json(body: bytes) -> bytes | None:
    """``body`` as a JSON string, as ``orjson`` writes it; ``None`` when it is not clean UTF-8 text.

    Lines with a NUL byte or invalid UTF-8 are left to the general path, which skips or
    repairs them and counts why.
    """
    if _VERBATIM.fullmatch(body) is not None:
        return b'"%b"' % body
    if b"\x00" in body:
        return None
    try:
        return orjson.dumps(body.decode("utf-8"))
    except UnicodeDecodeError:
        return None
