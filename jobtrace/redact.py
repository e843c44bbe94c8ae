"""Keeping secrets out of what jobtrace prints: URLs in messages, errors and reports.

Users paste URLs with credentials in them (``https://user:pw@es:9200``) or tokens in the
query string (``?access_token=…``, presigned ``X-Amz-Signature=…``). Every URL that
reaches a log line, an exception or a report goes through one of the two helpers here,
so there is one place that decides what is secret:

* :func:`redact_url` keeps the URL whole but masks its user info and every query
  parameter whose name says it holds a secret (errors: the user needs to see which
  endpoint and which parameters were used);
* :func:`url_for_display` keeps only scheme, host, port and path (reports and summaries).
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["MASK", "is_secret_name", "redact_url", "url_for_display"]

MASK: Final = "***"
"""What stands where a secret was."""

_SECRET_NAME: Final = re.compile(
    r"(token|secret|passw(or)?d|pass|pwd|api[-_]?key|apikey|auth|credential|signature|sig|session|key)$",
    re.IGNORECASE,
)
"""Query parameter names that carry secrets: ``access_token``, ``api_key``, ``X-Amz-Signature``,
``X-Amz-Credential``, ``sig``, ``password``… (matched at the end of the name, any case)."""


def is_secret_name(name: str) -> bool:
    """Whether a parameter or header called ``name`` holds a secret."""
    return bool(_SECRET_NAME.search(name.replace("-", "_")))


def _netloc(host: str | None, port: int | None) -> str:
    return (host or "") + (f":{port}" if port else "")


def redact_url(url: str) -> str:
    """``url`` with its user info masked and secret query parameters replaced by :data:`MASK`."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # not a URL we can take apart (a bad port, say): show nothing of it that could leak
        return url.split("@")[-1].split("?")[0]
    netloc = parts.netloc
    if parts.username or parts.password:
        netloc = f"{MASK}@{_netloc(parts.hostname, port)}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(k) for k, _ in pairs):
            query = urlencode([(k, MASK if is_secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def url_for_display(url: str) -> str:
    """A URL fit for reports and summaries: scheme, host, port and path; no credentials, no query."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return url.split("@")[-1].split("?")[0]
    return urlunsplit((parts.scheme, _netloc(parts.hostname, port), parts.path, "", ""))
