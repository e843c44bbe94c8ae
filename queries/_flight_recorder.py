"""PyTorch Flight Recorder dumps, read into the same ``events`` table the analysis queries.

A dump (``TORCH_FR_BUFFER_SIZE`` > 0; written on a watchdog timeout with
``TORCH_NCCL_DUMP_ON_TIMEOUT``/``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, or on demand with
``torch._C._distributed_c10d._dump_fr_trace``) is one file per rank, named
``<prefix><rank>``, holding a pickle (or JSON) dict: ``pg_config`` (groups and their
ranks), ``pg_status`` (last enqueued/started/completed sequence number per group) and
``entries``, each with the group ``(name, desc)``, ``collective_seq_id``/``p2p_seq_id``,
``profiling_name`` (``nccl:all_reduce``), input sizes and dtypes, ``state`` and times.

Each entry becomes a canonical event: a completed one a ``collective`` span, the first
unfinished one per group a heartbeat saying the rank is inside it (``in_op``/``in_seq``)
at the dump's time. Groups are named ``fr:<name>[:<desc>]`` because Flight Recorder
numbers collectives per process group on its own, which need not match jobtrace's
counter: the two views are matched separately and both reach the wavefront. The pickle
is read with an unpickler that admits only plain data (dicts, lists, strings, numbers),
so a dump cannot run code.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from jobtrace.errors import QueryError
from jobtrace.store import json_scan_sql

from ._store import JobData, ReadStats, load_events

__all__ = ["add_flight_recorder", "flight_recorder_events", "flight_recorder_summary", "load_flight_recorder",
           "read_flight_recorder"]

_DTYPE_BYTES = {
    "Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
}
_TRAILING_RANK = re.compile(r"(\d+)(?:\.\w+)?$")


class _PlainData(pickle.Unpickler):
    """Refuses every global: a Flight Recorder dump is plain data, and anything else could run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name} in a flight recorder dump")


def _decode(data: bytes) -> dict[str, Any]:
    if data[:1] in (b"{", b" ", b"\n"):
        out = orjson.loads(data)
    else:
        out = _PlainData(io.BytesIO(data)).load()
    if not isinstance(out, dict) or "entries" not in out:
        raise ValueError("not a flight recorder dump (no 'entries')")
    return out


def _files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and _TRAILING_RANK.search(f.name)
                          and not f.name.endswith(".tmp"))
        elif p.is_file():
            out.append(p)
        else:
            raise QueryError(f"no flight recorder dump at {p}")
    return out


def read_flight_recorder(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[int, dict[str, Any], int]]:
    """``(rank, dump, dump_time_ns)`` for every readable dump; the rank comes from the file name."""
    dumps = []
    for f in _files(paths):
        try:
            dump = _decode(f.read_bytes())
        except (pickle.UnpicklingError, ValueError, EOFError, orjson.JSONDecodeError) as exc:
            raise QueryError(f"{f} is not a readable flight recorder dump: {exc}") from exc
        m = _TRAILING_RANK.search(f.name)
        rank_in_name = int(m.group(1)) if m else -1
        rank = int(dump.get("rank", rank_in_name))
        dumps.append((rank, dump, f.stat().st_mtime_ns))
    if not dumps:
        raise QueryError("no flight recorder dumps found")
    return dumps


def _bytes(sizes: Any, dtypes: Any) -> int:
    total = 0
    for shape, dtype in zip(sizes or [], dtypes or []):
        n = 1
        for d in shape or []:
            n *= int(d)
        total += n * _DTYPE_BYTES.get(str(dtype), 4)
    return total


def _frames(entry: dict[str, Any]) -> str:
    lines = []
    for fr in reversed(entry.get("frames") or []):  # innermost first in the dump; tracebacks read outermost first
        lines.append(f'  File "{fr.get("filename")}", line {fr.get("line")}, in {fr.get("name")}')
    return "\n".join(lines)


