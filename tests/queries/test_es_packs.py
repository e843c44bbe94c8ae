"""OpenSearch holding the ranks' packs: ``trace-job`` reads them instead of the packed ranks' events.

A synthetic 16-rank job (one slow rank, NaN loss from step 50) is written to an embedded store, whose
ranks exit cleanly and so leave their rollups. Its events are shipped to a real OpenSearch with the
Elasticsearch shipper, and each rank's pack (:func:`jobtrace.store.pack_lines`) after them, as a rank
does at exit, each case in a namespace of its own (``<type>-jobtrace-<ns>`` for the events,
``metrics-jobtrace.rollup-<ns>`` for the packs):

* every rank packed: the report and every derived table are the embedded store's, while only a few
  events are read whole (the ones the packs carry come from them);
* one rank's pack never arrived: that rank is read from its events, the others from their packs;
* packs replayed (409 through the shipper) and stored twice under other ids: the same report;
* ``whole=True`` reads every event and no pack; a whole event read never returns a pack document;
* ``jobtrace export`` sends the packs too, and the export reads back the same way.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests

from jobtrace.http import HttpConfig
from jobtrace.store import job_files, pack_lines
from jobtrace.synth import SynthJob, write_job
from kibana import doc_id, pack_document
from queries import JobData, analyze, load_local
from queries._backends import TimeRange, load_job
from tests.queries.test_server_reads import CFG, assert_same_tables, derived_tables, verdicts
from tests.servers.opensearch_server import OpenSearchServer

pytestmark = [pytest.mark.servers]

T0 = 1_767_225_600 * 10**9  # SynthJob's first event
RANGE = TimeRange(T0 - 60 * 10**9, T0 + 86_400 * 10**9)
RANKS = 16
SLOW_RANK = 5
UNPACKED = 11
"""The rank whose pack is not shipped in the ``missing`` namespace."""


@dataclass
class Shipped:
    """The job as the embedded store reports it, and the namespaces that hold its copies in OpenSearch."""

    job_id: str
    data: Path
    events: int
    rank_events: dict[int, int]
    verdicts: list[tuple[str, list[int]]]
    findings: list[dict[str, Any]]
    tables: dict[str, list[tuple[Any, ...]]]
    pack_lines: dict[int, list[bytes]]
    namespaces: dict[str, str]
    replayed: int = 0
    """Pack documents the server already had when the packs were shipped a second time (409)."""


def _findings(job: JobData) -> list[dict[str, Any]]:
    """Every finding, as the report states it (links aside: they name the backend)."""
    return [{k: v for k, v in dataclasses.asdict(f).items() if k != "links"} for f in analyze(job, CFG).findings]


def _ship(server: OpenSearchServer, spool: Path, namespace: str, *batches: list[bytes]) -> int:
    """Each batch of lines through the Elasticsearch shipper into ``namespace``; returns the 409s (replays)."""
    from shippers._elasticsearch import ElasticsearchShipper

    shipper = ElasticsearchShipper(HttpConfig(server.url), spool, namespace=namespace, setup="off")
    try:
        assert shipper.takes_packs
        for lines in batches:
            for i in range(0, len(lines), 500):
                shipper.write(lines[i:i + 500])
        assert shipper.wait_idle(120)
    finally:
        shipper.close()
    assert shipper.dead_letter.count == 0, shipper.dead_letter.path.read_text()[:2000]
    return int(shipper.encoder.duplicates)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def shipped(opensearch: OpenSearchServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shipped]:
    from kibana._setup import run_setup

    data = tmp_path_factory.mktemp("es-packs")
    job_id = f"packs-{uuid.uuid4().hex[:8]}"
    job_dir = write_job(data, SynthJob(job_id=job_id, ranks=RANKS, steps=60, ranks_per_node=8,
                                       slow_ranks={SLOW_RANK: 1.6}, nan_step=50, logs_per_step=1))
    events = [line + b"\n" for path in sorted(job_dir.glob("*.jsonl"))
              for line in path.read_bytes().splitlines() if line.strip()]
    packs: dict[int, list[bytes]] = {}
    for segment in job_files(job_dir).segments:
        lines = pack_lines(segment)
        packs[orjson.loads(lines[0])["rank"]] = lines
    assert sorted(packs) == list(range(RANKS))  # every rank exited cleanly: every one has a pack
    run_setup(HttpConfig(opensearch.url), replicas=0)
    tag = uuid.uuid4().hex[:6]
    ns = {case: f"{case}_{tag}" for case in ("all", "missing", "twice", "export")}
    every_pack = [line for rank in sorted(packs) for line in packs[rank]]
    spool = tmp_path_factory.mktemp("es-packs-spool")
    _ship(opensearch, spool / "all", ns["all"], events, every_pack)
    _ship(opensearch, spool / "missing", ns["missing"], events,
          [line for rank in sorted(packs) if rank != UNPACKED for line in packs[rank]])
    _ship(opensearch, spool / "twice", ns["twice"], events, every_pack)
    replayed = _ship(opensearch, spool / "twice-again", ns["twice"], every_pack)
    # ... and a second copy of every pack stored under other _ids (a replay into a stream that ids documents
    # itself): the same document, event.id (the line's hash) included
    stream = f"metrics-jobtrace.rollup-{ns['twice']}"
    bulk: list[dict[str, Any]] = []
    for line in every_pack:
        bulk += [{"create": {"_index": stream, "_id": uuid.uuid4().hex}}, pack_document(orjson.loads(line), doc_id(line))]
    opensearch.bulk(bulk)
    with pytest.MonkeyPatch.context() as mp:
        for var in [v for v in os.environ if v.startswith("JOBTRACE_") and v != "JOBTRACE_SERVERS_CACHE"]:
            mp.delenv(var)
        mp.setenv("JOBTRACE_ES_NAMESPACE", ns["export"])
        mp.setenv("JOBTRACE_ES_SETUP", "off")
        from shippers import export_job

        summary = export_job(data, job_id, "elasticsearch", url=opensearch.url, timeout_s=300)
        assert summary.complete, summary.to_dict()
    opensearch.refresh("*jobtrace*")
    here = load_local(data, job_id)
    findings = _findings(here)
    report = analyze(here, CFG)
    per_rank = dict(here.con.execute("SELECT rank, count(*) FROM events GROUP BY rank").fetchall())
    yield Shipped(job_id, data, here.stats.events, per_rank, verdicts(report), findings, derived_tables(here),
                  packs, ns, replayed)


def _read(shipped: Shipped, case: str, url: str, **options: Any) -> JobData:
    return load_job("elasticsearch", shipped.job_id, url=url, time_range=RANGE, namespace=shipped.namespaces[case],
                    **options)


def _assert_same_report(shipped: Shipped, job: JobData) -> None:
    findings = _findings(job)
    assert verdicts(analyze(job, CFG)) == shipped.verdicts
    assert findings == shipped.findings
    assert_same_tables(job, shipped.tables, "elasticsearch")


def test_the_embedded_store_finds_the_faults(shipped: Shipped) -> None:
    """The reference must itself be right, or agreeing with it would prove nothing."""
    assert any(kind in ("slow_rank", "late_arrival") and ranks == [SLOW_RANK] for kind, ranks in shipped.verdicts)
    assert any(kind == "nan_loss" for kind, _ in shipped.verdicts)
    assert len(shipped.tables["steps"]) == RANKS * 60


def test_every_rank_packed_reads_the_packs_and_gives_the_same_report(shipped: Shipped, opensearch: OpenSearchServer,
                                                                     fault_proxy: Any) -> None:
    proxy = fault_proxy(opensearch)  # passes every request through, recording them
    job = _read(shipped, "all", proxy.url)
    assert job.stats.events == shipped.events
    # the events in the job are the few the packs carry (every log line, the first step, ...): none was read whole
    assert job.stats.fetched_events is not None and job.stats.fetched_events < shipped.events / 4
    assert not [r.path for r in proxy.seen if "point_in_time" in r.path or "_pit" in r.path]
    assert len(proxy.seen) < 10, [r.path for r in proxy.seen]
    assert f"{RANKS} ranks read from the rollups" in job.source
    _assert_same_report(shipped, job)


def test_a_rank_without_its_pack_is_read_from_its_events(shipped: Shipped, opensearch: OpenSearchServer) -> None:
    job = _read(shipped, "missing", opensearch.url)
    assert job.stats.events == shipped.events
    assert f"{RANKS - 1} ranks read from the rollups" in job.source
    # the unpacked rank arrived whole, the others only as the few events their packs carry
    read = dict(job.con.execute("SELECT rank, count(*) FROM events GROUP BY rank").fetchall())
    assert read[UNPACKED] == shipped.rank_events[UNPACKED]
    assert all(n < shipped.rank_events[r] / 4 for r, n in read.items() if r != UNPACKED)
    assert job.stats.fetched_events is not None and job.stats.fetched_events < shipped.events / 4
    _assert_same_report(shipped, job)


def test_packs_shipped_twice_give_the_same_report(shipped: Shipped, opensearch: OpenSearchServer) -> None:
    assert shipped.replayed == sum(len(lines) for lines in shipped.pack_lines.values())  # every replay was a 409
    stream = f"metrics-jobtrace.rollup-{shipped.namespaces['twice']}"
    stored = requests.get(f"{opensearch.url}/{stream}/_count", timeout=30).json()["count"]
    assert stored == 2 * shipped.replayed  # the second copies, under other ids
    once = _read(shipped, "all", opensearch.url)
    job = _read(shipped, "twice", opensearch.url)
    assert f"{RANKS} ranks read from the rollups" in job.source
    assert job.stats.fetched_events == once.stats.fetched_events
    _assert_same_report(shipped, job)


def test_small_pack_pages_and_a_throttled_read(shipped: Shipped, opensearch: OpenSearchServer,
                                               fault_proxy: Any) -> None:
    """Pages of 10 pack documents (many ``search_after`` round trips), and a 429 among them: retried."""
    records = 2 * sum(len(v) for v in shipped.pack_lines.values())
    proxy = fault_proxy(opensearch)
    proxy.respond(429, '{"error":{"type":"es_rejected_execution_exception"},"status":429}',
                  {"Content-Type": "application/json"}, count=1, after=5)
    job = _read(shipped, "twice", proxy.url, pack_page=10)
    pack_pages = [r for r in proxy.seen if "rollup" in r.path and r.path.split("?")[0].endswith("/_search")]
    assert len(pack_pages) > records // 10, len(pack_pages)  # every page read, one of them twice
    assert sum(r.status == 429 for r in proxy.seen) == 1
    assert f"{RANKS} ranks read from the rollups" in job.source
    _assert_same_report(shipped, job)


def test_whole_reads_every_event_and_no_pack(shipped: Shipped, opensearch: OpenSearchServer) -> None:
    job = _read(shipped, "all", opensearch.url, whole=True)
    assert job.stats.fetched_events is None and "rollups" not in job.source
    assert job.con.execute("SELECT count(*) FROM events").fetchone() == (shipped.events,)
    _assert_same_report(shipped, job)


def test_event_reads_never_return_pack_documents(shipped: Shipped, opensearch: OpenSearchServer) -> None:
    from kibana import Cluster, client_caller, make_client
    from queries._elasticsearch import iter_job_documents

    ns = shipped.namespaces["all"]
    packs = requests.get(f"{opensearch.url}/metrics-jobtrace.rollup-{ns}/_count", timeout=30).json()["count"]
    assert packs == sum(len(v) for v in shipped.pack_lines.values())  # they are there, in their own stream
    cluster = Cluster("opensearch", "2.19.0")
    client = make_client(HttpConfig(opensearch.url), cluster)
    try:
        docs = list(iter_job_documents(client_caller(client, cluster), cluster, shipped.job_id, RANGE, namespace=ns))
    finally:
        client.close()
    assert len(docs) == shipped.events
    assert not [d for d in docs if (d.get("jobtrace") or {}).get("kind") == "rollup" or "jobtrace_pack" in d]


def test_the_rollup_stream_has_its_own_template_and_mapping(shipped: Shipped, opensearch: OpenSearchServer) -> None:
    ns = shipped.namespaces["all"]
    (stream,) = requests.get(f"{opensearch.url}/_data_stream/metrics-jobtrace.rollup-{ns}",
                             timeout=30).json()["data_streams"]
    assert stream["template"] == "jobtrace-rollup"
    mapping = requests.get(f"{opensearch.url}/metrics-jobtrace.rollup-{ns}/_mapping", timeout=30).json()
    props = next(iter(mapping.values()))["mappings"]["properties"]
    assert props["jobtrace_pack"]["type"] == "binary"
    assert props["@timestamp"]["type"] == "date_nanos"
    rollup = props["jobtrace"]["properties"]["rollup"]["properties"]
    assert (rollup["table"]["type"], rollup["part"]["type"], rollup["last_ts"]["type"]) == ("keyword", "integer", "long")
    assert "message" not in props and "metrics" not in props["jobtrace"]["properties"]  # not the events' mapping


def test_a_cluster_without_packs_reads_events(shipped: Shipped, opensearch: OpenSearchServer) -> None:
    """No ``metrics-jobtrace.rollup-<ns>`` at all (a namespace never given a pack): no packs, no error."""
    from kibana import Cluster, client_caller, make_client
    from queries._elasticsearch import read_packs

    cluster = Cluster("opensearch", "2.19.0")
    client = make_client(HttpConfig(opensearch.url), cluster)
    try:
        packs = read_packs(client_caller(client, cluster), shipped.job_id, RANGE, namespace=f"nopacks_{uuid.uuid4().hex[:6]}")
    finally:
        client.close()
    assert packs.ranks == set() and packs.records == 0
    packs.close()


def test_an_exported_job_reads_from_its_packs(shipped: Shipped, opensearch: OpenSearchServer) -> None:
    """``jobtrace export`` sends each rank's pack after its events, as a rank shipping live does at exit."""
    job = _read(shipped, "export", opensearch.url)
    assert f"{RANKS} ranks read from the rollups" in job.source
    assert job.stats.events == shipped.events
    _assert_same_report(shipped, job)


