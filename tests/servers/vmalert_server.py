"""vmalert (VictoriaMetrics v1.150.0) built from the Go module proxy: jobtrace's VictoriaLogs alert rules, run for
real against a real VictoriaLogs, notifying a real Alertmanager.

v1.150.0: the newest release whose go.mod still builds on this machine's Go 1.26 (v1.154 asks for 1.27.2).
The rule file is given at start; ``alerts()`` reads vmalert's own API (``/api/v1/alerts``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import requests

from .base import ManagedServer, ServerError, wait_until
from .gobuild import build_go_server

VERSION = "v1.150.0"
PACKAGE = "github.com/VictoriaMetrics/VictoriaMetrics/app/vmalert"


class VmalertServer(ManagedServer):
    """vmalert evaluating ``rule_file`` every ``interval`` against ``datasource`` (VictoriaLogs)."""

    name = "vmalert"
    start_timeout = 30.0

    def __init__(self, port: int | None = None, *, rule_file: str | os.PathLike[str] = "", datasource: str = "",
                 notifier: str | None = None, interval: str = "2s") -> None:
        super().__init__(port)
        self.rule_file, self.datasource, self.notifier, self.interval = str(rule_file), datasource, notifier, interval

    @classmethod
    def build(cls) -> Path:
        """The cached binary (built on first use); ``$JOBTRACE_VMALERT_BIN`` skips the build."""
        override = os.environ.get("JOBTRACE_VMALERT_BIN")
        if override:
            return Path(override)
        return build_go_server("vmalert", VERSION, PACKAGE, "vmalert")

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        if not self.rule_file or not self.datasource:
            raise ServerError("vmalert needs rule_file and datasource")
        notify = [f"-notifier.url={self.notifier}"] if self.notifier else ["-notifier.blackhole"]
        return [str(artifact), f"-rule={self.rule_file}", f"-datasource.url={self.datasource}", *notify,
                f"-evaluationInterval={self.interval}", f"-httpListenAddr={self.host}:{self.port}",
                "-rule.defaultRuleType=vlogs", "-loggerLevel=WARN"]

    def _wait_ready(self) -> None:
        wait_until(lambda: self._http_ok("/health"), self.start_timeout, f"{self.name} GET /health",
                   alive=self.is_running)

    def alerts(self) -> list[dict[str, Any]]:
        """vmalert's active alerts (pending and firing), with their labels."""
        r = requests.get(f"{self.url}/api/v1/alerts", timeout=10)
        r.raise_for_status()
        return list(r.json()["data"]["alerts"])
