"""``trace-job --backend elasticsearch``: a job's events from Elasticsearch 8/9 or OpenSearch 2.x.

The documents of the job (all three data streams, ``<type>-jobtrace-<namespace>``) are
read with a point in time and ``search_after``, in pages of ``page_size`` documents in
index order (``_shard_doc`` on Elasticsearch; ``_index`` + ``_doc`` on OpenSearch, whose
``_doc`` is unique only within a shard, so only where every backing index has one
shard, else ``@timestamp`` + ``event.id``; see :func:`_sort`). Each page is turned
back into canonical events (:func:`kibana.from_document`) and streamed
into :func:`queries._store.load_events`, which stages them on disk for DuckDB, so
Python holds one page at a time whatever the size of the job; the analysis is then
the one the embedded store gets.

By default (``whole=False``) that whole pull is kept for the views that draw every event and
for jobs with no collective span; otherwise the cluster does the summing
(:mod:`._server_tables`, tier A), over ``parallel`` slices of ranks (a ``range`` on
``jobtrace.rank``) at once: phase sums per rank × step from a ``composite`` aggregation
paged by ``after_key`` (its page is ``search.max_buckets``, read once from the cluster),
the step spans and step metrics from doc values (exact nanosecond dates, nothing
decompressed), ranks from a composite with ``top_hits`` per rank, the collectives and the
events the checks read whole (logs, heartbeats, fp16 loss scaling, each rank's ten longest
data waits, the first step span and loss) from ``_source``. Times never come from
``min``/``max`` aggregations, which compute in doubles (epoch nanoseconds to ~256 ns).
Every request is retried on 429 (a full search queue), 5xx and no answer.

Before either, the ranks' *packs* are read (``metrics-jobtrace.rollup-*``: each rank's rollup,
shipped at its exit; :mod:`jobtrace.store._packs`): where there are usable ones, only the events
of the ranks without one (and those with no rank) are read whole, and :func:`._packed.with_packs`
joins the two (:func:`_load_packed`), a few thousand documents for a 1,024-rank job instead of
aggregating nine million. ``whole`` reads every event and no pack.

Only ``term``/``terms``/``range``/``exists`` queries with the job id as a JSON value are
sent (no query-string parsing, so any job id is just a value). A search that reports
failed shards is an error, never a silently partial report.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from jobtrace.config import ES, ES_FLAVOR, ES_NAMESPACE, get_choice, get_str
from jobtrace.errors import BackendUnavailable, ConfigError, JobNotFound, QueryError, ServerUnavailable
from jobtrace.http import HttpConfig, RequestsTransport
from jobtrace.redact import redact_url
from jobtrace.store import METRICS, Packs, unpack
from kibana import (
    STREAM_TYPES,
    Caller,
    Cluster,
    check,
    client_caller,
    detect_cluster,
    error_reason,
    from_document,
    from_pack_document,
    iso_ns,
    make_client,
    parse_iso_ns,
    rollup_stream_name,
    validate_namespace,
)

from ._packed import unpacked_ranks, with_packs
from ._reading import TimeRange, rank_slices
from ._server_tables import Staging, load_aggregated
from ._store import JobData, ReadStats, load_events

__all__ = ["iter_job_documents", "load_elasticsearch"]

_FLAVOURS = ("elasticsearch", "opensearch", "victorialogs")

PAGE_SIZE = 10_000  # index.max_result_window, the largest page a cluster serves by default
KEEP_ALIVE = "5m"
KEEP_ALIVE_S = 300.0


def _indices(namespace: str | None) -> str:
    ns = "*" if not namespace or namespace == "*" else validate_namespace(namespace)
    return ",".join(f"{t}-jobtrace-{ns}" for t in STREAM_TYPES)


def _pack_indices(namespace: str | None) -> str:
    """The packs' data stream(s) (:func:`kibana._document.rollup_stream_name`)."""
    return rollup_stream_name("*" if not namespace or namespace == "*" else validate_namespace(namespace))


def _query(job_id: str, rng: TimeRange, ranks: list[int] | None = None, unranked: bool = False) -> dict[str, Any]:
    """The job's documents in ``rng``; with ``ranks``, only those ranks' (and, with ``unranked``, those with none)."""
    filters: list[dict[str, Any]] = [
        {"term": {"jobtrace.job": job_id}},
        {"range": {"@timestamp": {"gte": iso_ns(rng.start_ns), "lte": iso_ns(rng.end_ns),
                                  "format": "strict_date_optional_time_nanos"}}},
    ]
    if ranks is not None:
        should: list[dict[str, Any]] = [{"terms": {"jobtrace.rank": ranks}}] if ranks else []
        if unranked:
            should.append({"bool": {"must_not": [{"exists": {"field": "jobtrace.rank"}}]}})
        filters.append({"bool": {"should": should, "minimum_should_match": 1}})
    return {"bool": {"filter": filters}}


def _open_pit(call: Caller, cluster: Cluster, indices: str) -> str:
    if cluster.flavour == "opensearch":
        st, body = call("POST", f"/{indices}/_search/point_in_time", params={"keep_alive": KEEP_ALIVE})
        key = "pit_id"
    else:
        st, body = call("POST", f"/{indices}/_pit", params={"keep_alive": KEEP_ALIVE})
        key = "id"
    if st == 404:
        raise JobNotFound(f"no jobtrace data streams ({indices}) on this cluster: {error_reason(body)}")
    check(st, body, f"opening a point in time on {indices}")
    pit = body.get(key) if isinstance(body, dict) else None
    if not pit:
        raise QueryError(f"opening a point in time on {indices}: no id in the answer")
    return str(pit)


