"""Links from a finding to exactly its events in the user's backend: Grafana Explore, Kibana Discover.

Formats (checked against the products' documentation):

* Grafana Explore (Grafana ≥ 10): ``/explore?schemaVersion=1&panes=<JSON>&orgId=<id>``;
  ``panes`` maps a pane id to ``{datasource, queries: [{refId, datasource: {type, uid},
  expr}], range: {from, to}}``, times as epoch milliseconds in strings. The query is
  LogQL on the canonical JSON line: ``{training_job="…"} | json | rank=~"…" | span_id=~"…"`` (the stream
  label ``JOBTRACE_LOKI_JOB_LABEL`` names).
* Kibana Discover: ``/app/discover#/?_g=(time:(from:'ISO',to:'ISO'))&_a=(…)``, both
  states in Rison, the query in KQL.

Every piece of user input (job ids, labels, field names) is escaped for the language it
lands in (LogQL string, regular expression, KQL string, Rison string) and then
percent-encoded for the URL, so a job id with quotes, pipes or ``&`` cannot change the
query or the URL around it. The base URLs must be absolute http(s) URLs: a link is opened
by a click (in the terminal, in the HTML timeline), so a ``javascript:`` or ``data:`` "Grafana
URL" would make every finding's link run or show whatever it holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

import loki
from jobtrace.errors import ConfigError
from loki import JOB_LABEL

__all__ = [
    "LinkConfig",
    "attach_links",
    "grafana_explore_url",
    "kibana_discover_url",
    "kql_query",
    "logql_query",
    "rison",
]


@dataclass(frozen=True)
class LinkConfig:
    """Where the user's backends are. Unset parts produce no link."""

    grafana_url: str | None = None
    grafana_datasource: str | None = None
    """The Loki (or VictoriaLogs-as-Loki) data source uid in Grafana."""
    grafana_datasource_type: str = "loki"
    grafana_org_id: int = 1
    loki_job_label: str = field(default_factory=loki.job_label)
    """The stream label that holds the job id (``JOBTRACE_LOKI_JOB_LABEL``, by default ``training_job``)."""
    kibana_url: str | None = None
    kibana_data_view: str | None = None
    """The Kibana data view (index pattern) id."""
    kibana_fields: Mapping[str, str] = field(default_factory=lambda: {"job": "job", "rank": "rank", "span_id": "span_id"})
    margin_s: float = 5.0
    """Seconds added on both sides of the cited events' time range."""

    def __post_init__(self) -> None:
        """Refuse a base URL that is not http(s) when it is given, not when the first link is made."""
        for name in ("grafana_url", "kibana_url"):
            value = getattr(self, name)
            if value and not _is_http_url(value):
                raise ConfigError(f"{name.replace('_', ' ')} must be an absolute http(s) URL, got {value!r}")

    @property
    def enabled(self) -> bool:
        return bool((self.grafana_url and self.grafana_datasource) or (self.kibana_url and self.kibana_data_view))


# ---- base URLs ----------------------------------------------------------------------------------

def _is_http_url(url: str) -> bool:
    """An absolute http(s) URL with a host (no scheme hidden behind spaces or control characters)."""
    if url != url.strip() or any(ord(c) < 0x21 or c == "\x7f" for c in url):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:  # a malformed netloc, say an unclosed IPv6 bracket
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)


def _base_url(url: str) -> str:
    if not _is_http_url(url):
        raise ValueError(f"not an absolute http(s) URL: {url!r}")
    return url.rstrip("/")


# ---- escaping ------------------------------------------------------------------------------------

_GO_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _logql_str(value: str) -> str:
    """A LogQL double-quoted string (Go syntax): backslash, quote and control characters escaped."""
    out = []
    for ch in value:
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _regex_alternatives(values: Iterable[Any]) -> str:
    return "|".join(re.escape(str(v)) for v in values)


def logql_query(job_id: str, ranks: Iterable[int] = (), span_ids: Iterable[str] = (),
                job_label: str = JOB_LABEL) -> str:
    """LogQL selecting the job's lines of these ranks (and spans), whatever the values contain."""
    if not _LABEL_NAME.match(job_label):
        raise ValueError(f"not a Loki label name: {job_label!r}")
    q = "{" + job_label + "=" + _logql_str(job_id) + "} | json"
    ranks = sorted({int(r) for r in ranks})
    if ranks:
        q += " | rank=~" + _logql_str(_regex_alternatives(ranks))
    spans = sorted({str(s) for s in span_ids if s})
    if spans:
        q += " | span_id=~" + _logql_str(_regex_alternatives(spans))
    return q


