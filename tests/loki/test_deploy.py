"""deploy/: the compose stack is consistent (no Docker here to start it; its files are checked instead)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_the_top_level_compose_includes_the_loki_stack():
    top = load(DEPLOY / "compose.yaml")
    assert "loki/compose.yaml" in top["include"]


def test_every_mounted_file_exists_and_grafana_gets_the_provisioning():
    compose_file = DEPLOY / "loki" / "compose.yaml"
    stack = load(compose_file)
    services = stack["services"]
    assert {"loki", "grafana", "tempo", "otel-collector"} <= set(services)
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                assert (compose_file.parent / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in stack["volumes"], f"{name}: named volume {source} not declared"
    mounts = {v.split(":")[1]: (compose_file.parent / v.split(":")[0]).resolve() for v in services["grafana"]["volumes"]
              if v.startswith(".")}
    assert mounts["/etc/grafana/provisioning/datasources"] == ROOT / "loki" / "grafana" / "provisioning" / "datasources"
    provider = load(ROOT / "loki" / "grafana" / "provisioning" / "dashboards" / "jobtrace.yaml")
    assert mounts[provider["providers"][0]["options"]["path"]] == ROOT / "loki" / "grafana" / "dashboards"
    loki_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["loki"]["volumes"]}
    rules_dir = load(compose_file.parent / "loki.yaml")["ruler"]["storage"]["local"]["directory"]
    assert (compose_file.parent / loki_mounts[rules_dir + "/fake"]).resolve() == ROOT / "loki" / "rules"


def test_data_sources_and_the_collector_point_at_the_stacks_services():
    stack = load(DEPLOY / "loki" / "compose.yaml")["services"]
    ds = {d["type"]: d for d in load(ROOT / "loki" / "grafana" / "provisioning" / "datasources" / "jobtrace.yaml")["datasources"]}
    for kind in ("loki", "tempo"):
        url = urlsplit(ds[kind]["url"])
        assert url.hostname in stack
    assert urlsplit(ds["loki"]["url"]).port == load(DEPLOY / "loki" / "loki.yaml")["server"]["http_listen_port"]
    assert urlsplit(ds["tempo"]["url"]).port == load(DEPLOY / "loki" / "tempo.yaml")["server"]["http_listen_port"]
    collector = load(DEPLOY / "loki" / "otel-collector.yaml")
    assert collector["exporters"]["otlp/tempo"]["endpoint"] == "tempo:4317"
    assert collector["service"]["pipelines"]["traces"]["exporters"] == ["otlp/tempo"]
    tempo = load(DEPLOY / "loki" / "tempo.yaml")
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    published = {svc: [str(p).rsplit(":", 2)[-2] + ":" + str(p).rsplit(":", 1)[-1] for p in stack[svc]["ports"]]
                 for svc in ("otel-collector", "loki")}
    assert "4318:4318" in published["otel-collector"] and "3100:3100" in published["loki"]
    assert load(DEPLOY / "loki" / "loki.yaml")["limits_config"]["allow_structured_metadata"] is True


COMPOSE_FILES = sorted(DEPLOY.glob("*/compose*.yaml"))


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_published_port_binds_to_loopback_unless_told(path):
    """The demo stacks bound every port on 0.0.0.0 (issue 20): now 127.0.0.1 unless JOBTRACE_BIND says."""
    services = load(path).get("services", {})
    ports = [p for svc in services.values() for p in svc.get("ports", [])]
    assert ports or path.name != "compose.yaml"
    for p in ports:
        assert str(p).startswith("${JOBTRACE_BIND:-127.0.0.1}:"), f"{path.name}: {p}"


def test_grafana_has_no_default_password_and_no_anonymous_access_by_default():
    env = load(DEPLOY / "loki" / "compose.yaml")["services"]["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "${GRAFANA_ANONYMOUS:-false}"
