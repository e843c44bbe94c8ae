"""Words and figures for the text a person reads: counts, rank lists, ratios, shares, folded log lines.

Every finding's summary is built by a small function marked :func:`template`, fed plain values, and
phrased with the helpers here, so that "1 rank" / "2 ranks", "rank 0" (never "ranks 0"), a ratio
over a zero median or a share over nothing read as English whatever the figures are. The registry
lets one test render every template with singular, plural, zero and infinite values (issue 25):
a phrase is only right if it is right at its edges.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Final, TypeVar

from ._model import span_list

__all__ = ["TEMPLATES", "count", "fold", "num", "rank_on", "ranks", "shares", "step_range", "steps", "template", "times",
           "windows"]

F = TypeVar("F", bound=Callable[..., str])

TEMPLATES: Final[dict[str, Callable[..., str]]] = {}
"""Every finding summary's template, by ``module.function``: what the grammar test renders."""


def template(fn: F) -> F:
    """Register ``fn`` (plain, annotated parameters; returns the phrase) in :data:`TEMPLATES`."""
    TEMPLATES[f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"] = fn
    return fn


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 rank``, ``0 ranks``, ``12,000 ranks``: the noun agrees with the number."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def ranks(values: Iterable[int], noun: str = "rank") -> str:
    """``rank 3``, ``ranks 0-3,5``, ``no rank``: one rank is never "ranks 3"."""
    ids = sorted(set(values))
    if not ids:
        return f"no {noun}"
    return f"{noun if len(ids) == 1 else noun + 's'} {span_list(ids)}"  # "0-3,5": the project's form


def steps(ids: Iterable[int]) -> str:
    """``step 5``, ``steps 5-9``, ``no step``."""
    return ranks(ids, "step")


def num(x: float | int | None, spec: str = ".4g") -> str:
    """``x`` formatted with ``spec``; infinities as ``∞``, NaN as ``NaN``, ``None`` as ``unknown``.

    Python writes ``inf`` and ``nan`` (and ``inff`` for ``f"{x:.0f}x"``), which read as typos in a sentence.
    """
    if x is None:
        return "unknown"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return format(x, spec)


def times(x: float | None, of: str, digits: int = 1) -> str:
    """``2.5× the median``; over a zero base, ``∞× the median (which is 0)`` rather than Python's "infx", and
    an undefined ratio (0 ÷ 0, or none) said as such."""
    if x is None or math.isnan(x):
        return f"an undefined multiple of {of}"
    if math.isinf(x):
        return f"{'∞' if x > 0 else '-∞'}× {of} (which is 0)"
    return f"{x:.{digits}f}× {of}"


def shares(parts: dict[str, float]) -> dict[str, int]:
    """Whole percentages of ``parts`` (fractions of one total) that add up to exactly their rounded sum.

    Rounding each alone can make 33 % + 33 % + 33 % = 99 %; the largest-remainder method keeps the total
    (100 % where the parts cover the whole), so a reader adding them up finds what the report claims.
    """
    raw = {k: max(v, 0.0) * 100 for k, v in parts.items()}
    total = round(sum(raw.values()))
    out = {k: math.floor(v) for k, v in raw.items()}
    short = total - sum(out.values())
    for k in sorted(raw, key=lambda k: raw[k] - out[k], reverse=True)[: max(short, 0)]:
        out[k] += 1
    return out


# What only says who wrote a line: a "[rank3]:" / "[default3]:" head, NCCL's "host:pid:tid [3]" head, a timestamp
# head, and a "[Rank 3]" tag anywhere (the folded line names its ranks itself).
_HEADS: Final = re.compile(
    r"^(?:\s*(?:\[(?:rank|default)\s*\d+\]:?|\d{4}-\d\d-\d\d[ T][\d:.,]+\S*|[\w.-]+:\d+:\d+ \[\d+\])\s*)+",
    re.IGNORECASE)
_RANK_TAG: Final = re.compile(r"\s*\[\s*rank\s*\d+\s*\]:?", re.IGNORECASE)
_NUMBER: Final = re.compile(r"(\d+)")


def _shown(line: str) -> str:
    """A line without its head and rank tags, its inner runs of blanks made one (its line breaks and
    indentation kept: a traceback reads as one)."""
    text = _RANK_TAG.sub(" ", _HEADS.sub("", line)).strip()
    return "\n".join(part[: len(part) - len(part.lstrip())] + " ".join(part.split()) for part in text.split("\n"))


def _merged(texts: list[str]) -> str:
    """One text for lines that differ only in their numbers: the numbers that vary as ``min–max``
    ("ran for 1800035–1800946 milliseconds"), the others as they are."""
    parts = [_NUMBER.split(t) for t in texts]
    out = parts[0][:]
    for i in range(1, len(out), 2):  # the odd positions are the numbers
        values = sorted({int(p[i]) for p in parts})
        if len(values) > 1:
            out[i] = f"{values[0]}–{values[-1]}"
    return "".join(out)


def fold(lines: Sequence[tuple[int | None, str]], limit: int = 5) -> list[str]:
    """Identical log lines from many ranks as one: ``ranks 1-7: NCCL WARN …`` (torchrun prints each rank's copy).

    ``lines`` are ``(rank, text)`` in the order seen. Lines that say the same once their heads (the ``[rank3]:``
    prefix, NCCL's ``host:pid:tid [3]``, a timestamp, a ``[Rank 3]`` tag) are stripped and their numbers
    set aside fold into one, prefixed with the ranks that wrote it; numbers that vary between them are shown
    as their range. At most ``limit`` folded lines, then a count of the rest.
    """
    groups: dict[str, tuple[list[str], list[int]]] = {}
    for rank, text in lines:
        shown = _shown(text) or text.strip()
        texts, who = groups.setdefault(_NUMBER.sub("#", shown), ([], []))
        texts.append(shown)
        if rank is not None and rank not in who:
            who.append(rank)
    folded = list(groups.values())
    out = [f"{ranks(who)}: {_merged(texts)}" if who else _merged(texts) for texts, who in folded[:limit]]
    rest = sum(len(texts) for texts, _ in folded[limit:])
    if rest:
        out.append(f"and {count(rest, 'more line')} unlike these")
    return out


def step_range(lo: int, hi: int) -> str:
    """``step 5`` or ``steps 5–9``: a window of one step is not "steps 5–5"."""
    return f"step {lo}" if lo == hi else f"steps {lo}–{hi}"


def rank_on(rank: int, node: str | None) -> str:
    """``rank 5 on node n3``, or ``rank 5`` where the node is unknown (never "on node " or "on node None")."""
    return f"rank {rank} on node {node}" if node else f"rank {rank}"


def windows(slow: int, total: int, steps: int | None = None) -> str:
    """``slow in 3 of 6 windows`` / ``… of 6 windows of 5 steps``."""
    per = f" of {count(steps, 'step')}" if steps is not None else ""
    return f"slow in {slow:,} of {count(total, 'window')}{per}"