def flight_recorder_events(dumps: list[tuple[int, dict[str, Any], int]], job_id: str, trace_id: str,
                           nodes: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Canonical event dicts for the dumps (see the module docstring for the mapping)."""
    nodes = nodes or {}
    events: list[dict[str, Any]] = []
    world = len(dumps)
    for rank, dump, mtime in dumps:
        entries = list(dump.get("entries") or [])
        status = dump.get("pg_status") or {}
        config = dump.get("pg_config") or {}
        latest = max([mtime] + [int(e.get(k) or 0) for e in entries
                                for k in ("time_created_ns", "time_discovered_completed_ns")])
        base = {"job": job_id, "trace_id": trace_id, "rank": rank, "local_rank": 0, "world": world,
                "node": nodes.get(rank, f"rank{rank}"), "pid": 0, "v": 1}
        pending_seen: set[str] = set()
        last_entry: dict[str, Any] | None = None
        for e in sorted(entries, key=lambda e: (e.get("record_id") or 0)):
            pg = e.get("process_group") or ("?", "")
            name, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
            group = f"fr:{name}" + (f":{desc}" if desc and desc != "undefined" else "")
            p2p = bool(e.get("is_p2p"))
            seq = int(e.get("p2p_seq_id") if p2p else e.get("collective_seq_id") or 0)
            if p2p:
                group += ":p2p"
            op = str(e.get("profiling_name") or "?").split(":")[-1]
            st = status.get(name) or status.get(str(e.get("pg_id"))) or {}
            done_upto = st.get("last_completed_collective")
            state = e.get("state")
            completed = state == "completed" or (not p2p and done_upto is not None and 0 <= seq <= int(done_upto))
            if done_upto is None and e.get("retired"):
                completed = True
            created = int(e.get("time_created_ns") or 0)
            started = int(e.get("time_discovered_started_ns") or 0) or created
            finished = int(e.get("time_discovered_completed_ns") or 0)
            cfg = config.get(name) or {}
            try:
                gsize = len(orjson.loads(str(cfg.get("ranks", "[]")).replace("'", '"')))
            except orjson.JSONDecodeError:
                gsize = None
            attrs: dict[str, Any] = {"op": op, "group": group, "seq": seq, "group_size": gsize or None,
                                     "bytes": _bytes(e.get("input_sizes"), e.get("input_dtypes")),
                                     "source": "flight_recorder", "state": state}
            if completed:
                if not finished:
                    attrs["async"] = True  # no timing: the duration is unknown, keep it out of wait statistics
                end = finished or started
                events.append({"ts": end, "kind": "span", **base, "span_id": f"fr{rank:x}.{e.get('record_id', 0)}",
                               "name": op, "cat": "collective", "start": started, "dur": max(0, end - started),
                               "attrs": {k: v for k, v in attrs.items() if v is not None}})
                last_entry = e
            elif group not in pending_seen:
                pending_seen.add(group)
                events.append({"ts": latest, "kind": "heartbeat", **base, "attrs": {
                    "in_op": op, "in_group": group, "in_seq": seq, "in_bytes": attrs["bytes"],
                    "op_age_ms": max(0, latest - created) // 1_000_000, "source": "flight_recorder"}})
                last_entry = e
        if last_entry is not None:
            events.append({"ts": latest, "kind": "log", **base, "level": "INFO", "logger": "jobtrace.flight_recorder",
                           "msg": f"flight recorder: last entry {last_entry.get('profiling_name')} "
                                  f"#{last_entry.get('collective_seq_id')} ({last_entry.get('state')})",
                           "exc": _frames(last_entry) or None})
    return [{k: v for k, v in ev.items() if v is not None} for ev in events]


def load_flight_recorder(job_id: str, paths: Iterable[str | os.PathLike[str]]) -> JobData:
    """A job made of Flight Recorder dumps alone (when jobtrace was not running)."""
    from jobtrace.identity import trace_id_for_job

    dumps = read_flight_recorder(paths)
    events = flight_recorder_events(dumps, job_id, trace_id_for_job(job_id))
    return load_events(job_id, events, f"flight-recorder:{len(dumps)} dumps", ReadStats(files=len(dumps)))


def add_flight_recorder(job: JobData, paths: Iterable[str | os.PathLike[str]]) -> int:
    """Append the dumps' events to an already loaded job; returns how many were added."""
    dumps = read_flight_recorder(paths)
    info = job.con.execute("SELECT any_value(trace_id), list(DISTINCT {'rank': rank, 'node': node}) FROM events").fetchone()
    trace_id = info[0] if info else ""
    nodes = {int(d["rank"]): d["node"] for d in (info[1] if info else [])}
    events = flight_recorder_events(dumps, job.job_id, trace_id or "", nodes)
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as tmp:
        for ev in events:
            tmp.write(orjson.dumps(ev, option=orjson.OPT_APPEND_NEWLINE))
        path = tmp.name
    job.writable()
    try:
        job.con.execute(
            f"INSERT INTO events BY NAME SELECT * FROM {json_scan_sql()}",
            [path],
        )
    finally:
        os.unlink(path)
    job.stats.events += len(events)
    job.source += f" + flight-recorder:{len(dumps)} dumps"
    return len(events)


_FR_WRITTEN = re.compile(r"Flight Recorder buffer written to (\S+) ---")


def flight_recorder_summary(scene: str | None) -> dict[str, Any] | None:
    """Where a rank's stall scene names a Flight Recorder dump (written by its heartbeat thread), the dump's
    word per process group, where the watcher can read the file: the collectives still in flight (not
    retired) and the last one retired. A waiting rank shows the hung collective in flight; the rank that
    never joined it shows the one before as its last."""
    m = _FR_WRITTEN.search(scene or "")
    if m is None:
        return None
    path = m.group(1)
    try:
        ((_, dump, _),) = read_flight_recorder([path])
    except (OSError, QueryError, ValueError):
        return {"file": path}
    groups: dict[str, dict[str, Any]] = {}
    for entry in sorted(dump.get("entries") or [], key=lambda e: e.get("record_id") or 0):
        pg = entry.get("process_group") or ["?"]
        g = groups.setdefault(str(pg[-1] if isinstance(pg, list) else pg), {"in_flight": [], "last_retired": None})
        what = f"{entry.get('profiling_name', '?')} #{entry.get('collective_seq_id') or entry.get('p2p_seq_id')}"
        if entry.get("retired"):
            g["last_retired"] = what
        else:
            g["in_flight"].append(what)
    return {"file": path, "groups": groups}
