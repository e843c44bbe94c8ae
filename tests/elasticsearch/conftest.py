"""Fixtures for the Elasticsearch/OpenSearch tests: the real OpenSearch node, an Elasticsearch façade, helpers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests


@pytest.fixture(scope="session")
def es_shim(opensearch: Any) -> Iterator[Any]:
    """An Elasticsearch 8.15 façade over the session OpenSearch node (see es_shim.py)."""
    from tests.elasticsearch.es_shim import EsShim

    shim = EsShim(opensearch.url).start()
    yield shim
    shim.stop()


@pytest.fixture
def namespace() -> str:
    """A data stream namespace of this test's own."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def no_jobtrace_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith(("JOBTRACE_", "OTEL_"))]:
        monkeypatch.delenv(var, raising=False)


def refresh(url: str) -> None:
    requests.post(f"{url}/*-jobtrace-*/_refresh", timeout=60).raise_for_status()


def search_docs(url: str, query: dict[str, Any], *, index: str = "*-jobtrace-*", size: int = 10_000,
                sort: list[Any] | None = None) -> list[dict[str, Any]]:
    """``_source`` of every document matching ``query`` (after a refresh)."""
    refresh(url)
    body: dict[str, Any] = {"size": size, "query": query, "sort": sort or [{"@timestamp": "asc"}, {"event.id": "asc"}]}
    r = requests.post(f"{url}/{index}/_search", json=body, timeout=60)
    assert r.status_code == 200, r.text[:500]
    return [h["_source"] for h in r.json()["hits"]["hits"]]


def job_docs(url: str, job: str) -> list[dict[str, Any]]:
    return search_docs(url, {"term": {"jobtrace.job": job}})


def read_lines(directory: Path) -> list[bytes]:
    """Every complete canonical line of a job directory of the embedded store."""
    out: list[bytes] = []
    for path in sorted(directory.glob("*.jsonl")):
        out += [line for line in path.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")]
    return out


def canonical(lines: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in lines]


def as_multiset(events: list[dict[str, Any]]) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for ev in events:
        key = orjson.dumps(ev, option=orjson.OPT_SORT_KEYS)
        out[key] = out.get(key, 0) + 1
    return out


def ship(url: str, lines: list[bytes], spool_dir: Path, *, timeout_s: float = 60.0, request_timeout_s: float = 10.0,
         **kw: Any) -> Any:
    """Ship ``lines`` with an in-process ElasticsearchShipper, wait until all are accepted, close it."""
    from jobtrace.http import HttpConfig
    from shippers._elasticsearch import ElasticsearchShipper

    shipper = ElasticsearchShipper(HttpConfig(url, timeout_s=request_timeout_s), spool_dir, **kw)
    shipper.write(lines)
    assert shipper.wait_idle(timeout_s), f"not shipped within {timeout_s}s: {shipper.stats}"
    shipper.close()
    return shipper


def synth_lines(tmp_path: Path, **kw: Any) -> tuple[Path, list[bytes]]:
    """A synthetic job (jobtrace.synth) in an embedded store under ``tmp_path``, and its lines."""
    from jobtrace.synth import SynthJob, write_job

    data = tmp_path / "data"
    directory = write_job(data, SynthJob(**kw))
    return data, read_lines(directory)


def all_time() -> Any:
    import time

    from queries._backends import TimeRange

    return TimeRange(1_600_000_000_000_000_000, time.time_ns() + 3600 * 10**9)


def report_without_source(report: Any) -> dict[str, Any]:
    d = report.to_dict()
    d.pop("source", None)
    return d


def report_modulo_ties(report: Any) -> dict[str, Any]:
    """:func:`report_without_source` without what depends on row order when spans end in the same nanosecond.

    Synthetic jobs end a step span and its optimizer phase at the same instant; the analysis
    picks "the last span" with ``arg_max(name, ts)``, which then depends on the order rows
    arrived in (file order in the embedded store, ``(@timestamp, event.id)`` from a server).
    Real jobs have no such ties (their report is compared whole).
    """
    d = report_without_source(report)
    for f in d.get("findings", []):
        f["evidence"] = [e for e in f.get("evidence", []) if not str(e).startswith("last span")]
        (f.get("details") or {}).pop("last_span", None)
        if "refs" in f:
            f["refs"] = [r for r in f["refs"] if r.get("kind") != "span"]
    return d
