"""Fixtures of the Loki tests: Loki's own protobuf classes, Grafana's LogQL parser, real servers.

The real-server fixtures come from the ``tests.servers`` harness. When its plugin is
registered (``tests/conftest.py``) its session VictoriaLogs is shared; otherwise an
equivalent server is started here with the same harness classes (non-root conftests
may not declare ``pytest_plugins``).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers.fixtures import fault_proxy  # noqa: F401 - re-exported fixture

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = Path(__file__).resolve().parent / "node"
PROTO_DIR = ROOT / "loki" / "proto"
PLUGIN = "tests.servers.fixtures"


def _skip_servers(config: pytest.Config) -> bool:
    in_ci = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
    flag = False
    try:
        flag = bool(config.getoption("skip_servers"))
    except ValueError:
        pass
    return (flag or os.environ.get("JOBTRACE_SKIP_SERVERS", "") in ("1", "true")) and not in_ci


def _own_server(config: pytest.Config) -> Iterator[Any]:
    from tests.servers import VictoriaLogsServer

    if _skip_servers(config):
        pytest.skip(reason="victorialogs: real test servers skipped by --skip-servers / JOBTRACE_SKIP_SERVERS=1")
    server = VictoriaLogsServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def vl(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session VictoriaLogs (Loki push at ``.loki_push_url``, LogsQL at ``.query_url``)."""
    if request.config.pluginmanager.has_plugin(PLUGIN):
        yield request.getfixturevalue("victorialogs")
    else:
        yield from _own_server(request.config)


@pytest.fixture
def private_vl(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A VictoriaLogs of the test's own, free to stop and restart."""
    if request.config.pluginmanager.has_plugin(PLUGIN):
        yield request.getfixturevalue("private_victorialogs")
    else:
        yield from _own_server(request.config)


@pytest.fixture(scope="session")
def push_pb2(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Classes compiled by protoc (grpcio-tools) from Loki's published push.proto, independent of the encoder."""
    grpc_tools = pytest.importorskip("grpc_tools", reason="grpcio-tools is a dev dependency")
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("loki_pb2")
    include = Path(grpc_tools.__file__).parent / "_proto"
    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}",
                      str(PROTO_DIR / "push.proto"), str(PROTO_DIR / "gogoproto" / "gogo.proto")])
    assert rc == 0, "protoc could not compile loki/proto/push.proto"
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("push_pb2")
    finally:
        sys.path.remove(str(out))


def lezer_parse(exprs: dict[str, str]) -> dict[str, str | None]:
    """Parse LogQL expressions with Grafana's @grafana/lezer-logql (through node); name → error or None."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is needed to run Grafana's LogQL grammar: apt-get install nodejs")
    if not (NODE_DIR / "node_modules" / "@grafana" / "lezer-logql").is_dir():
        pytest.fail(f"@grafana/lezer-logql is not installed: run `npm ci --prefix {NODE_DIR.relative_to(ROOT)}`")
    proc = subprocess.run([node, str(NODE_DIR / "parse.cjs")], input=json.dumps(exprs), capture_output=True,
                          text=True, timeout=60, cwd=NODE_DIR)
    if proc.returncode not in (0, 1):
        pytest.fail(f"parse.cjs failed ({proc.returncode}): {proc.stderr}")
    result: dict[str, str | None] = json.loads(proc.stdout)
    return result
