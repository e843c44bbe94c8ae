"""deploy/: the compose stacks are consistent and safe by default.

No Docker engine runs here to start them, so their files are checked instead: every service's image
is pinned by version, every port binds to 127.0.0.1 unless ``JOBTRACE_BIND`` says otherwise, every
long-running service has a healthcheck and every dependency waits for it, no password has a
default, and Loki is reachable only through its authenticating gateway (whose nginx config
tests/loki/test_gateway.py runs for real). ``docker compose config`` also checks each file where
Compose is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
LOKI_STACK = DEPLOY / "loki" / "compose.yaml"
GATEWAY_CONF = DEPLOY / "loki" / "gateway" / "loki-gateway.conf"
TENANT = "jobtrace"

COMPOSE_FILES = sorted(DEPLOY.glob("*/compose*.yaml"))
ALL_SERVICES = [(path, name) for path in COMPOSE_FILES for name in yaml.safe_load(path.read_text())["services"]]

# A service that runs on but cannot have a healthcheck, and why. Nothing may wait for it to be healthy.
NO_HEALTHCHECK = {
    ("loki/compose.yaml", "otel-collector"): "the collector's image is FROM scratch: no shell, no HTTP client",
}
# Images without a shell: their healthcheck must be an exec form ("CMD") of a binary they contain.
SHELL_LESS = {"grafana/loki": "/usr/bin/loki", "grafana/tempo": "/busybox/wget"}

# Values that must not be anywhere under deploy/ (well-known default credentials).
DEFAULT_CREDENTIALS = re.compile(r"changeme|admin[:/]admin\b|kibanaserver[:/]kibanaserver|"
                                 r"GF_SECURITY_ADMIN_PASSWORD:\s*admin\b|elastic[:/]elastic\b", re.I)
VERSION = re.compile(r"v?\d+\.\d+(\.\d+){0,2}(-[a-z0-9.]+)?")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def rel(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


def services_of(path: Path) -> dict:
    return load(path)["services"]


def one_shot(svc: dict) -> bool:
    return svc.get("restart") == "no"


def resolved(value: str) -> str:
    """``${VAR:-default}`` → default (what Compose uses when VAR is unset)."""
    return re.sub(r"\$\{[A-Z_0-9]+:-([^}]*)\}", r"\1", value)


def gateway_servers() -> list[str]:
    text = GATEWAY_CONF.read_text()
    return [block for block in re.split(r"\n(?=server \{)", text) if block.startswith("server {")]


# ---- every compose file, every service ---------------------------------------------------------------

def test_the_top_level_compose_includes_every_stack():
    top = load(DEPLOY / "compose.yaml")
    assert "loki/compose.yaml" in top["include"]
    for path in top["include"]:
        assert (DEPLOY / path).is_file()


@pytest.mark.parametrize("path,name", ALL_SERVICES, ids=lambda v: rel(v) if isinstance(v, Path) else v)
def test_every_image_is_pinned_by_version(path, name):
    image = services_of(path)[name]["image"]
    if image.startswith("*"):            # a YAML alias is resolved by safe_load; this cannot happen
        pytest.fail(f"{name}: unresolved image {image}")
    repo, sep, tag = resolved(image).rpartition(":")
    assert sep and "/" not in tag, f"{rel(path)} {name}: {image} has no tag"
    assert tag != "latest" and VERSION.match(tag), f"{rel(path)} {name}: {image} is not pinned to a version"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=rel)
def test_every_published_port_binds_to_loopback_unless_told(path):
    """The demo stacks bound every port on 0.0.0.0 (issue 20): now 127.0.0.1 unless JOBTRACE_BIND says."""
    services = services_of(path)
    ports = [p for svc in services.values() for p in svc.get("ports", [])]
    assert ports
    for p in ports:
        assert str(p).startswith("${JOBTRACE_BIND:-127.0.0.1}:"), f"{rel(path)}: {p}"


@pytest.mark.parametrize("path,name", ALL_SERVICES, ids=lambda v: rel(v) if isinstance(v, Path) else v)
def test_every_long_running_service_has_a_healthcheck(path, name):
    svc = services_of(path)[name]
    if one_shot(svc):
        assert "healthcheck" not in svc, f"{name} exits when done: others wait for service_completed_successfully"
        return
    if (rel(path), name) in NO_HEALTHCHECK:
        assert "healthcheck" not in svc
        return
    check = svc.get("healthcheck")
    assert check and check.get("test"), f"{rel(path)} {name}: no healthcheck"
    test = check["test"]
    assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1
    assert check.get("interval") and check.get("retries")
    image = resolved(svc["image"]).rpartition(":")[0]
    if image in SHELL_LESS:
        assert test[:2] == ["CMD", SHELL_LESS[image]], f"{name}: {image} has no shell; use {SHELL_LESS[image]}"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=rel)
def test_every_dependency_waits_until_healthy_or_done(path):
    services = services_of(path)
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must say a condition for each service"
        for dep, how in deps.items():
            target = services[dep]
            if one_shot(target):
                assert how == {"condition": "service_completed_successfully"}, (name, dep)
            else:
                assert how == {"condition": "service_healthy"}, (name, dep, how)
                assert "healthcheck" in target, f"{name} waits for {dep}, which has no healthcheck"


@pytest.mark.parametrize("path", sorted(p for p in DEPLOY.rglob("*") if p.is_file()), ids=rel)
def test_no_default_passwords_anywhere_under_deploy(path):
    text = path.read_text()
    found = DEFAULT_CREDENTIALS.search(text)
    assert found is None, f"{rel(path)}: {found.group() if found else ''}"
    # a password variable is required (${X:?why}), never defaulted (${X:-value})
    defaulted = re.findall(r"\$\{\w*(?:PASSWORD|SECRET|TOKEN)\w*:-", text)
    assert not defaulted, f"{rel(path)}: {defaulted}"


@pytest.mark.parametrize("path,name", ALL_SERVICES, ids=lambda v: rel(v) if isinstance(v, Path) else v)
def test_every_password_a_service_gets_is_required(path, name):
    env = services_of(path)[name].get("environment", {})
    assert isinstance(env, dict)
    for key, value in env.items():
        if "PASSWORD" in key:
            assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", str(value)), f"{rel(path)} {name}: {key}={value}"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=rel)
def test_docker_compose_config_accepts_the_file(path, tmp_path):
    """Where Compose is installed. v2 (`docker compose`) checks the file as is; v1 (`docker-compose`,
    Debian's 1.29) knows neither `name:` nor `include:`, so it gets the file without its `name:` line."""
    env = {**os.environ, "GRAFANA_ADMIN_PASSWORD": "x" * 16, "LOKI_PASSWORD": "x" * 16,
           "ELASTIC_PASSWORD": "x" * 16, "KIBANA_PASSWORD": "x" * 16, "OPENSEARCH_ADMIN_PASSWORD": "x" * 16,
           "OPENSEARCH_DASHBOARDS_PASSWORD": "x" * 16}
    v2 = shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    if v2:
        cmd = ["docker", "compose", "-f", str(path), "config", "-q"]
    elif shutil.which("docker-compose"):
        stripped = tmp_path / "compose.yaml"
        stripped.write_text("".join(line for line in path.read_text().splitlines(True) if not line.startswith("name:")))
        cmd = ["docker-compose", "--project-directory", str(path.parent), "-f", str(stripped), "config", "-q"]
    else:
        pytest.skip(reason="no docker compose / docker-compose here")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # and without the passwords it refuses to start
    bare = {k: v for k, v in env.items() if "PASSWORD" not in k}
    assert subprocess.run(cmd, env=bare, capture_output=True, text=True, timeout=120).returncode != 0


# ---- the Loki stack ------------------------------------------------------------------------------------

def test_every_mounted_file_exists_and_grafana_gets_the_provisioning():
    stack = load(LOKI_STACK)
    services = stack["services"]
    assert {"loki", "loki-gateway", "gateway-auth", "grafana", "tempo", "otel-collector", "alertmanager"} <= set(services)
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith((".", "/")):
                assert (LOKI_STACK.parent / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in stack["volumes"], f"{name}: named volume {source} not declared"
    mounts = {v.split(":")[1]: (LOKI_STACK.parent / v.split(":")[0]).resolve() for v in services["grafana"]["volumes"]
              if v.startswith(".")}
    assert mounts["/etc/grafana/provisioning/datasources/jobtrace.yaml"] == DEPLOY / "loki" / "grafana" / "datasources.yaml"
    provider = load(ROOT / "loki" / "grafana" / "provisioning" / "dashboards" / "jobtrace.yaml")
    under = {source for target, source in mounts.items()
             if target.startswith(provider["providers"][0]["options"]["path"] + "/")}
    # the provider walks its folder: the Loki boards and the Prometheus board are both under it
    assert under == {ROOT / "loki" / "grafana" / "dashboards", ROOT / "metrics" / "grafana" / "jobtrace-metrics.json"}
    loki_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["loki"]["volumes"]}
    rules_dir = load(LOKI_STACK.parent / "loki.yaml")["ruler"]["storage"]["local"]["directory"]
    # the ruler reads the rules of the tenant the gateway sets
    assert (LOKI_STACK.parent / loki_mounts[f"{rules_dir}/{TENANT}"]).resolve() == ROOT / "loki" / "rules"


def test_loki_is_multi_tenant_and_reachable_only_through_the_gateway():
    stack = load(LOKI_STACK)
    services = stack["services"]
    assert load(DEPLOY / "loki" / "loki.yaml")["auth_enabled"] is True
    loki = services["loki"]
    assert "ports" not in loki and "expose" not in loki and "network_mode" not in loki
    assert loki["networks"] == ["loki-internal"]
    assert stack["networks"]["loki-internal"] == {"internal": True}
    members = {name for name, svc in services.items() if "loki-internal" in svc.get("networks", [])}
    assert members == {"loki", "loki-gateway", "alertmanager"}
    # the gateway publishes Loki's port, and proxies to Loki
    gateway = services["loki-gateway"]
    assert "${JOBTRACE_BIND:-127.0.0.1}:3100:3100" in gateway["ports"]
    assert "proxy_pass http://loki:3100;" in GATEWAY_CONF.read_text()
    assert gateway["depends_on"]["loki"] == {"condition": "service_healthy"}
    # nothing else in the stack talks to Loki directly
    for name, svc in services.items():
        if name == "loki-gateway":
            continue
        for mount in svc.get("volumes", []):
            source = LOKI_STACK.parent / mount.split(":")[0]
            if mount.startswith(".") and source.is_file() and source.name != "loki.yaml":
                assert "loki:3100" not in source.read_text(), f"{name} reads {source.name}, which names loki:3100"


def test_every_gateway_server_requires_basic_auth_from_the_generated_htpasswd():
    servers = gateway_servers()
    assert len(servers) == 2
    for block in servers:
        assert re.search(r"^    auth_basic \"[^\"]+\";", block, re.M), block
        assert "    auth_basic_user_file /etc/nginx/auth/htpasswd;" in block
        # the only place without auth is the gateway's own health answer
        off = re.findall(r"location ([^{]+)\{[^}]*auth_basic off;", block)
        assert [o.strip() for o in off] == ["= /gateway-health"]
        assert 'return 200 "ok\\n";' in block
    (loki_server,) = [b for b in servers if "proxy_pass http://loki:3100;" in b]
    assert f"proxy_set_header X-Scope-OrgID {TENANT};" in loki_server
    assert 'proxy_set_header Authorization "";' in loki_server
    services = services_of(LOKI_STACK)
    gateway, auth = services["loki-gateway"], services["gateway-auth"]
    assert "gateway-auth:/etc/nginx/auth:ro" in gateway["volumes"]
    assert "./gateway/loki-gateway.conf:/etc/nginx/conf.d/default.conf:ro" in gateway["volumes"]
    assert gateway["depends_on"]["gateway-auth"] == {"condition": "service_completed_successfully"}
    assert "gateway-auth:/auth" in auth["volumes"] and auth["entrypoint"][-1] == "/auth/htpasswd"
    assert auth["entrypoint"][:2] == ["sh", "/gateway/htpasswd.sh"]
    assert auth["environment"]["LOKI_PASSWORD"].startswith("${LOKI_PASSWORD:?")
    assert gateway["healthcheck"]["test"][-1].endswith(":3100/gateway-health")


def test_grafana_sends_basic_auth_and_the_tenant_with_the_password_from_its_environment():
    ds = {d["uid"]: d for d in load(DEPLOY / "loki" / "grafana" / "datasources.yaml")["datasources"]}
    loki = ds["jobtrace-loki"]
    assert urlsplit(loki["url"]).hostname == "loki-gateway" and urlsplit(loki["url"]).port == 3100
    assert loki["basicAuth"] is True and loki["basicAuthUser"] == "${LOKI_USER}"
    assert loki["secureJsonData"] == {"basicAuthPassword": "${LOKI_PASSWORD}", "httpHeaderValue1": TENANT}
    assert loki["jsonData"]["httpHeaderName1"] == "X-Scope-OrgID"
    env = services_of(LOKI_STACK)["grafana"]["environment"]
    assert env["LOKI_PASSWORD"].startswith("${LOKI_PASSWORD:?") and env["LOKI_USER"] == "${LOKI_USER:-jobtrace}"


def test_the_deploy_data_sources_are_the_packaged_ones_but_for_the_gateway():
    """deploy/loki/grafana/datasources.yaml is loki/'s file with only the Loki connection changed."""
    deployed = load(DEPLOY / "loki" / "grafana" / "datasources.yaml")
    packaged = load(ROOT / "loki" / "grafana" / "provisioning" / "datasources" / "jobtrace.yaml")
    for d in deployed["datasources"]:
        if d["uid"] == "jobtrace-loki":
            for key in ("basicAuth", "basicAuthUser", "secureJsonData"):
                d.pop(key)
            d["jsonData"].pop("httpHeaderName1")
            d["url"] = "http://loki:3100"
    assert deployed == packaged


def test_grafana_has_no_default_password_and_no_anonymous_access_by_default():
    env = services_of(LOKI_STACK)["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "${GRAFANA_ANONYMOUS:-false}"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"          # never an anonymous admin or editor


def test_the_collector_takes_credentials_and_ships_logs_through_the_gateway():
    collector = load(DEPLOY / "loki" / "otel-collector.yaml")
    ext = collector["extensions"]
    for proto in ("grpc", "http"):
        name = collector["receivers"]["otlp"]["protocols"][proto]["auth"]["authenticator"]
        assert name.startswith("basicauth/") and ext[name]["htpasswd"]["inline"].strip() == \
            "${env:LOKI_USER}:${env:LOKI_PASSWORD}"
    loki = collector["exporters"]["otlphttp/loki"]
    assert urlsplit(loki["endpoint"]).hostname == "loki-gateway" and urlsplit(loki["endpoint"]).path == "/otlp"
    client = ext[loki["auth"]["authenticator"]]["client_auth"]
    assert client == {"username": "${env:LOKI_USER}", "password": "${env:LOKI_PASSWORD}"}
    assert set(collector["service"]["extensions"]) == set(ext)
    env = services_of(LOKI_STACK)["otel-collector"]["environment"]
    assert env["LOKI_PASSWORD"].startswith("${LOKI_PASSWORD:?")


def test_data_sources_and_the_collector_point_at_the_stacks_services():
    stack = services_of(LOKI_STACK)
    ds = {d["type"]: d for d in load(DEPLOY / "loki" / "grafana" / "datasources.yaml")["datasources"]}
    for kind in ("loki", "tempo"):
        assert urlsplit(ds[kind]["url"]).hostname in stack
    assert urlsplit(ds["tempo"]["url"]).port == load(DEPLOY / "loki" / "tempo.yaml")["server"]["http_listen_port"]
    assert load(DEPLOY / "loki" / "loki.yaml")["server"]["http_listen_port"] == 3100   # the gateway's proxy_pass
    collector = load(DEPLOY / "loki" / "otel-collector.yaml")
    assert collector["exporters"]["otlp/tempo"]["endpoint"] == "tempo:4317"
    assert collector["service"]["pipelines"]["traces"]["exporters"] == ["otlp/tempo"]
    tempo = load(DEPLOY / "loki" / "tempo.yaml")
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    published = {svc: [str(p).rsplit(":", 2)[-2] + ":" + str(p).rsplit(":", 1)[-1] for p in stack[svc].get("ports", [])]
                 for svc in ("otel-collector", "loki-gateway", "tempo", "alertmanager")}
    assert "4318:4318" in published["otel-collector"] and "3100:3100" in published["loki-gateway"]
    assert "9093:9093" in published["loki-gateway"]
    assert published["tempo"] == [] and published["alertmanager"] == []     # no auth of their own
    assert load(DEPLOY / "loki" / "loki.yaml")["limits_config"]["allow_structured_metadata"] is True
    assert load(DEPLOY / "loki" / "loki.yaml")["ruler"]["alertmanager_url"] == "http://alertmanager:9093"
    assert "proxy_pass http://alertmanager:9093;" in GATEWAY_CONF.read_text()


def test_retention_is_set_on_every_tier():
    """Raw logs 7 days in Loki (applied by its compactor), metrics a year in Prometheus."""
    conf = load(DEPLOY / "loki" / "loki.yaml")
    assert conf["limits_config"]["retention_period"] == "${JOBTRACE_RETENTION_LOGS:-168h}"
    loki = services_of(LOKI_STACK)["loki"]
    assert "-config.expand-env=true" in loki["command"]  # else Loki would read the text as it is
    assert loki["environment"]["JOBTRACE_RETENTION_LOGS"] == "${JOBTRACE_RETENTION_LOGS:-168h}"
    assert conf["compactor"]["retention_enabled"] is True and conf["compactor"]["delete_request_store"] == "filesystem"
    prometheus = services_of(LOKI_STACK)["prometheus"]["command"]
    assert "--storage.tsdb.retention.time=${JOBTRACE_RETENTION_METRICS:-365d}" in prometheus