def grafana_explore_url(base_url: str, datasource_uid: str, expr: str, start_ns: int, end_ns: int, *,
                        datasource_type: str = "loki", org_id: int = 1) -> str:
    pane = {
        "datasource": datasource_uid,
        "queries": [{"refId": "A", "datasource": {"type": datasource_type, "uid": datasource_uid}, "expr": expr}],
        "range": {"from": str(start_ns // 1_000_000), "to": str(-(-end_ns // 1_000_000))},
    }
    panes = orjson.dumps({"jt": pane}).decode()
    return f"{_base_url(base_url)}/explore?schemaVersion=1&panes={quote(panes, safe='')}&orgId={int(org_id)}"


def _kql_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


_KQL_FIELD = re.compile(r"^[A-Za-z_@][A-Za-z0-9_.@-]*$")


def kql_query(job_id: str, ranks: Iterable[int] = (), span_ids: Iterable[str] = (),
              fields: Mapping[str, str] | None = None) -> str:
    f = {"job": "job", "rank": "rank", "span_id": "span_id", **(fields or {})}
    for name in f.values():
        if not _KQL_FIELD.match(name):
            raise ValueError(f"not a field name: {name!r}")
    parts = [f"{f['job']}:{_kql_str(job_id)}"]
    ranks = sorted({int(r) for r in ranks})
    if ranks:
        parts.append(f"{f['rank']}:(" + " or ".join(str(r) for r in ranks) + ")")
    spans = sorted({str(s) for s in span_ids if s})
    if spans:
        parts.append(f"{f['span_id']}:(" + " or ".join(_kql_str(s) for s in spans) + ")")
    return " and ".join(parts)


def rison(obj: Any) -> str:
    """Rison encoding (the URL-friendly JSON Kibana keeps its state in). Strings are always quoted."""
    if obj is None:
        return "!n"
    if obj is True:
        return "!t"
    if obj is False:
        return "!f"
    if isinstance(obj, (int, float)):
        return repr(obj)
    if isinstance(obj, str):
        return "'" + obj.replace("!", "!!").replace("'", "!'") + "'"
    if isinstance(obj, Mapping):
        return "(" + ",".join(f"{_rison_key(k)}:{rison(v)}" for k, v in obj.items()) + ")"
    if isinstance(obj, (list, tuple)):
        return "!(" + ",".join(rison(v) for v in obj) + ")"
    raise TypeError(f"cannot encode {type(obj).__name__} in Rison")


_RISON_ID = re.compile(r"^[A-Za-z_.~][A-Za-z0-9_.~-]*$")


def _rison_key(key: str) -> str:
    return key if _RISON_ID.match(key) else rison(str(key))


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


_RISON_SAFE = "!'(),:*-._~@$/"


def kibana_discover_url(base_url: str, data_view: str, kql: str, start_ns: int, end_ns: int,
                        columns: Iterable[str] = ("rank", "step", "kind", "name", "msg")) -> str:
    g = {"time": {"from": _iso(start_ns), "to": _iso(end_ns)}}
    a = {"columns": list(columns), "index": data_view, "query": {"language": "kuery", "query": kql},
         "sort": [["@timestamp", "asc"]]}
    return (f"{_base_url(base_url)}/app/discover#/?_g={quote(rison(g), safe=_RISON_SAFE)}"
            f"&_a={quote(rison(a), safe=_RISON_SAFE)}")


def attach_links(report: Any, cfg: LinkConfig) -> None:
    """Give every finding links to its cited events (ranks, span ids, time range) in the configured backends."""
    if not cfg.enabled:
        return
    margin = int(cfg.margin_s * 1e9)
    for f in report.findings:
        t0, t1 = f.time_range if f.time_range else (report.t_min, report.t_max)
        ranks = sorted({r["rank"] for r in f.refs} or set(f.ranks))
        spans = [r["span_id"] for r in f.refs if r.get("span_id")] if f.refs and all(
            r.get("span_id") for r in f.refs) else []
        if cfg.grafana_url and cfg.grafana_datasource:
            expr = logql_query(report.job_id, ranks, spans, cfg.loki_job_label)
            f.links["grafana"] = grafana_explore_url(cfg.grafana_url, cfg.grafana_datasource, expr, t0 - margin,
                                                     t1 + margin, datasource_type=cfg.grafana_datasource_type,
                                                     org_id=cfg.grafana_org_id)
        if cfg.kibana_url and cfg.kibana_data_view:
            kql = kql_query(report.job_id, ranks, spans, cfg.kibana_fields)
            f.links["kibana"] = kibana_discover_url(cfg.kibana_url, cfg.kibana_data_view, kql, t0 - margin,
                                                    t1 + margin)
