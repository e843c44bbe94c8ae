"""The parser contract and the registry: how a format plugs into the ingest engine.

A parser is any object with a ``name``, ``triggers`` and ``parse(line)``:

* ``triggers`` are regular expressions (no anchors, the subset that both Python's
  ``re`` and Hyperscan accept). The engine scans each chunk of input for all
  triggers of all parsers at once and hands a line to ``parse`` only when one of
  that parser's triggers occurs in it, so a parser never pays for lines that are not
  its own and adding a parser costs nothing per line.
* ``parse`` returns ``None`` ("not mine after all": the line becomes a plain log
  event), a list of partial event dicts (the engine adds identity and, when absent,
  the line's timestamp; unless one of them is a ``log`` event, the line itself is
  also kept as a plain log event), a :class:`Skip` with a reason, or a
  :class:`Block` that takes the following lines of the same stream (a traceback, a
  timer table, a failure summary).
* Partial events use the canonical keys of :class:`jobtrace.events.Event`. Two extra
  keys are read by the engine and never stored: ``sync`` (this event's ``ts`` is a
  moment every rank shares, such as the end of a step that ends in an all-reduce;
  used for clock alignment) and ``route_rank`` (the event belongs to another rank
  than the stream's, e.g. per-rank rows of a timer table printed by one rank) and
  ``dt`` (nanoseconds to add to the line's timestamp). A span without ``start``
  ends at its ``ts`` and starts ``dur`` earlier.

Optional capabilities are declared as small protocols that the engine checks with
``isinstance`` (see :func:`sync_parser` and :class:`TakesZone`):

* :class:`SyncPoints`: a parser whose step events are shared moments sets
  ``sync_points = True`` and has ``sync_step(text) -> int | None`` (the step a line
  ends, found cheaply): the alignment pass calls only that.
* :class:`TakesZone`: a parser with a ``tz`` attribute gets the ingest's zone of
  naive timestamps (a :class:`._timestamps.TzSpec`) before the first line.

Parsers run on the ingest thread; one that raises is counted per name and the line
is kept as a plain log event, so a parser bug never loses a line or stops an ingest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

__all__ = ["Block", "FEED_DONE", "FEED_MORE", "FEED_REJECT", "Line", "Parser", "ParserRegistry", "Skip", "StreamState",
           "SyncPoints", "TakesZone", "sync_parser"]

PartialEvent = dict[str, Any]
"""A canonical event without identity: at least ``kind``; ``ts`` defaults to the line's."""

FEED_MORE: Final = 0
"""The block took the line and wants more."""
FEED_DONE: Final = 1
"""The block took the line and is complete."""
FEED_REJECT: Final = 2
"""The line is not part of the block: the block ends before it and the line is parsed anew."""


@dataclass(frozen=True, slots=True)
class Skip:
    """Returned by ``parse``: the line carries nothing worth an event (counted as skipped, with the reason)."""

    reason: str


@runtime_checkable
class Block(Protocol):
    """A multi-line record in progress (one per stream at a time)."""

    def feed(self, text: str, line: Line) -> int: ...

    def finish(self) -> list[PartialEvent]: ...


@dataclass(slots=True)
class StreamState:
    """Per input stream (a file, or one rank's lines of an interleaved file): parsers keep state here."""

    key: str
    node: str
    rank: int
    local_rank: int
    rank_guessed: bool = False
    vars: dict[str, dict[str, Any]] = field(default_factory=dict)

    def state(self, parser: str) -> dict[str, Any]:
        d = self.vars.get(parser)
        if d is None:
            d = self.vars[parser] = {}
        return d


@dataclass(slots=True)
class Line:
    """One line as a parser sees it.

    ``raw`` is the line after the launcher prefix, ``text`` the message after the log
    head (timestamp, level, logger). ``ts`` is UTC nanoseconds or ``None`` when the
    line has no timestamp of its own (the engine then estimates one from neighbours).
    """

    raw: str
    text: str
    ts: int | None
    level: str | None
    logger: str | None
    stream: StreamState
    lineno: int = 0
    source: str = ""
    hits: frozenset[int] = frozenset()


@runtime_checkable
class Parser(Protocol):
    """What every parser has (see the module's docstring); checked when it is registered."""

    name: str

    @property
    def triggers(self) -> Sequence[str]: ...  # read-only: parsers keep them in a class-level tuple

    def parse(self, line: Line) -> list[PartialEvent] | Block | Skip | None: ...


@runtime_checkable
class SyncPoints(Protocol):
    """A parser whose step ends are moments all ranks share (used for clock alignment)."""

    sync_points: bool

    def sync_step(self, text: str) -> int | None: ...


@runtime_checkable
class TakesZone(Protocol):
    """A parser that reads times itself and is given the ingest's zone of naive timestamps."""

    tz: Any


def sync_parser(parser: Parser) -> SyncPoints | None:
    """``parser`` as a source of alignment moments, or ``None`` when it declares none."""
    return parser if isinstance(parser, SyncPoints) and parser.sync_points else None


class ParserRegistry:
    """An ordered set of parsers: earlier ones get a line first."""

    def __init__(self, parsers: Sequence[Parser] = ()) -> None:
        self._parsers: list[Parser] = list(parsers)

    def register(self, parser: Parser, *, first: bool = False) -> Parser:
        """Add ``parser`` (last, or ``first=True`` to run before the built-in ones); replaces one of the same name."""
        from jobtrace.errors import ConfigError

        if not isinstance(parser, Parser):
            raise ConfigError(f"parser {parser!r} is not a Parser: it needs 'name', 'triggers' and 'parse'")
        if not parser.triggers:
            raise ConfigError(f"parser {parser.name!r} has no triggers")
        self._parsers = [p for p in self._parsers if p.name != parser.name]
        if first:
            self._parsers.insert(0, parser)
        else:
            self._parsers.append(parser)
        return parser

    def unregister(self, name: str) -> None:
        self._parsers = [p for p in self._parsers if p.name != name]

    def names(self) -> list[str]:
        return [p.name for p in self._parsers]

    def parsers(self) -> list[Parser]:
        return list(self._parsers)

    def copy(self) -> ParserRegistry:
        return ParserRegistry(self._parsers)


ParserFactory = Callable[[], Parser]
