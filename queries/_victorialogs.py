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
from loki import job_label, logsql_quote

from ._reading import TimeRange, busy_windows, read_request
from ._store import COLUMNS, JobData, ReadStats, load_events

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
        from urllib.parse import urlencode

        from jobtrace.http import Request

        body = urlencode({"query": logsql, "start": rfc3339_ns(start_ns), "end": rfc3339_ns(end_ns)}).encode()
        response = read_request(self.transport, Request("POST", f"{self.base}/select/logsql/query", body, self.headers),
                                timeout_s=self.timeout_s, retries=self.retries, backend="VictoriaLogs", base=self.base,
                                credentials_hint="JOBTRACE_VL_USERNAME/_PASSWORD/_TOKEN", on_attempt=self._count_request)
        loads = orjson.loads
        return [loads(line) for line in response.body.splitlines() if line.strip()]

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

    def fetch(self, selector: str, start_ns: int, end_ns: int, stats: ReadStats) -> Iterator[dict[str, Any]]:
        windows = self.windows(selector, start_ns, end_ns)
        if len(windows) <= 1 or self.parallel == 1:
            return (e for w in windows for e in self.fetch_window(selector, w[0], w[1], stats))
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="jobtrace-vl-read") as pool:
            parts = list(pool.map(lambda w: self.fetch_window(selector, w[0], w[1], stats), windows))
        return (e for part in parts for e in part)


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


def load_victorialogs(job_id: str, *, url: str | None = None, time_range: TimeRange, transport: Any = None,
                      parallel: int | None = None, **options: Any) -> JobData:
    """Load ``job_id`` from VictoriaLogs (``url`` or ``JOBTRACE_VL_URL``; auth from ``JOBTRACE_VL_*``;
    ``JOBTRACE_VL_TENANT=<AccountID>[:<ProjectID>]``)."""
    from jobtrace.http import HttpConfig, RequestsTransport

    http = HttpConfig.from_env(config.VL.prefix, url)
    reader = VictoriaLogsReader(http.url, transport or RequestsTransport(http), tenant=http.tenant,
                                parallel=parallel or config.get_int(config.VL_QUERY_PARALLEL, default=4, minimum=1) or 4,
                                **options)
    selector = "{" + job_label() + "=" + logsql_quote(job_id) + "}"
    stats = ReadStats()
    try:
        events = _only_job(job_id, reader.fetch(selector, time_range.start_ns, time_range.end_ns, stats), stats)
        return load_events(job_id, events, f"victorialogs:{_safe(reader.base)}", stats)
    except JobNotFound:
        raise JobNotFound(f"no events for job {job_id!r} in VictoriaLogs at {_safe(reader.base)} in the chosen "
                          "time range (widen with --since)") from None
    finally:
        if transport is None:
            reader.transport.close()
