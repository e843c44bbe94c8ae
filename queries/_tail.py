"""Following a running job: the events its ranks write, as they write them, from the store or a server.

* :class:`LocalTail`, the embedded store: each process of the job appends JSON lines to its own file
  (``jobtrace.store``); new ranks add new files. It keeps an offset per file and returns only the
  events written since the last call: complete lines only (a line still being written stays for the
  next call), torn or corrupt ones counted and skipped. It never reads a file twice, so following a
  job costs what the job writes.
* the servers' tails (:class:`VictoriaLogsTail`, :class:`LokiTail`, :class:`ElasticsearchTail`): each
  call asks for the job's events of the last ``lookback_s`` seconds (ranks ship on their own clocks and
  batches, so an event can arrive after a later one of another rank) and returns those not seen before;
  one query a call (paged where the window holds more than a page), bounded by the lookback, never by
  the job's length. An event that arrives more than ``lookback_s`` late is not seen (raise the lookback
  where shipping lags that much).

:func:`open_tail` picks one by the backend's name, the names ``trace-job --backend`` takes.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import orjson

from jobtrace.errors import JobNotFound
from jobtrace.store import job_dir

__all__ = ["TAIL_BACKENDS", "ElasticsearchTail", "LocalTail", "LokiTail", "Tail", "VictoriaLogsTail", "open_tail"]

_MAX_READ = 64 << 20
"""Bytes read from one file per call at most: a job that writes faster is caught up with over several calls."""


class Tail(Protocol):
    """The new events of one job, a batch per :meth:`read`."""

    where: str
    """Where the events are read from, for messages (no credentials)."""
    skipped: int
    """Lines or documents that were not events of the job (torn, corrupt, another schema)."""
    bytes_read: int
    requests: int
    """Queries sent to a server (0 for the embedded store)."""

    def exists(self) -> bool:
        """Whether the job has any event yet (a server: in the lookback)."""
        ...

    def read(self) -> list[dict[str, Any]]:
        """The events that arrived since the last call."""
        ...


class LocalTail:
    """The new events of ``job_id`` in the store at ``data_dir``, a batch per :meth:`read`."""

    def __init__(self, data_dir: str | os.PathLike[str], job_id: str) -> None:
        self.directory = job_dir(data_dir, job_id)
        self.job_id = job_id
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.where = str(data_dir)
        self.skipped = 0
        self.bytes_read = 0
        self.requests = 0

    def exists(self) -> bool:
        return self.directory.is_dir() and any(self.directory.glob("*.jsonl"))

    def read(self) -> list[dict[str, Any]]:
        """The events appended since the last call (every event of the job on the first)."""
        if not self.directory.is_dir():
            raise JobNotFound(f"no job {self.job_id!r} in the embedded store at {self.directory.parent}")
        out: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            try:
                size = path.stat().st_size
            except OSError:  # removed meanwhile (compacted): its segment holds the same lines
                continue
            if size < offset:  # rewritten from the start: read it again
                offset, self._partial[path] = 0, b""
            if size == offset:
                continue
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(min(size - offset, _MAX_READ))
            self._offsets[path] = offset + len(data)
            self.bytes_read += len(data)
            data = self._partial.pop(path, b"") + data
            cut = data.rfind(b"\n") + 1
            if cut < len(data):
                self._partial[path] = data[cut:]
            for line in data[:cut].splitlines():
                if not line.strip():
                    continue
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    self.skipped += 1
                    continue
                if isinstance(event, dict) and "kind" in event and "ts" in event:
                    out.append(event)
                else:
                    self.skipped += 1
        return out


_Row = tuple[bytes, "str | dict[str, Any]"]
"""A server's answer for one event: a key unique to it, and its JSON line or its decoded event."""


