"""The named LogQL query library: one place where each query is written (see :mod:`loki`)."""


from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from jobtrace import config
from jobtrace.errors import ConfigError

from ._logql import JOB_LABEL, LABEL_KEYS, METADATA_KEYS, is_label_name, logql_quote

__all__ = ["ASSETS", "Alert", "Query", "QueryLibrary", "Regex", "job_label", "library", "re2_escape", "valid_job_label"]

ASSETS = Path(__file__).resolve().parent
"""Where the packaged files are: ``queries.yaml``, ``rules/``, ``grafana/``, ``proto/``."""

_JOB_LABEL_TOKEN = re.compile(r"(?<!\w)" + JOB_LABEL + r"(?!\w)")
"""Where the library names the job's stream label: ``training_job`` as a whole word, never a JSON key (``"job"``)."""
_PLACEHOLDER = re.compile(r'@\{(\w+)\}|"\$(\w+)"|\$(\w+)')
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_RE2_META = frozenset("\\.+*?()|[]{}^$")


class Regex(str):
    """A trusted regex passed as a parameter value: used as is, not escaped as a literal."""


def re2_escape(value: str) -> str:
    """``value`` as an RE2 regex that matches exactly that text (RE2 rejects ``\\`` before most letters,
    so only metacharacters are escaped, and control characters become ``\\xNN``)."""
    out = []
    for ch in value:
        if ch in _RE2_META:
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # regex | duration | int | number
    default: Any
    grafana: str
    doc: str = ""

    def value(self, raw: Any) -> str:
        """The text that replaces the placeholder, validated or escaped."""
        if raw is None:
            raw = self.default if self.kind != "regex" else Regex(str(self.default))
        if self.kind == "regex":
            if isinstance(raw, Regex):
                return logql_quote(str(raw))
            if isinstance(raw, (list, tuple, set, frozenset)):
                items = sorted(str(v) for v in raw) if isinstance(raw, (set, frozenset)) else [str(v) for v in raw]
                if not items:
                    raise ConfigError(f"parameter {self.name}: empty list")
                return logql_quote("|".join(re2_escape(v) for v in items))
            if isinstance(raw, bool) or not isinstance(raw, (str, int)):
                raise ConfigError(f"parameter {self.name}: expected a string, an int or a list, got {type(raw).__name__}")
            return logql_quote(re2_escape(str(raw)))
        if self.kind == "duration":
            text = str(raw)
            if not _DURATION.match(text):
                raise ConfigError(f"parameter {self.name}: {text!r} is not a LogQL duration such as 30s, 5m, 1h")
            return text
        if self.kind == "int":
            if isinstance(raw, bool) or not isinstance(raw, (int, str)) or not str(raw).isdigit():
                raise ConfigError(f"parameter {self.name}: {raw!r} is not a non-negative integer")
            return str(int(raw))
        if self.kind == "number":
            try:
                x = float(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"parameter {self.name}: {raw!r} is not a number") from None
            if x != x or x in (float("inf"), float("-inf")):
                raise ConfigError(f"parameter {self.name}: {raw!r} is not finite")
            return repr(x) if not x.is_integer() else str(int(x))
        raise ConfigError(f"parameter {self.name}: unknown kind {self.kind!r}")


@dataclass(frozen=True)
class Query:
    """One named query: its LogQL template and what it answers."""

    name: str
    type: str  # log | metric
    expr: str
    answers: str
    unit: str | None = None

    @property
    def template(self) -> str:
        return " ".join(self.expr.split())


@dataclass(frozen=True)
class Alert:
    """One ruler alert: a library expression with fixed parameters."""

    alert: str
    expr: str
    params: Mapping[str, Any]
    for_: str
    severity: str
    summary: str
    description: str
    logsql: str | None = None
    """The same alert for vmalert on VictoriaLogs: a LogsQL ``stats`` query (``{param}`` placeholders from
    ``params`` and ``logsql_params``); every series it returns fires (its own ``filter`` pipe holds the threshold)."""
    logsql_params: Mapping[str, Any] = field(default_factory=dict)

    def logsql_expr(self, **overrides: Any) -> str | None:
        if self.logsql is None:
            return None
        values = {**self.params, **self.logsql_params, **overrides}
        return " ".join(self.logsql.format(**values).split())


