"""Network sinks chosen by environment, so ``init_tracing()`` stays one line.

``JOBTRACE_LOKI_URL`` adds the Loki shipper, ``JOBTRACE_ES_URL`` the
Elasticsearch/OpenSearch shipper (credentials and TLS from the same prefix, see
:meth:`shippers.HttpConfig.from_env`). ``JOBTRACE_LOCAL=0`` turns the embedded
store off when a server is configured. Each process spools under
``<data_dir>/<job>/.spool/<backend>-r<rank>`` so a restarted rank replays what its
previous life could not send.
"""

from __future__ import annotations

from jobtrace import config
from jobtrace.errors import ConfigError

from ._batch import Sink
from ._process import ProcessInfo
from ._sender import SpoolingSender

__all__ = ["NETWORK_BACKENDS", "SHIPPER_BACKENDS", "local_store_enabled", "network_sinks_from_env", "open_shipper"]

NETWORK_BACKENDS = ("loki", "elasticsearch")
"""The shippers a process starts from its environment (their URL variable set)."""

SHIPPER_BACKENDS = ("loki", "victorialogs", "elasticsearch")
"""What :func:`open_shipper` opens: VictoriaLogs through its Loki ingest, for ``jobtrace export``,
``replay`` and ``ingest`` (``JOBTRACE_VL_URL`` names the server to read, so it starts no shipper)."""


def open_shipper(backend: str, info: ProcessInfo, url: str | None = None) -> SpoolingSender:
    """The shipper for ``backend`` (one of :data:`SHIPPER_BACKENDS`), configured from the environment.

    ``url`` overrides ``JOBTRACE_LOKI_URL`` / ``JOBTRACE_VL_URL`` / ``JOBTRACE_ES_URL``; credentials
    and TLS still come from the environment only, so they never appear on a command line.
    """
    if backend == "loki":
        from ._loki import LokiShipper

        return LokiShipper.from_env(info, url=url)
    if backend == "victorialogs":
        from ._loki import LokiShipper

        return LokiShipper.for_victorialogs(info, url=url)
    if backend == "elasticsearch":
        from ._elasticsearch import ElasticsearchShipper

        return ElasticsearchShipper.from_env(info, url=url)
    raise ConfigError(f"unknown backend {backend!r}; expected one of {', '.join(SHIPPER_BACKENDS)}")


def network_sinks_from_env(info: ProcessInfo) -> list[Sink]:
    """A shipper for each backend whose URL variable is set (``JOBTRACE_LOKI_URL``, ``JOBTRACE_ES_URL``)."""
    urls = {"loki": config.LOKI.url, "elasticsearch": config.ES.url}
    return [open_shipper(backend, info) for backend in NETWORK_BACKENDS if config.get_str(urls[backend])]


def local_store_enabled() -> bool:
    """Whether the embedded store is written besides the network shippers (``JOBTRACE_LOCAL``)."""
    return config.get_bool(config.LOCAL, default=True)
