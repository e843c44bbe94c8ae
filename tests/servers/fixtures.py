"""Pytest plugin: real-server fixtures. Register with ``pytest_plugins = ["tests.servers.fixtures"]``.

Fixtures:

* ``victorialogs``, ``opensearch``, ``jaeger`` (session): one started server each for the whole run.
  Do not stop them in a test; use the private ones for that.
* ``private_victorialogs``, ``private_opensearch`` (function): a fresh server with its own
  data, for tests that stop, kill or restart it.
* ``fault_proxy`` (function): factory ``fault_proxy(server) -> FaultProxy``; all are
  stopped after the test.

Why the skip rules are strict: a missing server must not silently turn integration
tests into passes. Without ``--skip-servers`` (or ``JOBTRACE_SKIP_SERVERS=1``) a server
that cannot be built or started is a fixture ERROR with the build/start log in it.
With the flag, tests using these fixtures are skipped with a reason. When ``CI=true``
the flag is ignored: servers are mandatory in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from .base import ManagedServer, free_port
from .jaeger_server import JaegerServer
from .opensearch_server import OpenSearchServer
from .prometheus3_server import Prometheus3Server
from .proxy import FaultProxy, HasAddress
from .seaweedfs_server import SeaweedFSServer
from .victorialogs_server import VictoriaLogsServer
from .victoriametrics_server import VictoriaMetricsServer

SERVER_FIXTURES = {"victorialogs", "opensearch", "jaeger", "private_victorialogs", "private_opensearch",
                   "victoriametrics", "seaweedfs", "prometheus3"}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _skip_requested(config: pytest.Config) -> bool:
    return bool(config.getoption("skip_servers")) or os.environ.get("JOBTRACE_SKIP_SERVERS", "") in ("1", "true")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("jobtrace servers").addoption(
        "--skip-servers", action="store_true", default=False, dest="skip_servers",
        help="skip tests that need the real VictoriaLogs/OpenSearch servers "
             "(same as JOBTRACE_SKIP_SERVERS=1; ignored when CI=true)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "servers: needs the real VictoriaLogs/OpenSearch test servers")
    if _in_ci() and _skip_requested(config):
        config.issue_config_time_warning(
            pytest.PytestConfigWarning("--skip-servers/JOBTRACE_SKIP_SERVERS ignored: CI=true"), stacklevel=2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses a server fixture, so ``-m "not servers"`` deselects them."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)


def _maybe_skip(config: pytest.Config, name: str) -> None:
    if _skip_requested(config) and not _in_ci():
        pytest.skip(reason=f"{name}: real test servers skipped by --skip-servers / JOBTRACE_SKIP_SERVERS=1")


def _serve(config: pytest.Config, cls: type[ManagedServer]) -> Iterator[Any]:
    _maybe_skip(config, cls.name)
    server = cls()
    try:
        server.start()  # raises ServerError (with the log tail): the fixture errors loudly
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def victorialogs(request: pytest.FixtureRequest) -> Iterator[VictoriaLogsServer]:
    """Session VictoriaLogs: ``.loki_push_url``, ``.es_bulk_url``, ``.query(logsql)``."""
    yield from _serve(request.config, VictoriaLogsServer)


@pytest.fixture(scope="session")
def victoriametrics(request: pytest.FixtureRequest) -> Iterator[VictoriaMetricsServer]:
    """Session VictoriaMetrics: ``.otlp_url`` (OTLP metrics in), ``.query(promql)``."""
    yield from _serve(request.config, VictoriaMetricsServer)


@pytest.fixture(scope="session")
def seaweedfs(request: pytest.FixtureRequest) -> Iterator[SeaweedFSServer]:
    """Session SeaweedFS S3 gateway: ``.url``, ``.client()``, ``.env()`` (the AWS variables for it)."""
    yield from _serve(request.config, SeaweedFSServer)


@pytest.fixture(scope="session")
def prometheus3(request: pytest.FixtureRequest) -> Iterator[Prometheus3Server]:
    """Session Prometheus 3 with its OTLP receiver: ``.otlp_url``, ``.query(promql)``."""
    yield from _serve(request.config, Prometheus3Server)


@pytest.fixture(scope="session")
def opensearch(request: pytest.FixtureRequest) -> Iterator[OpenSearchServer]:
    """Session OpenSearch 2.19 node: ``.url``, ``.bulk(...)``, ``.search(index, body)``."""
    yield from _serve(request.config, OpenSearchServer)


@pytest.fixture(scope="session")
def jaeger(request: pytest.FixtureRequest) -> Iterator[JaegerServer]:
    """Session Jaeger (memory storage): ``.otlp_url`` for exporters, ``.trace(trace_id)``."""
    yield from _serve(request.config, JaegerServer)


@pytest.fixture
def private_victorialogs(request: pytest.FixtureRequest) -> Iterator[VictoriaLogsServer]:
    """A VictoriaLogs of this test's own, free to stop, kill and restart."""
    yield from _serve(request.config, VictoriaLogsServer)


@pytest.fixture
def private_opensearch(request: pytest.FixtureRequest) -> Iterator[OpenSearchServer]:
    """An OpenSearch node of this test's own (about 4 s to start), free to stop and restart."""
    yield from _serve(request.config, OpenSearchServer)


@pytest.fixture
def fault_proxy() -> Iterator[Callable[..., FaultProxy]]:
    """Factory: ``proxy = fault_proxy(server_or_(host, port), **kw)``; started, stopped after the test."""
    made: list[FaultProxy] = []

    def make(upstream: HasAddress | tuple[str, int], **kw: Any) -> FaultProxy:
        proxy = FaultProxy(upstream, **kw).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager (Debian's prometheus-alertmanager) on loopback ports; its base URL."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.skip(reason="needs Alertmanager (Debian's prometheus-alertmanager)")
    conf = tmp_path / "alertmanager.yml"
    conf.write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
    port, cluster = free_port(), free_port()
    proc = subprocess.Popen([binary, f"--config.file={conf}", f"--storage.path={tmp_path / 'am'}",
                             f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address=127.0.0.1:{cluster}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/-/ready", timeout=1).ok:
                break
        except requests.RequestException:
            pass
        time.sleep(0.3)
    else:
        proc.kill()
        raise AssertionError("Alertmanager did not start")
    yield url
    proc.terminate()
    proc.wait(timeout=15)
