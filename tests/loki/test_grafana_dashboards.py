"""The Loki dashboards import into any Grafana: Grafana's published schema, variables filled by label queries over
the labels the shipper really writes, and annotations over the records jobtrace really writes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import orjson
import pytest

import loki
from loki._build import DASHBOARDS, METRICS_DS, PANEL_DS
from shippers._loki import LokiEncoder, LokiOptions
from tests.loki.conftest import lezer_parse
from tests.loki.fake_loki import FakeLoki
from tests.loki.grafana_schema import dashboard_errors

lib = loki.library()
HANG = Path(__file__).resolve().parents[1] / "queries" / "data" / "torn_down_hang"
"""Events a real 4-rank gloo job wrote while one rank hung (committed test data of tests/queries)."""


def _dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (loki.ASSETS / "grafana" / "dashboards").glob("*.json")}


def _shipped_streams(lines: list[bytes], **options) -> list[dict[str, str]]:
    """The stream label sets the real encoder pushes for ``lines`` (JSON push format, to read them back)."""
    enc = LokiEncoder("http://loki:3100/loki/api/v1/push", LokiOptions(format="json", **options))
    body = orjson.loads(enc.request(lines).body)
    return [s["stream"] for s in body["streams"]]


def _hang_lines() -> list[bytes]:
    return [raw for p in sorted(HANG.glob("*.jsonl")) for raw in p.read_bytes().splitlines() if raw.strip()]


class TestSchema:
    @pytest.mark.parametrize("uid", sorted(DASHBOARDS))
    def test_every_dashboard_is_valid_under_grafanas_published_schema(self, uid):
        """The saved model against Grafana's dashboard JSON Schema, each target against the Loki query schema."""
        assert dashboard_errors(_dashboards()[uid]) == []

    def test_the_schema_check_fails_on_what_grafana_would_not_take(self):
        """The check is real: a misspelt target field, a variable without a name, a string grid width, a misspelt
        panel option, an import input of an unknown type are each reported."""
        d = copy.deepcopy(_dashboards()["jobtrace-overview"])
        d["panels"][0]["targets"][0]["exprr"] = "x"
        del d["templating"]["list"][2]["name"]
        d["panels"][1]["gridPos"]["w"] = "12"
        d["panels"][1]["options"]["orientaton"] = "horizontal"  # the bar gauge's options, misspelt
        d["__inputs"][0]["type"] = "plugin"
        errors = dashboard_errors(d)
        assert any("target" in e and "exprr" in e for e in errors), errors
        assert any("templating/list/2" in e and "'name' is a required property" in e for e in errors), errors
        assert any("panels/1/gridPos/w" in e for e in errors), errors
        assert any("options" in e and "orientaton" in e for e in errors), errors
        assert any(e.startswith("__inputs") for e in errors), errors


class TestVariables:
    def test_job_node_and_rank_are_multi_select_lists_filled_by_label_queries(self):
        for uid, d in _dashboards().items():
            v = {x["name"]: x for x in d["templating"]["list"]}
            assert all(v[n]["type"] == "query" and v[n]["multi"] for n in ("job", "node", "rank")), uid
            assert v["job"]["query"] == f"label_values({loki.JOB_LABEL})"
            assert v["node"]["query"] == f'label_values({{{loki.JOB_LABEL}=~"$job"}}, node)'
            assert v["job"]["datasource"] == v["node"]["datasource"] == PANEL_DS
            # rank is structured metadata in Loki (no label query lists it): the Prometheus of `jobtrace metrics` does
            assert v["rank"]["datasource"] == METRICS_DS
            assert v["rank"]["query"] == 'label_values(jobtrace_step{job=~"$job"}, rank)'
            assert v["rank"]["includeAll"] and v["rank"]["allValue"] == ".+" and v["rank"]["allowCustomValue"]

    def test_the_labels_the_lists_query_are_the_ones_the_shipper_writes(self):
        """Every stream the real encoder pushes for a real job carries the job and node labels the variables list,
        and never rank (which is why the rank list comes from Prometheus)."""
        d = _dashboards()["jobtrace-overview"]
        v = {x["name"]: x for x in d["templating"]["list"]}
        listed = {re.search(r"(\w+)\)$", v[n]["query"]).group(1) for n in ("job", "node")}
        streams = _shipped_streams(_hang_lines())
        assert streams and all(listed <= set(s) and "rank" not in s for s in streams)
        assert {s[loki.JOB_LABEL] for s in streams} == {"hang3"}

    def test_every_variable_query_and_annotation_parses(self):
        """Label selectors in the variables and LogQL in the annotations, with Grafana's grammar."""
        exprs = {}
        for uid, d in _dashboards().items():
            node = next(x for x in d["templating"]["list"] if x["name"] == "node")
            exprs[f"{uid} node"] = re.fullmatch(r"label_values\((\{.*\}), node\)", node["query"]).group(1)
            for a in d["annotations"]["list"]:
                exprs[f"{uid} {a['name']}"] = a["expr"]
        assert {k: v for k, v in lezer_parse(exprs).items() if v is not None} == {}


class TestAnnotations:
    def test_findings_and_errors_come_from_the_library(self):
        for uid, d in _dashboards().items():
            a = {x["name"]: x for x in d["annotations"]["list"]}
            assert a["jobtrace findings"]["expr"] == lib.grafana("findings") and a["jobtrace findings"]["enable"]
            assert a["Errors"]["expr"] == lib.grafana("errors") and not a["Errors"]["enable"]
            assert all(x["datasource"] == PANEL_DS for x in a.values()), uid
            # the title and text name labels the query has: structured metadata (rank), stream labels, json fields
            assert set(re.findall(r"\{\{(\w+)\}\}", a["jobtrace findings"]["titleFormat"])) <= {"level", "rank", "node"}

    def test_the_findings_query_selects_what_jobtrace_wrote_in_a_real_hang(self):
        """Over a real hung job's records, shipped by the real encoder: the selector (matched as Loki does), the line
        filter and the logger filter keep jobtrace's own warnings (stall dumps, the SIGTERM), and not the training script's
        warning, nor jobtrace's INFO lifecycle records."""
        expr = lib.render("findings", job="hang3")
        selector = expr[: expr.index("}") + 1]
        needle = re.search(r"\|= `([^`]*)`", expr).group(1)
        logger_rx = re.compile(re.search(r'\| logger=~"([^"]*)"', expr).group(1))
        match = FakeLoki()._matcher(selector)

        class Entry:
            def __init__(self, labels):
                self.labels = labels

        kept, dropped = [], []
        for raw in _hang_lines():
            ev = orjson.loads(raw)
            (labels,) = _shipped_streams([raw])
            ok = match(Entry(labels)) and needle in raw.decode() and bool(logger_rx.fullmatch(ev.get("logger", "")))
            (kept if ok else dropped).append(ev)
        assert kept and all(e["logger"] == "jobtrace" and e["level"] == "WARNING" for e in kept)
        assert all(e["msg"].startswith(("no progress for", "received SIGTERM")) for e in kept)
        assert {e["rank"] for e in kept if e["msg"].startswith("no progress for")} == {0, 1, 2, 3}  # each rank's stall
        assert len(kept) == sum(1 for e in map(orjson.loads, _hang_lines())
                                if e["kind"] == "log" and e["logger"].startswith("jobtrace") and e["level"] != "INFO")
        assert any(e.get("logger") == "demo.train" and e.get("level") == "WARNING" for e in dropped)
        assert any(e.get("logger") == "jobtrace.lifecycle" for e in dropped)
