"""SeaweedFS (``weed mini``: master, volume, filer and its S3 gateway in one process), built from its Go module:
a real S3-compatible object store for ``jobtrace archive`` and ``trace-job --backend archive``.

The S3 gateway requires signed requests from the one identity of its config (``ACCESS_KEY``/``SECRET_KEY``);
every port is a free one on 127.0.0.1. The module is pinned to the pseudo-version the module proxy serves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .base import ManagedServer, free_port, wait_until
from .gobuild import build_go_server

VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
PACKAGE = "github.com/seaweedfs/seaweedfs/weed"
ACCESS_KEY = "jobtrace-test"
SECRET_KEY = "jobtrace-test-secret-0123456789"


class SeaweedFSServer(ManagedServer):
    name = "seaweedfs"
    start_timeout = 90.0

    @classmethod
    def build(cls) -> Path:
        """The cached ``weed`` binary (built on first use, ~6 minutes); ``$JOBTRACE_WEED_BIN`` skips the build."""
        override = os.environ.get("JOBTRACE_WEED_BIN")
        if override:
            return Path(override)
        return build_go_server("seaweedfs", VERSION, PACKAGE, "weed")

    def _command(self, artifact: Path, data_dir: Path) -> list[str]:
        config = data_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "jobtrace", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        ports = {flag: free_port() for flag in ("master.port", "volume.port", "filer.port", "admin.port",
                                                "s3.port.iceberg", "s3.port.lance")}
        return [str(artifact), "mini", f"-dir={data_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-s3.port={self.port}", f"-s3.config={config}", "-admin.port.legacy=0", "-webdav=false",
                *(f"-{flag}={port}" for flag, port in ports.items())]

    def _wait_ready(self) -> None:
        import socket

        def answers() -> bool:
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return True
            except OSError:
                return False

        wait_until(answers, self.start_timeout, f"{self.name} S3 port", alive=self.is_running)

    def client(self, secret: str = SECRET_KEY):
        """A boto3 S3 client signed as the test identity (or with another secret: refused)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=secret,
                            region_name="us-east-1")

    def env(self) -> dict[str, str]:
        """The standard AWS variables a user sets for this store."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": "us-east-1"}
