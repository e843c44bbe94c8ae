"""Packs: a rank's rollup, shipped to a log server as a few records, so a reader need not sum its events.

A log server holding a 1,024-rank job holds about nine million events. Summing them per rank
and step on the server costs it more than ten seconds of CPU however it is asked
(docs/server-scale.md). But each rank that exits cleanly has already derived its own rows of
the tables every check reads (its *rollup*, :mod:`._segments`). A *pack* is that rollup
shipped alongside the rank's events, as records of the same job:

* one record per derived table (:data:`PACK_TABLES`) plus ``events``: the events the checks read
  directly (every log and heartbeat, fp16 loss-scale metrics, the rank's ten longest ``data``
  waits, its first step span and its first loss), each table as the Parquet file DuckDB wrote,
  base64 in the record's ``parquet`` key, split into parts of at most :data:`PART_BYTES`
  (half of Loki's and VictoriaLogs' default 256 KiB line limit);
* a record is a JSON object with the event identity keys (``kind`` is :data:`PACK_KIND`, ``ts``
  the rank's last event, so a time-range query finds it) and a ``rollup`` object: ``key``
  (:data:`ROLLUP_KEY`: another version's packs are never misread), ``table``, ``part``, ``parts``,
  ``rows``, ``events`` (the rank's events), ``first_ts``, ``last_ts``.

A reader (:func:`unpack`) takes a rank's pack only when every part of every table is there,
from one process (a restarted rank's lives must be derived together), and of this version;
duplicates (a push replayed) are dropped. Ranks without a usable pack are read from their events.
A 1,024 × 1,000 job is about 6,000 records and 100 MB of text instead of nine million events.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from ._segments import rollup_paths
from ._sql import literal
from ._tables import DERIVED, ROLLUP_KEY

__all__ = ["PACK_KIND", "PACK_TABLES", "PART_BYTES", "Packs", "pack_lines", "pack_records", "unpack"]

PACK_KIND: Final = "rollup"
"""The ``kind`` of a pack record. Not an event kind: readers of events exclude it (``kind!="rollup"``)."""

PACK_TABLES: Final = (*(t for t in DERIVED if t != "scaling"), "events")
"""What a pack holds. Not ``scaling``: its rows come from the fp16 loss-scale metrics, which ``events`` holds,
so a reader derives them (one file fewer per rank to write and read back)."""

PART_BYTES: Final = 96 * 1024
"""Parquet bytes per record: 128 KiB of base64, half of Loki's ``max_line_size`` and VictoriaLogs'
``-insert.maxLineSizeBytes`` (both 256 KiB by default)."""

_EVENTS: Final = """
    SELECT * FROM seg WHERE kind NOT IN ('span', 'metric')
    UNION ALL SELECT * FROM seg WHERE kind = 'metric' AND (contains(metrics, '"overflow"') OR contains(metrics, '"loss_scale"'))
    UNION ALL (SELECT * FROM seg WHERE kind = 'span' AND cat = 'phase' AND name = 'data' ORDER BY dur DESC, ts LIMIT 10)
    UNION ALL (SELECT * FROM seg WHERE kind = 'span' AND cat = 'step' ORDER BY ts LIMIT 1)
    UNION ALL (SELECT * FROM seg WHERE kind = 'metric' AND NOT contains(metrics, '"overflow"')
               AND NOT contains(metrics, '"loss_scale"') AND json_extract(metrics, '$.loss') IS NOT NULL
               ORDER BY ts LIMIT 1)
"""
"""What the checks read from a rank's ``events`` besides the derived tables (docs/server-scale.md)."""

_PARQUET: Final = "FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2"


