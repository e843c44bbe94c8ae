"""Installing jobtrace into Elasticsearch/OpenSearch and Kibana/OpenSearch Dashboards.

What gets installed (bodies in ``kibana/templates``):

* retention: one policy per data stream type, ``jobtrace-logs`` (default 7 days),
  ``jobtrace-traces`` (default: as logs) and ``jobtrace-metrics`` (default 365 days),
  as ILM on Elasticsearch (attached through ``index.lifecycle.name`` in the index
  template), as ISM on OpenSearch (attached through the policy's ``ism_template``,
  which ISM matches against the data stream name), as data stream lifecycle
  (``data_retention``) on Elasticsearch Serverless, which has no ILM. Each policy rolls
  the write index over (daily for 7 days of retention, at most every 30 days) so that
  whole backing indices can be deleted once they are older than the retention;
* component templates ``jobtrace-mappings`` (the ECS + ``jobtrace.*`` mapping) and
  ``jobtrace-settings``, and index templates ``jobtrace-{logs,metrics,traces}`` for
  ``<type>-jobtrace-*`` with ``data_stream: {}`` at priority 501 (above the
  ``logs-*-*``/``metrics-*-*`` templates Elasticsearch ships at 100);
* index template ``jobtrace-rollup`` for ``metrics-jobtrace.rollup-*``, the ranks' packs
  (:func:`kibana._document.pack_document`): its own small mapping (the Parquet part is
  ``binary``, never indexed), the ``jobtrace-settings``, and the metrics retention (the
  ``jobtrace-metrics`` policy: by name in ILM, by a second pattern in the ISM policy);
* the saved objects in ``kibana/saved_objects`` (``jobtrace setup`` only).

Two callers, one algorithm (:func:`install`), driven through a :data:`Caller`:

* ``jobtrace setup`` is authoritative: it writes every template and policy (retention
  changes take effect) and re-attaches policies to existing backing indices;
* the shipper, on first use (``JOBTRACE_ES_SETUP=auto``, the default), checks that the
  templates of this version exist and installs them if not, creating policies only when
  missing (it never overrides a retention an administrator set). Missing privileges
  there are a warning, not an error: shipping goes on.

Why the official clients here and raw HTTP in the shipper: the shipper sends through
the shared :class:`~jobtrace.http.Transport` so that the disk spool, retries and
dead-letter logic exist once for every backend, and a training process does not
import a search client. Setup and queries run in a CLI, where the clients bring their
connection handling (auth, TLS, pooling, retries on dead connections). They are used
through their generic ``perform_request`` with one request shape for both flavours:
elasticsearch-py's typed methods pin ``compatible-with=<client major>`` in the media
type, which a 9.x client sends to an 8.x server and gets a 400
(elastic/elasticsearch-py#2923), and OpenSearch needs opensearch-py anyway (it answers
the Elasticsearch media types with 406 and lacks the product header the Elasticsearch
client insists on). The flavour comes from ``GET /`` (``version.distribution`` is
``opensearch`` on OpenSearch; ``X-Elastic-Product: Elasticsearch`` on Elasticsearch).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson

from jobtrace import config
from jobtrace.errors import BackendUnavailable, ConfigError
from jobtrace.http import HttpConfig, Request, RequestsTransport, Transport
from jobtrace.redact import redact_url

from ._assets import load_template, saved_objects
from ._document import STREAM_TYPES, rollup_stream_name

__all__ = [
    "Caller",
    "Cluster",
    "INDEX_TEMPLATES",
    "Retention",
    "SetupReport",
    "TEMPLATE_VERSION",
    "check",
    "client_caller",
    "detect_cluster",
    "error_reason",
    "import_saved_objects",
    "install",
    "is_victorialogs",
    "make_client",
    "parse_days",
    "parse_root",
    "run_setup",
    "templates_current",
    "transport_caller",
]

_log = logging.getLogger("jobtrace.setup")

TEMPLATE_VERSION = 2
"""Bumped when the mapping or the templates change; the shipper reinstalls older ones.
2: the ``jobtrace-rollup`` template (packs)."""

INDEX_TEMPLATES = (*STREAM_TYPES, "rollup")
"""The index templates ``jobtrace-<name>``: one per event data stream type, and the packs'."""

