"""``jobtrace jobs --backend …``: the jobs a log server holds, from ONE aggregation, never from its events.

Listing a server's jobs by pulling events (or by listing streams and asking each) costs what
reading every job costs; a server holding thousands of jobs answers one grouped aggregation
in the time of one query. So each backend is asked exactly one question (Elasticsearch pages
it only past ``page_size`` jobs):

* **VictoriaLogs**: one LogsQL ``stats by (<job label>)`` query: first and last ``_time``,
  the number of distinct ``rank`` and ``step`` values, and the line count, per job. Exact
  (VictoriaLogs keeps nanoseconds and counts unique values exactly).
* **Elasticsearch/OpenSearch**: one ``composite`` aggregation on ``jobtrace.job`` (paged by
  ``after_key``), with ``min``/``max`` of ``@timestamp`` and the ``cardinality`` of
  ``jobtrace.rank`` and ``jobtrace.step``. Aggregations read ``date_nanos`` as
  milliseconds, so first and last are to the millisecond (``resolution_ns``); cardinality
  is exact below its precision threshold (3,000 by default), approximate above.
* **Loki**: one metric ``query_range``, ``sum by (<job label>) (count_over_time(...))``:
  the buckets with lines give first and last to the bucket's length (``resolution_ns``) and
  the count. Counting distinct ranks or steps would need a series per rank (a 1,000-rank
  job alone passes Loki's ``max_query_series``), so Loki gives ``ranks`` and ``steps`` as
  ``None`` (``-`` in the table).

**State.** The verdict (failed, hung, …) needs the job's events; a listing only says
``running`` while the last event is more recent than trace-job's stall threshold
(:attr:`AnalysisConfig.stall_s`, 5 minutes) and ``ended`` otherwise. ``trace-job`` gives
the verdict.

Every value sent is either a validated label name (``loki.job_label()``), a number, or a
JSON value; no job id is ever spliced into a query.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlencode

import orjson

from jobtrace import config
from jobtrace.errors import ConfigError, QueryError
from jobtrace.http import HttpConfig, Request, RequestsTransport, Transport
from jobtrace.redact import url_for_display
from jobtrace.store import PACK_KIND
from loki import job_label, logql_quote, logsql_quote

from ._model import AnalysisConfig
from ._reading import TimeRange, read_request

__all__ = ["SERVER_JOB_BACKENDS", "list_server_jobs"]

SERVER_JOB_BACKENDS: Final = ("loki", "victorialogs", "elasticsearch")
"""The servers :func:`list_server_jobs` lists (``jobtrace jobs --backend``; ``local`` is the embedded store's own listing)."""

ES_PAGE_SIZE: Final = 1000
"""Jobs per page of the Elasticsearch composite aggregation: a server with fewer jobs answers in one request."""

_LOKI_MAX_POINTS: Final = 10_000  # Loki refuses more than 11,000 points per series


def _iso(ns: int) -> str:
    stamp = datetime.fromtimestamp(ns / 1e9, tz=UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


def _row(job_id: str, first_ns: int, last_ns: int, *, ranks: int | None, steps: int | None, events: int,
         resolution_ns: int, now_ns: int, running_s: float) -> dict[str, Any]:
    """One job as ``jobtrace jobs --backend … --json`` shows it (``server_job`` in docs/schema/jobs.schema.json)."""
    quiet_s = (now_ns - last_ns) / 1e9
    state = "running" if quiet_s < running_s else "ended"
    if state == "running":
        why = f"last event {_age(quiet_s)} ago (under the {running_s:g}s stall threshold)"
    else:
        why = f"no event for {_age(quiet_s)}"
    return {
        "job_id": job_id, "state": state, "reason": f"{why}; trace-job gives the verdict",
        "first_ns": first_ns, "last_ns": last_ns, "first": _iso(first_ns), "last": _iso(last_ns),
        "resolution_ns": resolution_ns, "ranks": ranks, "steps": steps, "events": events,
    }


def _int(value: Any) -> int:
    """A count as a server wrote it (VictoriaLogs: a string; Loki: a string of a float)."""
    return int(float(value))


# ---- VictoriaLogs ------------------------------------------------------------------------------------
def victorialogs_query(label: str) -> str:
    """The one LogsQL query: per job (stream label ``label``), first and last time, distinct ranks and steps, lines.

    Events only: the ranks' packs (``kind="rollup"``, :mod:`jobtrace.store._packs`) are not events to count."""
    return (f'{{{label}=~".+", kind!={logsql_quote(PACK_KIND)}}} | stats by ({label}) min(_time) t_first, '
            "max(_time) t_last, count_uniq(rank) n_ranks, count_uniq(step) n_steps, count() n_events")


def _victorialogs(url: str | None, time_range: TimeRange, transport: Transport | None,
                  make_row: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    from kibana import parse_iso_ns

    from ._victorialogs import VictoriaLogsReader

    http = HttpConfig.from_env(config.VL.prefix, url)
    reader = VictoriaLogsReader(http.url, transport or RequestsTransport(http), tenant=http.tenant)
    label = job_label()
    try:
        rows = reader.query(victorialogs_query(label), time_range.start_ns, time_range.end_ns)
    finally:
        if transport is None:
            reader.transport.close()
    out = []
    for r in rows:
        if not r.get(label) or not r.get("t_first"):
            continue
        out.append(make_row(r[label], parse_iso_ns(r["t_first"]), parse_iso_ns(r["t_last"]),
                            ranks=_int(r.get("n_ranks") or 0), steps=_int(r.get("n_steps") or 0),
                            events=_int(r.get("n_events") or 0), resolution_ns=1))
    return out


# ---- Elasticsearch / OpenSearch ------------------------------------------------------------------------
def elasticsearch_indices(namespace: str | None) -> str:
    """The jobtrace data streams, as the reader names them (every namespace unless one is given)."""
    from kibana import STREAM_TYPES, validate_namespace

    ns = "*" if not namespace or namespace == "*" else validate_namespace(namespace)
    return ",".join(f"{t}-jobtrace-{ns}" for t in STREAM_TYPES)


def elasticsearch_body(time_range: TimeRange, page_size: int, after: dict[str, Any] | None = None) -> dict[str, Any]:
    """The search: no hits, one composite aggregation by job with its time span, ranks and steps."""
    from kibana import iso_ns

    composite: dict[str, Any] = {"size": page_size, "sources": [{"job": {"terms": {"field": "jobtrace.job"}}}]}
    if after:
        composite["after"] = after
    return {
        "size": 0,
        "track_total_hits": False,
        "query": {"bool": {"filter": [
            {"range": {"@timestamp": {"gte": iso_ns(time_range.start_ns), "lte": iso_ns(time_range.end_ns),
                                      "format": "strict_date_optional_time_nanos"}}},
        ]}},
        "aggs": {"jobs": {"composite": composite, "aggs": {
            "t_first": {"min": {"field": "@timestamp"}},
            "t_last": {"max": {"field": "@timestamp"}},
            "n_ranks": {"cardinality": {"field": "jobtrace.rank"}},
            "n_steps": {"cardinality": {"field": "jobtrace.step"}},
        }}},
    }


def _elasticsearch(url: str | None, time_range: TimeRange, transport: Transport | None,
                   make_row: Callable[..., dict[str, Any]], page_size: int = ES_PAGE_SIZE) -> list[dict[str, Any]]:
    from kibana import error_reason, is_victorialogs

    cfg = HttpConfig.from_env(config.ES.prefix, url=url)
    if is_victorialogs(cfg.url):
        raise ConfigError(f"{url_for_display(cfg.url)} is VictoriaLogs' Elasticsearch ingest endpoint; list it with "
                          "--backend victorialogs")
    indices = elasticsearch_indices(config.get_str(config.ES_NAMESPACE))
    # A namespace with no data stream yet is an empty listing, not an error.
    target = f"{cfg.url}/{indices}/_search?" + urlencode({"ignore_unavailable": "true", "allow_no_indices": "true"})
    headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": "jobtrace-jobs"}
    sender = transport or RequestsTransport(cfg)
    out: list[dict[str, Any]] = []
    after: dict[str, Any] | None = None
    try:
        while True:
            body = orjson.dumps(elasticsearch_body(time_range, page_size, after))
            response = read_request(sender, Request("POST", target, body, headers), timeout_s=cfg.timeout_s,
                                    retries=3, backend="Elasticsearch/OpenSearch", base=cfg.url,
                                    credentials_hint="JOBTRACE_ES_USERNAME/_PASSWORD, _API_KEY or _TOKEN")
            try:
                answer = orjson.loads(response.body)
            except orjson.JSONDecodeError:
                raise QueryError(f"{url_for_display(cfg.url)} answered something that is not JSON") from None
            shards = answer.get("_shards") or {}
            if shards.get("failed"):
                failures = shards.get("failures") or [{}]
                raise QueryError(f"{shards['failed']} shard(s) failed while listing jobs: "
                                 f"{error_reason(failures[0].get('reason'))}; the listing would be incomplete")
            agg = (answer.get("aggregations") or {}).get("jobs") or {}
            buckets = agg.get("buckets") or []
            for b in buckets:
                first, last = b["t_first"].get("value"), b["t_last"].get("value")
                if first is None or last is None:
                    continue
                # Aggregations read date_nanos as (whole) milliseconds: first and last are to the millisecond.
                out.append(make_row(str(b["key"]["job"]), int(first) * 1_000_000, int(last) * 1_000_000,
                                    ranks=int(b["n_ranks"]["value"]), steps=int(b["n_steps"]["value"]),
                                    events=int(b["doc_count"]), resolution_ns=1_000_000))
            after = agg.get("after_key")
            if len(buckets) < page_size or not after:
                return out
    finally:
        if transport is None:
            sender.close()


# ---- Loki -----------------------------------------------------------------------------------------------
def loki_step_s(time_range: TimeRange) -> int:
    """The bucket length: whole seconds, under Loki's points-per-series limit, whole minutes past one."""
    span_s = max(1.0, (time_range.end_ns - time_range.start_ns) / 1e9)
    step_s = max(1, math.ceil(span_s / _LOKI_MAX_POINTS))
    return math.ceil(step_s / 60) * 60 if step_s > 60 else step_s


def loki_query(label: str, step_s: int) -> str:
    """The one LogQL metric query: lines per job (stream label ``label``) per bucket of ``step_s`` seconds
    (events only, not the ranks' packs: ``kind!="rollup"``)."""
    return f'sum by ({label}) (count_over_time({{{label}=~".+", kind!={logql_quote(PACK_KIND)}}} [{step_s}s]))'


def parse_loki_matrix(data: dict[str, Any], label: str, step_s: int, time_range: TimeRange,
                      make_row: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """Jobs from a ``query_range`` matrix: each point at ``t`` counts the lines in ``(t - step, t]``."""
    if data.get("resultType") != "matrix":
        raise QueryError(f"Loki answered a {data.get('resultType')!r} to a range query, not a matrix")
    step_ns = step_s * 1_000_000_000
    out = []
    for series in data.get("result") or []:
        job = (series.get("metric") or {}).get(label)
        points = [(round(float(t) * 1000) * 1_000_000, _int(v)) for t, v in series.get("values") or []]
        points = sorted(p for p in points if p[1] > 0)
        if not job or not points:
            continue
        first = max(time_range.start_ns, points[0][0] - step_ns)
        last = min(time_range.end_ns, points[-1][0])
        out.append(make_row(job, first, last, ranks=None, steps=None, events=sum(n for _, n in points),
                            resolution_ns=step_ns))
    return out


def _loki(url: str | None, time_range: TimeRange, transport: Transport | None,
          make_row: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    from ._loki import LokiReader

    http = HttpConfig.from_env(config.LOKI.prefix, url)
    reader = LokiReader(http.url, transport or RequestsTransport(http), tenant=http.tenant)
    label = job_label()
    step_s = loki_step_s(time_range)
    try:
        data = reader.get("query_range", {"query": loki_query(label, step_s), "start": str(time_range.start_ns),
                                          "end": str(time_range.end_ns), "step": f"{step_s}s"})
    finally:
        if transport is None:
            reader.transport.close()
    return parse_loki_matrix(data, label, step_s, time_range, make_row)


_LISTERS: Final[dict[str, Callable[..., list[dict[str, Any]]]]] = {
    "loki": _loki, "victorialogs": _victorialogs, "elasticsearch": _elasticsearch,
}


def list_server_jobs(backend: str, *, url: str | None, time_range: TimeRange, transport: Transport | None = None,
                     now_ns: int | None = None, running_s: float | None = None) -> list[dict[str, Any]]:
    """The jobs with events on ``backend`` within ``time_range``, by job id, from one aggregation.

    Args:
        backend: ``victorialogs``, ``elasticsearch`` (OpenSearch too) or ``loki``.
        url: the server (default: ``JOBTRACE_VL_URL`` / ``JOBTRACE_ES_URL`` / ``JOBTRACE_LOKI_URL``; credentials
            and tenant from the same ``JOBTRACE_*`` variables as trace-job's).
        time_range: the events considered; a job is listed with its first and last event inside it.
        transport: a :class:`jobtrace.http.Transport` to send through (default: a pooled ``requests`` session).
        now_ns: the time ``state`` is judged at (default: now).
        running_s: a job whose last event is more recent than this many seconds is ``running``, else ``ended``
            (default: trace-job's stall threshold, :attr:`AnalysisConfig.stall_s`, 300 s).

    Each row: ``job_id``, ``state``, ``reason``, ``first_ns``/``last_ns`` (and RFC 3339 ``first``/``last``),
    ``resolution_ns`` (how precise those are), ``ranks`` and ``steps`` (``None`` on Loki), ``events``.
    """
    lister = _LISTERS.get(backend)
    if lister is None:
        raise ConfigError(f"cannot list the jobs of backend {backend!r}; choose one of {', '.join(SERVER_JOB_BACKENDS)}")
    now = time.time_ns() if now_ns is None else now_ns
    window = AnalysisConfig().stall_s if running_s is None else running_s

    def make_row(job_id: str, first_ns: int, last_ns: int, **counts: Any) -> dict[str, Any]:
        return _row(job_id, first_ns, last_ns, now_ns=now, running_s=window, **counts)

    return sorted(lister(url, time_range, transport, make_row), key=lambda r: str(r["job_id"]))
