"""Timestamps of every format in use, to UTC nanoseconds, and the log-line head that carries them.

Constraints that shape it:

* It runs once per input line, so the common case is one anchored regular-expression
  match (the layout the stream used last) and dictionary look-ups: the calendar date
  and the time zone offset of a ``(date, hour)`` are computed once and cached.
* A timestamp without a zone is wall-clock time of the machine that wrote it; the
  caller says which zone that was (``tz``: ``UTC``, ``local``, ``+05:30`` or an IANA
  name). Formats without a year (glog, c10) or without a date take them from the
  stream's last full timestamp, else from ``default_date``.
* The c10 logger (``[E1218 20:27:21.426415540 file.cpp:629]``) prints the nanoseconds
  of the *monotonic* clock after a wall-clock second, so only the second is kept.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from re import Pattern
from typing import Final

__all__ = ["Head", "HeadParser", "ISO_LAYOUT", "TzSpec", "parse_timestamp", "parse_tz"]

LEVELS: Final = {
    "DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "WARN": "WARNING", "ERROR": "ERROR",
    "CRITICAL": "CRITICAL", "FATAL": "CRITICAL", "TRACE": "DEBUG", "NOTICE": "INFO",
    "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL", "D": "DEBUG",
}
_MONTHS: Final = {m: i for i, m in enumerate(calendar.month_abbr) if m}


class TzSpec:
    """Where naive wall-clock times come from: a fixed offset or a zone with DST rules."""

    __slots__ = ("name", "_fixed", "_zone", "_cache")

    def __init__(self, name: str, fixed: int | None, zone: _dt.tzinfo | None) -> None:
        self.name = name
        self._fixed = fixed
        self._zone = zone
        self._cache: dict[tuple[int, int], int] = {}

    @property
    def fixed_offset_s(self) -> int | None:
        """Seconds east of UTC when the zone has no DST rules (``UTC``, ``+05:30``), else ``None``."""
        return self._fixed

    def offset_s(self, epoch_day: int, second_of_day: int) -> int:
        """Seconds to subtract from a naive wall-clock time to get UTC."""
        if self._fixed is not None:
            return self._fixed
        key = (epoch_day, second_of_day // 3600)
        off = self._cache.get(key)
        if off is None:
            naive = _dt.datetime(1970, 1, 1) + _dt.timedelta(days=epoch_day, seconds=key[1] * 3600)
            aware = naive.replace(tzinfo=self._zone)
            delta = aware.utcoffset()
            off = int(delta.total_seconds()) if delta is not None else 0
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = off
        return off


_OFFSET_RX: Final = re.compile(r"^(?:UTC|GMT)?([+-])(\d\d):?(\d\d)$")


def parse_tz(spec: str | None) -> TzSpec:
    """``UTC`` (default), ``local``, ``+HH:MM``/``-HHMM`` or an IANA zone name such as ``Europe/Paris``."""
    from jobtrace.errors import ConfigError

    if spec is None or spec.upper() in ("UTC", "Z", "GMT", ""):
        return TzSpec("UTC", 0, None)
    m = _OFFSET_RX.match(spec.strip())
    if m:
        sign = -1 if m.group(1) == "-" else 1
        return TzSpec(spec, sign * (int(m.group(2)) * 3600 + int(m.group(3)) * 60), None)
    if spec.lower() == "local":
        local = _dt.datetime.now().astimezone().tzinfo
        return TzSpec("local", None, local)
    try:
        from zoneinfo import ZoneInfo

        return TzSpec(spec, None, ZoneInfo(spec))
    except Exception as exc:
        raise ConfigError(f"unknown time zone {spec!r}: use UTC, local, +HH:MM or a name like Europe/Paris") from exc


_DAY_CACHE: dict[str, int] = {}


def _epoch_day_iso(date: str) -> int:
    """``YYYY-MM-DD`` → days since 1970-01-01 (cached: one date serves millions of lines)."""
    day = _DAY_CACHE.get(date)
    if day is None:
        y, m, d = int(date[0:4]), int(date[5:7]), int(date[8:10])
        day = (_dt.date(y, m, d) - _dt.date(1970, 1, 1)).days  # raises ValueError on a bad date
        if len(_DAY_CACHE) > 100_000:
            _DAY_CACHE.clear()
        _DAY_CACHE[date] = day
    return day


def _ymd_day(y: int, m: int, d: int) -> int:
    return (_dt.date(y, m, d) - _dt.date(1970, 1, 1)).days


_FRAC_SCALE: Final = (0, 100_000_000, 10_000_000, 1_000_000, 100_000, 10_000, 1_000, 100, 10, 1)


def _frac_ns(frac: str | None) -> int:
    if not frac:
        return 0
    return int(frac[:9]) * _FRAC_SCALE[min(len(frac), 9)]


def _hms(t: str) -> int:
    h, m, s = int(t[0:2]), int(t[3:5]), int(t[6:8])
    if h > 23 or m > 59 or s > 60:
        raise ValueError(f"bad time {t!r}")
    return h * 3600 + m * 60 + s


def _zone_s(z: str | None) -> int | None:
    """An explicit zone in the timestamp: seconds east of UTC, or None when absent."""
    if not z:
        return None
    z = z.strip()
    if z in ("Z", "UTC", "GMT"):
        return 0
    sign = -1 if z[0] == "-" else 1
    digits = z[1:].replace(":", "")
    return sign * (int(digits[0:2]) * 3600 + int(digits[2:4]) * 60)


@dataclass(slots=True)
class Head:
    """What the head of a log line says: when, how severe, who logged it, where the message starts."""

    ts: int | None
    level: str | None
    logger: str | None
    body_at: int
    has_date: bool = True


# The part after a timestamp in Python ``logging`` formats: optional level, optional logger.
_TAIL = (
    r"(?:\s*[-|:]?\s*\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE|NOTICE)\]?(?=[\s:|\]-]))?"
    r"(?:\s*[-|:]?\s*(?P<logger>\[[^\]\s]{1,200}\]|[A-Za-z_<][\w.<>]{0,200}(?::[\w.<>]+){0,3})(?=\s+-\s|:\s|\s+\|\s|\s+\[|\s*$))?"
    r"(?:\s+-\s+|:\s+|\s+\|\s+|\s+|$)?"
)
_DATE = r"(?P<date>\d{4}-\d\d-\d\d)"
_TIME = r"(?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,9}))?"
_ZONE = r"(?P<zone>Z|[+-]\d\d:?\d\d|\s?UTC)?"


@dataclass(frozen=True, slots=True)
class _Layout:
    name: str
    rx: Pattern[str]
    kind: str  # how to turn groups into a timestamp


def _lay(name: str, pattern: str, kind: str) -> _Layout:
    return _Layout(name, re.compile(pattern), kind)


_LAYOUTS: Final = (
    # DeepSpeed's logger: [%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s
    _lay("deepspeed", r"\[" + _DATE + r" " + _TIME + r"\] \[(?P<level>[A-Z]+)\] \[(?P<logger>[^\]]*)\] ?", "iso"),
    # Megatron's iteration line, NCCL's "[%F %T] " and any bracketed ISO time.
    _lay("bracket-iso", r" ?\[" + _DATE + r"[ T_]" + _TIME + _ZONE + r"\] ?" + _TAIL, "iso"),
    # Hugging Face example scripts: [%(levelname)s|%(filename)s:%(lineno)s] %(asctime)s >> %(message)s
    _lay("hf-bracket", r"\[(?P<level>[A-Z]+)\|(?P<logger>[^\]]*)\] " + _DATE + r" " + _TIME + r" >> ", "iso"),
    # c10 (torch C++) logging since 2.2: [E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629]
    _lay("c10", r"\[(?P<level>[IWEF])(?P<md>\d{3,4}) (?P<time>\d\d:\d\d:\d\d)\.\d+ (?P<logger>[^\]\s]+)\] ?", "md"),
    # c10 logging before 2.2: [E ProcessGroupNCCL.cpp:475]
    _lay("c10-old", r"\[(?P<level>[IWEF]) (?P<logger>[^\]\s]+:\d+)\] ?", "none"),
    # ISO 8601 / Python logging asctime at the start of the line.
    _lay("iso", _DATE + r"[ T_]" + _TIME + _ZONE + _TAIL, "iso"),
    # Hugging Face / many scripts: datefmt="%m/%d/%Y %H:%M:%S"
    _lay("mdy", r"(?P<mo>\d\d)/(?P<dd>\d\d)/(?P<yy>\d{4}),? " + _TIME + _TAIL, "mdy"),
    # glog: E0105 12:34:56.123456 12345 file.cc:123]
    _lay("glog", r"(?P<level>[IWEF])(?P<md>\d{4}) " + _TIME + r" +\d+ (?P<logger>[^\]\s]+)\] ?", "md"),
    # Python logging's default basicConfig format: LEVEL:name:message
    _lay("python-default", r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<logger>[^:\s]*):", "none"),
    # syslog / journalctl short: Jan  5 12:34:56 host proc[pid]:
    _lay("syslog", r"(?P<mon>[A-Z][a-z]{2}) +(?P<dd>\d{1,2}) " + _TIME + r" (?P<host>[\w.-]+) (?P<logger>[\w./-]+)(?:\[\d+\])?: ", "syslog"),
    # Epoch seconds (optionally fractional), milliseconds or nanoseconds at the start.
    _lay("epoch", r"\[?(?P<epoch>1\d{9}(?:\.\d{1,9})?|1\d{12}|1\d{18})\]?(?=[\s,|])" + _TAIL, "epoch"),
    # A time of day only: 12:34:56,789 INFO ...
    _lay("time", _TIME + _ZONE + _TAIL, "time"),
)

_BY_NAME: Final = {lo.name: lo for lo in _LAYOUTS}
ISO_LAYOUT: Final = _BY_NAME["iso"]
"""The layout of Python ``logging`` lines (``2026-01-05 12:00:00,250 - INFO - name - msg``)."""

# First character of the (prefix-stripped) line → layouts worth trying; keeps misses cheap.
_BY_FIRST: dict[str, tuple[_Layout, ...]] = {}
for _lo in _LAYOUTS:
    firsts: str
    if _lo.name in ("deepspeed", "hf-bracket", "c10", "c10-old"):
        firsts = "["
    elif _lo.name == "bracket-iso":
        firsts = "[ "
    elif _lo.name in ("iso", "mdy", "time"):
        firsts = "0123456789"
    elif _lo.name == "epoch":
        firsts = "1["
    elif _lo.name == "glog":
        firsts = "IWEF"
    elif _lo.name == "python-default":
        firsts = "DIWEC"
    else:  # syslog
        firsts = "ADFJMNOS"
    for _c in firsts:
        _BY_FIRST[_c] = _BY_FIRST.get(_c, ()) + (_lo,)


class HeadParser:
    """Parses line heads for one input stream, remembering the layout and date it saw last."""

    __slots__ = ("tz", "year", "last_day", "_last", "_default_day", "_iso_cache")

    def __init__(self, tz: TzSpec, default_day: int | None = None, year: int | None = None) -> None:
        self.tz = tz
        self.year = year
        self.last_day: int | None = None
        self._default_day = default_day
        self._last: _Layout | None = None
        self._iso_cache: dict[tuple[str, str, str | None], tuple[int, int]] = {}

    def parse(self, text: str) -> Head | None:
        """The head of ``text``; ``None`` when the line has no recognised head."""
        if not text:
            return None
        last = self._last
        if last is not None:
            m = last.rx.match(text)
            if m is not None:
                head = self._head(last, m)
                if head is not None:
                    return head
        for layout in _BY_FIRST.get(text[0], ()):
            if layout is last:
                continue
            m = layout.rx.match(text)
            if m is not None:
                head = self._head(layout, m)
                if head is not None:
                    self._last = layout
                    return head
        return None

    def note_iso(self, day: int) -> None:
        """Remember a line whose ISO head was read elsewhere (the plain-line fast path), as :meth:`parse` would.

        The layout tried first and the date of later time-only lines must not depend on
        which path read the line.
        """
        self._last = ISO_LAYOUT
        self.last_day = day

    @property
    def last_layout(self) -> str | None:
        """The name of the layout tried first (the last that matched); ``None`` before any."""
        return self._last.name if self._last is not None else None

    def note_layout(self, name: str, day: int) -> None:
        """Remember a dated line read elsewhere (the compiled lane) with the layout ``name``, as :meth:`parse` would."""
        self._last = _BY_NAME[name]
        self.last_day = day

    def _head(self, layout: _Layout, m: re.Match[str]) -> Head | None:
        if layout.kind == "iso":  # the common case, without building a dict of groups
            date, tod, zone = m.group("date", "time", "zone") if "zone" in layout.rx.groupindex else (
                m.group("date"), m.group("time"), None)
            key = (date, tod, zone)
            hit = self._iso_cache.get(key)
            if hit is None:
                try:
                    day = _epoch_day_iso(date)
                    sod = _hms(tod)
                except (ValueError, TypeError):
                    return None
                z = _zone_s(zone)
                base = (day * 86400 + sod - (self.tz.offset_s(day, sod) if z is None else z)) * 1_000_000_000
                if len(self._iso_cache) > 4096:
                    self._iso_cache.clear()
                self._iso_cache[key] = (base, day)
            else:
                base, day = hit
            self.last_day = day  # every dated line, cached or not (the date of time-only lines follows it)
            level, logger = m.group("level", "logger")
            if level is not None:
                level = LEVELS.get(level.upper())
            if logger and logger[0] == "[" and logger[-1] == "]":
                logger = logger[1:-1]
            return Head(base + _frac_ns(m.group("frac")), level, logger, m.end(), True)
        g = m.groupdict()
        level = g.get("level")
        if level is not None:
            level = LEVELS.get(level.upper(), None)
        logger = g.get("logger")
        if logger and logger[0] == "[" and logger[-1] == "]":
            logger = logger[1:-1]
        try:
            ts, has_date = self._ts(layout.kind, g)
        except (ValueError, OverflowError, KeyError, TypeError):
            return None
        return Head(ts, level, logger, m.end(), has_date)

    def _ts(self, kind: str, g: dict[str, str | None]) -> tuple[int | None, bool]:
        if kind == "none":
            return None, False
        if kind == "epoch":
            raw = g["epoch"] or ""
            if "." in raw:
                sec, sec_frac = raw.split(".", 1)
                return int(sec) * 1_000_000_000 + _frac_ns(sec_frac), True
            if len(raw) == 10:
                return int(raw) * 1_000_000_000, True
            if len(raw) == 13:
                return int(raw) * 1_000_000, True
            return int(raw), True
        frac = _frac_ns(g.get("frac")) if kind != "md" else 0
        sod = _hms(g["time"] or "")
        has_date = True
        if kind == "iso":
            day = _epoch_day_iso(g["date"] or "")
        elif kind == "mdy":
            day = _ymd_day(int(g["yy"] or 0), int(g["mo"] or 0), int(g["dd"] or 0))
        elif kind in ("md", "syslog"):
            if kind == "md":
                md = int(g["md"] or 0)
                month, dom = divmod(md, 100)
            else:
                month, dom = _MONTHS[g["mon"] or ""], int(g["dd"] or 0)
            year = self.year or self._year_hint()
            day = _ymd_day(year, month, dom)
        else:  # time of day only
            has_date = False
            base = self.last_day if self.last_day is not None else self._default_day
            if base is None:
                return None, False
            day = base
        zone = _zone_s(g.get("zone"))
        if zone is None:
            zone = self.tz.offset_s(day, sod)
        if has_date:
            self.last_day = day
        return (day * 86400 + sod - zone) * 1_000_000_000 + frac, has_date

    def _year_hint(self) -> int:
        day = self.last_day if self.last_day is not None else self._default_day
        if day is None:
            return _dt.datetime.now(_dt.UTC).year
        return (_dt.date(1970, 1, 1) + _dt.timedelta(days=day)).year


def parse_timestamp(text: str, tz: str | TzSpec | None = None, default_day: int | None = None) -> int | None:
    """UTC nanoseconds of the timestamp that starts ``text`` (any supported format), or ``None``.

    ``tz`` is the zone of naive times (default UTC). A convenience for one-off use; the
    ingest engine keeps one :class:`HeadParser` per stream instead.
    """
    spec = tz if isinstance(tz, TzSpec) else parse_tz(tz)
    head = HeadParser(spec, default_day).parse(text)
    return None if head is None else head.ts


def torch_elastic_time(value: str, tz: TzSpec) -> int | None:
    """The ``time`` field of a torchelastic failure (``datetime.isoformat(sep='_')``, local time)."""
    m = re.match(r"(\d{4}-\d\d-\d\d)_(\d\d:\d\d:\d\d)(?:\.(\d+))?", value.strip())
    if not m:
        return None
    try:
        day = _epoch_day_iso(m.group(1))
        sod = _hms(m.group(2))
    except ValueError:
        return None
    return (day * 86400 + sod - tz.offset_s(day, sod)) * 1_000_000_000 + _frac_ns(m.group(3))


ClockFn = Callable[[], int]