_ROLLUP_PATTERN = rollup_stream_name("*")


def _patterns(type_: str) -> list[str]:
    """The data streams kept by the ``jobtrace-<type_>`` policy: the packs live as long as the metrics."""
    return [f"{type_}-jobtrace-*", _ROLLUP_PATTERN] if type_ == "metrics" else [f"{type_}-jobtrace-*"]

Caller = Callable[..., "tuple[int, Any]"]
"""``call(method, path, params=None, body=None) -> (HTTP status, parsed JSON body or text)``.

Raises :class:`BackendUnavailable` when the server did not answer."""


# ---- the cluster ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cluster:
    """What ``GET /`` said: ``flavour`` is ``elasticsearch``, ``opensearch`` or ``victorialogs``."""

    flavour: str
    version: str = ""
    serverless: bool = False

    @property
    def major(self) -> int:
        return _version_tuple(self.version)[0]

    @property
    def label(self) -> str:
        name = {"elasticsearch": "Elasticsearch", "opensearch": "OpenSearch", "victorialogs": "VictoriaLogs"}[self.flavour]
        return f"{name}{' Serverless' if self.serverless else ''} {self.version}".strip()

    def compat_headers(self) -> dict[str, str]:
        """Media types an Elasticsearch server of this major accepts from any client version."""
        if self.flavour != "elasticsearch":
            return {}
        # Serverless reports 8.x and takes the 8 media type whatever the client version.
        mt = f"application/vnd.elasticsearch+json; compatible-with={8 if self.serverless else self.major}"
        return {"accept": mt, "content-type": mt}


def _version_tuple(v: str) -> tuple[int, int, int]:
    nums = [int(x) for x in re.findall(r"\d+", v)[:3]]
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


def is_victorialogs(url: str) -> bool:
    return urlsplit(url).path.rstrip("/").endswith("/insert/elasticsearch")


def parse_root(status: int, headers: Mapping[str, str], body: Any, url: str) -> Cluster:
    """The cluster from a ``GET /`` answer; raises :class:`ConfigError` for what jobtrace cannot use."""
    where = redact_url(url)
    product = next((v for k, v in headers.items() if k.lower() == "x-elastic-product"), "")
    if status == 401:
        raise ConfigError(f"authentication failed at {where} (HTTP 401): check JOBTRACE_ES_USERNAME and "
                          "JOBTRACE_ES_PASSWORD, JOBTRACE_ES_API_KEY or JOBTRACE_ES_TOKEN")
    if status == 403:
        raise ConfigError(f"the account may not read {where}/ (HTTP 403, needs the 'monitor' cluster "
                          "privilege); set JOBTRACE_ES_FLAVOR=elasticsearch|opensearch to skip detection")
    if status >= 500 or status in (408, 429):
        raise BackendUnavailable(f"GET {where}/: HTTP {status}")
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("version"), dict):
        raise ConfigError(f"{where} does not look like Elasticsearch or OpenSearch (GET / gave HTTP {status})")
    version = body["version"]
    number = str(version.get("number", ""))
    if version.get("distribution") == "opensearch":
        cluster = Cluster("opensearch", number)
        if _version_tuple(number) < (2, 4, 0):
            raise ConfigError(f"OpenSearch {number} at {where} is not supported: jobtrace needs OpenSearch 2.4 "
                              "or newer (data streams, composable templates and point-in-time search)")
        return cluster
    if product == "Elasticsearch" or body.get("tagline") == "You Know, for Search":
        cluster = Cluster("elasticsearch", number, serverless=version.get("build_flavor") == "serverless")
        if not cluster.serverless and cluster.major < 8:
            raise ConfigError(f"Elasticsearch {number} at {where} is not supported: jobtrace needs "
                              "Elasticsearch 8 or 9")
        return cluster
    raise ConfigError(f"{where} answers GET / but is neither Elasticsearch nor OpenSearch "
                      f"(version {number!r}); set {config.ES_FLAVOR} if it is a compatible server")