def test_the_packs_are_kept_as_long_as_the_metrics() -> None:
    """ILM by the metrics policy's name, ISM by a second pattern of the metrics policy, serverless by days;
    and no event pattern (``<type>-jobtrace-*``) matches the packs' stream."""
    from fnmatch import fnmatch

    from kibana import Cluster, Retention
    from kibana._setup import index_template, ism_policy

    retention = Retention(logs=7, metrics=400)
    es = index_template("rollup", Cluster("elasticsearch", "8.15.0"), retention)
    assert es["index_patterns"] == ["metrics-jobtrace.rollup-*"] and "data_stream" in es
    assert es["template"]["settings"]["index.lifecycle.name"] == "jobtrace-metrics"
    serverless = index_template("rollup", Cluster("elasticsearch", "8.11.0", serverless=True), retention)
    assert serverless["template"]["lifecycle"] == {"data_retention": "400d"}
    stream = "metrics-jobtrace.rollup-default"
    (metrics,) = ism_policy("metrics", retention)["policy"]["ism_template"]
    assert any(fnmatch(stream, p) for p in metrics["index_patterns"])
    for type_ in ("logs", "traces"):
        (other,) = ism_policy(type_, retention)["policy"]["ism_template"]
        assert not any(fnmatch(stream, p) for p in other["index_patterns"])
    assert not any(fnmatch(stream, f"{t}-jobtrace-*") for t in ("logs", "metrics", "traces"))


