"""The Elasticsearch/OpenSearch shipper: ``_bulk`` over the shared spooling sender.

:class:`ElasticsearchShipper` is a :class:`~shippers.SpoolingSender` (disk spool, retry
with backoff and ``Retry-After``, dead-letter file, one request in flight) around
:class:`EsBulkEncoder`, the only Elasticsearch-specific part:

* ``request(lines)``: one ``POST /_bulk`` of ``create`` actions (data streams take
  nothing else) into ``logs-``, ``metrics-`` or ``traces-jobtrace-<namespace>``, each
  canonical line mapped to an ECS document (:mod:`kibana`) with a
  deterministic ``_id``: a batch replayed after a crash or a lost response comes back
  as ``409 version_conflict_engine_exception``, which counts as stored. No duplicates.
* ``outcome(lines, response)``: reads every item of the bulk response. ``201`` and
  ``409`` are accepted; ``429``, ``5xx`` and the transient cluster errors (rejected
  execution, unavailable shards, a read-only block while the disk is full) are
  retried with backoff, only those lines; anything else (a mapping or parse error:
  ``mapper_parsing_exception``, ``document_parsing_exception``…) goes to the
  dead-letter file with the server's reason, and is counted.
* a rank's *pack* (a line with ``"kind":"rollup"``, :mod:`jobtrace.store._packs`) goes, with
  its own deterministic ``_id``, to ``metrics-jobtrace.rollup-<namespace>``
  (:func:`kibana._document.pack_document`), which no event reader searches. Not to
  VictoriaLogs' ``_bulk``: the shipper says so with :attr:`ElasticsearchShipper.takes_packs`
  (VictoriaLogs gets packs as raw lines from its own shipper).

The shipper speaks raw HTTP through :class:`~shippers.RequestsTransport` (API key,
basic or bearer auth; TLS with the system or a given CA, verification on by default;
see :meth:`~shippers.HttpConfig.from_env`), so retrying and spooling stay in the one
shared core and a training process never imports a search client. Flavour detection
and template installation (``GET /``, then the templates; see
:mod:`kibana`) happen once, on the sender thread, before the first bulk
request, so an unreachable server at start costs nothing but a retry later.

Environment (besides ``JOBTRACE_ES_URL`` and the credentials):

``JOBTRACE_ES_NAMESPACE``      data stream namespace (default ``default``)
``JOBTRACE_ES_SETUP``          ``auto`` (default): install the templates on first use when they are
                               missing or older, creating retention policies only if absent; ``off``
``JOBTRACE_ES_FLAVOR``         ``elasticsearch``, ``opensearch`` or ``victorialogs``: skip ``GET /``
``JOBTRACE_ES_LOGS_RETENTION`` / ``_METRICS_RETENTION`` / ``_TRACES_RETENTION``: retention for
                               policies the shipper creates (7d / 365d / as logs)
``JOBTRACE_ES_BATCH_LINES``    events per bulk request (default 2000)
``JOBTRACE_ES_BATCH_BYTES``    canonical bytes per bulk request (default 4 MiB; the request is ~2x)
``JOBTRACE_ES_COMPRESS``       ``1``: gzip request bodies (for slow links)
``OTEL_SERVICE_NAME``          ``service.name`` of the documents (default ``jobtrace``)

A ``JOBTRACE_ES_URL`` ending in ``/insert/elasticsearch`` is taken for VictoriaLogs'
bulk endpoint: the same documents go there with ``_time_field=@timestamp`` and
``_msg_field=message`` (VictoriaLogs ignores ids, so replays are not de-duplicated).
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import orjson

from jobtrace.config import (
    ES,
    ES_BATCH_BYTES,
    ES_BATCH_LINES,
    ES_COMPRESS,
    ES_FLAVOR,
    ES_NAMESPACE,
    ES_SETUP,
    OTEL_SERVICE_NAME,
    get_bool,
    get_choice,
    get_int,
    get_str,
)
from jobtrace.errors import BackendUnavailable, ConfigError
from jobtrace.http import HttpConfig, Request, RequestsTransport, Response, RetryPolicy, Transport
from jobtrace.redact import redact_url
from kibana import (
    STREAM_TYPES,
    Cluster,
    Retention,
    constant_fields,
    data_stream_name,
    detect_cluster,
    doc_id,
    document_core,
    install,
    is_pack,
    is_victorialogs,
    pack_constant_fields,
    pack_document,
    rollup_stream_name,
    templates_current,
    transport_caller,
    validate_namespace,
)

from ._sender import Outcome, SpoolingSender

if TYPE_CHECKING:
    from ._process import ProcessInfo

__all__ = ["ElasticsearchShipper", "EsBulkEncoder", "SetupOnFirstUse"]

_log = logging.getLogger("jobtrace.export")

RETRY_ITEM_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""Bulk item statuses worth another try (the rest of 4xx is the document's fault)."""

