"""``trace-job --backend victorialogs``: fetch a job's events from VictoriaLogs with LogsQL.

The Loki shipper can push to VictoriaLogs' Loki endpoint (``/insert/loki/api/v1/push``);
it asks VictoriaLogs not to parse the JSON lines (``disable_message_parsing=1``), so the
canonical event is stored whole in ``_msg`` and the stream labels (training_job, node, kind,
level) and structured metadata (rank, trace_id, span_id, step) become fields.

Reading: ``/select/logsql/query`` answers JSON Lines and has no per-query line limit,
so there is no paging. To keep memory bounded on large jobs, one ``stats by
(_time:<step>) count()`` query first finds where the job's lines are; the non-empty
time is cut into windows of about ``window_lines`` lines, fetched by ``parallel``
threads, each as ``{training_job="…"} | fields _msg`` (the label ``JOBTRACE_LOKI_JOB_LABEL``
names: ``job`` reads what earlier versions shipped).

Lines stored by another producer with message parsing on have no usable ``_msg``;
such a window is fetched again with every field and the event is rebuilt from the
fields (numbers and nested ``attrs.*``/``metrics.*`` restored).

The job id is quoted with LogsQL's (Go) string escaping, so a hostile id cannot
change the query.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import orjson

from jobtrace import config
from jobtrace.errors import JobNotFound
from jobtrace.http import url_without_suffix
from jobtrace.redact import url_for_display
from jobtrace.store import METRICS, PACK_KIND, Packs, unpack
from loki import job_label, logsql_quote

from ._packed import unpacked_ranks, with_packs
from ._reading import Progress, TimeRange, busy_windows, rank_runs, rank_slices, read_request
from ._server_tables import Staging, with_aggregates
from ._store import COLUMNS, JobData, ReadStats, load_events, load_wrapped_events

__all__ = ["VictoriaLogsReader", "load_victorialogs", "logsql_quote", "rfc3339_ns"]

_log = logging.getLogger("jobtrace.query")

_MAX_BUCKETS = 5_000


def rfc3339_ns(ns: int) -> str:
    """Unix nanoseconds as RFC 3339 with nanoseconds, UTC (VictoriaLogs keeps ns precision)."""
    sec, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{frac:09d}Z"


def _parse_time_ns(text: str) -> int:
    """RFC 3339 (as VictoriaLogs writes ``_time``, up to ns) → Unix ns."""
    main, _, frac = text.rstrip("Z").partition(".")
    dt = datetime.strptime(main, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return int(dt.timestamp()) * 1_000_000_000 + int((frac + "000000000")[:9] or 0)


def _base(url: str) -> str:
    root, path = url_without_suffix(url, ("/insert/loki/api/v1/push", "/insert/loki", "/select/logsql/query",
                                          "/select/logsql"))
    return root + path


_safe = url_for_display


class VictoriaLogsReader:
    """Runs LogsQL queries; see the module docstring."""

    def __init__(self, url: str, transport: Any, *, tenant: str | None = None, parallel: int = 4,
                 window_lines: int = 200_000, timeout_s: float = 120.0, retries: int = 3) -> None:
        self.base = _base(url)
        self.transport = transport
        self.parallel = max(1, parallel)
        self.window_lines = max(1000, window_lines)
        self.timeout_s = timeout_s
        self.retries = retries
        self.headers = {"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "jobtrace-trace-job"}
        if tenant:
            account, _, project = tenant.partition(":")
            self.headers["AccountID"] = account
            if project:
                self.headers["ProjectID"] = project
        self.requests = 0
        self._lock = threading.Lock()

    def query(self, logsql: str, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """Rows of a LogsQL query over ``[start, end)`` (one dict per JSON line)."""
        body, _ = self.query_bytes(logsql, start_ns, end_ns)
        loads = orjson.loads
        return [loads(line) for line in body.splitlines() if line.strip()]

    def query_bytes(self, logsql: str, start_ns: int, end_ns: int) -> tuple[bytes, int]:
        """A LogsQL query's answer as the server sent it (JSON lines) and its number of rows."""
        from urllib.parse import urlencode

        from jobtrace.http import Request

        body = urlencode({"query": logsql, "start": rfc3339_ns(start_ns), "end": rfc3339_ns(end_ns)}).encode()
        response = read_request(self.transport, Request("POST", f"{self.base}/select/logsql/query", body, self.headers),
                                timeout_s=self.timeout_s, retries=self.retries, backend="VictoriaLogs", base=self.base,
                                credentials_hint="JOBTRACE_VL_USERNAME/_PASSWORD/_TOKEN", on_attempt=self._count_request)
        body = response.body
        return body, body.count(b"\n") + (1 if body and not body.endswith(b"\n") else 0)

    def _count_request(self) -> None:
        self.requests += 1

    def windows(self, selector: str, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
        span_s = max(1.0, (end_ns - start_ns) / 1e9)
        step_s = max(1, math.ceil(span_s / _MAX_BUCKETS))
        rows = self.query(f"{selector} | stats by (_time:{step_s}s) count() as n", start_ns, end_ns)
        step = step_s * 1_000_000_000
        counted = []
        for row in sorted(rows, key=lambda r: r.get("_time", "")):
            n = int(row.get("n") or 0)
            if n > 0 and "_time" in row:
                a = max(start_ns, _parse_time_ns(row["_time"]))
                counted.append((a, min(end_ns, a + step), n))
        return busy_windows(counted, self.window_lines)

    def fetch_window(self, selector: str, start_ns: int, end_ns: int, stats: ReadStats) -> list[dict[str, Any]]:
        rows = self.query(f"{selector} | fields _msg", start_ns, end_ns)
        events: list[dict[str, Any]] = []
        unparsed = 0
        loads = orjson.loads
        for row in rows:
            try:
                event = loads(row.get("_msg", ""))
            except orjson.JSONDecodeError:
                event = None
            if isinstance(event, dict) and "kind" in event:
                events.append(event)
            else:
                unparsed += 1
        if unparsed:
            # Stored with message parsing on: rebuild those events from their fields.
            events = [e for e in (_event_from_fields(r) for r in self.query(selector, start_ns, end_ns)) if e]
            _log.warning("jobtrace: %d lines in VictoriaLogs were stored with message parsing on (not by jobtrace's "
                         "shipper); their events were rebuilt from the fields", unparsed)
        with self._lock:
            stats.lines += len(rows)
        return events

    def stage(self, selector: str, start_ns: int, end_ns: int, staging: Staging) -> None:
        """Every line of ``selector``, as the server sends it, into ``staging``'s events (windows in parallel)."""
        windows = self.windows(selector, start_ns, end_ns)
        progress = Progress("reading from VictoriaLogs", len(windows))

        def one(window: tuple[int, int]) -> None:
            body, n = self.query_bytes(f"{selector} | fields _msg", *window)
            staging.add("events", body, n)
            progress.step(len(body))

        try:
            with ThreadPoolExecutor(self.parallel, thread_name_prefix="jobtrace-vl-read") as pool:
                list(pool.map(one, windows))
        finally:
            progress.close()

    def fetch(self, selector: str, start_ns: int, end_ns: int, stats: ReadStats) -> Iterator[dict[str, Any]]:
        """Every event of ``selector`` as a dict, rebuilt from the fields where the server parsed the messages."""
        windows = self.windows(selector, start_ns, end_ns)
        if len(windows) <= 1 or self.parallel == 1:
            return (e for w in windows for e in self.fetch_window(selector, w[0], w[1], stats))
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="jobtrace-vl-read") as pool:
            parts = list(pool.map(lambda w: self.fetch_window(selector, w[0], w[1], stats), windows))
        return (e for part in parts for e in part)


