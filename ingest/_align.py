"""Clock alignment across nodes, from moments every rank shares.

Each node writes timestamps with its own clock. Some moments are the same for all
ranks by construction: the end of a synchronous collective, hence the end of a step
in data-parallel training (every rank leaves the gradient all-reduce together). For
each pair (reference node, node) the differences of their timestamps of the same
such moment (same step) are the clock offset plus noise (logging latency, timestamp
resolution). The estimate is the mean of the central half of those differences (a
trimmed mean: robust to a few late lines, and finer than the timestamp resolution
when the resolution is coarser than the noise). With fewer than ``min_points``
shared moments a node is left as it is and reported as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["ClockOffset", "SyncMoments", "estimate_offsets", "node_medians", "offsets_from_medians"]

MIN_POINTS: Final = 3
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
MAX_MOMENTS: Final = 4096
"""Shared moments kept per node: plenty for a millisecond estimate, and a bound on memory."""


class SyncMoments:
    """The shared moments seen so far, per clock domain, in memory that does not grow with the log.

    Each domain keeps the steps divisible by its stride; when it holds ``cap`` steps the
    stride doubles and the others are dropped. Strides are powers of two, so the steps two
    domains keep always include those divisible by the larger stride: whatever part of
    the job each node's log covers, their shared moments stay shared.
    """

    def __init__(self, cap: int | None = None) -> None:
        self.points: dict[str, dict[int, list[int]]] = {}  # domain -> step -> its timestamps
        self._strides: dict[str, int] = {}
        self._cap = max(cap if cap is not None else MAX_MOMENTS, 1)

    def add(self, domain: str, step: int, ts: int) -> None:
        # only step numbers are moments every rank shares; both fit in 64 bits (as the lane's MomentStore keeps them)
        if (type(step) is not int or type(ts) is not int
                or not (_I64_MIN <= step <= _I64_MAX and _I64_MIN <= ts <= _I64_MAX)):
            return
        stride = self._strides.get(domain, 1)
        if step % stride:
            return
        keys = self.points.get(domain)
        if keys is None:
            keys = self.points[domain] = {}
        ts_list = keys.get(step)
        if ts_list is not None:
            ts_list.append(ts)
            return
        if len(keys) >= self._cap:
            stride *= 2
            self._strides[domain] = stride
            for k in [k for k in keys if k % stride]:
                del keys[k]
            if step % stride:
                return
        keys[step] = [ts]

    def medians(self) -> dict[str, dict[Any, float]]:
        return node_medians(self.points)

    def __bool__(self) -> bool:
        return bool(self.points)


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """How far a node's clock was from the reference node's, and how sure the estimate is.

    ``offset_ms`` is what the node's clock read minus the reference's at the same moment;
    it is subtracted from the node's timestamps. ``spread_ms`` is the median absolute
    deviation of the differences; ``points`` the number of shared moments used.
    """

    domain: str
    reference: str
    offset_ms: float
    points: int
    spread_ms: float
    applied: bool
    note: str = ""
    offset_ns: int = 0


def _median(xs: list[float]) -> float:
    if len(xs) == 1:  # the common case: one rank per clock domain and moment
        return xs[0]
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _trimmed_mean(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n < 4:
        return _median(s)
    lo, hi = n // 4, n - n // 4
    core = s[lo:hi]
    return sum(core) / len(core)


def node_medians(points: Mapping[str, Mapping[Any, list[int]]]) -> dict[str, dict[Any, float]]:
    """Each domain's time of each shared moment: the median of its ranks' timestamps (ranks of one node
    share its clock)."""
    per_domain: dict[str, dict[Any, float]] = {}
    for domain, keys in points.items():
        d = {k: float(ts[0]) if len(ts) == 1 else _median([float(t) for t in ts]) for k, ts in keys.items() if ts}
        if d:
            per_domain[domain] = d
    return per_domain


def estimate_offsets(points: Mapping[str, Mapping[Any, list[int]]], *, reference: str | None = None,
                     min_points: int = MIN_POINTS) -> dict[str, ClockOffset]:
    """Offsets of every clock domain (node) against a reference, from shared moments.

    ``points[domain][key]`` lists the timestamps (ns) that ranks of ``domain`` logged for
    the shared moment ``key`` (a step number). The reference is the domain with the most
    moments (ties: the first name) unless given.
    """
    return offsets_from_medians(node_medians(points), reference=reference, min_points=min_points)


def offsets_from_medians(per_domain: Mapping[str, Mapping[Any, float]], *, reference: str | None = None,
                         min_points: int = MIN_POINTS) -> dict[str, ClockOffset]:
    """:func:`estimate_offsets` from :func:`node_medians` (which the lane's ``MomentStore`` computes itself)."""
    if not per_domain:
        return {}
    if reference is None or reference not in per_domain:
        reference = sorted(per_domain, key=lambda k: (-len(per_domain[k]), k))[0]
    ref = per_domain[reference]
    out: dict[str, ClockOffset] = {reference: ClockOffset(reference, reference, 0.0, len(ref), 0.0, False, "reference")}
    for domain, d in sorted(per_domain.items()):
        if domain == reference:
            continue
        common = [k for k in d if k in ref]
        diffs = [d[k] - ref[k] for k in common]
        if len(diffs) < min_points:
            out[domain] = ClockOffset(domain, reference, 0.0, len(diffs), 0.0, False,
                                      f"not aligned: {len(diffs)} shared moments (< {min_points})")
            continue
        est = _trimmed_mean(diffs)
        med = _median(diffs)
        spread = _median([abs(x - med) for x in diffs])
        out[domain] = ClockOffset(domain, reference, round(est / 1e6, 3), len(diffs), round(spread / 1e6, 3), True,
                                  offset_ns=int(round(est)))
    return out