def _close_pit(call: Caller, cluster: Cluster, pit: str) -> None:
    try:
        if cluster.flavour == "opensearch":
            call("DELETE", "/_search/point_in_time", body={"pit_id": [pit]})
        else:
            call("DELETE", "/_pit", body={"id": pit})
    except Exception:  # noqa: BLE001, S110 - the PIT expires by itself after KEEP_ALIVE
        pass


def _sort(call: Caller, cluster: Cluster, indices: str) -> list[Any]:
    """The cheapest total order a point in time can page through on this cluster.

    Elasticsearch: ``_shard_doc`` (shard and Lucene doc id; a page costs its own size).
    OpenSearch has no ``_shard_doc``; ``_index`` then ``_doc`` is a total order as long
    as every backing index has one shard, which the jobtrace template sets (checked
    here); ten times faster per page than sorting on ``@timestamp`` there. Otherwise
    ``(@timestamp, event.id)``: correct for any layout, slower.
    """
    if cluster.flavour == "elasticsearch":
        return [{"_shard_doc": "asc"}]
    try:
        st, body = call("GET", f"/{indices}/_settings/index.number_of_shards",
                        params={"flat_settings": "true", "allow_no_indices": "true", "ignore_unavailable": "true"})
        shards = [v.get("settings", {}).get("index.number_of_shards") for v in (body or {}).values()] \
            if st == 200 and isinstance(body, dict) else []
    except Exception:  # noqa: BLE001 - without the privilege to read settings, take the order that is always right
        shards = []
    if shards and all(str(n) == "1" for n in shards):
        return [{"_index": "asc"}, {"_doc": "asc"}]
    return [{"@timestamp": {"order": "asc", "numeric_type": "date_nanos"}}, {"event.id": "asc"}]


def _checked(st: int, answer: Any, what: str) -> dict[str, Any]:
    """A search's answer, or the error: its status, or shards that failed (the report would be incomplete)."""
    check(st, answer, what)
    shards = answer.get("_shards") or {}
    if shards.get("failed"):
        failures = shards.get("failures") or [{}]
        raise QueryError(f"{shards['failed']} shard(s) failed while {what}: "
                         f"{error_reason(failures[0].get('reason'))}; the report would be incomplete")
    return answer  # type: ignore[no-any-return]