# Tier A (queries._server_tables): the server sums spans and metrics per rank and step; events are
# fetched whole only where a check reads them. Each query runs over one slice of ranks, so no group
# straddles two answers and the slices run side by side.
_SPAN_FIELDS = "cat, name, dur, start, ts"
_PHASE_SUMS = ", ".join(f"sum(dur) if (cat:=phase name:={name}) {p}_ns, count(dur) if (cat:=phase name:={name}) n_{p}"
                        for p, name in (("data", "data"), ("fwd", "forward"), ("bwd", "backward"), ("opt", "optimizer")))
_STEP_ROWS = (
    "| unpack_json fields (" + _SPAN_FIELDS + ") | filter cat:in(step, phase)"
    " | stats by (rank, step) min(node) node, count() if (cat:=step) n_step, sum(dur) if (cat:=step) step_ns,"
    " count(dur) if (cat:=step) n_step_dur, min(start) if (cat:=step) t0, max(ts) if (cat:=step) t1,"
    " uniq_values(span_id) if (cat:=step) step_span_ids, count() if (cat:=phase) n_phase,"
    " sum(dur) if (cat:=phase) phase_ns, count(dur) if (cat:=phase) n_phase_dur, " + _PHASE_SUMS)
_COLL_ATTRS = ("group", "seq", "bytes", "group_size", "async", "error", "source")
_COLL_ROWS = (
    "| unpack_json fields (" + _SPAN_FIELDS + ", " + ", ".join(f"attrs.{a}" for a in _COLL_ATTRS) + ")"
    " | filter cat:=collective | rename " + ", ".join(f"attrs.{a} as {a}" for a in _COLL_ATTRS) +
    " | fields rank, node, step, ts, start, dur, span_id, name, " + ", ".join(_COLL_ATTRS))