def detect_cluster(transport: Transport, url: str, timeout_s: float = 10.0, flavour: str | None = None) -> Cluster:
    """``GET /`` through ``transport``; ``flavour`` (or ``JOBTRACE_ES_FLAVOR``) skips the request."""
    if flavour in ("elasticsearch", "opensearch", "victorialogs"):
        return Cluster(flavour, "")
    if is_victorialogs(url):
        return Cluster("victorialogs", "")
    response = transport.send(Request("GET", url.rstrip("/") + "/", b"", {"Accept": "application/json"}), timeout_s)
    return parse_root(response.status, response.headers, _parse(response.body), url)


def _parse(body: bytes) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")


# ---- callers ---------------------------------------------------------------------------------------
def transport_caller(transport: Transport, url: str, timeout_s: float = 10.0,
                     headers: Mapping[str, str] | None = None) -> Caller:
    """A :data:`Caller` over jobtrace's own transport (raw HTTP; used by the shipper)."""
    base = url.rstrip("/")
    extra = dict(headers or {})

    def call(method: str, path: str, params: Mapping[str, Any] | None = None, body: Any = None) -> tuple[int, Any]:
        target = base + path + ("?" + urlencode(params) if params else "")
        hdrs = {"Accept": "application/json", **extra}
        data = b""
        if body is not None:
            data = orjson.dumps(body)
            hdrs["Content-Type"] = "application/json"
        response = transport.send(Request(method, target, data, hdrs), timeout_s)
        return response.status, _parse(response.body)

    return call


def make_client(config: HttpConfig, cluster: Cluster) -> Any:
    """An ``elasticsearch.Elasticsearch`` or ``opensearchpy.OpenSearch`` client for ``config``."""
    headers = {**config.auth_headers(), **config.extra_headers}
    tls: dict[str, Any] = {}
    if config.url.startswith("https"):
        tls = {"verify_certs": config.verify, "ca_certs": config.ca_file, "client_cert": config.client_cert,
               "client_key": config.client_key}
        tls = {k: v for k, v in tls.items() if v is not None}
    if cluster.flavour == "elasticsearch":
        try:
            from elasticsearch import Elasticsearch
        except ImportError:
            raise ConfigError("the Elasticsearch backend needs: pip install 'jobtrace[elasticsearch]'") from None
        from elasticsearch.serializer import JsonSerializer as EsJson

        class _EsOrjson(EsJson):
            """Search pages are megabytes of JSON: orjson parses them several times faster."""

            def loads(self, data: bytes) -> Any:
                return orjson.loads(data)

            def dumps(self, data: Any) -> bytes:
                if isinstance(data, str):
                    return data.encode("utf-8")
                return data if isinstance(data, bytes) else orjson.dumps(data, default=self.default)

        fast = _EsOrjson()
        return Elasticsearch(config.url, headers=headers, request_timeout=config.timeout_s, max_retries=2,
                             retry_on_timeout=True,
                             serializers={"application/json": fast, "application/vnd.elasticsearch+json": fast},
                             **tls)
    try:
        from opensearchpy import OpenSearch
    except ImportError:
        raise ConfigError("the OpenSearch backend needs: pip install 'jobtrace[elasticsearch]'") from None
    from opensearchpy.serializer import JSONSerializer as OsJson

    # opensearch-py logs every non-2xx answer as a warning; 404 "no such template" is an answer we expect.
    logging.getLogger("opensearch").setLevel(logging.ERROR)

    class _OsOrjson(OsJson):
        def loads(self, s: Any) -> Any:
            return orjson.loads(s)

        def dumps(self, data: Any) -> Any:
            if isinstance(data, (str, bytes)):
                return data
            return orjson.dumps(data, default=self.default).decode("utf-8")

    if config.url.startswith("https") and not config.verify:
        tls["ssl_show_warn"] = False
    return OpenSearch(hosts=[config.url], headers=headers, timeout=config.timeout_s, max_retries=2,
                      retry_on_timeout=True, serializer=_OsOrjson(), **tls)


