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
stall and silence checks, and every event's place on the timeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ._model import rows

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

__all__ = ["MIN_POINTS", "node_offsets"]

MIN_POINTS: Final = 3


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