_MET_ROWS = (
    "| unpack_json fields (ts, " + ", ".join(f"metrics.{m}" for m in METRICS) + ")"
    " | stats by (rank, step) max(ts) ts, min(node) node, row_max(ts, span_id) r_span_id, "
    + ", ".join(f"row_max(ts, metrics.{m}) if (metrics.{m}:*) r_{m}" for m in METRICS)
    + " | unpack_json from r_span_id fields (span_id) | "
    + " | ".join(f"unpack_json from r_{m} fields (metrics.{m})" for m in METRICS)
    + " | rename " + ", ".join(f"metrics.{m} as {m}" for m in METRICS)
    + " | fields rank, step, ts, node, span_id, " + ", ".join(METRICS))
_RANK_ROWS = (
    "| unpack_json fields (ts, world, rank_est, cat, attrs.error)"
    " | stats by (rank) min(node) node, min(ts) first_ts, max(ts) last_ts,"
    " max(ts) if (-(cat:=collective attrs.error:*)) progress_ts, max(step) last_step, max(world) world,"
    " uniq_values(trace_id) traces, count() n, count() if (rank_est:=true) n_est")
_LAST_SPANS = (
    "| unpack_json fields (ts, dur, name, cat, attrs.error)"
    " | sort by (ts desc, dur desc, span_id desc) partition by (rank) limit 1"
    " | rename ts as ls_ts, dur as ls_dur, name as ls_name, cat as ls_cat, span_id as ls_span_id,"
    " attrs.error as ls_error, step as ls_step | fields rank, ls_ts, ls_dur, ls_name, ls_cat, ls_span_id, ls_error, ls_step")
_RAW = (
    # logs and heartbeats: the checks read them whole
    "-kind:in(span, metric) | fields _msg",
    # the fp16 loss-scale metrics (the scaling table)
    'kind:=metric ("loss_scale" OR "overflow") | fields _msg',
    # each rank's ten longest data waits (cited by the data-wait finding)
    "kind:=span | unpack_json fields (cat, name, dur) | filter cat:=phase name:=data"
    " | sort by (dur desc) partition by (rank) limit 10 | fields _msg",
    # the first step span and the first loss (where training settled, for the overflow check)
    "kind:=span | unpack_json fields (cat, ts) | filter cat:=step | sort by (ts) limit 1 | fields _msg",
    'kind:=metric -"loss_scale" -"overflow" | unpack_json fields (ts, metrics.loss) | filter metrics.loss:*'
    " | sort by (ts) limit 1 | fields _msg",
)


def rank_counts(reader: VictoriaLogsReader, selector: str, start_ns: int, end_ns: int) -> tuple[dict[int, int], int]:
    """Events per rank in ``selector``, and the events with no rank."""
    counts: dict[int, int] = {}
    unranked = 0
    for row in reader.query(f"{selector} | stats by (rank) count() n", start_ns, end_ns):
        try:
            counts[int(row.get("rank", ""))] = int(row["n"])
        except (TypeError, ValueError, KeyError):
            unranked += int(row.get("n") or 0)
    return counts, unranked