def client_caller(client: Any, cluster: Cluster) -> Caller:
    """A :data:`Caller` over an official client's ``perform_request``, with its errors translated."""
    if cluster.flavour == "elasticsearch":
        from elastic_transport import TransportError as EsTransportError
        from elasticsearch import ApiError

        compat = cluster.compat_headers()

        def call_es(method: str, path: str, params: Mapping[str, Any] | None = None, body: Any = None) -> tuple[int, Any]:
            headers = dict(compat) if body is not None else {k: v for k, v in compat.items() if k == "accept"}
            if not headers:
                headers = {"accept": "application/json"}
                if body is not None:
                    headers["content-type"] = "application/json"
            try:
                resp = client.perform_request(method, path, params=dict(params or {}) or None, headers=headers,
                                              body=body)
                return int(resp.meta.status), resp.body
            except ApiError as exc:
                return int(exc.meta.status), exc.body
            except EsTransportError as exc:
                raise BackendUnavailable(f"{method} {path}: {type(exc).__name__}") from None

        return call_es

    import opensearchpy

    def call_os(method: str, path: str, params: Mapping[str, Any] | None = None, body: Any = None) -> tuple[int, Any]:
        try:
            data = client.transport.perform_request(method, path, params=dict(params or {}), body=body)
            return 200, data
        except opensearchpy.ConnectionError as exc:
            raise BackendUnavailable(f"{method} {path}: {type(exc).__name__}") from None
        except opensearchpy.TransportError as exc:
            status = exc.status_code if isinstance(exc.status_code, int) else 0
            if not status:
                raise BackendUnavailable(f"{method} {path}: {type(exc).__name__}") from None
            return status, exc.info

    return call_os


