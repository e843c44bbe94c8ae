"""``trace-job --backend loki``: fetch a job's events from Loki's ``query_range`` API.

Loki returns at most ``limit`` entries per query (``max_entries_limit_per_query``,
5000 by default), so a job of 1,000 ranks takes many queries. How they are made:

1. **Where is the job?** One metric query, ``sum(count_over_time({training_job=…}[step]))``
   over the whole ``--since/--until`` range, gives the number of lines per time
   bucket. Empty buckets are never fetched (a 7-day default range costs nothing for
   a 20-minute job), and the counts size the windows below.
2. **Windows in parallel.** The non-empty time is cut into windows of about
   ``window_lines`` lines, fetched by ``parallel`` threads (Loki answers queries
   over disjoint time ranges independently; the GIL is released while waiting).
3. **Pages within a window,** like logcli's batch mode: ``direction=forward``, the
   next page starts at the last entry's timestamp (``start`` is inclusive), and the
   entries of that timestamp already seen are dropped as duplicates. A full page on
   one nanosecond (which stalls logcli) is read stream by stream instead: the
   ``series`` API lists the streams, and each is fetched for that nanosecond alone.

The selector comes from the query library (``job_events``), with the job id escaped, on the
stream label ``JOBTRACE_LOKI_JOB_LABEL`` names (``training_job``; ``job`` for data shipped before),
and the request asks for ``categorize-labels`` so that Loki 3.x returns structured
metadata beside each line instead of splitting every entry into its own stream.
Lines are the canonical JSON events; they end in :func:`queries._store.load_events`,
so the report is the one the embedded store gives.

**Packs first.** Each rank that exited cleanly shipped its *pack* (:mod:`jobtrace.store._packs`),
a stream of its own (``kind="rollup"``). :func:`load_loki` reads those few lines first; then
instant metric queries count the server's events per rank (:func:`rank_counts`), and only the
ranks without a usable pack (and the events of no rank) are read line by line, through a label
filter on the ``rank`` structured metadata (:func:`rank_filter`). :func:`queries._packed.with_packs`
joins the two, as the VictoriaLogs and Elasticsearch readers do.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson

from jobtrace import config
from jobtrace.errors import ConfigError, JobNotFound, QueryError
from jobtrace.http import url_without_suffix
from jobtrace.redact import url_for_display
from jobtrace.store import PACK_KIND, Packs, unpack
from loki import label_string, logql_quote

from ._packed import unpacked_ranks, with_packs
from ._reading import TimeRange, busy_windows, even_windows, rank_runs, read_request
from ._store import JobData, ReadStats, load_events

__all__ = ["LokiReader", "load_loki", "query_base", "rank_counts", "rank_filter", "read_packs"]

_HEADERS = {"Accept": "application/json", "X-Loki-Response-Encoding-Flags": "categorize-labels",
            "User-Agent": "jobtrace-trace-job"}
_MAX_POINTS = 10_000  # Loki refuses more than 11,000 points per series
_MAX_ENTRIES = re.compile(r"max entries limit per query exceeded.*?\(\d+ > (\d+)\)")


def query_base(url: str) -> str:
    """The API root for a URL a user gave: push or query endpoints are trimmed back to it."""
    root, path = url_without_suffix(
        url, ("/loki/api/v1/push", "/loki/api/v1/query_range", "/loki/api/v1", "/api/v1/push"))
    if not path.endswith("/loki"):
        path += "/loki"
    return root + path + "/api/v1"


_safe = url_for_display


@dataclass
class _Counters:
    requests: int = 0
    lines: int = 0
    duplicates: int = 0


class LokiReader:
    """Fetches every line of one selector over a time range; see the module docstring."""

    def __init__(self, url: str, transport: Any, *, tenant: str | None = None, limit: int = 5000,
                 parallel: int = 4, window_lines: int = 50_000, timeout_s: float = 60.0,
                 retries: int = 4) -> None:
        if limit < 2:
            raise ConfigError("the Loki page limit must be at least 2")
        self.base = query_base(url)
        self.transport = transport
        self.limit = limit
        self.parallel = max(1, parallel)
        self.window_lines = max(limit, window_lines)
        self.timeout_s = timeout_s
        self.retries = retries
        self.headers = dict(_HEADERS)
        if tenant:
            self.headers["X-Scope-OrgID"] = tenant
        self.counters = _Counters()
        self._lock = threading.Lock()

    # ---- HTTP ------------------------------------------------------------------------------------
    def get(self, path: str, params: dict[str, Any]) -> Any:
        from jobtrace.http import Request

        response = read_request(self.transport, Request("GET", f"{self.base}/{path}?{urlencode(params)}", b"",
                                                        self.headers),
                                timeout_s=self.timeout_s, retries=self.retries, backend="Loki", base=self.base,
                                credentials_hint="JOBTRACE_LOKI_USERNAME/_PASSWORD/_TOKEN/_TENANT",
                                on_attempt=self._count_request)
        try:
            doc = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            raise QueryError(f"Loki at {_safe(self.base)} answered something that is not JSON") from None
        if doc.get("status") not in (None, "success"):
            raise QueryError(f"Loki query failed: {str(doc.get('error'))[:500]}")
        data = doc.get("data")
        return {} if data is None else data

    def _count_request(self) -> None:
        with self._lock:
            self.counters.requests += 1

    # ---- planning ----------------------------------------------------------------------------------
    def histogram(self, selector: str, start_ns: int, end_ns: int) -> tuple[int, list[tuple[int, int]]] | None:
        """(bucket length ns, [(bucket end ns, lines)]) for the non-empty buckets, or None if unknown."""
        span_s = max(1.0, (end_ns - start_ns) / 1e9)
        step_s = max(1, math.ceil(span_s / _MAX_POINTS))
        if step_s > 60:
            step_s = math.ceil(step_s / 60) * 60
        try:
            data = self.get("query_range", {
                "query": f"sum(count_over_time({selector} [{step_s}s]))",
                "start": str(start_ns), "end": str(end_ns), "step": f"{step_s}s",
            })
        except QueryError:
            return None
        if data.get("resultType") != "matrix":
            return None
        buckets: dict[int, int] = {}
        for series in data.get("result") or []:
            for t, v in series.get("values") or []:
                n = int(float(v))
                if n > 0:
                    t_ns = int(round(float(t) * 1e9))
                    buckets[t_ns] = buckets.get(t_ns, 0) + n
        return step_s * 1_000_000_000, sorted(buckets.items())

    def windows(self, selector: str, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
        """Disjoint ``[start, end)`` windows covering every non-empty part of the range."""
        hist = self.histogram(selector, start_ns, end_ns)
        if hist is None:
            return even_windows(start_ns, end_ns, self.parallel)
        step, buckets = hist
        if not buckets:
            return []
        # A point at t counts lines in (t - step, t]; pad by a step on both sides against
        # alignment and clock differences, then merge what touches.
        padded = ((max(start_ns, t - 2 * step), min(end_ns, t + step + 1), n) for t, n in buckets)
        return busy_windows(padded, self.window_lines)

    # ---- fetching ------------------------------------------------------------------------------------
    def fetch_window(self, selector: str, start_ns: int, end_ns: int) -> list[tuple[int, str]]:
        """Every ``(ts, line)`` in ``[start, end)``, paging forward (see the module docstring)."""
        out: list[tuple[int, str]] = []
        start = start_ns
        seen_at_start: set[str] = set()
        while start < end_ns:
            entries = self._page(selector, start, end_ns)
            full = len(entries) >= self.limit
            if full and all(ts == start for ts, _ in entries):
                # A whole page on one nanosecond: paging by time cannot pass it; read it stream by stream.
                every = self._fetch_instant(selector, start)
                fresh = [e for e in every if e[1] not in seen_at_start]
                self._count(len(fresh), len(every) - len(fresh))
                out += fresh
                start, seen_at_start = start + 1, set()
                continue
            fresh = [e for e in entries if not (e[0] == start and e[1] in seen_at_start)]
            self._count(len(fresh), len(entries) - len(fresh))
            out += fresh
            if not full:
                break
            last = max(e[0] for e in entries)
            at_last = {line for ts, line in entries if ts == last}
            seen_at_start = (seen_at_start | at_last) if last == start else at_last
            start = last
        return out

    def _count(self, lines: int, duplicates: int) -> None:
        with self._lock:
            self.counters.lines += lines
            self.counters.duplicates += duplicates

    def _page(self, selector: str, start: int, end: int) -> list[tuple[int, str]]:
        while True:
            try:
                data = self.get("query_range", {
                    "query": selector, "start": str(start), "end": str(end), "limit": str(self.limit),
                    "direction": "forward",
                })
            except QueryError as exc:
                # The server's max_entries_limit_per_query is lower than our page size: use its limit.
                m = _MAX_ENTRIES.search(str(exc))
                if m is None or int(m.group(1)) >= self.limit or int(m.group(1)) < 2:
                    raise
                self.limit = int(m.group(1))
                continue
            return list(_entries(data))

    def _fetch_instant(self, selector: str, ts: int) -> list[tuple[int, str]]:
        """All entries at exactly ``ts``: one query per stream (from the series API, which takes a stream
        selector only: a pipeline such as a rank filter is applied to each stream's query)."""
        streams, pipeline = split_pipeline(selector)
        series = self.get("series", {"match[]": streams, "start": str(ts), "end": str(ts + 1)})
        out: list[tuple[int, str]] = []
        for labels in series if isinstance(series, list) else []:
            entries = self._page(label_string(labels) + pipeline, ts, ts + 1)
            if len(entries) >= self.limit:
                raise QueryError(
                    f"more than {self.limit} lines of one stream share the timestamp {ts} ns; paging cannot get "
                    f"past it (raise max_entries_limit_per_query on the server and JOBTRACE_LOKI_QUERY_LIMIT)")
            out += entries
        return out

    def fetch(self, selector: str, start_ns: int, end_ns: int) -> Iterator[tuple[int, str]]:
        windows = self.windows(selector, start_ns, end_ns)
        if not windows:
            return iter(())
        if len(windows) == 1 or self.parallel == 1:
            return (e for w in windows for e in self.fetch_window(selector, *w))
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="jobtrace-loki-read") as pool:
            parts = list(pool.map(lambda w: self.fetch_window(selector, *w), windows))
        return (e for part in parts for e in part)


