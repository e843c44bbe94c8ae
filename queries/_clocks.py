"""Clock offsets between the nodes of a traced job, from the moments its ranks leave the same collective.

Each node stamps events with its own clock; NTP keeps nodes within a few milliseconds at best, and a
node whose clock is off by more shifts its ranks on every timeline and makes it look stalled or early.
Every rank leaves a synchronous collective at about the same moment (the last to arrive releases
them all), so for each collective instance that the reference node (the lowest rank's) and another
node both took part in, the difference of their end stamps is the offset plus tens of microseconds
of noise. The estimate per node is the median of those differences over all its ranks and instances
(robust to the few collectives a rank left late), and needs :data:`MIN_POINTS` of them. Collectives
that failed or carry no timing are left out. Ingest aligns the logs it reads the same way
(``ingest._align``); this is the same for jobs jobtrace traced itself.

The offsets are applied where times of different ranks meet: "now" in each rank's own clock for the
stall and silence checks, and every event's place on the timeline. ``jobtrace watch`` estimates them the
same way while the job runs (:func:`offsets_from_ends`, fed by :class:`queries.LiveState`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from ._model import rows

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["APPLY_NS", "MIN_POINTS", "node_offsets", "offsets_from_ends"]

MIN_POINTS: Final = 3
APPLY_NS: Final = 2_000_000
"""Offsets under 2 ms are reported, not applied: ranks of one clock leave a gloo collective up to ~0.6 ms
apart on a busy machine (the demo on 2 cores, 2 simulated nodes), and NTP keeps nodes about that close."""


def node_offsets(con: DuckDBPyConnection, reference_node: str) -> dict[str, dict[str, Any]]:
    """``{node: {"offset_ns": …, "points": …}}`` relative to ``reference_node`` (absent: too few shared moments)."""
    found = rows(
        con,
        """WITH c AS (SELECT grp, seq, node, ts FROM colls
                      WHERE seq IS NOT NULL AND NOT is_async AND error IS NULL AND (gsize IS NULL OR gsize > 1)),
                ref AS (SELECT grp, seq, median(ts) AS t FROM c WHERE node = $ref GROUP BY grp, seq)
           SELECT c.node, median(c.ts - ref.t) AS off, count(*) AS n
           FROM c JOIN ref USING (grp, seq) WHERE c.node <> $ref GROUP BY c.node""",
        {"ref": reference_node},
    )
    return {r["node"]: {"offset_ns": int(r["off"]), "points": int(r["n"])} for r in found
            if r["n"] >= MIN_POINTS and r["off"] is not None}


def offsets_from_ends(ends: Iterable[Mapping[str, Sequence[int]]], reference_node: str) -> dict[str, dict[str, Any]]:
    """The same estimate from collective instances held in memory: per instance, each node's end stamps."""
    diffs: dict[str, list[int]] = {}
    for by_node in ends:
        ref = by_node.get(reference_node)
        if not ref:
            continue
        t = statistics.median(ref)
        for node, stamps in by_node.items():
            if node != reference_node:
                diffs.setdefault(node, []).extend(int(ts - t) for ts in stamps)
    return {node: {"offset_ns": int(statistics.median(d)), "points": len(d)} for node, d in diffs.items()
            if len(d) >= MIN_POINTS}
