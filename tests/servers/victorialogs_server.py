"""VictoriaLogs v1.52.1 built from the Go module proxy and run on a loopback port.

Why VictoriaLogs: one small Go binary that speaks both the Loki push API and the
Elasticsearch ``_bulk`` API, so the Loki and ES shippers can be tested against a
real server without Docker. Built with ``CGO_ENABLED=0`` (pure-Go zstd), so no C
toolchain is needed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import requests

from .base import ManagedServer, ServerError, build_lock, cache_dir, run_logged, wait_until

VERSION = "v1.52.1"
MODULE = "github.com/VictoriaMetrics/VictoriaLogs"
PACKAGE = f"{MODULE}/app/victoria-logs"
LDFLAGS = f"-X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version=victoria-logs-{VERSION}"


def go_binary() -> str:
    """``$JOBTRACE_GO``, else the toolchain install-toolchains.sh put in the cache, else PATH."""
    bootstrapped = str(cache_dir() / "go" / "bin" / "go")
    for cand in (os.environ.get("JOBTRACE_GO"), bootstrapped, shutil.which("go"), "/usr/local/go/bin/go"):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ServerError("no Go toolchain found: set JOBTRACE_GO or run tests/servers/install-toolchains.sh")


class VictoriaLogsServer(ManagedServer):
    """A VictoriaLogs single-node server; see the URL helpers for its ingest/query APIs."""

    name = "victorialogs"
    start_timeout = 30.0

    @classmethod
    def build(cls) -> Path:
        """Return the cached binary, building it with ``go install`` on first use.

        ``$JOBTRACE_VICTORIALOGS_BIN`` points at a prebuilt binary and skips the build.
        GOMODCACHE/GOCACHE keep their defaults, so a rebuild after a cache wipe is fast.
        """
        override = os.environ.get("JOBTRACE_VICTORIALOGS_BIN")
        if override:
            return Path(override)
        root = cache_dir() / f"victorialogs-{VERSION}"
        binary = root / "bin" / "victoria-logs"
        if binary.is_file():
            return binary
        with build_lock("victorialogs"):
            if binary.is_file():
                return binary
            tmp = root.with_name(root.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "bin").mkdir(parents=True)
            log = cache_dir() / f"victorialogs-{VERSION}-build.log"
            log.unlink(missing_ok=True)
            env = dict(os.environ, CGO_ENABLED="0", GOBIN=str(tmp / "bin"),
                       GOTOOLCHAIN=os.environ.get("JOBTRACE_GOTOOLCHAIN", "auto"))
            go = go_binary()
            try:
                run_logged([go, "install", "-ldflags", LDFLAGS, f"{PACKAGE}@{VERSION}"], log, env=env)
            except ServerError:
                if "replace directives" not in log.read_text(errors="replace"):
                    raise
                _build_via_tools_module(go, tmp, log, env)
            root.mkdir(parents=True, exist_ok=True)
            (root / "bin").mkdir(exist_ok=True)
            os.replace(tmp / "bin" / "victoria-logs", binary)
            shutil.rmtree(tmp, ignore_errors=True)
        return binary

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        return [str(artifact), "-httpListenAddr", f"{self.host}:{self.port}",
                "-storageDataPath", str(data_dir), "-retentionPeriod", "100y",
                "-futureRetention", "1y", "-loggerLevel", "WARN"]

    def _wait_ready(self) -> None:
        wait_until(lambda: self._http_ok("/health"), self.start_timeout,
                   f"{self.name} GET /health", alive=self.is_running)

    # --- URLs of the real APIs ------------------------------------------------------
    @property
    def loki_push_url(self) -> str:
        """Loki push API (JSON or snappy protobuf); the Loki shipper posts here."""
        return self.url + "/insert/loki/api/v1/push"

    @property
    def es_base_url(self) -> str:
        """Base URL for Elasticsearch clients; only ``<base>/_bulk`` ingests."""
        return self.url + "/insert/elasticsearch"

    @property
    def es_bulk_url(self) -> str:
        """Elasticsearch ``_bulk`` (index name in the path is NOT supported)."""
        return self.url + "/insert/elasticsearch/_bulk"

    @property
    def query_url(self) -> str:
        """LogsQL query endpoint; answers JSON Lines."""
        return self.url + "/select/logsql/query"

    # --- helpers --------------------------------------------------------------------
    def force_flush(self) -> None:
        """Make just-ingested rows searchable now instead of within ~1 s."""
        r = requests.get(self.url + "/internal/force_flush", timeout=30)
        r.raise_for_status()

    def query(self, logsql: str, flush: bool = True, **params: Any) -> list[dict[str, str]]:
        """Run a LogsQL query (after a flush by default); one dict per row, values are strings."""
        if flush:
            self.force_flush()
        r = requests.post(self.query_url, data={"query": logsql, **params}, timeout=30)
        if r.status_code != 200:
            raise ServerError(f"LogsQL {logsql!r}: HTTP {r.status_code}: {r.text[:500]}")
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def _build_via_tools_module(go: str, tmp: Path, log: Path, env: dict[str, str]) -> None:
    """Fallback for a release whose go.mod carries ``replace``: a dependency's replace is ignored."""
    mod = tmp / "toolsmod"
    mod.mkdir()
    run_logged([go, "mod", "init", "jobtrace/vltools"], log, cwd=mod, env=env)
    run_logged([go, "get", "-tool", f"{PACKAGE}@{VERSION}"], log, cwd=mod, env=env)
    run_logged([go, "build", "-ldflags", LDFLAGS, "-o", str(tmp / "bin" / "victoria-logs"), PACKAGE],
               log, cwd=mod, env=env)