def split_pipeline(query: str) -> tuple[str, str]:
    """A log query's stream selector ``{…}`` and the rest (its pipeline, with its leading space), read
    past quoted strings so that a ``}`` inside a job id does not end the selector."""
    quote = ""
    i = 0
    while i < len(query):
        ch = query[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"`":
            quote = ch
        elif ch == "}":
            return query[:i + 1], query[i + 1:]
        i += 1
    return query, ""


def _entries(data: dict[str, Any]) -> Iterator[tuple[int, str]]:
    """``(ts ns, line)`` of a streams result, in either encoding (categorized labels or not)."""
    if data.get("resultType") not in (None, "streams"):
        raise QueryError(f"expected a streams result from Loki, got {data.get('resultType')!r}")
    for stream in data.get("result") or []:
        for value in stream.get("values") or []:
            yield int(value[0]), value[1]


def _events(job_id: str, lines: Iterable[tuple[int, str]], stats: ReadStats) -> Iterator[dict[str, Any]]:
    loads = orjson.loads
    for _, line in lines:
        stats.lines += 1
        try:
            event = loads(line)
        except orjson.JSONDecodeError:
            stats.skipped["not JSON (not written by jobtrace)"] = stats.skipped.get("not JSON (not written by jobtrace)", 0) + 1
            continue
        if not isinstance(event, dict) or "kind" not in event or event.get("job") != job_id:
            stats.skipped["not a jobtrace event of this job"] = stats.skipped.get("not a jobtrace event of this job", 0) + 1
            continue
        yield event


# ---- packs (jobtrace.store._packs): the ranks' rollups, read instead of their events ----------------------------
PACK_PAGE = 200
"""Pack lines per page: each holds up to 128 KiB of base64, so a page is at most ~26 MB of JSON (a page of
``max_entries_limit_per_query`` = 5,000 such lines would exceed Loki's 100 MB gRPC message limit)."""

MAX_SERIES = 500
"""Loki's ``max_query_series`` default: a metric query answering more series fails, so ranks are counted
in slices of this many."""

MAX_QUERY_LENGTH_NS = 720 * 3600 * 10**9
"""Under Loki's ``max_query_length`` default (721h): the range of one count query."""

MAX_RANK_FILTER = 4_000
"""Characters of rank filter a query may carry (it travels in a GET request's URL)."""


def read_packs(reader: LokiReader, pack_selector: str, start_ns: int, end_ns: int) -> Packs:
    """The job's packs (``kind="rollup"`` lines: :mod:`jobtrace.store._packs`) in ``[start, end)``, unpacked.

    Read with the reader's paging (histogram, windows, forward pages), in pages of :data:`PACK_PAGE` lines.
    """
    packs_reader = LokiReader(reader.base, reader.transport, limit=max(2, min(reader.limit, PACK_PAGE)),
                              parallel=reader.parallel, window_lines=10 * PACK_PAGE, timeout_s=reader.timeout_s,
                              retries=reader.retries)
    packs_reader.headers = dict(reader.headers)
    lines = list(packs_reader.fetch(pack_selector, start_ns, end_ns))
    reader.counters.requests += packs_reader.counters.requests
    loads = orjson.loads

    def records() -> Iterator[dict[str, Any]]:
        for _, line in lines:
            try:
                record = loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                yield record

    return unpack(records(), start_ns=start_ns, end_ns=end_ns)


def _instant(reader: LokiReader, query: str, time_ns: int) -> list[tuple[dict[str, str], int]]:
    """``(labels, value)`` of each series of an instant metric query at ``time_ns``."""
    data = reader.get("query", {"query": query, "time": str(time_ns)})
    if data.get("resultType") != "vector":
        raise QueryError(f"expected a vector result from Loki, got {data.get('resultType')!r}")
    return [(dict(s.get("metric") or {}), int(float(s["value"][1]))) for s in data.get("result") or []]


def rank_counts(reader: LokiReader, selector: str, start_ns: int, end_ns: int,
                known_max: int = 0) -> tuple[dict[int, int], int] | None:
    """Events per rank in ``selector`` over ``[start, end)`` and the events with no rank; ``None`` where they
    cannot be counted cleanly (the caller then reads every event whole).

    Instant queries over the whole range (split at :data:`MAX_QUERY_LENGTH_NS`), evaluated at ``end - 1 ns``
    so that ``(t - range, t]`` is the range read, rounded out to whole milliseconds (a duration unit both
    Loki and Prometheus parse): the job's total, its events of no rank (``| rank=""``), then
    ``sum by (rank)`` over slices of :data:`MAX_SERIES` ranks (``| rank >= a | rank < b``: a numeric
    label filter on the ``rank`` structured metadata; it drops lines without one) until every event is
    counted. ``None`` when a rank is not an integer, or events stay uncounted eight slices past the
    highest rank seen (a rank Loki cannot compare as a number). On a Loki without structured metadata
    (rank only inside the line) every event counts as of no rank: all are read whole, and
    :func:`with_packs` then keeps the events over the packs (correct, only not cheaper).
    """
    counts: dict[int, int] = {}
    unranked = 0
    a = start_ns
    while a < end_ns:
        b = min(end_ns, a + MAX_QUERY_LENGTH_NS)
        rng = f"[{-(-(b - a) // 1_000_000)}ms]"
        at = b - 1
        total = sum(n for _, n in _instant(reader, f"sum(count_over_time({selector} {rng}))", at))
        none = sum(n for _, n in _instant(reader, f'sum(count_over_time({selector} | rank="" {rng}))', at))
        unranked += none
        seen, lo, top = none, 0, known_max
        while seen < total:
            if lo > top + 8 * MAX_SERIES:
                return None
            query = f"sum by (rank) (count_over_time({selector} | rank >= {lo} | rank < {lo + MAX_SERIES} {rng}))"
            for labels, n in _instant(reader, query, at):
                try:
                    rank = int(labels.get("rank", ""))
                except ValueError:
                    return None
                counts[rank] = counts.get(rank, 0) + n
                seen += n
                top = max(top, rank)
            lo += MAX_SERIES
        a = b
    return counts, unranked


def rank_filter(ranks: list[int], unranked: bool) -> str | None:
    """A LogQL label filter stage for ``ranks`` and, with ``unranked``, lines with no rank; ``None`` when it
    would be longer than :data:`MAX_RANK_FILTER` (the caller reads every rank then).

    Runs of three or more ranks become ``(rank >= a and rank < b)``, the others one regex (label filter
    regexes are anchored, as in selectors); ``rank=""`` matches a line without the metadata.
    """
    singles: list[str] = []
    parts: list[str] = []
    for lo, hi in rank_runs(ranks):
        if hi - lo >= 3:
            parts.append(f"(rank >= {lo} and rank < {hi})")
        else:
            singles += [str(r) for r in range(lo, hi)]
    if singles:
        parts.insert(0, "rank=~" + logql_quote("|".join(singles)))
    if unranked:
        parts.append('rank=""')
    if not parts:
        return None
    text = "| " + " or ".join(parts)
    return text if len(text) <= MAX_RANK_FILTER else None


def _load_packed(reader: LokiReader, job_id: str, selector: str, packs: Packs, time_range: TimeRange,
                 source: str) -> JobData | None:
    """The job from ``packs`` plus, read whole, the events of the ranks they do not stand for and of no rank;
    ``None`` (``packs`` closed) where the events cannot be counted per rank (:func:`rank_counts`).

    Consumes ``packs`` (closed on any error too).
    """
    start, end = time_range.start_ns, time_range.end_ns
    try:
        try:
            counted = rank_counts(reader, selector, start, end, max(packs.ranks))
        except QueryError:
            counted = None  # e.g. a max_query_series below 500: read every event instead
        if counted is None:
            packs.close()
            return None
        counts, unranked = counted
        others = unpacked_ranks(packs, counts)
        stats = ReadStats(files=0)
        lines: Iterable[tuple[int, str]] = ()
        if others or unranked:
            where = rank_filter(others, bool(unranked))
            lines = reader.fetch(selector if where is None else f"{selector} {where}", start, end)
        job = load_events(job_id, _events(job_id, lines, stats), source, stats, empty_ok=True)
    except BaseException:
        packs.close()
        raise
    return with_packs(job, packs, sum(counts.values()) + unranked)


def load_loki(job_id: str, *, url: str | None = None, time_range: TimeRange, transport: Any = None,
              limit: int | None = None, parallel: int | None = None, whole: bool = False, packs: bool = True,
              **options: Any) -> JobData:
    """Load ``job_id`` from Loki (``url`` or ``JOBTRACE_LOKI_URL``; auth and tenant from ``JOBTRACE_LOKI_*``).

    Ranks that shipped a pack at exit are read from it, and only the other ranks' lines are read
    (see the module docstring); ``packs=False``, or ``whole`` (the timeline and Perfetto views draw
    every event), reads every rank's lines.
    """
    import loki
    from jobtrace.http import HttpConfig, RequestsTransport

    http = HttpConfig.from_env(config.LOKI.prefix, url)
    reader = LokiReader(
        http.url, transport or RequestsTransport(http), tenant=http.tenant,
        limit=limit or config.get_int(config.LOKI_QUERY_LIMIT, default=5000, minimum=2) or 5000,
        parallel=parallel or config.get_int(config.LOKI_QUERY_PARALLEL, default=4, minimum=1) or 4,
        **options,
    )
    label = loki.job_label()
    selector = loki.library(label).render("job_events", job=job_id)
    source = f"loki:{_safe(reader.base)}"
    stats = ReadStats(files=0)
    try:
        if packs and not whole:
            packed = read_packs(reader, "{" + label + "=" + logql_quote(job_id) + ", kind=" + logql_quote(PACK_KIND) + "}",
                                time_range.start_ns, time_range.end_ns)
            if packed.ranks:
                loaded = _load_packed(reader, job_id, selector, packed, time_range, source)
                if loaded is not None:
                    return loaded
            else:
                packed.close()
        lines = reader.fetch(selector, time_range.start_ns, time_range.end_ns)
        return load_events(job_id, _events(job_id, lines, stats), source, stats)
    except JobNotFound:
        raise JobNotFound(f"no events for job {job_id!r} in Loki at {_safe(reader.base)} between "
                          f"{_iso(time_range.start_ns)} and {_iso(time_range.end_ns)} (widen with --since)") from None
    finally:
        if transport is None:
            reader.transport.close()


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))