def aggregate_victorialogs(reader: VictoriaLogsReader, selector: str, start_ns: int, end_ns: int,
                           staging: Staging) -> tuple[int, int]:
    """Stage the job's per rank × step rows and the events read whole; return ``(events in the job, collectives)``."""
    counts, unranked = rank_counts(reader, selector, start_ns, end_ns)
    total = sum(counts.values()) + unranked
    slices = [f"rank:range[{lo}, {hi})" for lo, hi in rank_slices(counts, reader.window_lines * 10, reader.parallel)]
    if unranked:
        slices.append('rank:""')
    kinds = {"step_rows": ('kind:=span step:*', _STEP_ROWS), "coll_rows": ("kind:=span", _COLL_ROWS),
             "met_rows": ("kind:=metric step:*", _MET_ROWS), "rank_rows": ("kind:in(span, metric)", _RANK_ROWS),
             "last_spans": ("kind:=span", _LAST_SPANS)}
    colls = 0
    lock = threading.Lock()

    def run(task: tuple[str, str]) -> None:
        nonlocal colls
        what, where = task
        if what == "raw":
            for q in _RAW:
                staging.add("events", *reader.query_bytes(f"{selector} {where} {q}", start_ns, end_ns))
            return
        filt, pipes = kinds[what]
        body, n = reader.query_bytes(f"{selector} {where} {filt} {pipes}", start_ns, end_ns)
        staging.add("rank_rows" if what == "last_spans" else what, body, n)
        if what == "coll_rows":
            with lock:
                colls += n

    tasks = [(what, where) for where in slices for what in (*kinds, "raw")]
    progress = Progress("reading from VictoriaLogs", len(tasks))

    def step(task: tuple[str, str]) -> None:
        run(task)
        progress.step()

    try:
        with ThreadPoolExecutor(reader.parallel, thread_name_prefix="jobtrace-vl-agg") as pool:
            list(pool.map(step, tasks))
    finally:
        progress.close()
    return total, colls


_INT_COLUMNS = {k for k, v in COLUMNS.items() if v in ("BIGINT", "INTEGER")}