def iter_job_documents(call: Caller, cluster: Cluster, job_id: str, rng: TimeRange, *, namespace: str | None = None,
                       page_size: int = PAGE_SIZE, stats: ReadStats | None = None,
                       refresh: bool = True, query: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """The job's documents' ``_source``, page by page (in the order :func:`_sort` picks).

    ``query`` replaces the job's (:func:`_query`), to read some of its ranks. The next page is
    fetched on a helper thread while this one is converted (the server's work and ours overlap);
    at most three pages are held at a time.
    """
    pages = _pages(call, cluster, job_id, rng, namespace=namespace, page_size=page_size, stats=stats,
                   refresh=refresh, query=query)
    for hits in _prefetched(pages):
        for hit in hits:
            yield hit.get("_source") or {}


def _pages(call: Caller, cluster: Cluster, job_id: str, rng: TimeRange, *, namespace: str | None, page_size: int,
           stats: ReadStats | None, refresh: bool,
           query: dict[str, Any] | None = None) -> Generator[list[dict[str, Any]], None, None]:
    indices = _indices(namespace)
    if refresh:
        _refresh(call, indices)
    sort = _sort(call, cluster, indices)
    pit = _open_pit(call, cluster, indices)
    body: dict[str, Any] = {
        "size": page_size,
        "query": query or _query(job_id, rng),
        "sort": sort,
        "track_total_hits": False,
        # what from_document() does not read is not sent: a third less JSON to parse
        "_source": {"excludes": ["service", "ecs", "data_stream", "event.id", "event.kind", "event.dataset",
                                 "event.outcome", "jobtrace.phase"]},
        "pit": {"id": pit, "keep_alive": KEEP_ALIVE},
    }
    params = {"filter_path": "pit_id,_shards.failed,_shards.failures,hits.hits._source,hits.hits.sort"}
    try:
        while True:
            st, page = call("POST", "/_search", params=params, body=body)
            page = _checked(st, page, f"reading job {job_id!r} from {indices}")
            hits = (page.get("hits") or {}).get("hits") or []
            if stats is not None:
                stats.lines += len(hits)
            if hits:
                yield hits
            if len(hits) < page_size:
                return
            body["search_after"] = hits[-1]["sort"]
            body["pit"]["id"] = page.get("pit_id") or body["pit"]["id"]  # always the newest PIT id
    finally:
        _close_pit(call, cluster, body["pit"]["id"])


def _refresh(call: Caller, indices: str) -> None:
    """Events shipped in the last second are not searchable until a refresh; the job may have just ended."""
    try:
        call("POST", f"/{indices}/_refresh", params={"ignore_unavailable": "true", "allow_no_indices": "true"})
    except Exception:  # noqa: BLE001, S110 - best effort: without the privilege the periodic refresh comes
        pass


_DONE = object()


def _prefetched(pages: Generator[list[dict[str, Any]], None, None], depth: int = 2) -> Iterator[list[dict[str, Any]]]:
    """``pages``, produced on a daemon thread up to ``depth`` ahead; errors re-raised here, in order."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for page in pages:
                if not put(page):
                    return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            put(exc)
        finally:
            pages.close()  # closes the point in time

    thread = threading.Thread(target=produce, name="jobtrace-es-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=KEEP_ALIVE_S)


def _events(docs: Iterator[dict[str, Any]], stats: ReadStats) -> Iterator[dict[str, Any]]:
    for doc in docs:
        try:
            yield from_document(doc)
        except (KeyError, ValueError, TypeError, AttributeError):
            stats.skipped["not a jobtrace document"] = stats.skipped.get("not a jobtrace document", 0) + 1


# ---- tier A (queries._server_tables): the cluster sums spans and metrics per rank and step -------------
# Each request covers one slice of ranks (a range on jobtrace.rank), so no group straddles two answers and
# the slices run side by side. Times are read from ``_source`` (or sorted hits), never from min/max
# aggregations: those compute in doubles, which hold epoch nanoseconds only to ~256 ns.

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_DEFAULT_MAX_BUCKETS = 65_535
_SPAN, _METRIC = {"term": {"jobtrace.kind": "span"}}, {"term": {"jobtrace.kind": "metric"}}
_HAS_STEP = {"exists": {"field": "jobtrace.step"}}
_DUR = "event.duration"
_PHASES = {"data": "data", "fwd": "forward", "bwd": "backward", "opt": "optimizer"}
_FP16 = ("loss_scale", "overflow")
_RAW_EXCLUDES = ["service", "ecs", "data_stream", "event.id", "event.kind", "event.dataset", "event.outcome",
                 "jobtrace.phase"]


def _cat(cat: str) -> dict[str, Any]:
    return {"term": {"jobtrace.span.category": cat}}


def _has_metric(name: str) -> dict[str, Any]:
    """A metric point with a value for ``name``: a number, or NaN/±Infinity (kept as a keyword)."""
    return {"bool": {"should": [{"exists": {"field": f"jobtrace.metrics.{name}"}},
                                {"exists": {"field": f"jobtrace.nonfinite.{name}"}}], "minimum_should_match": 1}}


def _latest(fields: list[str], *, order: str = "desc") -> dict[str, Any]:
    return {"top_hits": {"size": 1, "sort": [{"@timestamp": {"order": order}}], "_source": {"includes": fields}}}


def _key_min(field: str, order: str = "asc") -> dict[str, Any]:
    """The smallest (or largest) value of a keyword field (``min``/``max`` take numbers only)."""
    return {"terms": {"field": field, "size": 1, "order": {"_key": order}}}


def retrying(call: Caller, where: str, label: str = "Elasticsearch", retries: int = 4) -> Caller:
    """``call``, tried again with backoff on 429 (``es_rejected_execution_exception``: the search queue is
    full, which parallel slices can cause), 5xx and no answer; searches and aggregations are idempotent.
    When every try failed, :class:`ServerUnavailable` names the server (``where``, without credentials)."""
    from jobtrace.http import RetryPolicy

    policy = RetryPolicy(initial_s=0.5, max_s=8.0)

    def again(method: str, path: str, params: Any = None, body: Any = None) -> tuple[int, Any]:
        for attempt in range(retries + 1):
            try:
                status, answer = call(method, path, params=params, body=body)
            except BackendUnavailable as exc:
                if attempt == retries:
                    raise ServerUnavailable(f"cannot reach {label} at {where}: {exc}") from None
            else:
                if status not in _RETRY_STATUS:
                    return status, answer
                if attempt == retries:
                    raise ServerUnavailable(f"{label} at {where} kept answering HTTP {status} to {method} {path}: "
                                            f"{error_reason(answer)}")
            time.sleep(policy.delay(attempt))
        raise AssertionError("unreachable")

    return again


def _source_at(src: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(src, dict):
            return None
        src = src.get(part)  # type: ignore[assignment]
    return src


def _hit(agg: dict[str, Any] | None) -> dict[str, Any]:
    """The ``_source`` of a ``top_hits`` answer's first hit (empty when it had none)."""
    hits = ((agg or {}).get("hits") or {}).get("hits") or []
    return hits[0].get("_source") or {} if hits else {}


def _ns(value: Any) -> int | None:
    return None if value is None else parse_iso_ns(value)


def _int(value: Any) -> int | None:
    return None if value is None else round(value)


def _first_key(agg: dict[str, Any] | None) -> Any:
    buckets = (agg or {}).get("buckets") or []
    return buckets[0]["key"] if buckets else None


class _Tier:
    """One job's tier-A requests: slices of ranks, composite aggregations paged by ``after_key``, and
    the searches (one point in time) for the collectives and the events the checks read whole."""

    def __init__(self, call: Caller, cluster: Cluster, indices: str, job: dict[str, Any], *, page_size: int,
                 bucket_page: int | None, parallel: int, stats: ReadStats) -> None:
        self.call, self.cluster, self.indices, self.job = call, cluster, indices, job
        self.page_size, self.parallel, self.stats = page_size, max(1, parallel), stats
        self.max_buckets = bucket_page or self._max_buckets()
        self.fixed_page = bucket_page is not None
        self.params = {"ignore_unavailable": "true", "allow_no_indices": "true"}
        self.lock = threading.Lock()
        self.pit = ""
        self.sort: list[Any] = []

    def _max_buckets(self) -> int:
        """``search.max_buckets`` (sub-aggregations' buckets count toward it), read once."""
        try:
            st, body = self.call("GET", "/_cluster/settings", params={
                "include_defaults": "true", "flat_settings": "true"})
        except BackendUnavailable:
            return _DEFAULT_MAX_BUCKETS
        if st != 200 or not isinstance(body, dict):
            return _DEFAULT_MAX_BUCKETS  # no cluster:monitor privilege: the default
        for part in ("transient", "persistent", "defaults"):
            value = (body.get(part) or {}).get("search.max_buckets")
            if value is not None:
                try:
                    return max(1, int(value))
                except (TypeError, ValueError):
                    break
        return _DEFAULT_MAX_BUCKETS

    def _page(self, sub_buckets: int) -> int:
        return self.max_buckets if self.fixed_page else max(1, self.max_buckets // (1 + sub_buckets))

    def query(self, *filters: dict[str, Any], must_not: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        q: dict[str, Any] = {"filter": [*self.job["bool"]["filter"], *filters]}
        if must_not:
            q["must_not"] = must_not
        return {"bool": q}

    def composite(self, query: dict[str, Any], keys: list[str], aggs: dict[str, Any],
                  sub_buckets: int, most: int | None = None) -> Iterator[dict[str, Any]]:
        """The buckets of a composite aggregation on ``keys`` (a missing key is a bucket of its own), in pages
        of at most ``most`` buckets (where each carries documents)."""
        sources = [{k.rsplit(".", 1)[-1]: {"terms": {"field": k, "missing_bucket": True}}} for k in keys]
        size = self._page(sub_buckets)
        comp: dict[str, Any] = {"size": min(size, most) if most else size, "sources": sources}
        body = {"size": 0, "track_total_hits": False, "query": query,
                "aggs": {"g": {"composite": comp, **({"aggs": aggs} if aggs else {})}}}
        while True:
            st, answer = self.call("POST", f"/{self.indices}/_search", params=self.params, body=body)
            g = (_checked(st, answer, f"aggregating job {self.job_id!r}").get("aggregations") or {}).get("g") or {}
            buckets = g.get("buckets") or []
            yield from buckets
            if len(buckets) < comp["size"] or not g.get("after_key"):
                return
            comp["after"] = g["after_key"]

    @property
    def job_id(self) -> str:
        return str(self.job["bool"]["filter"][0]["term"]["jobtrace.job"])

    def hits(self, query: dict[str, Any], source: Any) -> Iterator[dict[str, Any]]:
        """Every matching document's ``_source``, paged through the shared point in time."""
        body: dict[str, Any] = {"size": self.page_size, "query": query, "sort": self.sort, "track_total_hits": False,
                                "_source": source, "pit": {"id": self.pit, "keep_alive": KEEP_ALIVE}}
        for hits in self._paged(body, "hits.hits._source"):
            yield from (h.get("_source") or {} for h in hits)

    def _paged(self, body: dict[str, Any], returned: str) -> Iterator[list[dict[str, Any]]]:
        """Each page of hits of a point-in-time search (``body``), ``returned`` being the hit part to send back."""
        params = {"filter_path": f"_shards.failed,_shards.failures,{returned},hits.hits.sort"}
        while True:
            st, page = self.call("POST", "/_search", params=params, body=body)
            hits = (_checked(st, page, f"searching job {self.job_id!r}").get("hits") or {}).get("hits") or []
            with self.lock:
                self.stats.lines += len(hits)
            yield hits
            if len(hits) < self.page_size:
                return
            body["search_after"] = hits[-1]["sort"]

    def values(self, query: dict[str, Any], fields: list[str]) -> Iterator[dict[str, Any]]:
        """Every matching document's ``fields`` (first value each) from doc values, paged like :meth:`hits`.

        Four times faster than ``_source`` for a sparse subset of the job: nothing is decompressed
        (the streams use ``best_compression``). Dates come formatted with nanoseconds, so exact.
        """
        dates = {"@timestamp", "event.start"}
        body: dict[str, Any] = {
            "size": self.page_size, "query": query, "sort": self.sort, "track_total_hits": False, "_source": False,
            "stored_fields": "_none_", "pit": {"id": self.pit, "keep_alive": KEEP_ALIVE},
            "docvalue_fields": [{"field": f, "format": "strict_date_optional_time_nanos"} if f in dates else f
                                for f in fields]}
        for hits in self._paged(body, "hits.hits.fields"):
            for h in hits:
                yield {k: v[0] for k, v in (h.get("fields") or {}).items() if v}

    # ---- the relations -------------------------------------------------------------------------------
    def counts(self) -> tuple[dict[int, int], int]:
        """Events per rank, and events without a rank."""
        counts: dict[int, int] = {}
        unranked = 0
        for b in self.composite(self.job, ["jobtrace.rank"], {}, 0):
            rank = b["key"]["rank"]
            if rank is None:
                unranked += b["doc_count"]
            else:
                counts[int(rank)] = b["doc_count"]
        return counts, unranked

    def step_rows(self, where: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Per rank and step: the phase sums from a composite aggregation on (rank, step, name) with only a
        ``stats`` below (a filter or terms under each bucket costs OpenSearch several times more), and the
        step spans themselves (one per rank and step), summed here in exact integers."""
        rows: dict[tuple[Any, Any], dict[str, Any]] = {}
        query = self.query(where, _SPAN, _HAS_STEP, _cat("phase"))
        phase = {name: short for short, name in _PHASES.items()}
        for b in self.composite(query, ["jobtrace.rank", "jobtrace.step", "jobtrace.span.name"],
                                {"d": {"stats": {"field": _DUR}}}, 0):
            k, d = b["key"], b["d"]
            row = rows.setdefault((k["rank"], k["step"]), {"rank": k["rank"], "step": k["step"], "n_phase": 0,
                                                          "n_phase_dur": 0})
            row["n_phase"] += b["doc_count"]
            row["n_phase_dur"] += d["count"]
            if d["count"]:
                row["phase_ns"] = row.get("phase_ns", 0) + round(d["sum"])
            short = phase.get(k["name"])
            if short is not None:
                row[f"n_{short}"] = row.get(f"n_{short}", 0) + d["count"]
                if d["count"]:
                    row[f"{short}_ns"] = row.get(f"{short}_ns", 0) + round(d["sum"])
        fields = ["@timestamp", "jobtrace.rank", "jobtrace.step", "span.id", "host.name", "event.start", _DUR]
        for doc in self.values(self.query(where, _SPAN, _HAS_STEP, _cat("step")), fields):
            key = (doc.get("jobtrace.rank"), doc.get("jobtrace.step"))
            row = rows.setdefault(key, {"rank": key[0], "step": key[1]})
            row["n_step"] = row.get("n_step", 0) + 1
            dur = doc.get(_DUR)
            if dur is not None:
                row["n_step_dur"] = row.get("n_step_dur", 0) + 1
                row["step_ns"] = row.get("step_ns", 0) + dur
            ts, start = parse_iso_ns(doc["@timestamp"]), _ns(doc.get("event.start"))
            span_id, node = doc.get("span.id"), doc.get("host.name")
            if row.get("t1") is None or ts > row["t1"]:
                row["t1"] = ts
            if start is not None and (row.get("t0") is None or start < row["t0"]):
                row["t0"] = start
            if span_id is not None and (not row.get("step_span_ids") or span_id < row["step_span_ids"][0]):
                row["step_span_ids"] = [span_id]
            if node is not None and (row.get("node") is None or node < row["node"]):
                row["node"] = node
        yield from rows.values()

    def met_rows(self, where: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Per rank and step, the latest metric point and each metric's latest value, from the points
        themselves (a few per rank and step; ``top_hits`` per bucket costs OpenSearch far more)."""
        rows: dict[tuple[Any, Any], dict[str, Any]] = {}
        latest: dict[tuple[Any, Any, str], int] = {}
        fields = ["@timestamp", "jobtrace.rank", "jobtrace.step", "span.id", "host.name",
                  *(f"jobtrace.{o}.{m}" for o in ("metrics", "nonfinite") for m in METRICS)]
        for doc in self.values(self.query(where, _METRIC, _HAS_STEP), fields):
            key = (doc.get("jobtrace.rank"), doc.get("jobtrace.step"))
            ts = parse_iso_ns(doc["@timestamp"])
            row = rows.get(key)
            if row is None or ts > row["ts"]:
                row = rows[key] = (row or {}) | {"rank": key[0], "step": key[1], "ts": ts, "span_id": doc.get("span.id"),
                                                 "node": doc.get("host.name")}
            for m in METRICS:
                value = doc.get(f"jobtrace.metrics.{m}", doc.get(f"jobtrace.nonfinite.{m}"))
                if value is not None and ts >= latest.get((*key, m), ts):
                    latest[(*key, m)] = ts
                    row[m] = value
        yield from rows.values()

    def rank_rows(self, where: dict[str, Any]) -> Iterator[dict[str, Any]]:
        failed = {"bool": {"filter": [_cat("collective"), {"exists": {"field": "jobtrace.collective.error"}}]}}
        last_span = {"top_hits": {"size": 1, "sort": [
            {"@timestamp": {"order": "desc"}}, {_DUR: {"order": "desc", "missing": 0}},
            {"span.id": {"order": "desc", "missing": "_last"}}], "_source": {"includes": [
                "@timestamp", _DUR, "jobtrace.span", "span.id", "jobtrace.collective.error", "jobtrace.attrs.error",
                "jobtrace.step"]}}}
        aggs = {"node": _key_min("host.name"), "first": _latest(["@timestamp"], order="asc"),
                "last": _latest(["@timestamp"]),
                "prog": {"filter": {"bool": {"must_not": [failed]}}, "aggs": {"t": _latest(["@timestamp"])}},
                "step": {"max": {"field": "jobtrace.step"}}, "world": {"max": {"field": "jobtrace.world_size"}},
                "tlo": _key_min("trace.id"), "thi": _key_min("trace.id", "desc"),
                "ls": {"filter": _SPAN, "aggs": {"h": last_span}}}
        query = self.query(where, {"terms": {"jobtrace.kind": ["span", "metric"]}})
        for b in self.composite(query, ["jobtrace.rank"], aggs, 5):
            ls = _hit(b["ls"]["h"])
            error = _source_at(ls, "jobtrace.collective.error") or _source_at(ls, "jobtrace.attrs.error")
            traces = [t for t in (_first_key(b["tlo"]), _first_key(b["thi"])) if t is not None]
            yield {"rank": b["key"]["rank"], "node": _first_key(b["node"]),
                   "first_ts": _ns(_hit(b["first"]).get("@timestamp")), "last_ts": _ns(_hit(b["last"]).get("@timestamp")),
                   "progress_ts": _ns(_hit(b["prog"]["t"]).get("@timestamp")), "last_step": _int(b["step"]["value"]),
                   "world": _int(b["world"]["value"]), "traces": traces, "n": b["doc_count"],
                   "n_est": 0,  # see _estimated_ranks
                   **({"ls_ts": _ns(ls.get("@timestamp")), "ls_dur": _source_at(ls, _DUR),
                       "ls_name": _source_at(ls, "jobtrace.span.name"), "ls_cat": _source_at(ls, "jobtrace.span.category"),
                       "ls_span_id": _source_at(ls, "span.id"), "ls_error": error if isinstance(error, str) else None,
                       "ls_step": _source_at(ls, "jobtrace.step")} if ls else {})}

    def coll_rows(self, where: dict[str, Any]) -> Iterator[dict[str, Any]]:
        source = {"includes": ["@timestamp", "jobtrace.kind", "jobtrace.rank", "host.name", "jobtrace.step",
                               "event.start", _DUR, "span.id", "jobtrace.span", "jobtrace.collective", "jobtrace.attrs"]}
        for doc in self.hits(self.query(where, _SPAN, _cat("collective")), source):
            e = from_document(doc)
            attrs = e.get("attrs")
            if not isinstance(attrs, dict):
                attrs = {}
            yield {"rank": e.get("rank"), "node": e.get("node"), "step": e.get("step"), "ts": e["ts"],
                   "start": e.get("start"), "dur": e.get("dur"), "span_id": e.get("span_id"), "name": e.get("name"),
                   **{a: attrs.get(a) for a in ("group", "seq", "bytes", "group_size", "async", "error", "source")}}

    def raw(self, where: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The documents the checks read whole (see ``_RAW`` in :mod:`._victorialogs`)."""
        src = {"excludes": _RAW_EXCLUDES}
        fp16 = {"bool": {"should": [_has_metric(m) for m in _FP16], "minimum_should_match": 1}}
        # logs and heartbeats; the fp16 loss-scale metrics (the scaling table)
        yield from self.hits(self.query(where, {"terms": {"jobtrace.kind": ["log", "heartbeat"]}}), src)
        yield from self.hits(self.query(where, _METRIC, fp16), src)
        # each rank's ten longest data waits (cited by the data-wait finding)
        data = self.query(where, _SPAN, _cat("phase"), {"term": {"jobtrace.span.name": "data"}})
        top = {"top_hits": {"size": 10, "sort": [{_DUR: {"order": "desc"}}], "_source": src}}
        for b in self.composite(data, ["jobtrace.rank"], {"top": top}, 0, most=max(1, self.page_size // 10)):
            hits = b["top"]["hits"]["hits"]
            with self.lock:
                self.stats.lines += len(hits)
            yield from (h.get("_source") or {} for h in hits)
        # the first step span and the first loss (where training settled, for the overflow check)
        for query in (self.query(where, _SPAN, _cat("step")),
                      self.query(where, _METRIC, _has_metric("loss"), must_not=[fp16])):
            body = {"size": 1, "query": query, "sort": [{"@timestamp": {"order": "asc"}}], "_source": src,
                    "track_total_hits": False}
            st, answer = self.call("POST", f"/{self.indices}/_search", params=self.params, body=body)
            hits = (_checked(st, answer, f"searching job {self.job_id!r}").get("hits") or {}).get("hits") or []
            with self.lock:
                self.stats.lines += len(hits)
            yield from (h.get("_source") or {} for h in hits)


def _pool_for(client: Any, cluster: Cluster, parallel: int) -> None:
    """Room for ``parallel`` kept-alive connections.

    opensearch-py's urllib3 pool keeps one connection, so the slices' threads would open a new one per
    request and log "Connection pool is full" for each. Its transport rebuilds the connection with the
    larger pool (``pool_maxsize``, which :func:`kibana.make_client` does not pass); elastic-transport
    keeps ten per node already. Best effort: another opensearch-py keeps the default.
    """
    transport = getattr(client, "transport", None)
    if cluster.flavour != "opensearch" or transport is None or not hasattr(transport, "pool_maxsize"):
        return
    old = getattr(transport, "connection_pool", None)
    try:
        transport.pool_maxsize = max(parallel, 1)
        del transport.connection_pool  # else set_connections keeps the connection it has
        transport.set_connections(transport.hosts)
    except (AttributeError, TypeError):
        if old is not None and not hasattr(transport, "connection_pool"):
            transport.connection_pool = old
        return
    if old is not None:
        old.close()


def aggregate_elasticsearch(tier: _Tier, staging: Staging) -> tuple[list[dict[str, Any]], int, int]:
    """Stage the job's per rank × step rows and return ``(events fetched whole, events in the job, collectives)``."""
    counts, unranked = tier.counts()
    total = sum(counts.values()) + unranked
    if not total:
        return [], 0, 0
    slices: list[dict[str, Any]] = [{"range": {"jobtrace.rank": {"gte": lo, "lt": hi}}}
                                    for lo, hi in rank_slices(counts, 2_000_000, tier.parallel)]
    if unranked:
        slices.append({"bool": {"must_not": [{"exists": {"field": "jobtrace.rank"}}]}})
    relations: dict[str, Callable[[dict[str, Any]], Iterator[dict[str, Any]]]] = {
        "step_rows": tier.step_rows, "met_rows": tier.met_rows, "rank_rows": tier.rank_rows,
        "coll_rows": tier.coll_rows}
    raw: list[dict[str, Any]] = []
    rank_rows: list[dict[str, Any]] = []
    colls = 0

    def run(task: tuple[str, dict[str, Any]]) -> None:
        nonlocal colls
        what, where = task
        if what == "raw":
            events = list(_events(tier.raw(where), tier.stats))
            with tier.lock:
                raw.extend(events)
            return
        if what == "rank_rows":
            found = list(tier.rank_rows(where))
            with tier.lock:
                rank_rows.extend(found)
            return
        rows = [orjson.dumps(r) for r in relations[what](where)]
        staging.add(what, b"\n".join(rows) + b"\n" if rows else b"", len(rows))
        if what == "coll_rows":
            with tier.lock:
                colls += len(rows)

    indices = tier.indices
    tier.sort = _sort(tier.call, tier.cluster, indices)
    tier.pit = _open_pit(tier.call, tier.cluster, indices)
    try:
        tasks = [(what, where) for where in slices for what in (*relations, "raw")]
        with ThreadPoolExecutor(tier.parallel, thread_name_prefix="jobtrace-es-agg") as pool:
            list(pool.map(run, tasks))
    finally:
        _close_pit(tier.call, tier.cluster, tier.pit)
    _estimated_ranks(rank_rows, raw)
    staging.add("rank_rows", b"".join(orjson.dumps(r) + b"\n" for r in rank_rows), len(rank_rows))
    return raw, total, colls


def _estimated_ranks(rank_rows: list[dict[str, Any]], raw: list[dict[str, Any]]) -> None:
    """``n_est`` of each rank row, from the events fetched whole.

    ``rank_est`` lives in ``jobtrace.extra``, which is stored, not indexed, so the cluster cannot count
    it. Ingest marks every line of a writer whose rank it numbered itself, so a rank whose fetched logs
    and heartbeats all say ``rank_est`` is taken to be estimated in its spans and metrics too (wrong
    only for a writer of that rank with spans or metrics and not one log line).
    """
    est: dict[Any, bool] = {}
    for event in raw:
        rank = event.get("rank")
        est[rank] = est.get(rank, True) and event.get("rank_est") is True
    for row in rank_rows:
        row["n_est"] = row["n"] if est.get(row["rank"]) else 0


# ---- packs (jobtrace.store._packs): the ranks' rollups, read instead of their events ----------------------------
PACK_PAGE = 200
"""Pack documents per search page: each holds up to 128 KiB of base64, so a page is at most ~26 MB of JSON."""


def read_packs(call: Caller, job_id: str, rng: TimeRange, *, namespace: str | None = None,
               page_size: int = PACK_PAGE) -> Packs:
    """The job's packs in ``rng``, unpacked (:func:`jobtrace.store.unpack`); none where the packs' data stream is
    missing (a cluster set up before packs, a job shipped without them).

    Paged with ``search_after`` on (rank, ``event.id``): ``event.id`` is the hash of the pack line, so
    two documents tie only when they are copies of one record (a replay stored twice), and skipping
    one of those at a page boundary loses nothing. No point in time is needed for a few thousand
    documents written once, when their rank exited.
    """
    indices = _pack_indices(namespace)
    query = _query(job_id, rng)
    query["bool"]["filter"] += [{"term": {"jobtrace.kind": "rollup"}}, {"exists": {"field": "jobtrace.rank"}}]
    body: dict[str, Any] = {"size": page_size, "query": query, "track_total_hits": False,
                            "sort": [{"jobtrace.rank": "asc"}, {"event.id": "asc"}],
                            "_source": {"excludes": ["data_stream", "event"]}}
    params = {"ignore_unavailable": "true", "allow_no_indices": "true",
              "filter_path": "_shards.failed,_shards.failures,hits.hits._source,hits.hits.sort"}

    def records() -> Iterator[dict[str, Any]]:
        while True:
            st, page = call("POST", f"/{indices}/_search", params=params, body=body)
            if st == 404:  # index_not_found: no packs on this cluster
                return
            page = _checked(st, page, f"reading the packs of job {job_id!r} from {indices}")
            hits = (page.get("hits") or {}).get("hits") or []
            for hit in hits:
                try:
                    yield from_pack_document(hit.get("_source") or {})
                except (KeyError, ValueError, TypeError):
                    continue  # not a pack document: unpack() never sees it, the rank is read whole
            if len(hits) < page_size:
                return
            body["search_after"] = hits[-1]["sort"]

    return unpack(records(), start_ns=rng.start_ns, end_ns=rng.end_ns)


def _load_packed(call: Caller, cluster: Cluster, job_id: str, packs: Packs, rng: TimeRange, *,
                 namespace: str | None, page_size: int, bucket_page: int | None, source: str) -> JobData:
    """The job from ``packs`` plus, read whole, the events of the ranks they do not stand for and of no rank.

    Consumes ``packs`` (closed on any error too). The server's events per rank come from one composite
    aggregation (:meth:`_Tier.counts`): a rank with more events there than its pack stands for is read whole.
    """
    try:
        stats = ReadStats()
        tier = _Tier(call, cluster, _indices(namespace), _query(job_id, rng), page_size=page_size,
                     bucket_page=bucket_page, parallel=1, stats=stats)
        counts, unranked = tier.counts()
        others = unpacked_ranks(packs, counts)
        events: Iterator[dict[str, Any]] = iter(())
        if others or unranked:
            docs = iter_job_documents(call, cluster, job_id, rng, namespace=namespace, page_size=page_size,
                                      stats=stats, refresh=False, query=_query(job_id, rng, others, bool(unranked)))
            events = _events(docs, stats)
        job = load_events(job_id, events, source, stats, empty_ok=True)
    except BaseException:
        packs.close()
        raise
    return with_packs(job, packs, sum(counts.values()) + unranked)


def load_elasticsearch(job_id: str, *, url: str | None = None, time_range: TimeRange, namespace: str | None = None,
                       page_size: int = PAGE_SIZE, flavour: str | None = None, config: HttpConfig | None = None,
                       parallel: int = 4, whole: bool = False, bucket_page: int | None = None,
                       pack_page: int = PACK_PAGE, packs: bool = True, **_: Any) -> JobData:
    """Load ``job_id`` from Elasticsearch/OpenSearch (``--url`` or ``JOBTRACE_ES_URL``) into DuckDB.

    ``namespace`` (or ``JOBTRACE_ES_NAMESPACE``) narrows the search to one namespace;
    by default every ``*-jobtrace-*`` data stream is read.

    The ranks' packs (:func:`read_packs`) come first, unless ``packs`` is false: where some are usable,
    only the other ranks' events are read (:func:`_load_packed`). Otherwise the cluster aggregates the spans and metrics per rank and step (:mod:`._server_tables`), in
    ``parallel`` slices of ranks, unless ``whole`` asks for every event (the timeline and Perfetto
    views draw them all) or the job recorded no collective (then phases may stand in for them, and
    that inference reads the phase spans themselves). ``bucket_page`` fixes the composite
    aggregations' page (by default ``search.max_buckets`` shared among each bucket's sub-aggregations);
    ``pack_page`` the pack documents per search (:data:`PACK_PAGE`).
    """
    cfg = config or HttpConfig.from_env(ES.prefix, url=url)
    namespace = namespace or get_str(ES_NAMESPACE)
    where = redact_url(cfg.url)
    raw = RequestsTransport(cfg)
    try:
        cluster = detect_cluster(raw, cfg.url, cfg.timeout_s, flavour or get_choice(ES_FLAVOR, _FLAVOURS))
    finally:
        raw.close()
    if cluster.flavour == "victorialogs":
        raise ConfigError(f"{where} is VictoriaLogs' Elasticsearch ingest endpoint; read it with "
                          "--backend victorialogs")
    client = make_client(cfg, cluster)
    stats = ReadStats()
    source = f"elasticsearch:{where} ({cluster.label})"
    not_found = JobNotFound(
        f"no events for job {job_id!r} in {_indices(namespace)} at {where} between "
        f"{iso_ns(time_range.start_ns)[:19]}Z and {iso_ns(time_range.end_ns)[:19]}Z "
        "(widen it with --since/--until)")
    try:
        call = retrying(client_caller(client, cluster), where, cluster.label)
        if not whole:
            indices = _indices(namespace)
            _refresh(call, f"{indices},{_pack_indices(namespace)}" if packs else indices)
            packed = read_packs(call, job_id, time_range, namespace=namespace, page_size=pack_page) if packs else None
            if packed is not None and packed.ranks:
                return _load_packed(call, cluster, job_id, packed, time_range, namespace=namespace,
                                    page_size=page_size, bucket_page=bucket_page, source=source)
            if packed is not None:
                packed.close()
            _pool_for(client, cluster, parallel)
            tier = _Tier(call, cluster, indices, _query(job_id, time_range), page_size=page_size,
                         bucket_page=bucket_page, parallel=parallel, stats=stats)
            staging = Staging()
            try:
                events, total, colls = aggregate_elasticsearch(tier, staging)
            except BaseException:
                staging.close()
                raise
            if total == 0:
                staging.close()
                raise not_found
            if colls:
                return load_aggregated(job_id, events, staging, source, stats, total)
            staging.close()
            stats = ReadStats()
        docs = iter_job_documents(call, cluster, job_id, time_range, namespace=namespace, page_size=page_size,
                                  stats=stats, refresh=whole)
        try:
            return load_events(job_id, _events(docs, stats), source, stats)
        except JobNotFound:
            raise not_found from None
    finally:
        client.close()