RETRY_ITEM_ERRORS = frozenset({
    "es_rejected_execution_exception",
    "opensearch_rejected_execution_exception",
    "rejected_execution_exception",
    "unavailable_shards_exception",
    "cluster_block_exception",  # read-only while the flood-stage disk watermark is exceeded
    "no_shard_available_action_exception",
    "node_closed_exception",
    "circuit_breaking_exception",
    "process_cluster_event_timeout_exception",
})
"""Item error types that are the cluster's temporary state, whatever their status."""

CONFIG_STATUSES = frozenset({301, 302, 307, 308, 401, 403, 404, 405})
"""Whole-request answers that mean a wrong URL or credentials: keep the data spooled and say so."""


_PACK = "rollup"
"""The encoder's key for the packs' data stream, beside the event stream types."""


class EsBulkEncoder:
    """Canonical lines → one ``_bulk`` request; bulk response → which lines to retry or dead-letter."""

    name = "elasticsearch"

    def __init__(self, url: str, *, namespace: str = "default", service_name: str = "jobtrace",
                 max_batch_lines: int = 2000, max_batch_bytes: int = 4 << 20, compress: bool = False,
                 victorialogs: bool | None = None) -> None:
        self.namespace = validate_namespace(namespace)
        self.max_batch_lines = max_batch_lines
        self.max_batch_bytes = max_batch_bytes
        self.compress = compress
        base = url.rstrip("/")
        self.victorialogs = is_victorialogs(base) if victorialogs is None else victorialogs
        if self.victorialogs:
            query = {"_time_field": "@timestamp", "_msg_field": "message",
                     "_stream_fields": "data_stream.type,jobtrace.job,host.name"}
        else:
            # Only what outcome() reads: a bulk answer for 2,000 items shrinks from ~400 KB to ~40 KB.
            query = {"filter_path": "errors,items.*.status,items.*.error"}
        self.url = f"{base}/_bulk?{urlencode(query)}"
        self._headers = {"Content-Type": "application/x-ndjson", "Accept": "application/json"}
        if compress:
            self._headers["Content-Encoding"] = "gzip"
        self._action = {t: b'{"create":{"_index":"' + data_stream_name(t, namespace).encode() + b'","_id":"'
                        for t in STREAM_TYPES}
        self._tail = {t: b"," + orjson.dumps(constant_fields(t, namespace, service_name))[1:] + b"\n"
                      for t in STREAM_TYPES}
        self._action[_PACK] = b'{"create":{"_index":"' + rollup_stream_name(namespace).encode() + b'","_id":"'
        self._tail[_PACK] = b"," + orjson.dumps(pack_constant_fields(namespace))[1:] + b"\n"
        self.duplicates = 0
        """Items the server already had (409): replays made harmless by the deterministic ids."""
        self._warned: set[str] = set()

    # ---- request -----------------------------------------------------------------------------------
    def request(self, lines: Sequence[bytes]) -> Request:
        loads, dumps = orjson.loads, orjson.dumps
        action, tail = self._action, self._tail
        parts: list[bytes] = []
        for line in lines:
            event = loads(line)
            if not isinstance(event, dict):
                raise TypeError("not a JSON object")
            id_ = doc_id(line)
            if is_pack(event):
                type_, doc = _PACK, pack_document(event, id_)
            else:
                type_, doc = document_core(event, id_)
            parts.append(action[type_] + id_.encode() + b'"}}\n' + dumps(doc)[:-1] + tail[type_])
        body = b"".join(parts)
        if self.compress:
            body = gzip.compress(body, compresslevel=1)
        return Request("POST", self.url, body, self._headers)

    # ---- outcome -----------------------------------------------------------------------------------
    def outcome(self, lines: Sequence[bytes], response: Response) -> Outcome:
        status = response.status
        everything = list(range(len(lines)))
        if status in CONFIG_STATUSES or 300 <= status < 400:
            self._warn_once(f"http{status}", f"HTTP {status} from {redact_url(self.url.split('?')[0])}: "
                            f"{_snippet(response.body)}; check JOBTRACE_ES_URL and the credentials. Events stay "
                            "spooled on disk and are sent once this is fixed")
            return Outcome(retry=everything, status=status)
        if status == 413:
            return self._too_large(lines, response)
        if status >= 400:
            reason = f"HTTP {status}: {_snippet(response.body)}"
            return Outcome(rejected=[(i, reason) for i in everything], status=status)
        if response.body[:40].replace(b" ", b"").startswith(b'{"errors":false') and len(lines):
            return Outcome.all_ok()
        try:
            body = orjson.loads(response.body)
            items = body["items"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            self._warn_once("garbled", f"an unreadable bulk answer (HTTP {status}): {_snippet(response.body)}; "
                            "retrying (ids make the retry safe)")
            return Outcome(retry=everything, status=status)
        if not body.get("errors"):
            return Outcome.all_ok()
        if len(items) != len(lines):
            self._warn_once("count", f"the bulk answer has {len(items)} items for {len(lines)} documents; retrying")
            return Outcome(retry=everything, status=status)
        retry: list[int] = []
        rejected: list[tuple[int, str]] = []
        rejected_status: int | None = None
        for i, item in enumerate(items):
            result = next(iter(item.values())) if isinstance(item, dict) and item else {}
            st = result.get("status", 0)
            if 200 <= st < 300:
                continue
            error = result.get("error")
            etype = error.get("type", "") if isinstance(error, dict) else ""
            if st == 409 and etype in ("version_conflict_engine_exception", ""):
                self.duplicates += 1
                continue
            if st in RETRY_ITEM_STATUSES or etype in RETRY_ITEM_ERRORS or st == 0:
                retry.append(i)
                continue
            rejected.append((i, f"HTTP {st} {_item_reason(error)}"))
            rejected_status = rejected_status or st
        return Outcome(retry=retry, rejected=rejected, retry_after=response.header("Retry-After"),
                       status=rejected_status or status)

    def _too_large(self, lines: Sequence[bytes], response: Response) -> Outcome:
        """413: refuse the lines too big to ever fit; shrink later batches; retry the rest."""
        limit = max(64 << 10, self.max_batch_bytes // 2)
        self.max_batch_bytes = limit
        big = [(i, f"HTTP 413: the document alone exceeds the server's request size limit ({len(line)} bytes)")
               for i, line in enumerate(lines) if len(line) >= limit or len(lines) == 1]
        big_ids = {i for i, _ in big}
        self._warn_once("413", f"HTTP 413 from the server: batches are now at most {limit} bytes; lower "
                        "JOBTRACE_ES_BATCH_BYTES (or raise http.max_content_length / the proxy's limit)")
        return Outcome(retry=[i for i in range(len(lines)) if i not in big_ids], rejected=big, status=413)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log.warning("jobtrace: elasticsearch: %s", message)


def _snippet(body: bytes, n: int = 300) -> str:
    text = body[:n].decode("utf-8", "replace").strip().replace("\n", " ")
    return text or "(empty body)"


def _item_reason(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)[:1000] if error else "no reason given"
    reason = f"{error.get('type', 'error')}: {error.get('reason', '')}"
    caused = error.get("caused_by")
    if isinstance(caused, dict):
        reason += f" (caused by {caused.get('type')}: {caused.get('reason')})"
    return reason[:1500]


class SetupOnFirstUse:
    """A :class:`~shippers.Transport` that installs the templates before the first request goes out.

    Runs on the sender thread. A server that is down raises :class:`BackendUnavailable`,
    which the sender treats like any failed send (backoff, retry); anything else
    (no privilege, a version jobtrace does not support) is logged once and shipping
    goes on, since the data is better in the cluster than nowhere.
    """

    def __init__(self, inner: Transport, url: str, *, retention: Retention | None = None,
                 flavour: str | None = None) -> None:
        self.inner = inner
        self.url = url
        self.retention = retention
        self.flavour = flavour
        self.cluster: Cluster | None = None
        self.done = False

    def send(self, request: Request, timeout_s: float) -> Response:
        if not self.done:
            self._setup(timeout_s)
        return self.inner.send(request, timeout_s)

    def _setup(self, timeout_s: float) -> None:
        where = redact_url(self.url)
        try:
            cluster = detect_cluster(self.inner, self.url, timeout_s, self.flavour)
            if cluster.flavour != "victorialogs":
                call = transport_caller(self.inner, self.url, timeout_s)
                if not templates_current(call):
                    report = install(call, cluster, self.retention, authoritative=False)
                    _log.info("jobtrace: installed %s into %s at %s", ", ".join(report.installed), cluster.label, where)
                    for warning in report.warnings:
                        _log.warning("jobtrace: elasticsearch: %s", warning)
            self.cluster = cluster
        except BackendUnavailable:
            raise
        except ConfigError as exc:
            _log.warning("jobtrace: elasticsearch: cannot install templates at %s (%s); shipping anyway. Run "
                         "`jobtrace setup` with an account allowed to, or set JOBTRACE_ES_SETUP=off", where, exc)
        except Exception as exc:  # noqa: BLE001 - never let setup kill the sender thread
            _log.warning("jobtrace: elasticsearch: template setup failed at %s: %s: %s; shipping anyway",
                         where, type(exc).__name__, exc)
        self.done = True

    def close(self) -> None:
        self.inner.close()


class ElasticsearchShipper(SpoolingSender):
    """Ships canonical lines to Elasticsearch 8/9, OpenSearch 2.x (or VictoriaLogs' ``_bulk``) losslessly.

    Args:
        config: URL, credentials and TLS (:meth:`HttpConfig.from_env` with ``JOBTRACE_ES``).
        spool_dir: this process's spool directory (kept across restarts for replay).
        namespace: data stream namespace (``logs-jobtrace-<namespace>`` …).
        setup: ``auto`` installs missing templates on first use; ``off`` never touches them.
        retention: for policies the shipper creates when missing (default 7d/365d).
        flavour: skip ``GET /`` detection.
        transport: replaces the HTTP transport (tests).
        policy: retry policy (default :class:`RetryPolicy`: 0.5 s doubling to 30 s, jitter).
        max_batch_lines, max_batch_bytes: bulk request size (2,000 lines / 4 MiB of canonical JSON).
        compress: gzip request bodies.
        shutdown_timeout_s: how long ``close()`` tries to drain before leaving the rest spooled.
    """

    def __init__(self, config: HttpConfig, spool_dir: str | Path, *, namespace: str = "default",
                 setup: str = "auto", retention: Retention | None = None, flavour: str | None = None,
                 service_name: str = "jobtrace", transport: Transport | None = None,
                 policy: RetryPolicy | None = None, dead_letter: str | Path | None = None,
                 max_batch_lines: int = 2000, max_batch_bytes: int = 4 << 20, compress: bool = False,
                 shutdown_timeout_s: float = 10.0) -> None:
        if setup not in ("auto", "off"):
            raise ConfigError(f"{ES_SETUP}={setup!r}: use auto or off")
        try:
            encoder = EsBulkEncoder(config.url, namespace=namespace, service_name=service_name,
                                    max_batch_lines=max_batch_lines, max_batch_bytes=max_batch_bytes,
                                    compress=compress, victorialogs=True if flavour == "victorialogs" else None)
        except ValueError as exc:
            raise ConfigError(f"{ES_NAMESPACE}: {exc}") from None
        inner: Transport = transport or RequestsTransport(config)
        self.setup_transport: SetupOnFirstUse | None = None
        if setup == "auto":
            self.setup_transport = SetupOnFirstUse(inner, config.url, retention=retention, flavour=flavour)
            inner = self.setup_transport
        self.config = config
        self.takes_packs = not encoder.victorialogs
        """Whether ranks' packs may be written here: Elasticsearch/OpenSearch keep them in their own data stream;
        VictoriaLogs' ``_bulk`` would store them as fields its reader never asks for (known from the URL or
        ``flavour`` now, so an instance attribute, not a property)."""
        super().__init__(encoder, inner, spool_dir, dead_letter=dead_letter, policy=policy,
                         timeout_s=config.timeout_s, shutdown_timeout_s=shutdown_timeout_s)

    @classmethod
    def from_env(cls, info: ProcessInfo, *, url: str | None = None, env: Mapping[str, str] | None = None,
                 **overrides: Any) -> ElasticsearchShipper:
        """The shipper ``JOBTRACE_ES_URL`` (or ``url``) asks for, spooling under ``info.spool_dir("elasticsearch")``.

        Credentials and TLS always come from the process environment
        (:meth:`HttpConfig.from_env`); ``env`` (default ``os.environ``) supplies the rest.
        """
        http = HttpConfig.from_env(ES.prefix, url=url)
        kw: dict[str, Any] = {
            "namespace": get_str(ES_NAMESPACE, env, "default"),
            "setup": get_choice(ES_SETUP, ("auto", "off"), env, "auto"),
            "retention": Retention.from_env(env),
            "flavour": get_choice(ES_FLAVOR, ("elasticsearch", "opensearch", "victorialogs"), env),
            "service_name": get_str(OTEL_SERVICE_NAME, env, "jobtrace"),
            "max_batch_lines": get_int(ES_BATCH_LINES, env, 2000, minimum=1),
            "max_batch_bytes": get_int(ES_BATCH_BYTES, env, 4 << 20, minimum=1),
            "compress": get_bool(ES_COMPRESS, env, False),
        }
        kw.update(overrides)
        return cls(http, info.spool_dir("elasticsearch"), **kw)