def error_reason(body: Any) -> str:
    """The server's own words from an error body (never our request headers)."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            reason = f"{err.get('type', 'error')}: {err.get('reason', '')}".strip()
            caused = err.get("caused_by")
            if isinstance(caused, dict):
                reason += f" (caused by {caused.get('type')}: {caused.get('reason')})"
            return reason[:600]
        return str(err)[:600]
    return str(body)[:600] if body else "no details"


def check(status: int, body: Any, what: str) -> None:
    """Raise the jobtrace error that fits a non-2xx answer to ``what``."""
    if 200 <= status < 300:
        return
    reason = error_reason(body)
    if status == 401:
        raise ConfigError(f"{what}: authentication failed (HTTP 401): check the credentials "
                          "(JOBTRACE_ES_USERNAME/_PASSWORD, _API_KEY or _TOKEN)")
    if status == 403:
        raise ConfigError(f"{what}: not allowed (HTTP 403): {reason}. Setup needs the manage_index_templates "
                          "and manage_ilm (Elasticsearch) or the ISM (OpenSearch) privileges")
    if status in (408, 429, 500, 502, 503, 504):
        raise BackendUnavailable(f"{what}: HTTP {status}: {reason}")
    raise ConfigError(f"{what}: HTTP {status}: {reason}")  # 501, 505…: not something a retry fixes


# ---- what to install -----------------------------------------------------------------------------------
_DURATION = re.compile(r"^\s*(\d+)\s*(d|w|y|days?|weeks?|years?)?\s*$")


def parse_days(value: str | int) -> int:
    """``7d``, ``2w``, ``1y``, ``365`` (days) → days."""
    if isinstance(value, int):
        days = value
    else:
        m = _DURATION.match(str(value).lower())
        if not m:
            raise ConfigError(f"cannot read retention {value!r}: use 7d, 2w, 1y or a number of days")
        n, unit = int(m.group(1)), (m.group(2) or "d")[0]
        days = n * {"d": 1, "w": 7, "y": 365}[unit]
    if days < 1:
        raise ConfigError(f"retention {value!r} is shorter than a day")
    return days


@dataclass(frozen=True)
class Retention:
    """Days to keep each data stream type; ``traces`` defaults to ``logs``."""

    logs: int = 7
    metrics: int = 365
    traces: int | None = None

    def days(self, type_: str) -> int:
        if type_ == "traces":
            return self.traces if self.traces is not None else self.logs
        return int(getattr(self, type_))

    @staticmethod
    def rollover_days(days: int) -> int:
        return max(1, min(30, days // 7))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Retention:
        """``JOBTRACE_ES_LOGS_RETENTION``, ``_METRICS_RETENTION`` and ``_TRACES_RETENTION``."""
        traces = config.get_str(config.ES_TRACES_RETENTION, env)
        return cls(parse_days(config.get_str(config.ES_LOGS_RETENTION, env, "7d") or "7d"),
                   parse_days(config.get_str(config.ES_METRICS_RETENTION, env, "365d") or "365d"),
                   parse_days(traces) if traces else None)


def _spec(body: Any) -> str:
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]


def ilm_policy(type_: str, retention: Retention) -> dict[str, Any]:
    """The ILM body for ``PUT _ilm/policy/jobtrace-<type>``."""
    body: dict[str, Any] = load_template("ilm-policy")
    days = retention.days(type_)
    phases = body["policy"]["phases"]
    phases["hot"]["actions"]["rollover"]["max_age"] = f"{retention.rollover_days(days)}d"
    phases["delete"]["min_age"] = f"{days}d"
    meta = body["policy"]["_meta"]
    meta.update(version=TEMPLATE_VERSION, data_stream_type=type_, retention_days=days)
    meta["spec"] = _spec(body["policy"]["phases"])
    return body


def ism_policy(type_: str, retention: Retention) -> dict[str, Any]:
    """The ISM body for ``PUT _plugins/_ism/policies/jobtrace-<type>``."""
    body: dict[str, Any] = load_template("ism-policy")
    days = retention.days(type_)
    policy = body["policy"]
    hot, _delete = policy["states"]
    hot["actions"][0]["rollover"]["min_index_age"] = f"{retention.rollover_days(days)}d"
    hot["transitions"][0]["conditions"]["min_rollover_age"] = f"{days}d"
    policy["ism_template"][0]["index_patterns"] = _patterns(type_)
    spec = _spec([policy["states"], policy["ism_template"]])
    policy["description"] = (f"jobtrace {type_}: roll over every {retention.rollover_days(days)}d, delete "
                             f"{days}d after rollover (managed by jobtrace, version {TEMPLATE_VERSION}, spec {spec})")
    return body


def component_templates(replicas: int | None = None) -> dict[str, dict[str, Any]]:
    out = {name: load_template(name) for name in ("jobtrace-mappings", "jobtrace-settings")}
    if replicas is not None:
        out["jobtrace-settings"]["template"]["settings"]["index"]["number_of_replicas"] = replicas
    for body in out.values():
        body["version"] = TEMPLATE_VERSION
    return out


def index_template(type_: str, cluster: Cluster, retention: Retention) -> dict[str, Any]:
    """The body of ``jobtrace-<type_>`` (one of :data:`INDEX_TEMPLATES`); ``rollup`` keeps the metrics' retention."""
    body: dict[str, Any] = load_template(f"index-template-{type_}")
    body["version"] = TEMPLATE_VERSION
    settings = body.setdefault("template", {}).setdefault("settings", {})
    policy_type = "metrics" if type_ == "rollup" else type_
    if cluster.flavour == "elasticsearch":
        if cluster.serverless:
            body["template"]["lifecycle"] = {"data_retention": f"{retention.days(policy_type)}d"}
        else:
            settings["index.lifecycle.name"] = f"jobtrace-{policy_type}"
    return body


# ---- installing -------------------------------------------------------------------------------------
@dataclass
class SetupReport:
    """What :func:`install` (and the saved objects import) did, for people and for ``--json``."""

    cluster: str
    installed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    retention: str = ""
    saved_objects: str = ""

    @property
    def ok(self) -> bool:
        return not self.warnings


def _existing_templates(call: Caller) -> dict[str, dict[str, Any]]:
    """``{name: {"version": …, "spec": …}}`` of the jobtrace index and component templates present."""
    found: dict[str, dict[str, Any]] = {}
    for kind, key in (("_index_template", "index_template"), ("_component_template", "component_template")):
        st, body = call("GET", f"/{kind}/jobtrace-*")
        if st == 404:
            continue
        check(st, body, f"reading {kind[1:].replace('_', ' ')}s")
        for item in (body or {}).get(f"{key}s", []):
            tpl = item.get(key) or {}
            found[item.get("name")] = {"version": tpl.get("version"), "spec": (tpl.get("_meta") or {}).get("spec")}
    return found


