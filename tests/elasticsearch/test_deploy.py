"""deploy/elastic: the compose stacks are well formed and run `jobtrace setup` against both services."""

from __future__ import annotations

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
