"""``jobtrace jobs --backend …``: a server's jobs from one aggregation (issue 26, "Many jobs").

Three small synthetic jobs are written to an embedded store and sent with ``jobtrace export``'s
own code to the real VictoriaLogs and OpenSearch; the server listing must name exactly those
jobs, with the ranks, steps, events and first/last event the embedded store's listing gives,
and must cost one request (counted by a FaultProxy in front of the server). Their times are
placed in an hour of 2024 chosen per run, and the listing asked for that hour only, so jobs
other tests ship to the same servers are never in it. No Loki server runs here: its query is
parsed with Grafana's LogQL grammar and its answer is a response in Loki's documented shape.
"""

from __future__ import annotations

import functools
import json
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from click.testing import CliRunner

from jobtrace.cli import main
from jobtrace.cli.store import LIST_FROM, SERVER_JOB_STATES, format_jobs_table
from jobtrace.http import InMemoryTransport, Request, Response
from jobtrace.synth import SynthJob, write_job
from queries import SERVER_JOB_BACKENDS, TimeRange, list_server_jobs
from tests.servers.opensearch_server import OpenSearchServer
from tests.servers.victorialogs_server import VictoriaLogsServer

ROOT = Path(__file__).resolve().parents[2]
SECOND = 10**9
JOBS = {"a": (8, 20), "b": (4, 12), "c": (2, 6)}  # suffix -> (ranks, steps)


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((ROOT / "docs" / "schema" / "jobs.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def invoke(*args: Any) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["jobs", *[str(a) for a in args]])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three jobs in an embedded store, ten minutes apart in an hour of 2024 of this run's own."""
    data = tmp_path_factory.mktemp("server-jobs")
    run = uuid.uuid4()
    hour0 = 1_704_067_200 * SECOND + (run.int % 8000) * 3600 * SECOND  # 2024-01-01 + up to 8,000 hours
    ids = {}
    for i, (suffix, (ranks, steps)) in enumerate(JOBS.items()):
        job_id = f"listed-{run.hex[:8]}-{suffix}"
        write_job(data, SynthJob(job_id=job_id, ranks=ranks, steps=steps, t0_ns=hour0 + (60 + 600 * i) * SECOND))
        ids[suffix] = job_id
    local = {j["job_id"]: j for j in invoke("--data-dir", data, "--json")["jobs"]}
    assert set(local) == set(ids.values())
    return {"data": data, "ids": ids, "local": local, "since": str(hour0 // SECOND),
            "until": str(hour0 // SECOND + 3600)}


def ship(written: dict[str, Any], backend: str, url: str) -> None:
    from shippers import export_job

    for job_id in written["ids"].values():
        summary = export_job(written["data"], job_id, backend, url=url, timeout_s=120)
        assert summary.complete and summary.refused == 0, summary.to_dict()


@pytest.fixture(scope="module")
def on_victorialogs(written: dict[str, Any], victorialogs: VictoriaLogsServer) -> dict[str, Any]:
    ship(written, "victorialogs", victorialogs.url)
    victorialogs.force_flush()
    return written


@pytest.fixture(scope="module")
def on_opensearch(written: dict[str, Any], opensearch: OpenSearchServer) -> dict[str, Any]:
    ship(written, "elasticsearch", opensearch.url)
    opensearch.refresh("*-jobtrace-*")
    return written


def the_same_jobs(listing: dict[str, Any], local: dict[str, Any], resolution_ns: int) -> None:
    """The server's rows agree with the embedded store's: ids, ranks, steps, events, first and last event."""
    assert [] == [e.message for e in validator().iter_errors(listing)]
    rows = {j["job_id"]: j for j in listing["jobs"]}
    assert sorted(local) == [j["job_id"] for j in listing["jobs"]]
    for job_id, here in local.items():
        there = rows[job_id]
        assert (here["ranks"], here["steps"], here["events"]) == (there["ranks"], there["steps"], there["events"])
        assert resolution_ns == there["resolution_ns"]
        assert (here["first_ns"] // resolution_ns, here["last_ns"] // resolution_ns) == \
               (there["first_ns"] // resolution_ns, there["last_ns"] // resolution_ns)
        assert "ended" == there["state"]  # 2024: long past the stall threshold


class TestVictoriaLogs:
    pytestmark = [pytest.mark.servers]

    def test_lists_exactly_the_shipped_jobs_as_the_store_does_in_one_query(self, on_victorialogs, victorialogs,
                                                                            fault_proxy):
        """One LogsQL stats query; each job's ranks, steps, events and times as the embedded store has them, to the ns."""
        proxy = fault_proxy(victorialogs)
        listing = invoke("--backend", "victorialogs", "--url", proxy.url, "--since", on_victorialogs["since"],
                         "--until", on_victorialogs["until"], "--json")
        the_same_jobs(listing, on_victorialogs["local"], resolution_ns=1)
        assert [("POST", "/select/logsql/query")] == [(r.method, r.path) for r in proxy.seen]
        assert ("victorialogs", proxy.url) == (listing["backend"], listing["url"])

    def test_a_job_is_running_until_its_last_event_is_older_than_the_stall_threshold(self, on_victorialogs,
                                                                                      victorialogs):
        """running under trace-job's 300 s stall threshold after the last event, ended past it."""
        rng = TimeRange.parse(on_victorialogs["since"], on_victorialogs["until"])
        last = max(j["last_ns"] for j in on_victorialogs["local"].values())
        states = {}
        for after_s in (10, 299, 301):
            rows = list_server_jobs("victorialogs", url=victorialogs.url, time_range=rng, now_ns=last + after_s * SECOND)
            states[after_s] = {r["job_id"]: r["state"] for r in rows}[on_victorialogs["ids"]["c"]]
        assert {10: "running", 299: "running", 301: "ended"} == states

    def test_the_names_format_prints_the_job_ids_alone(self, on_victorialogs, victorialogs):
        """``--format names`` (what a pipe gets): one job id a line, for ``for j in $(jobtrace jobs …)``."""
        res = CliRunner().invoke(main, ["jobs", "--backend", "victorialogs", "--url", victorialogs.url, "--since",
                                        on_victorialogs["since"], "--until", on_victorialogs["until"]])
        assert res.exit_code == 0, res.output
        assert sorted(on_victorialogs["ids"].values()) == res.stdout.split()


class TestOpenSearch:
    pytestmark = [pytest.mark.servers]

    def test_lists_exactly_the_shipped_jobs_as_the_store_does_in_one_search(self, on_opensearch, opensearch,
                                                                            fault_proxy):
        """One composite aggregation; times to the millisecond (aggregations read date_nanos as ms)."""
        proxy = fault_proxy(opensearch)
        listing = invoke("--backend", "elasticsearch", "--url", proxy.url, "--since", on_opensearch["since"],
                         "--until", on_opensearch["until"], "--json")
        the_same_jobs(listing, on_opensearch["local"], resolution_ns=1_000_000)
        assert [("POST", "/logs-jobtrace-*,metrics-jobtrace-*,traces-jobtrace-*/_search")] == \
               [(r.method, r.path.split("?")[0]) for r in proxy.seen]

    def test_more_jobs_than_a_page_are_read_page_by_page(self, on_opensearch, opensearch, fault_proxy, monkeypatch):
        """A composite page of one job: three requests (after_key), and the same rows as one page gives."""
        from queries import _server_jobs

        rng = TimeRange.parse(on_opensearch["since"], on_opensearch["until"])
        whole = list_server_jobs("elasticsearch", url=opensearch.url, time_range=rng)
        monkeypatch.setitem(_server_jobs._LISTERS, "elasticsearch",
                            functools.partial(_server_jobs._elasticsearch, page_size=1))
        proxy = fault_proxy(opensearch)
        paged = list_server_jobs("elasticsearch", url=proxy.url, time_range=rng)
        assert [r["job_id"] for r in whole] == [r["job_id"] for r in paged] == sorted(on_opensearch["ids"].values())
        assert [{k: v for k, v in r.items() if k != "reason"} for r in whole] == \
               [{k: v for k, v in r.items() if k != "reason"} for r in paged]
        assert 4 == len(proxy.seen)  # one job a page, and the last page comes back empty


# ---- Loki: no server here ---------------------------------------------------------------------------------
T0 = 1_735_689_600  # 2025-01-01T00:00:00Z, seconds
LOKI_RANGE = TimeRange(T0 * SECOND, (T0 + 3600) * SECOND)


def documented_matrix(request: Request) -> Response:
    """A ``query_range`` answer in the shape docs/sources/reference/loki-http-api.md gives for a metric query:
    ``{"status":"success","data":{"resultType":"matrix","result":[{"metric":{…},"values":[[<s>,"<n>"],…]}],
    "stats":{…}}}``, sample times in (fractional) seconds and values as strings."""
    body = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"training_job": "run-b"}, "values": [[T0 + 600, "0"], [T0 + 1200.5, "12"], [T0 + 1800.5, "3"]]},
        {"metric": {"training_job": "run-a"}, "values": [[T0 + 1, "40"], [T0 + 2, "2"]]},
    ], "stats": {"summary": {"bytesProcessedPerSecond": 1, "linesProcessedPerSecond": 1, "totalBytesProcessed": 1,
                             "totalLinesProcessed": 57, "execTime": 0.01}}}}
    return Response(200, orjson.dumps(body), {"Content-Type": "application/json"})


class TestLoki:
    def test_the_query_parses_with_grafanas_logql_grammar(self):
        """The one metric query, on the default and a custom job label, is LogQL by Grafana's own grammar."""
        from queries._server_jobs import loki_query, loki_step_s
        from tests.loki.conftest import lezer_parse

        exprs = {"default": loki_query("training_job", loki_step_s(LOKI_RANGE)),
                 "old label": loki_query("job", 120), "week": loki_query("training_job", 61 * 60)}
        assert {"default": None, "old label": None, "week": None} == lezer_parse(exprs)

    def test_one_range_query_gives_each_jobs_span_and_lines_without_ranks_or_steps(self):
        """From a documented matrix: first = first bucket's start, last = last bucket's end, events summed."""
        transport = InMemoryTransport(documented_matrix)
        rows = list_server_jobs("loki", url="http://loki:3100", time_range=LOKI_RANGE, transport=transport,
                                now_ns=(T0 + 1900) * SECOND)
        (request,) = transport.requests
        assert request.url.startswith("http://loki:3100/loki/api/v1/query_range?")
        from urllib.parse import parse_qs, urlsplit

        params = {k: v[0] for k, v in parse_qs(urlsplit(request.url).query).items()}
        assert 'sum by (training_job) (count_over_time({training_job=~".+", kind!="rollup"} [1s]))' == params["query"]
        assert (str(LOKI_RANGE.start_ns), str(LOKI_RANGE.end_ns), "1s") == (params["start"], params["end"],
                                                                            params["step"])
        got = [(r["job_id"], r["first_ns"], r["last_ns"], r["events"], r["ranks"], r["steps"], r["resolution_ns"],
                r["state"]) for r in rows]
        assert [("run-a", T0 * SECOND, (T0 + 2) * SECOND, 42, None, None, SECOND, "ended"),
                ("run-b", (T0 + 1199) * SECOND + SECOND // 2, (T0 + 1800) * SECOND + SECOND // 2, 15, None, None,
                 SECOND, "running")] == got

    def test_the_listing_meets_the_schema_and_shows_dashes_for_what_loki_cannot_count(self):
        """The JSON document of a Loki listing validates; the table prints "-" for ranks and steps."""
        rows = list_server_jobs("loki", url="http://loki:3100", time_range=LOKI_RANGE,
                                transport=InMemoryTransport(documented_matrix))
        doc = {"schema_version": 1, "backend": "loki", "url": None, "since_ns": LOKI_RANGE.start_ns,
               "until_ns": LOKI_RANGE.end_ns, "since": "2025-01-01T00:00:00.000Z", "until": "2025-01-01T01:00:00.000Z",
               "jobs": rows}
        assert [] == [e.message for e in validator().iter_errors(doc)]
        assert not validator().is_valid({**doc, "data_dir": "x"})  # a listing is of a store or of a server
        line = format_jobs_table(rows).splitlines()[1].split()
        assert ["run-a", "ended", "-", "-"] == line[:4]


def test_the_cli_offers_every_server_the_listing_reads():
    """``jobs --backend`` choices are the embedded store and :data:`queries.SERVER_JOB_BACKENDS`; the schema
    documents those servers and the states a server listing gives."""
    schema = validator().schema
    assert ("local", *SERVER_JOB_BACKENDS) == LIST_FROM
    assert sorted(SERVER_JOB_BACKENDS) == sorted(schema["properties"]["backend"]["enum"])
    assert list(SERVER_JOB_STATES) == schema["$defs"]["server_job"]["properties"]["state"]["enum"]