def _scalar(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _event_from_fields(row: dict[str, Any]) -> dict[str, Any] | None:
    """A canonical event from VictoriaLogs fields (all strings; nested keys dotted)."""
    event: dict[str, Any] = {}
    for key, value in row.items():
        if key.startswith("_"):
            continue
        head, _, rest = key.partition(".")
        if rest and head in ("attrs", "metrics"):
            event.setdefault(head, {})[rest] = _scalar(value)
        elif key in _INT_COLUMNS:
            try:
                event[key] = int(value)
            except (TypeError, ValueError):
                event[key] = value
        elif key == "est":
            event[key] = value == "true"
        elif key in COLUMNS:
            event[key] = value
    if "ts" not in event and "_time" in row:
        event["ts"] = _parse_time_ns(row["_time"])
    return event if "kind" in event else None


def _only_job(job_id: str, events: Iterable[dict[str, Any]], stats: ReadStats) -> Iterator[dict[str, Any]]:
    for event in events:
        if event.get("job") == job_id:
            yield event
        else:
            stats.skipped["not a jobtrace event of this job"] = stats.skipped.get("not a jobtrace event of this job", 0) + 1


def read_packs(reader: VictoriaLogsReader, job_selector: str, start_ns: int, end_ns: int) -> Packs:
    """The job's packs (``kind="rollup"`` lines: see :mod:`jobtrace.store._packs`), unpacked."""
    body, _ = reader.query_bytes(f"{job_selector} | fields _msg", start_ns, end_ns)
    loads = orjson.loads

    def records() -> Iterator[dict[str, Any]]:
        for line in body.splitlines():
            try:
                record = loads(loads(line).get("_msg", ""))
            except (orjson.JSONDecodeError, AttributeError):
                record = None
            if isinstance(record, dict):
                yield record

    return unpack(records(), start_ns=start_ns, end_ns=end_ns)


_MAX_RANK_FILTER = 8_000
"""Characters of rank ranges a query may carry (VictoriaLogs' ``-search.maxQueryLen`` is 16 KiB)."""


def rank_filter(ranks: list[int], unranked: bool) -> str | None:
    """A LogsQL filter for ``ranks`` (as ranges) and, with ``unranked``, events with no rank; ``None`` when
    it would be too long to send (the caller reads every rank then)."""
    parts = [f"rank:range[{lo}, {hi})" for lo, hi in rank_runs(ranks)]
    if unranked:
        parts.append('rank:""')
    text = "(" + " OR ".join(parts) + ")"
    return text if len(text) <= _MAX_RANK_FILTER else None


def _load_packed(reader: VictoriaLogsReader, job_id: str, selector: str, packs: Packs, time_range: TimeRange,
                 source: str) -> JobData:
    """The job from its packs plus, read whole, the events of the ranks they do not stand for."""
    start, end = time_range.start_ns, time_range.end_ns
    staging = Staging()
    try:
        counts, unranked = rank_counts(reader, selector, start, end)
        others = unpacked_ranks(packs, counts)
        if others or unranked:
            where = rank_filter(others, bool(unranked))
            reader.stage(selector if where is None else f"{selector} {where}", start, end, staging)
        job, unparsed = load_wrapped_events(job_id, staging.files("events"), "_msg", source, ReadStats(),
                                            staging.rows["events"])
    except BaseException:
        packs.close()
        raise
    finally:
        staging.close()
    if unparsed:
        _log.warning("jobtrace: %d lines in VictoriaLogs were not jobtrace events; they were skipped", unparsed)
    return with_packs(job, packs, sum(counts.values()) + unranked)


def load_victorialogs(job_id: str, *, url: str | None = None, time_range: TimeRange, transport: Any = None,
                      parallel: int | None = None, whole: bool = False, aggregate: bool | None = None,
                      packs: bool = True, **options: Any) -> JobData:
    """Load ``job_id`` from VictoriaLogs (``url`` or ``JOBTRACE_VL_URL``; auth from ``JOBTRACE_VL_*``;
    ``JOBTRACE_VL_TENANT=<AccountID>[:<ProjectID>]``).

    Ranks that shipped a pack at exit (:mod:`jobtrace.store._packs`) are read from it, a few records
    each, and only the other ranks' events are read (``packs=False``: every rank from its events).
    Those events are read as the server stores them, and parsed by DuckDB. With ``aggregate``
    (default ``JOBTRACE_VL_AGGREGATE``, off) the server sums the spans and metrics instead
    (:mod:`._server_tables`): a tenth of the transfer and of the client's memory, but each of those
    queries unpacks every event's JSON on the server, which costs it more CPU than sending the events
    costs both sides (docs/server-scale.md has the figures). ``whole`` (the timeline and Perfetto
    views draw every event) and a job with no collective recorded (phases may then stand in for
    them, which reads the phase spans themselves) always read every event.
    """
    from jobtrace.http import HttpConfig, RequestsTransport

    http = HttpConfig.from_env(config.VL.prefix, url)
    reader = VictoriaLogsReader(http.url, transport or RequestsTransport(http), tenant=http.tenant,
                                parallel=parallel or config.get_int(config.VL_QUERY_PARALLEL, default=4, minimum=1) or 4,
                                **options)
    job_is = job_label() + "=" + logsql_quote(job_id)
    selector = "{" + job_is + ", kind!=" + logsql_quote(PACK_KIND) + "}"  # events, not the ranks' packs
    stats = ReadStats()
    source = f"victorialogs:{_safe(reader.base)}"
    staging = Staging()
    try:
        total = colls = None
        if packs and not whole:
            packed = read_packs(reader, "{" + job_is + ", kind=" + logsql_quote(PACK_KIND) + "}",
                               time_range.start_ns, time_range.end_ns)
            if packed.ranks:
                return _load_packed(reader, job_id, selector, packed, time_range, source)
            packed.close()
        if aggregate is None:
            aggregate = config.get_bool(config.VL_AGGREGATE)
        if aggregate and not whole:
            total, colls = aggregate_victorialogs(reader, selector, time_range.start_ns, time_range.end_ns, staging)
            if total == 0:
                raise JobNotFound(job_id)
        if not colls:  # whole, or no collective recorded: every event (phases may stand in for collectives)
            staging.close()
            staging = Staging()
            reader.stage(selector, time_range.start_ns, time_range.end_ns, staging)
        job, unparsed = load_wrapped_events(job_id, staging.files("events"), "_msg", source, stats,
                                              staging.rows["events"])
        if unparsed:
            # Lines stored with message parsing on (not by jobtrace's shipper): every event, read the slow way,
            # where a window of such lines is rebuilt from its fields.
            job.con.close()
            stats = ReadStats()
            events = _only_job(job_id, reader.fetch(selector, time_range.start_ns, time_range.end_ns, stats), stats)
            return load_events(job_id, events, source, stats)
        if colls:
            return with_aggregates(job, staging, total or 0)
        if job.stats.events == 0:
            raise JobNotFound(job_id)
        return job
    except JobNotFound:
        raise JobNotFound(f"no events for job {job_id!r} in VictoriaLogs at {_safe(reader.base)} in the chosen "
                          "time range (widen with --since)") from None
    finally:
        staging.close()
        if transport is None:
            reader.transport.close()
