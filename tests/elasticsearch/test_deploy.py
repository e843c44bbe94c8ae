"""deploy/elastic: the compose stacks are well formed and run `jobtrace setup` against both services."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML (dev extra) reads the compose files")

HERE = Path(__file__).resolve().parents[2] / "deploy" / "elastic"


@pytest.mark.parametrize("name,search,ui", [("compose.yaml", "elasticsearch", "kibana"),
                                            ("compose.opensearch.yaml", "opensearch", "dashboards")])
def test_the_stack_starts_search_ui_and_a_setup_that_waits_for_both(name, search, ui):
    doc = yaml.safe_load((HERE / name).read_text())
    services = doc["services"]
    assert {search, ui, "setup"} <= set(services)
    setup = services["setup"]
    assert ["sh", "/src/deploy/elastic/setup.sh"] == setup["entrypoint"]
    cmd = setup["command"]
    assert cmd[cmd.index("--url") + 1] == f"http://{search}:9200"
    assert cmd[cmd.index("--kibana-url") + 1] == f"http://{ui}:5601"
    assert "--wait" in cmd and "no" == setup["restart"]
    assert {search, ui} <= set(setup["depends_on"])
    assert all(dep["condition"] == "service_healthy" for dep in setup["depends_on"].values())
    assert "healthcheck" in services[search] and "healthcheck" in services[ui]
    assert "../..:/src:ro" in setup["volumes"]


def test_setup_script_installs_the_packages_the_cli_needs():
    script = (HERE / "setup.sh").read_text()
    for package in ("jobtrace", "shippers", "queries", "kibana", "otel_instrumentation", "pyproject.toml"):
        assert package in script
    assert 'exec jobtrace setup "$@"' in script and "[elasticsearch]" in script


def test_the_elastic_stack_uses_a_kibana_new_enough_for_the_saved_objects():
    text = (HERE / "compose.yaml").read_text()
    version = text.split("ELASTIC_VERSION:-")[1].split("}")[0]
    assert tuple(map(int, version.split("."))) >= (8, 9, 0)


def test_opensearch_runs_its_security_plugin_with_required_passwords_and_no_demo_users():
    services = yaml.safe_load((HERE / "compose.opensearch.yaml").read_text())["services"]
    node, ui, setup = services["opensearch"], services["dashboards"], services["setup"]
    env = node["environment"]
    assert "DISABLE_SECURITY_PLUGIN" not in env and "DISABLE_INSTALL_DEMO_CONFIG" not in env
    assert "DISABLE_SECURITY_DASHBOARDS_PLUGIN" not in ui["environment"]
    assert env["OPENSEARCH_INITIAL_ADMIN_PASSWORD"].startswith("${OPENSEARCH_ADMIN_PASSWORD:?")
    assert env["OPENSEARCH_DASHBOARDS_PASSWORD"].startswith("${OPENSEARCH_DASHBOARDS_PASSWORD:?")
    assert ui["environment"]["OPENSEARCH_USERNAME"] == "kibanaserver"
    assert ui["environment"]["OPENSEARCH_PASSWORD"].startswith("${OPENSEARCH_DASHBOARDS_PASSWORD:?")
    assert setup["environment"] == {"JOBTRACE_ES_USERNAME": "admin",
                                    "JOBTRACE_ES_PASSWORD": env["OPENSEARCH_INITIAL_ADMIN_PASSWORD"]}
    # the entry point: the demo installer, then only our two users, then the image's own entry point
    assert node["entrypoint"] == ["bash", "/jobtrace/opensearch-security.sh"]
    assert "./opensearch-security.sh:/jobtrace/opensearch-security.sh:ro" in node["volumes"]
    script = (HERE / "opensearch-security.sh").read_text()
    assert script.index('install_demo_configuration.sh" -y -i -s') < script.index('cat > "$users.tmp"') \
        < script.index("exec ./opensearch-docker-entrypoint.sh")
    users = script.split("<<YAML\n", 1)[1].split("\nYAML\n", 1)[0]
    assert {k for k in re.findall(r"^(\w+):", users, re.M)} == {"_meta", "admin", "kibanaserver"}
    assert 'hash.sh" -env "$1"' in script and " -p " not in script     # never on a command line
    for check in (node["healthcheck"]["test"][-1], ui["healthcheck"]["test"][-1]):
        assert "curl -sf -u " in check


def test_opensearch_security_script_is_valid_bash():
    import shutil
    import subprocess

    if not shutil.which("bash"):
        pytest.skip(reason="no bash")
    subprocess.run(["bash", "-n", str(HERE / "opensearch-security.sh")], check=True)


def test_the_elastic_stack_requires_its_passwords():
    services = yaml.safe_load((HERE / "compose.yaml").read_text())["services"]
    assert services["elasticsearch"]["environment"]["ELASTIC_PASSWORD"].startswith("${ELASTIC_PASSWORD:?")
    assert services["kibana-password"]["environment"]["KIBANA_PASSWORD"].startswith("${KIBANA_PASSWORD:?")
    assert services["kibana"]["environment"]["ELASTICSEARCH_PASSWORD"].startswith("${KIBANA_PASSWORD:?")
    assert services["elasticsearch"]["environment"]["xpack.security.enabled"] == "true"