def test_the_bulk_encoder_routes_a_pack_line_to_the_packs_stream(shipped: Shipped, tmp_path: Path) -> None:
    from shippers._elasticsearch import ElasticsearchShipper, EsBulkEncoder

    pack = shipped.pack_lines[0][0]
    event = b'{"ts":1767225600000000000,"kind":"log","job":"j","rank":0,"msg":"m"}\n'
    body = EsBulkEncoder("http://es:9200", namespace="ns").request([pack, event]).body
    action, doc, event_action, _ = (orjson.loads(line) for line in body.splitlines())
    assert action == {"create": {"_index": "metrics-jobtrace.rollup-ns", "_id": doc_id(pack)}}
    assert event_action["create"]["_index"] == "logs-jobtrace-ns"
    record = orjson.loads(pack)
    assert doc["jobtrace_pack"] == record["parquet"] and doc["jobtrace"]["rollup"] == record["rollup"]
    assert doc["data_stream"] == {"type": "metrics", "dataset": "jobtrace.rollup", "namespace": "ns"}
    from kibana import from_pack_document

    assert from_pack_document(doc) == record  # what the reader rebuilds is what the rank packed
    vl = ElasticsearchShipper(HttpConfig("http://vl:9428/insert/elasticsearch"), tmp_path / "vl", setup="off")
    es = ElasticsearchShipper(HttpConfig("http://es:9200"), tmp_path / "es", setup="off")
    try:
        assert (vl.takes_packs, es.takes_packs) == (False, True)
    finally:
        vl.close()
        es.close()
