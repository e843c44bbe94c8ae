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

Only a ``term`` query on ``jobtrace.job`` with the job id as a JSON value is sent (no
query-string parsing, so any job id is just a value), plus a ``range`` on
``@timestamp``. A search that reports failed shards is an error, never a silently
partial report.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import Any

from jobtrace.config import ES, ES_FLAVOR, ES_NAMESPACE, get_choice, get_str
from jobtrace.errors import ConfigError, JobNotFound, QueryError
from jobtrace.http import HttpConfig, RequestsTransport
from jobtrace.redact import redact_url
from kibana import (
    STREAM_TYPES,
    Caller,
    Cluster,
    check,
    client_caller,
    detect_cluster,
    error_reason,
    from_document,
    iso_ns,
    make_client,
    validate_namespace,
)

from ._reading import TimeRange
from ._store import JobData, ReadStats, load_events

__all__ = ["iter_job_documents", "load_elasticsearch"]

_FLAVOURS = ("elasticsearch", "opensearch", "victorialogs")

PAGE_SIZE = 10_000  # index.max_result_window, the largest page a cluster serves by default
KEEP_ALIVE = "5m"
KEEP_ALIVE_S = 300.0


def _indices(namespace: str | None) -> str:
    ns = "*" if not namespace or namespace == "*" else validate_namespace(namespace)
    return ",".join(f"{t}-jobtrace-{ns}" for t in STREAM_TYPES)


def _query(job_id: str, rng: TimeRange) -> dict[str, Any]:
    return {"bool": {"filter": [
        {"term": {"jobtrace.job": job_id}},
        {"range": {"@timestamp": {"gte": iso_ns(rng.start_ns), "lte": iso_ns(rng.end_ns),
                                  "format": "strict_date_optional_time_nanos"}}},
    ]}}


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


def iter_job_documents(call: Caller, cluster: Cluster, job_id: str, rng: TimeRange, *, namespace: str | None = None,
                       page_size: int = PAGE_SIZE, stats: ReadStats | None = None,
                       refresh: bool = True) -> Iterator[dict[str, Any]]:
    """The job's documents' ``_source``, page by page (in the order :func:`_sort` picks).

    The next page is fetched on a helper thread while this one is converted (the
    server's work and ours overlap); at most three pages are held at a time.
    """
    pages = _pages(call, cluster, job_id, rng, namespace=namespace, page_size=page_size, stats=stats,
                   refresh=refresh)
    for hits in _prefetched(pages):
        for hit in hits:
            yield hit.get("_source") or {}


def _pages(call: Caller, cluster: Cluster, job_id: str, rng: TimeRange, *, namespace: str | None, page_size: int,
           stats: ReadStats | None, refresh: bool) -> Generator[list[dict[str, Any]], None, None]:
    indices = _indices(namespace)
    if refresh:
        # Events shipped in the last second are not searchable until a refresh; the job may have just ended.
        try:
            call("POST", f"/{indices}/_refresh", params={"ignore_unavailable": "true", "allow_no_indices": "true"})
        except Exception:  # noqa: BLE001, S110 - best effort: without the privilege the periodic refresh comes
            pass
    sort = _sort(call, cluster, indices)
    pit = _open_pit(call, cluster, indices)
    body: dict[str, Any] = {
        "size": page_size,
        "query": _query(job_id, rng),
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
            check(st, page, f"searching {indices} for job {job_id!r}")
            shards = page.get("_shards") or {}
            if shards.get("failed"):
                failures = shards.get("failures") or [{}]
                raise QueryError(f"{shards['failed']} shard(s) failed while reading job {job_id!r}: "
                                 f"{error_reason(failures[0].get('reason'))}; the report would be incomplete")
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


def load_elasticsearch(job_id: str, *, url: str | None = None, time_range: TimeRange, namespace: str | None = None,
                       page_size: int = PAGE_SIZE, flavour: str | None = None, config: HttpConfig | None = None,
                       **_: Any) -> JobData:
    """Load ``job_id`` from Elasticsearch/OpenSearch (``--url`` or ``JOBTRACE_ES_URL``) into DuckDB.

    ``namespace`` (or ``JOBTRACE_ES_NAMESPACE``) narrows the search to one namespace;
    by default every ``*-jobtrace-*`` data stream is read.
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
    try:
        call = client_caller(client, cluster)
        docs = iter_job_documents(call, cluster, job_id, time_range, namespace=namespace, page_size=page_size,
                                  stats=stats)
        try:
            return load_events(job_id, _events(docs, stats), source, stats)
        except JobNotFound:
            raise JobNotFound(
                f"no events for job {job_id!r} in {_indices(namespace)} at {where} between "
                f"{iso_ns(time_range.start_ns)[:19]}Z and {iso_ns(time_range.end_ns)[:19]}Z "
                "(widen it with --since/--until)") from None
    finally:
        client.close()