def pack_records(segment: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The pack of the rank whose segment this is; ``[]`` when its rollup is missing or of another version.

    Each table is Parquet as DuckDB writes it, base64 in parts (see the module docstring). Its text is
    as the store holds it, already redacted when the rank wrote it (a redactor cannot reach inside
    Parquet later: ``jobtrace export`` sends no pack for a rank whose lines it had to redact).
    """
    seg = Path(segment)
    rollup = rollup_paths(seg)
    if not seg.exists() or not all(p.exists() for p in rollup.values()):
        return []
    import duckdb

    con = duckdb.connect(":memory:")
    tmp = Path(tempfile.mkdtemp(prefix="jobtrace-pack-"))
    try:
        con.execute("SET threads = 1")  # the node's cores belong to the ranks still training
        con.execute(f"CREATE VIEW seg AS SELECT * FROM read_parquet({literal(seg)})")
        ident = con.execute("SELECT any_value(job), any_value(node), any_value(rank), any_value(pid), "
                            "any_value(trace_id), count(*), min(ts), max(ts) FROM seg").fetchone()
        if ident is None or ident[0] is None or ident[5] == 0:
            return []
        job, node, rank, pid, trace_id, events, first_ts, last_ts = ident
        sources = {t: f"read_parquet({literal(rollup[t])})" for t in PACK_TABLES if t != "events"}
        sources["events"] = f"({_EVENTS})"
        records: list[dict[str, Any]] = []
        for table in PACK_TABLES:
            out = tmp / f"{table}.parquet"
            con.execute(f"COPY (SELECT * FROM {sources[table]}) TO {literal(out)} ({_PARQUET})")
            rows = con.execute(f"SELECT count(*) FROM read_parquet({literal(out)})").fetchone()[0]  # type: ignore[index]
            data = out.read_bytes()
            parts = max(1, -(-len(data) // PART_BYTES))
            for i in range(parts):
                records.append({
                    "kind": PACK_KIND, "ts": last_ts, "job": job, "node": node, "rank": rank, "pid": pid,
                    "trace_id": trace_id,
                    "rollup": {"key": ROLLUP_KEY, "table": table, "part": i, "parts": parts, "rows": rows,
                               "events": events, "first_ts": first_ts, "last_ts": last_ts},
                    "parquet": base64.b64encode(data[i * PART_BYTES:(i + 1) * PART_BYTES]).decode("ascii"),
                })
        return records
    finally:
        con.close()
        shutil.rmtree(tmp, ignore_errors=True)


def pack_lines(segment: str | os.PathLike[str]) -> list[bytes]:
    """:func:`pack_records` as lines, each ending in a newline (what the shippers send)."""
    return [orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in pack_records(segment)]


@dataclass
class Packs:
    """The usable packs of a job, unpacked into Parquet files under :attr:`dir` (removed by :meth:`close`)."""

    dir: Path
    tables: dict[str, list[str]] = field(default_factory=dict)
    """Per table of :data:`PACK_TABLES`, one file per packed rank."""
    events: dict[int, int] = field(default_factory=dict)
    """Per packed rank, the events its pack stands for."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Ranks whose packs were not used, by reason (they are read from their events instead)."""
    records: int = 0
    bytes: int = 0

    @property
    def ranks(self) -> set[int]:
        return set(self.events)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def unpack(records: Iterable[Mapping[str, Any]], *, start_ns: int | None = None,
           end_ns: int | None = None) -> Packs:
    """The complete packs among ``records`` (pack records as read back, any order, duplicates allowed).

    A rank's pack is used only when it is of this version, from one process, has every part of
    every table, and (with ``start_ns``/``end_ns``) lies wholly inside the time range read: a
    pack stands for all of its rank's events, so a range cutting through them needs the events.
    """
    out = Packs(Path(tempfile.mkdtemp(prefix="jobtrace-packs-")))
    by_rank: dict[int, dict[tuple[Any, str, int], Mapping[str, Any]]] = {}
    bad: dict[int, str] = {}
    for record in records:
        out.records += 1
        roll = record.get("rollup")
        rank = record.get("rank")
        if type(rank) is not int or not isinstance(roll, Mapping):
            out.skipped["not a pack record"] = out.skipped.get("not a pack record", 0) + 1
            continue
        if roll.get("key") != ROLLUP_KEY:
            bad.setdefault(rank, "packed by another version of jobtrace")
            continue
        parts = by_rank.setdefault(rank, {})
        parts.setdefault((record.get("pid"), str(roll.get("table")), int(roll.get("part") or 0)), record)
    whole: dict[int, dict[tuple[Any, str, int], Mapping[str, Any]]] = {}
    for rank, parts in by_rank.items():
        reason = _incomplete(parts, start_ns, end_ns)
        if reason is None and rank not in bad:
            whole[rank] = parts
        else:
            bad.setdefault(rank, reason or "")
    _write(out, whole)
    for reason in bad.values():
        out.skipped[reason] = out.skipped.get(reason, 0) + 1
    return out


def _incomplete(parts: Mapping[tuple[Any, str, int], Mapping[str, Any]], start_ns: int | None,
                end_ns: int | None) -> str | None:
    """Why these records are not one whole pack, or ``None``."""
    if len({pid for pid, _, _ in parts}) != 1:
        return "several processes (a restarted rank)"
    for table in PACK_TABLES:
        have = [r["rollup"] for (_, t, _), r in parts.items() if t == table]
        if not have or {h.get("part") for h in have} != set(range(int(have[0].get("parts") or 0))):
            return "a part missing"
    roll = next(iter(parts.values()))["rollup"]
    first, last = roll.get("first_ts"), roll.get("last_ts")
    if (start_ns is not None and (type(first) is not int or first < start_ns)) or \
            (end_ns is not None and (type(last) is not int or last >= end_ns)):
        return "its events cross the time range read"
    return None


def _write(out: Packs, ranks: Mapping[int, Mapping[tuple[Any, str, int], Mapping[str, Any]]]) -> None:
    """Each rank's tables to files, several at a time (the writes release the GIL), one directory per table:
    a thousand ranks are five thousand small files, and creating them in one directory took 2.8 s on this
    project's machine (ext4), against 0.4 s spread over five."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: tuple[int, Mapping[tuple[Any, str, int], Mapping[str, Any]]]) -> tuple[int, dict[str, tuple[Path, int]] | None]:
        rank, parts = item
        files: dict[str, tuple[Path, int]] = {}
        try:
            for table in PACK_TABLES:
                chunks = sorted((p, r["parquet"]) for (_, t, p), r in parts.items() if t == table)
                data = b"".join(base64.b64decode(text, validate=True) for _, text in chunks)
                if data[:4] != b"PAR1" or data[-4:] != b"PAR1":
                    raise ValueError("not a Parquet file")
                path = out.dir / table / f"r{rank}.parquet"
                path.write_bytes(data)
                files[table] = path, len(data)
        except (ValueError, TypeError):
            return rank, None
        return rank, files

    for table in PACK_TABLES:
        (out.dir / table).mkdir(exist_ok=True)
    with ThreadPoolExecutor(8, thread_name_prefix="jobtrace-unpack") as pool:
        for rank, files in pool.map(one, ranks.items()):
            if files is None:
                out.skipped["a part damaged"] = out.skipped.get("a part damaged", 0) + 1
                continue
            for table, (path, size) in files.items():
                out.tables.setdefault(table, []).append(str(path))
                out.bytes += size
            out.events[rank] = int(next(iter(ranks[rank].values()))["rollup"].get("events") or 0)
