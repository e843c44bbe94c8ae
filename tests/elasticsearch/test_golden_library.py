"""The golden library kept on the cluster the jobs ship to: real demo jobs (two ranks, gloo) shipping to the
real OpenSearch node, their entries added from it and kept in its ``jobtrace-golden`` index, listed, shown,
chosen by ``trace-job --backend elasticsearch --golden`` and removed, on OpenSearch and through the
Elasticsearch facade. The embedded store's folder is never used: every command gets an empty ``--data-dir``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from jobtrace.cli import main, trace_job
from tests.demo_jobs import run_demo

pytestmark = pytest.mark.torchjob
pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")

HEALTHY = ("gold-a", "gold-b", "gold-c")


@pytest.fixture(scope="module")
def shipped(opensearch: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Four real jobs in OpenSearch: three healthy, one whose rank 1 is 20 ms slower a step."""
    data = str(tmp_path_factory.mktemp("golden-es"))
    env = {"JOBTRACE_ES_URL": opensearch.url, "JOBTRACE_ES_NAMESPACE": "golden"}
    for name in HEALTHY:
        assert run_demo(env, job_id=name, data_dir=data, ranks=2, steps=16) == 0
    assert run_demo(env, job_id="gold-slow", data_dir=data, ranks=2, steps=16, slow_ranks=[1], slow_ms=20) == 0
    requests.post(f"{opensearch.url}/*-jobtrace-*/_refresh", timeout=60).raise_for_status()
    return str(opensearch.url)


@pytest.fixture(params=["opensearch", "elasticsearch"])
def cluster(request: pytest.FixtureRequest, shipped: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
            ) -> tuple[str, str, Path]:
    """(URL, the library's index, an empty data dir): OpenSearch itself, or the Elasticsearch 8 facade over it."""
    url = shipped if request.param == "opensearch" else request.getfixturevalue("es_shim").url
    index = f"jobtrace-golden-{request.param}"
    requests.delete(f"{shipped}/{index}", timeout=60)  # a library of this test's own
    monkeypatch.setenv("JOBTRACE_GOLDEN_INDEX", index)
    return url, index, tmp_path / "empty"


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def test_entries_added_from_the_cluster_live_on_it_and_are_chosen_there(cluster):
    url, index, empty = cluster
    where = ["--backend", "elasticsearch", "--url", url, "--data-dir", str(empty)]
    for name in HEALTHY:
        res = cli("golden", "add", name, *where, "--since", "2h", "--tag", "nightly")
        assert res.exit_code == 0, res.output
        assert index in res.output
    assert not empty.exists()  # nothing went to a folder

    listed = json.loads(cli("golden", "list", *where, "--json").output)
    assert [e["name"] for e in listed] == list(HEALTHY)
    assert all(e["world"] == 2 and e["tags"] == ["nightly"] and e["model"] == "demo-mlp" for e in listed)
    shown = json.loads(cli("golden", "show", "gold-b", *where).output)
    assert shown["job_id"] == "gold-b" and shown["templates"] and "step_ms" in shown["series"]

    # The slow job is refused as an entry, then traced from the cluster against the cluster's library.
    res = cli("golden", "add", "gold-slow", *where, "--since", "2h")
    assert res.exit_code == 1 and "--force" in res.output
    res = CliRunner().invoke(trace_job, ["gold-slow", "--backend", "elasticsearch", "--url", url, "--since", "2h",
                                         "--data-dir", str(empty), "--golden", "--json"])
    report = json.loads(res.output)
    assert sorted(report["golden"]) == list(HEALTHY) and res.exit_code == 1
    assert "step_ms" in {f["details"].get("metric") for f in report["findings"] if f["kind"] == "golden_deviation"}

    # Removed from the cluster: gone from the list; removing it again is an error (exit 3).
    assert cli("golden", "remove", "gold-a", *where).exit_code == 0
    assert [e["name"] for e in json.loads(cli("golden", "list", *where, "--json").output)] == ["gold-b", "gold-c"]
    res = cli("golden", "remove", "gold-a", *where)
    assert res.exit_code == 3 and "gold-a" in res.output


def test_an_empty_cluster_library_says_so(cluster):
    url, index, empty = cluster
    res = CliRunner().invoke(trace_job, ["gold-a", "--backend", "elasticsearch", "--url", url, "--since", "2h",
                                         "--data-dir", str(empty), "--golden"])
    assert res.exit_code == 3 and "no golden runs in" in res.output and index in res.output
