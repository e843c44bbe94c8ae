"""Which parsers a line may concern: all parsers' triggers matched at once.

Python's ``re`` tries an alternation branch by branch at every position, which costs
more than all the rest of the per-line work together (about 1.7 µs a line for twenty
literals). Hyperscan compiles every trigger into one automaton and scans a whole
chunk of input at hundreds of MB/s, reporting only the few lines that match, so the
lines no parser wants pay nothing. Without Hyperscan (it is an optional dependency,
x86-64 only) each line is searched with one combined Python pattern: same result,
slower.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["Matcher", "make_matcher", "matcher_engine"]


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

                raise ConfigError("hyperscan is not installed: pip install 'jobtrace[ingest]'") from None
        except Exception:
            if use_hyperscan:
                raise
    return Matcher(triggers)