def templates_current(call: Caller) -> bool:
    """True when the jobtrace index and component templates of this version are all installed."""
    found = _existing_templates(call)
    wanted = [f"jobtrace-{t}" for t in INDEX_TEMPLATES] + ["jobtrace-mappings", "jobtrace-settings"]
    return all(isinstance(found.get(n, {}).get("version"), int) and found[n]["version"] >= TEMPLATE_VERSION
               for n in wanted)


def _with_spec(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with ``_meta.spec``: a hash of everything else, so an identical template is left alone."""
    meta = body.setdefault("_meta", {})
    meta.pop("spec", None)
    meta["spec"] = _spec(body)
    return body


def _no_handler(status: int, body: Any) -> bool:
    return status in (400, 404, 405) and "no handler found" in str(body)


def _install_ilm(call: Caller, retention: Retention, authoritative: bool, report: SetupReport) -> None:
    for type_ in STREAM_TYPES:
        name = f"jobtrace-{type_}"
        body = ilm_policy(type_, retention)
        st, got = call("GET", f"/_ilm/policy/{name}")
        if st == 200 and isinstance(got, dict):
            current = got.get(name, {}).get("policy", {}).get("_meta", {}).get("spec")
            if current == body["policy"]["_meta"]["spec"] or not authoritative:
                report.unchanged.append(f"ILM policy {name}")
                continue
        elif st != 404:
            check(st, got, f"reading ILM policy {name}")
        st, got = call("PUT", f"/_ilm/policy/{name}", body=body)
        check(st, got, f"installing ILM policy {name}")
        report.installed.append(f"ILM policy {name} ({retention.days(type_)}d)")
    report.retention = "ILM: " + ", ".join(f"{t} {retention.days(t)}d" for t in STREAM_TYPES)


def _install_ism(call: Caller, retention: Retention, authoritative: bool, report: SetupReport) -> tuple[bool, bool]:
    """ISM policies; ``(installed, an existing policy changed)``. Not installed (with a warning in
    the report) when the ISM plugin is missing."""
    updated = False
    for type_ in STREAM_TYPES:
        name = f"jobtrace-{type_}"
        body = ism_policy(type_, retention)
        st, got = call("GET", f"/_plugins/_ism/policies/{name}")
        if _no_handler(st, got):
            report.retention = "not installed: ISM missing"
            report.warnings.append(
                "retention NOT installed: this OpenSearch has no Index State Management plugin "
                "(opensearch-index-management; GET /_plugins/_ism/policies answers 'no handler found'), so "
                "jobtrace data is kept until deleted. Install the plugin and run `jobtrace setup` again.")
            return False, False
        params: dict[str, Any] = {}
        if st == 200 and isinstance(got, dict):
            if got.get("policy", {}).get("description") == body["policy"]["description"] or not authoritative:
                report.unchanged.append(f"ISM policy {name}")
                continue
            params = {"if_seq_no": got.get("_seq_no"), "if_primary_term": got.get("_primary_term")}
        elif st != 404:
            check(st, got, f"reading ISM policy {name}")
        st, got = call("PUT", f"/_plugins/_ism/policies/{name}", params=params or None, body=body)
        if st == 409 and not authoritative:  # another rank created it a moment ago
            report.unchanged.append(f"ISM policy {name}")
            continue
        check(st, got, f"installing ISM policy {name}")
        report.installed.append(f"ISM policy {name} ({retention.days(type_)}d)")
        updated = updated or bool(params)
    report.retention = "ISM: " + ", ".join(f"{t} {retention.days(t)}d" for t in STREAM_TYPES)
    return True, updated


def _attach_existing(call: Caller, cluster: Cluster, report: SetupReport, changed: bool) -> None:
    """Put the policies on backing indices created before them (templates only reach new ones);
    ``changed``: an ISM policy was updated, so indices it already manages move to its new version."""
    for type_ in STREAM_TYPES:
        name = f"jobtrace-{type_}"
        for pattern in _patterns(type_):
            try:
                if cluster.flavour == "elasticsearch":
                    st, got = call("PUT", f"/{pattern}/_settings", params={"expand_wildcards": "all"},
                                   body={"index.lifecycle.name": name})
                else:
                    st, got = call("POST", f"/_plugins/_ism/add/.ds-{pattern}", body={"policy_id": name})
                    if changed and st == 200 and isinstance(got, dict) and got.get("failures"):
                        # already managed: move them to this policy's current version
                        st, got = call("POST", f"/_plugins/_ism/change_policy/.ds-{pattern}",
                                       body={"policy_id": name})
                if st >= 300 and st != 404:
                    report.warnings.append(f"could not attach {name} to existing {pattern} data: {error_reason(got)}")
            except BackendUnavailable as exc:
                report.warnings.append(f"could not attach {name} to existing {pattern} data: {exc}")


def install(call: Caller, cluster: Cluster, retention: Retention | None = None, *, replicas: int | None = None,
            authoritative: bool = True) -> SetupReport:
    """Install retention policies and templates (see the module docstring); idempotent."""
    retention = retention or Retention()
    report = SetupReport(cluster.label)
    if cluster.flavour == "victorialogs":
        report.retention = "VictoriaLogs: its -retentionPeriod applies"
        report.unchanged.append("nothing to install on VictoriaLogs (it takes any field)")
        return report
    has_policies, changed = True, False
    if cluster.flavour == "elasticsearch" and not cluster.serverless:
        _install_ilm(call, retention, authoritative, report)
    elif cluster.flavour == "opensearch":
        has_policies, changed = _install_ism(call, retention, authoritative, report)
    else:
        report.retention = "data stream lifecycle: " + ", ".join(f"{t} {retention.days(t)}d" for t in STREAM_TYPES)
    existing = _existing_templates(call)

    def keep(name: str, body: dict[str, Any]) -> bool:
        have = existing.get(name)
        if have is None:
            return False
        if have.get("spec") == body["_meta"]["spec"]:
            return True
        current = isinstance(have.get("version"), int) and have["version"] >= TEMPLATE_VERSION
        # The shipper leaves current templates (and any settings an administrator chose) alone.
        return not authoritative and (current or name == "jobtrace-settings")

    for name, body in component_templates(replicas).items():
        body = _with_spec(body)
        if keep(name, body):
            report.unchanged.append(f"component template {name}")
            continue
        st, got = call("PUT", f"/_component_template/{name}", body=body)
        check(st, got, f"installing component template {name}")
        report.installed.append(f"component template {name}")
    for type_ in INDEX_TEMPLATES:
        name = f"jobtrace-{type_}"
        body = _with_spec(index_template(type_, cluster, retention))
        what = f"index template {name} ({', '.join(body['index_patterns'])})"
        if keep(name, body):
            report.unchanged.append(what)
            continue
        st, got = call("PUT", f"/_index_template/{name}", body=body)
        check(st, got, f"installing {what}")
        report.installed.append(what)
    if authoritative and has_policies and not cluster.serverless:
        _attach_existing(call, cluster, report, changed)
    return report


# ---- Kibana / OpenSearch Dashboards -----------------------------------------------------------------------
def _dashboards_flavour(headers: Mapping[str, str], body: Any, hint: str | None) -> tuple[str, str]:
    lower = {k.lower(): v for k, v in headers.items()}
    version = str(((body or {}) if isinstance(body, dict) else {}).get("version", {}).get("number", ""))
    if "osd-name" in lower:
        return "opensearch-dashboards", version
    if "kbn-name" in lower:
        return "kibana", version
    if version:
        return ("opensearch-dashboards" if _version_tuple(version)[0] <= 3 else "kibana"), version
    return hint or "kibana", version


def _dashboards_ready(body: Any) -> bool:
    """Kibana 8 says ``status.overall.level: available``; OpenSearch Dashboards ``status.overall.state: green``."""
    overall = ((body or {}).get("status") or {}).get("overall") if isinstance(body, dict) else None
    if not isinstance(overall, dict):
        return True  # a format we do not know: let the import answer
    return bool(overall.get("level", "available") == "available" and overall.get("state", "green") == "green")


def import_saved_objects(config: HttpConfig, *, hint: str | None = None, space: str | None = None,
                         transport: Transport | None = None, wait_s: float = 0.0) -> tuple[str, str]:
    """Import the packaged saved objects; returns ``(flavour, summary)``. Idempotent (fixed ids, overwrite)."""
    from urllib3 import encode_multipart_formdata

    own = transport is None
    tr = transport or RequestsTransport(config)
    base = config.url.rstrip("/")
    where = redact_url(base)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                r = tr.send(Request("GET", base + "/api/status", b"", {"Accept": "application/json"}),
                            config.timeout_s)
                if r.status in (401, 403) or (r.status == 200 and _dashboards_ready(_parse(r.body))) or \
                        time.monotonic() >= deadline:
                    break
            except BackendUnavailable:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(2.0)
        body = _parse(r.body)
        if r.status == 401:
            raise ConfigError(f"authentication failed at {where} (HTTP 401): check JOBTRACE_KIBANA_USERNAME/"
                              "_PASSWORD, _API_KEY or _TOKEN (default: the JOBTRACE_ES_* credentials)")
        check(r.status, body, f"GET {where}/api/status")
        flavour, version = _dashboards_flavour(r.headers, body, hint)
        if flavour == "kibana" and version and _version_tuple(version) < (8, 9, 0):
            raise ConfigError(f"Kibana {version} at {where} is too old: the jobtrace saved objects need Kibana 8.9 "
                              "or newer (they would be refused as 'from a more recent version')")
        data = saved_objects(flavour)
        payload, content_type = encode_multipart_formdata({"file": ("jobtrace.ndjson", data, "application/ndjson")})
        xsrf = "osd-xsrf" if flavour == "opensearch-dashboards" else "kbn-xsrf"
        prefix = f"/s/{space}" if space else ""
        r = tr.send(Request("POST", f"{base}{prefix}/api/saved_objects/_import?overwrite=true", payload,
                            {xsrf: "true", "Content-Type": content_type, "Accept": "application/json"}),
                    config.timeout_s * 3)
        result = _parse(r.body)
        check(r.status, result, f"importing saved objects into {where}")
        if not isinstance(result, dict) or not result.get("success"):
            errors = (result or {}).get("errors", []) if isinstance(result, dict) else []
            detail = "; ".join(f"{e.get('type')} {e.get('id')}: {e.get('error', {}).get('type')}" for e in errors[:10])
            raise ConfigError(f"importing saved objects into {where} failed: {detail or error_reason(result)}")
        name = "OpenSearch Dashboards" if flavour == "opensearch-dashboards" else "Kibana"
        return flavour, f"{result.get('successCount', 0)} objects imported into {name} {version}".rstrip()
    finally:
        if own:
            tr.close()


# ---- the whole setup ------------------------------------------------------------------------------------
def run_setup(config: HttpConfig, *, retention: Retention | None = None, replicas: int | None = None,
              kibana: HttpConfig | None = None, kibana_space: str | None = None, wait_s: float = 0.0,
              flavour: str | None = None) -> SetupReport:
    """``jobtrace setup``: templates, retention and (with ``kibana``) saved objects, with clear errors."""
    raw = RequestsTransport(config)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                cluster = detect_cluster(raw, config.url, config.timeout_s, flavour)
                break
            except BackendUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(2.0)
    finally:
        raw.close()
    if cluster.flavour == "victorialogs":
        report = install(lambda *a, **k: (200, {}), cluster, retention)
    else:
        client = make_client(config, cluster)
        try:
            report = install(client_caller(client, cluster), cluster, retention, replicas=replicas)
        finally:
            client.close()
    if kibana is not None:
        hint = "opensearch-dashboards" if cluster.flavour == "opensearch" else "kibana"
        _, report.saved_objects = import_saved_objects(kibana, hint=hint, space=kibana_space, wait_s=wait_s)
    return report