@dataclass
class QueryLibrary:
    queries: dict[str, Query]
    params: dict[str, Param]
    alerts: list[Alert] = field(default_factory=list)

    def __getitem__(self, name: str) -> Query:
        try:
            return self.queries[name]
        except KeyError:
            raise ConfigError(f"no query {name!r} in the library; known: {', '.join(sorted(self.queries))}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.queries

    def names(self) -> list[str]:
        return list(self.queries)

    def used_params(self, name: str) -> set[str]:
        """Parameter names the query ``name`` uses (its ``@{…}`` inclusions included)."""
        return _param_names(self._expand(self[name].template, set()))

    def _expand(self, template: str, seen: set[str]) -> str:
        def include(m: re.Match[str]) -> str:
            if m.group(1) is None:
                return m.group(0)
            name = m.group(1)
            if name in seen:
                raise ConfigError(f"query {name!r} includes itself")
            return self._expand(self[name].template, seen | {name})

        return _PLACEHOLDER.sub(include, " ".join(template.split()))

    def _substitute(self, template: str, text_for: Any) -> str:
        expanded = self._expand(template, set())

        def sub(m: re.Match[str]) -> str:
            name = m.group(2) or m.group(3)
            param = self.params.get(name)
            if param is None:
                raise ConfigError(f"unknown parameter ${name} in {template!r}")
            return str(text_for(param, quoted=m.group(2) is not None))

        return _PLACEHOLDER.sub(sub, expanded)

    def render_template(self, template: str, **values: Any) -> str:
        unknown = set(values) - set(self.params)
        if unknown:
            raise ConfigError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
        for name, value in values.items():  # validate every value given, used by this query or not
            self.params[name].value(value)
        return self._substitute(template, lambda p, quoted: p.value(values.get(p.name)))

    def render(self, name: str, **values: Any) -> str:
        """The query ``name`` with parameter values (``None`` or missing: the default), escaped."""
        return self.render_template(self[name].template, **values)

    def grafana_template(self, template: str) -> str:
        def text(p: Param, quoted: bool) -> str:
            return f'"{p.grafana}"' if quoted else p.grafana

        return self._substitute(template, text)

    def grafana(self, name: str) -> str:
        """The query as Grafana panels run it: parameters are dashboard variables/built-ins."""
        return self.grafana_template(self[name].template)

    def alert_expr(self, alert: Alert) -> str:
        return self.render_template(alert.expr, **dict(alert.params))

    def with_job_label(self, label: str) -> QueryLibrary:
        """The same library on streams whose job id is in ``label`` instead of ``training_job`` (data shipped
        under the old ``job`` label, or a site's own name): every selector, ``by``/``on``/``keep`` list and
        alert text that names the label follows."""
        label = valid_job_label(label)
        if label == JOB_LABEL:
            return self

        def sub(text: str) -> str:
            return _JOB_LABEL_TOKEN.sub(label, text)

        queries = {n: Query(q.name, q.type, sub(q.expr), q.answers, q.unit) for n, q in self.queries.items()}
        alerts = [Alert(a.alert, sub(a.expr), a.params, a.for_, a.severity, sub(a.summary), sub(a.description),
                        sub(a.logsql) if a.logsql is not None else None, a.logsql_params) for a in self.alerts]
        return QueryLibrary(queries, self.params, alerts)


def _param_names(text: str) -> set[str]:
    return {m.group(2) or m.group(3) for m in _PLACEHOLDER.finditer(text) if m.group(1) is None}


def _load(text: str) -> QueryLibrary:
    import yaml

    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise ConfigError("queries.yaml: expected version: 1")
    params = {
        name: Param(name, spec["kind"], spec.get("default"), str(spec.get("grafana", spec.get("default"))),
                    spec.get("doc", ""))
        for name, spec in doc["params"].items()
    }
    queries = {
        name: Query(name, spec["type"], spec["expr"], " ".join(str(spec["answers"]).split()), spec.get("unit"))
        for name, spec in doc["queries"].items()
    }
    alerts = [
        Alert(a["alert"], a["expr"], dict(a.get("params") or {}), str(a.get("for", "0m")), a["severity"],
              a["summary"], " ".join(str(a.get("description", "")).split()), a.get("logsql"),
              dict(a.get("logsql_params") or {}))
        for a in doc.get("alerts", [])
    ]
    return QueryLibrary(queries, params, alerts)


def valid_job_label(label: str) -> str:
    """``label`` when it can hold the job id (a label name, not one of jobtrace's other labels), else ConfigError."""
    if not is_label_name(label) or label.startswith("__") or label in LABEL_KEYS[1:] or label in METADATA_KEYS:
        raise ConfigError(f"{label!r} cannot hold the job id: it must be a Loki label name other than "
                          f"{', '.join(LABEL_KEYS[1:] + METADATA_KEYS)}")
    return label


def job_label(env: Mapping[str, str] | None = None) -> str:
    """The stream label that holds the job id: ``JOBTRACE_LOKI_JOB_LABEL``, by default ``training_job``.
    Shippers write it and readers query it, so both sides of a site agree; ``job`` reads old data."""
    return valid_job_label(config.get_str(config.LOKI_JOB_LABEL, env, default=JOB_LABEL) or JOB_LABEL)


@lru_cache(maxsize=4)
def library(job_label: str = JOB_LABEL) -> QueryLibrary:
    """The packaged query library (parsed once), on streams whose job id is in ``job_label``."""
    return _load((ASSETS / "queries.yaml").read_text(encoding="utf-8")).with_job_label(job_label)


def load_library(path: str | Path) -> QueryLibrary:
    """A library from another file in the same format (for users extending ours)."""
    return _load(Path(path).read_text(encoding="utf-8"))