class _WindowTail:
    """What the server tails share: the lookback window, and the events already returned (by key) while
    they are inside it. A subclass says how to list a window's events (:meth:`_window`)."""

    def __init__(self, job_id: str, lookback_s: float) -> None:
        self.job_id = job_id
        self.lookback_ns = int(lookback_s * 1e9)
        self._seen: dict[bytes, int] = {}  # key -> the event's ts (or when a non-event was first skipped)
        self.skipped = 0
        self.bytes_read = 0
        self.requests = 0

    def _window(self, start_ns: int, end_ns: int, limit: int | None) -> Iterable[_Row]:
        raise NotImplementedError

    def exists(self) -> bool:
        now = time.time_ns()
        return any(True for _ in self._window(now - self.lookback_ns, now + 10**9, 1))

    def read(self) -> list[dict[str, Any]]:
        now = time.time_ns()
        out: list[dict[str, Any]] = []
        for key, item in self._window(now - self.lookback_ns, now + 10**9, None):
            if key in self._seen:
                continue
            event = self._event(item)
            if event is None:
                self.skipped += 1
                self._seen[key] = now
                continue
            self._seen[key] = int(event["ts"])
            out.append(event)
        if out or len(self._seen) > 100_000:
            horizon = now - 2 * self.lookback_ns
            self._seen = {k: ts for k, ts in self._seen.items() if ts >= horizon}
        return out

    def _event(self, item: str | dict[str, Any]) -> dict[str, Any] | None:
        if isinstance(item, str):
            self.bytes_read += len(item)
            try:
                item = orjson.loads(item)
            except orjson.JSONDecodeError:
                return None
        if not isinstance(item, dict) or item.get("job") != self.job_id or "ts" not in item or "kind" not in item:
            return None
        return item


def _line_key(line: str) -> bytes:
    return hashlib.blake2b(line.encode(), digest_size=16).digest()


class VictoriaLogsTail(_WindowTail):
    """The new events of ``job_id`` in VictoriaLogs at ``url`` (``JOBTRACE_VL_*`` credentials)."""

    def __init__(self, job_id: str, url: str | None = None, *, lookback_s: float = 30.0, transport: Any = None) -> None:
        from jobtrace import config
        from jobtrace.http import HttpConfig, RequestsTransport
        from jobtrace.redact import url_for_display
        from jobtrace.store import PACK_KIND
        from loki import job_label, logsql_quote

        from ._victorialogs import VictoriaLogsReader

        super().__init__(job_id, lookback_s)
        http = HttpConfig.from_env(config.VL.prefix, url)
        self.where = f"VictoriaLogs at {url_for_display(http.url)}"
        self.reader = VictoriaLogsReader(http.url, transport or RequestsTransport(http), tenant=http.tenant,
                                         timeout_s=30.0, retries=1)
        # The job's events, not its ranks' packs (kind="rollup": their rollups, which are not events to show).
        self.selector = ("{" + job_label() + "=" + logsql_quote(job_id) + ", kind!=" + logsql_quote(PACK_KIND)
                         + "} | fields _msg")

    def _window(self, start_ns: int, end_ns: int, limit: int | None) -> Iterator[_Row]:
        self.requests += 1
        query = self.selector + (f" | limit {limit}" if limit else "")
        for row in self.reader.query(query, start_ns, end_ns):
            line = row.get("_msg", "")
            yield _line_key(line), line


class LokiTail(_WindowTail):
    """The new events of ``job_id`` in Loki at ``url`` (``JOBTRACE_LOKI_*`` credentials and tenant): the query
    library's ``job_events`` selector over the lookback, paged forward like ``trace-job``'s reader."""

    def __init__(self, job_id: str, url: str | None = None, *, lookback_s: float = 30.0, transport: Any = None) -> None:
        import loki
        from jobtrace import config
        from jobtrace.http import HttpConfig, RequestsTransport
        from jobtrace.redact import url_for_display

        from ._loki import LokiReader

        super().__init__(job_id, lookback_s)
        http = HttpConfig.from_env(config.LOKI.prefix, url)
        self.where = f"Loki at {url_for_display(http.url)}"
        self.reader = LokiReader(http.url, transport or RequestsTransport(http), tenant=http.tenant,
                                 limit=config.get_int(config.LOKI_QUERY_LIMIT, default=5000, minimum=2) or 5000,
                                 parallel=1)
        self.selector = loki.library(loki.job_label()).render("job_events", job=job_id)

    def _window(self, start_ns: int, end_ns: int, limit: int | None) -> Iterator[_Row]:
        before = self.reader.counters.requests
        rows = self.reader.fetch_window(self.selector, start_ns, end_ns)
        self.requests += self.reader.counters.requests - before
        for _, line in rows:
            yield _line_key(line), line


