"""The Loki wire's text forms: quoted strings, label names and label sets.

One home for how a value becomes LogQL (or LogsQL, or the Prometheus label text of a
protobuf push), used by the shipper that writes streams, the reader that queries them,
the query library and the VictoriaLogs reader: a quoting rule fixed here is fixed for
every query and every push.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

__all__ = ["JOB_LABEL", "LABEL_KEYS", "METADATA_KEYS", "is_label_name", "label_string", "logql_quote", "logsql_quote"]

JOB_LABEL: Final = "training_job"
"""The stream label that holds the job id. Not ``job``: Promtail, Alloy and Prometheus give ``job`` to the
scrape job, so in a Loki shared with them ``{job=…}`` would mix jobtrace's streams with theirs. Data shipped
before the rename carries ``job``: ``JOBTRACE_LOKI_JOB_LABEL=job`` reads it (docs/loki.md)."""

LABEL_KEYS: Final = (JOB_LABEL, "node", "kind", "level")
"""The stream labels jobtrace sets (the event's job, node, kind and level): few values each, so the index
stays small. A user's static labels may not take these names."""

METADATA_KEYS: Final = ("rank", "trace_id", "span_id", "step")
"""Event keys sent as structured metadata (Loki 3.x): high cardinality, never labels."""

_LABEL_NAME: Final = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def is_label_name(name: str) -> bool:
    """Whether ``name`` is a valid Prometheus/Loki label name."""
    return bool(_LABEL_NAME.match(name))


def logql_quote(value: str) -> str:
    """``value`` as a double-quoted LogQL / Prometheus label string (Go escaping rules).

    Every character that could end the string or the selector (``"``, ``\\``, newlines
    and other control characters) is escaped, so user input cannot change a query.
    """
    out = ['"']
    for ch in value:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def label_string(labels: Mapping[str, str]) -> str:
    """The Prometheus text form Loki's protobuf push expects: ``{a="x", b="y"}``, names sorted."""
    return "{" + ", ".join(f"{k}={logql_quote(v)}" for k, v in sorted(labels.items())) + "}"


def logsql_quote(value: str) -> str:
    """A double-quoted LogsQL string: VictoriaLogs unquotes with Go's rules, as LogQL does."""
    return logql_quote(value)
