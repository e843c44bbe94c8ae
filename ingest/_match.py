"""Which parsers a line may concern: all parsers' triggers matched at once.

Python's ``re`` tries an alternation branch by branch at every position, which costs
more than all the rest of the per-line work together (about 1.7 µs a line for twenty
literals). Hyperscan compiles every trigger into one automaton and scans a whole
chunk of input at hundreds of MB/s, reporting only the few lines that match, so the
lines no parser wants pay nothing. Without Hyperscan (it is an optional dependency,
x86-64 only) each line is searched with one combined Python pattern: same result,
slower.

The helpers at the end turn a block scan's hits back into lines with their parser ids;
they live here, not in the engine, because both of its passes read hits that way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

__all__ = ["NO_HITS", "Matcher", "hit_lines", "make_matcher", "matcher_engine"]

NO_HITS: Final = frozenset[int]()
"""The parser ids of a line no trigger hit (one shared empty set: most lines get it)."""


def _group(pattern: str) -> str:
    if pattern.startswith("(?i)"):
        return f"(?i:{pattern[4:]})"
    return f"(?:{pattern})"


class Matcher:
    """Per-line fallback: one combined pattern, then each parser's own triggers."""

    engine = "re"

    def __init__(self, triggers: Sequence[Sequence[str]]) -> None:
        self._per_parser = [re.compile("|".join(_group(t) for t in ts)) if ts else None for ts in triggers]
        alts = [_group(t) for ts in triggers for t in ts]
        self._any = re.compile("|".join(alts)) if alts else None

    def scan(self, block: bytes) -> list[tuple[int, int]] | None:
        """Hits of a whole block as ``(end offset, parser index)``; ``None``: ask per line."""
        return None

    def line(self, text: str) -> frozenset[int]:
        if self._any is None or self._any.search(text) is None:
            return frozenset()
        return frozenset(i for i, rx in enumerate(self._per_parser) if rx is not None and rx.search(text))


class HyperscanMatcher(Matcher):
    engine = "hyperscan"

    def __init__(self, triggers: Sequence[Sequence[str]]) -> None:
        import hyperscan

        super().__init__(triggers)
        expressions: list[bytes] = []
        ids: list[int] = []
        flags: list[int] = []
        for i, ts in enumerate(triggers):
            for t in ts:
                f = 0
                if t.startswith("(?i)"):
                    t = t[4:]
                    f |= hyperscan.HS_FLAG_CASELESS
                expressions.append(t.encode())
                ids.append(i)
                flags.append(f)
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(expressions=expressions, ids=ids, elements=len(expressions), flags=flags)
        self._scratch: Any = hyperscan.Scratch(self._db)

    def scan(self, block: bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(pid: int, start: int, end: int, flags: int, ctx: object) -> None:
            append((end, pid))

        self._db.scan(block, match_event_handler=on_match, scratch=self._scratch)
        hits.sort()
        return hits


def matcher_engine(use_hyperscan: bool | None = None) -> str:
    """The engine :func:`make_matcher` picks, without compiling anything (``re`` where Hyperscan is missing)."""
    if use_hyperscan is False:
        return Matcher.engine
    try:
        import hyperscan  # noqa: F401
    except ImportError:
        return Matcher.engine
    return HyperscanMatcher.engine


def make_matcher(triggers: Sequence[Sequence[str]], use_hyperscan: bool | None = None) -> Matcher:
    """Hyperscan when available (or required with ``use_hyperscan=True``), else the ``re`` fallback."""
    if use_hyperscan is not False:
        try:
            return HyperscanMatcher(triggers)
        except ImportError:
            if use_hyperscan:
                from jobtrace.errors import ConfigError

                raise ConfigError("hyperscan is not installed (it installs with jobtrace on x86-64 only): pip install hyperscan") from None
        except Exception:
            if use_hyperscan:
                raise
    return Matcher(triggers)


# ---- hits to lines: which lines of a scanned block the hits of :meth:`Matcher.scan` fall in ----------------

def hit_lines(block: bytes, hits: list[tuple[int, int]], all_lines: bool = False
              ) -> Iterable[tuple[bytes, frozenset[int] | None]]:
    """Lines of ``block`` with the parser ids whose triggers ended inside them (all lines, or only hit ones).

    A hit belongs to the line whose end (its newline, or the end of the block) is the
    first at or after the hit's end offset. All lines come as a ``zip`` of the split
    block and a list of id sets (empty for most), so that the per-line loop pays no
    generator step.
    """
    if not all_lines:
        return _only_hit_lines(block, hits)
    lines = block.split(b"\n")
    ids: list[frozenset[int] | None] = [NO_HITS] * len(lines)
    for index, found in _ids_by_line(block, hits):
        ids[index] = found
    return zip(lines, ids)


def _hit_spans(block: bytes, hits: list[tuple[int, int]]) -> Iterable[tuple[int, int, frozenset[int]]]:
    """``(start, stop, parser ids)`` of each line that hits end in, in order."""
    i, nh = 0, len(hits)
    while i < nh:
        end = hits[i][0]
        start = block.rfind(b"\n", 0, end) + 1  # the line that holds offset ``end``
        stop = block.find(b"\n", end)
        if stop < 0:
            stop = len(block)
        found: set[int] = set()
        while i < nh and hits[i][0] <= stop:
            found.add(hits[i][1])
            i += 1
        yield start, stop, frozenset(found)


def _ids_by_line(block: bytes, hits: list[tuple[int, int]]) -> Iterable[tuple[int, frozenset[int]]]:
    """``(line index, parser ids)`` of the lines that hits end in, in order."""
    index = pos = 0  # ``pos``: where the line numbered ``index`` starts
    for start, _, found in _hit_spans(block, hits):
        index += block.count(b"\n", pos, start)
        pos = start
        yield index, found


def _only_hit_lines(block: bytes, hits: list[tuple[int, int]]) -> Iterable[tuple[bytes, frozenset[int] | None]]:
    return ((block[start:stop], found) for start, stop, found in _hit_spans(block, hits))