class ElasticsearchTail(_WindowTail):
    """The new events of ``job_id`` in Elasticsearch or OpenSearch at ``url`` (``JOBTRACE_ES_*``): a ``term`` on
    the job and a ``range`` on ``@timestamp``, sorted by time and ``event.id`` (the document id, a hash of the
    event) and paged with ``search_after``. No refresh is forced: the index's own (every second while it is
    searched) makes new events visible, at a second's delay."""

    PAGE = 5000

    def __init__(self, job_id: str, url: str | None = None, *, lookback_s: float = 30.0,
                 namespace: str | None = None) -> None:
        from jobtrace.config import ES, ES_FLAVOR, ES_NAMESPACE, get_choice, get_str
        from jobtrace.errors import ConfigError
        from jobtrace.http import HttpConfig, RequestsTransport
        from jobtrace.redact import url_for_display
        from kibana import client_caller, detect_cluster, make_client

        from ._elasticsearch import _FLAVOURS, _indices

        super().__init__(job_id, lookback_s)
        cfg = HttpConfig.from_env(ES.prefix, url=url)
        self.where = f"Elasticsearch at {url_for_display(cfg.url)}"
        raw = RequestsTransport(cfg)
        try:
            cluster = detect_cluster(raw, cfg.url, cfg.timeout_s, get_choice(ES_FLAVOR, _FLAVOURS))
        finally:
            raw.close()
        if cluster.flavour == "victorialogs":
            raise ConfigError(f"{url_for_display(cfg.url)} is VictoriaLogs' Elasticsearch ingest endpoint; watch it "
                              "with --backend victorialogs")
        self.where = f"{cluster.label or cluster.flavour} at {url_for_display(cfg.url)}"
        self.client = make_client(cfg, cluster)
        self.call = client_caller(self.client, cluster)
        self.indices = _indices(namespace or get_str(ES_NAMESPACE))

    def _window(self, start_ns: int, end_ns: int, limit: int | None) -> Iterator[_Row]:
        from jobtrace.errors import QueryError
        from kibana import check, from_document

        from ._elasticsearch import _query
        from ._reading import TimeRange

        body: dict[str, Any] = {
            "query": _query(self.job_id, TimeRange(start_ns, end_ns)), "size": limit or self.PAGE,
            "sort": [{"@timestamp": {"order": "asc", "numeric_type": "date_nanos"}}, {"event.id": "asc"}],
            "track_total_hits": False}
        while True:
            self.requests += 1
            status, answer = self.call("POST", f"/{self.indices}/_search", body=body,
                                       params={"ignore_unavailable": "true", "allow_no_indices": "true"})
            check(status, answer, f"searching {self.indices}")
            if (answer.get("_shards") or {}).get("failed"):
                raise QueryError(f"searching {self.indices}: {answer['_shards']['failed']} shard(s) failed")
            hits = (answer.get("hits") or {}).get("hits") or []
            for hit in hits:
                try:
                    event: str | dict[str, Any] = from_document(hit.get("_source") or {})
                except (KeyError, ValueError, TypeError, AttributeError):
                    event = ""  # not a jobtrace document: counted as skipped
                yield str(hit.get("_id")).encode(), event
            if limit or len(hits) < self.PAGE:
                return
            body["search_after"] = hits[-1]["sort"]


TAIL_BACKENDS = ("local", "loki", "victorialogs", "elasticsearch")
"""The backends ``jobtrace watch`` follows, by ``trace-job``'s names for them."""


def open_tail(backend: str, job_id: str, *, data_dir: str | os.PathLike[str] = "jobtrace-data", url: str | None = None,
              lookback_s: float = 30.0) -> Tail:
    """The tail of ``job_id`` on ``backend`` (one of :data:`TAIL_BACKENDS`)."""
    if backend == "local":
        return LocalTail(data_dir, job_id)
    if backend == "loki":
        return LokiTail(job_id, url, lookback_s=lookback_s)
    if backend == "victorialogs":
        return VictoriaLogsTail(job_id, url, lookback_s=lookback_s)
    if backend == "elasticsearch":
        return ElasticsearchTail(job_id, url, lookback_s=lookback_s)
    from jobtrace.errors import ConfigError

    raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(TAIL_BACKENDS)}")
