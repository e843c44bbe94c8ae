"""Real log servers for jobtrace's integration tests (issue #3); see README.md here.

``VictoriaLogsServer`` (Loki push + ES ``_bulk`` + LogsQL), ``OpenSearchServer``
(embedded 2.19 node) and ``JaegerServer`` (OTLP in, trace query API out) are built once, cached in ``$JOBTRACE_SERVERS_CACHE``
(default ``~/.cache/jobtrace-servers``) and run on free 127.0.0.1 ports with data in
temp dirs. ``FaultProxy`` sits in front of either to inject refusals, delays and
error statuses. Pytest fixtures live in ``tests.servers.fixtures``; the command line
is ``python -m tests.servers``.
"""

from .base import ManagedServer, ServerError, cache_dir, free_port
from .jaeger_server import JaegerServer
from .opensearch_server import OpenSearchServer
from .prometheus3_server import Prometheus3Server
from .proxy import FaultProxy, SeenRequest
from .seaweedfs_server import SeaweedFSServer
from .victorialogs_server import VictoriaLogsServer
from .victoriametrics_server import VictoriaMetricsServer
from .vmalert_server import VmalertServer

SERVERS: dict[str, type[ManagedServer]] = {
    "victorialogs": VictoriaLogsServer,
    "opensearch": OpenSearchServer,
    "jaeger": JaegerServer,
    "vmalert": VmalertServer,
    "victoriametrics": VictoriaMetricsServer,
    "seaweedfs": SeaweedFSServer,
    "prometheus3": Prometheus3Server,
}

__all__ = ["SERVERS", "FaultProxy", "JaegerServer", "ManagedServer", "OpenSearchServer", "Prometheus3Server", "SeaweedFSServer", "SeenRequest",
           "ServerError", "VictoriaLogsServer", "VictoriaMetricsServer", "VmalertServer", "cache_dir", "free_port"]
