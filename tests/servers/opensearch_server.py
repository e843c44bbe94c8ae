"""Single-node OpenSearch 2.19.6 embedded in a JVM, built from Maven Central jars.

Why embedded: no OpenSearch distribution can be downloaded here, but its jars can.
``tests/servers/opensearch/`` is a tiny Maven project whose one class starts
``org.opensearch.node.Node`` with the Netty4, analysis-common, painless and reindex
plugins. The compiled classes and the runtime classpath (jars stay in ~/.m2) are
cached under ``$JOBTRACE_SERVERS_CACHE/opensearch-<version>-<source hash>/``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import requests

from .base import ManagedServer, ServerError, build_lock, cache_dir, free_port, run_logged, wait_until

VERSION = "2.19.6"
SOURCE_DIR = Path(__file__).resolve().parent / "opensearch"
MAIN_CLASS = "jobtrace.servers.EmbeddedOpenSearch"
READY_RE = re.compile(r"JOBTRACE_OPENSEARCH_READY http=127\.0\.0\.1:(\d+)")


def _tool(env_var: str, name: str) -> str:
    found = os.environ.get(env_var) or shutil.which(name)
    if name == "java" and not os.environ.get(env_var):
        # OpenSearch 2.19 is built and tested for Java 17; prefer it over a newer default JDK.
        java17 = sorted(glob.glob("/usr/lib/jvm/java-17-openjdk-*/bin/java"))
        found = java17[0] if java17 else found
    if not found:
        raise ServerError(f"{name} not found: set {env_var} or run tests/servers/install-toolchains.sh")
    return found


def _source_hash() -> str:
    """Hash of the Maven project, so an edited pom or class triggers a rebuild."""
    h = hashlib.sha256()
    files = [SOURCE_DIR / "pom.xml", *sorted((SOURCE_DIR / "src").rglob("*"))]
    for f in files:
        if f.is_file():
            h.update(str(f.relative_to(SOURCE_DIR)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _built(root: Path) -> bool:
    """Classes compiled and every jar of the classpath still in the Maven repo (~/.m2 may be wiped)."""
    cp = root / "cp.txt"
    if not (cp.is_file() and (root / "classes").is_dir()):
        return False
    return all(os.path.isfile(jar) for jar in cp.read_text().strip().split(os.pathsep))


class OpenSearchServer(ManagedServer):
    """An embedded OpenSearch node; ``url`` is its REST API (no auth, plain HTTP)."""

    name = "opensearch"
    start_timeout = 120.0
    stop_timeout = 40.0

    @classmethod
    def build(cls) -> Path:
        """Compile the embedded node and resolve its classpath once; returns the build dir."""
        root = cache_dir() / f"opensearch-{VERSION}-{_source_hash()}"
        if _built(root):
            return root
        with build_lock("opensearch"):
            if _built(root):
                return root
            tmp = root.with_name(root.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            log = cache_dir() / f"opensearch-{VERSION}-build.log"
            log.unlink(missing_ok=True)
            run_logged([_tool("JOBTRACE_MVN", "mvn"), "-q", "-B", f"-DbuildDir={tmp}",
                        "compile", "dependency:build-classpath",
                        f"-Dmdep.outputFile={tmp / 'cp.txt'}", "-Dmdep.includeScope=runtime"],
                       log, cwd=SOURCE_DIR)
            shutil.rmtree(root, ignore_errors=True)
            os.replace(tmp, root)
        return root

    def _stdin(self) -> int:
        # The JVM exits when this pipe closes, so a killed pytest leaves no orphan JVM.
        return subprocess.PIPE

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        heap = os.environ.get("JOBTRACE_OPENSEARCH_HEAP", "512m")
        classpath = f"{artifact / 'classes'}:{(artifact / 'cp.txt').read_text().strip()}"
        return [_tool("JOBTRACE_JAVA", "java"), f"-Xms{heap}", f"-Xmx{heap}",
                "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                # What the OpenSearch launcher would pass (it is bypassed when embedding).
                "-Djava.locale.providers=SPI,COMPAT", "-Dfile.encoding=UTF-8",
                "-Dio.netty.noUnsafe=true", "-Dlog4j2.disable.jmx=true",
                "-Djobtrace.exitOnStdinEof=true",
                "-cp", classpath, MAIN_CLASS, str(data_dir), str(self.port), str(free_port())]

    def _wait_ready(self) -> None:
        def printed_port() -> bool:
            m = READY_RE.search(self._log_text())
            if m and int(m.group(1)) != self.port:
                raise ServerError(f"bound {m.group(1)}, asked for {self.port}")
            return m is not None

        wait_until(printed_port, self.start_timeout, "opensearch node start",
                   alive=self.is_running, interval=0.1)
        r = requests.get(self.url + "/_cluster/health",
                         params={"wait_for_status": "yellow", "timeout": "30s"}, timeout=40)
        if r.status_code != 200 or r.json().get("status") not in ("yellow", "green"):
            raise ServerError(f"cluster health: HTTP {r.status_code} {r.text[:300]}")

    # --- helpers --------------------------------------------------------------------
    @property
    def bulk_url(self) -> str:
        return self.url + "/_bulk"

    def refresh(self, index: str = "_all") -> None:
        """Make indexed docs searchable now (instead of after the 1 s refresh interval)."""
        requests.post(f"{self.url}/{index}/_refresh", timeout=30).raise_for_status()

    def search(self, index: str, body: dict[str, Any] | None = None,
               refresh: bool = True) -> dict[str, Any]:
        """``POST /<index>/_search`` (after a refresh by default); returns the JSON answer."""
        if refresh:
            self.refresh(index)
        r = requests.post(f"{self.url}/{index}/_search", json=body or {"query": {"match_all": {}}},
                          timeout=30)
        if r.status_code != 200:
            raise ServerError(f"_search {index}: HTTP {r.status_code}: {r.text[:500]}")
        result: dict[str, Any] = r.json()
        return result

    def bulk(self, ndjson_lines: list[dict[str, Any]], refresh: str = "false") -> dict[str, Any]:
        """``POST /_bulk`` with action/source dicts; raises if any item failed."""
        body = "".join(json.dumps(x) + "\n" for x in ndjson_lines)
        r = requests.post(self.bulk_url, data=body.encode(), params={"refresh": refresh},
                          headers={"Content-Type": "application/x-ndjson"}, timeout=60)
        result: dict[str, Any] = r.json()
        if r.status_code != 200 or result.get("errors"):
            raise ServerError(f"_bulk: HTTP {r.status_code}: {r.text[:500]}")
        return result
