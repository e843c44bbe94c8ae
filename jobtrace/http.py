"""HTTP transport and retry policy shared by every network shipper and backend reader.

The transport is the test seam (as in httpx): shippers call ``send(Request)`` and
get a ``Response`` or a :class:`BackendUnavailable`; nothing above this module sees
a ``requests`` exception. :class:`InMemoryTransport` turns a function into a server
for unit tests; integration tests use real servers.

Secrets (passwords, tokens, API keys) come from :class:`HttpConfig`, which reads
the environment or a config file, and are never part of a ``repr``, a log line or
an error message.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Protocol

from . import config
from .errors import BackendUnavailable, ConfigError
from .redact import redact_url

__all__ = [
    "HttpConfig",
    "InMemoryTransport",
    "Request",
    "RequestsTransport",
    "Response",
    "RetryPolicy",
    "Transport",
    "url_without_suffix",
]


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for k, v in self.headers.items():
            if k.lower() == lname:
                return v
        return None


class Transport(Protocol):
    def send(self, request: Request, timeout_s: float) -> Response: ...

    def close(self) -> None: ...


@dataclass(frozen=True, repr=False)
class HttpConfig:
    """Where and how to connect. Build it with :meth:`from_env` to keep secrets out of code.

    ``verify`` is on by default; ``ca_file`` adds a private CA; ``client_cert``/
    ``client_key`` enable mutual TLS.
    """

    url: str
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    api_key: str | None = None
    tenant: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    verify: bool = True
    timeout_s: float = 10.0
    extra_headers: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={'***' if k in ('password', 'bearer_token', 'api_key') and v else v!r}"
            for k, v in self.__dict__.items()
        )
        return f"HttpConfig({shown})"

    @classmethod
    def from_env(cls, prefix: str, url: str | None = None, **overrides: object) -> HttpConfig:
        """The connection ``<PREFIX>_*`` describes (``JOBTRACE_LOKI``, ``JOBTRACE_ES``, ``JOBTRACE_VL``,
        ``JOBTRACE_KIBANA``; see :mod:`jobtrace.config`): ``_URL`` (``url`` wins), ``_USERNAME``,
        ``_PASSWORD``, ``_TOKEN``, ``_API_KEY`` (each also ``_FILE``), ``_TENANT``, ``_CA_FILE``,
        ``_CLIENT_CERT``, ``_CLIENT_KEY``, ``_INSECURE``. ``overrides`` that are not ``None`` win."""
        names = config.server_vars(prefix)
        chosen = url or config.get_str(names.url)
        if not chosen:
            raise ConfigError(f"no URL: pass one or set {names.url}")
        values: dict[str, object] = dict(
            url=chosen.rstrip("/"),
            username=config.get_str(names.username),
            password=config.get_secret(names.password),
            bearer_token=config.get_secret(names.token),
            api_key=config.get_secret(names.api_key),
            tenant=config.get_str(names.tenant),
            ca_file=config.get_str(names.ca_file),
            client_cert=config.get_str(names.client_cert),
            client_key=config.get_str(names.client_key),
            verify=not config.get_bool(names.insecure),
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def has_credentials(cls, prefix: str) -> bool:
        """Whether any credential variable of ``prefix`` is set (so that it should be used rather than another's)."""
        names = config.server_vars(prefix)
        secrets = (names.password, names.token, names.api_key)
        return any(config.get_str(n) for n in (names.username, *secrets, *map(names.file_of, secrets)))

    def auth_headers(self) -> dict[str, str]:
        import base64

        headers: dict[str, str] = {}
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        elif self.api_key:
            headers["Authorization"] = f"ApiKey {self.api_key}"
        elif self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers


class RequestsTransport:
    """A pooled ``requests`` session with TLS settings; connection errors become BackendUnavailable."""

    def __init__(self, config: HttpConfig) -> None:
        import requests

        self._requests = requests
        self._session = requests.Session()
        self._session.headers.update(config.auth_headers())
        self._session.headers.update(config.extra_headers)
        self._session.verify = config.ca_file if (config.verify and config.ca_file) else config.verify
        if config.client_cert:
            self._session.cert = (config.client_cert, config.client_key) if config.client_key else config.client_cert
        self._session.trust_env = False  # a proxy from the environment must not capture training telemetry

    def send(self, request: Request, timeout_s: float) -> Response:
        try:
            r = self._session.request(request.method, request.url, data=request.body or None,
                                      headers=dict(request.headers), timeout=timeout_s)
        except self._requests.RequestException as exc:
            # The exception text can contain the URL but never our headers; keep only its class and reason.
            raise BackendUnavailable(f"{request.method} {redact_url(request.url)}: {type(exc).__name__}") from None
        return Response(r.status_code, r.content, dict(r.headers))

    def close(self) -> None:
        self._session.close()


def url_without_suffix(url: str, suffixes: Sequence[str]) -> tuple[str, str]:
    """(scheme://host:port, path) of ``url`` with the first matching endpoint suffix removed.

    Users paste whichever URL they have (a push endpoint, a query endpoint, the root);
    each backend reader turns it back into its API root with this.
    """
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for suffix in suffixes:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urlunsplit(parts._replace(path="", query="", fragment="")), path


class InMemoryTransport:
    """A function as a server: ``InMemoryTransport(lambda req: Response(204))``. For unit tests."""

    def __init__(self, handler: Callable[[Request], Response]) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    def send(self, request: Request, timeout_s: float) -> Response:
        self.requests.append(request)
        return self.handler(request)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before sending again. There is no give-up: data stays spooled."""

    retry_statuses: frozenset[int] = frozenset({408, 425, 429, 500, 502, 503, 504})
    initial_s: float = 0.5
    max_s: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def retryable(self, status: int | None) -> bool:
        return status is None or status in self.retry_statuses

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before try ``attempt + 1``; ``Retry-After`` wins when the server sent one."""
        if retry_after:
            hinted = _parse_retry_after(retry_after)
            if hinted is not None:
                return min(max(hinted, 0.0), self.max_s * 4)
        base = min(self.max_s, self.initial_s * self.multiplier**attempt)
        return base * (1 + random.uniform(-self.jitter, self.jitter))


def _parse_retry_after(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        import time

        return parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None
