"""The LogQL library, the alert rules and the Grafana provisioning: parsed by Grafana's grammar, consistent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import loki
from jobtrace.errors import ConfigError
from loki._build import DASHBOARDS, LOKI_DS, PANEL_DS, TRACE_DS, build, rules_yaml
from tests.loki.conftest import lezer_parse
from tests.loki.fake_loki import go_unquote

GRAFANA_BUILTINS = {"__all", "__auto", "__interval", "__range", "__rate_interval", "__url_time_range", "__all_variables"}
HOSTILE = 'x"} |= "" or {job=~".+\\`$job\n\t\x01é'
lib = loki.library()


def grafana_for_parser(expr: str) -> str:
    """Grafana substitutes its built-ins before sending; the grammar sees a duration there."""
    return expr.replace("$__auto", "1m").replace("$__interval", "1m").replace("$__range", "1h")


class TestGrafanaGrammar:
    def test_every_query_parses_with_grafanas_logql_grammar(self):
        """Each query as Python renders it (defaults and a hostile job id) and as Grafana runs it."""
        exprs = {}
        for name in lib.names():
            exprs[f"{name} (defaults)"] = lib.render(name)
            exprs[f"{name} (hostile job)"] = lib.render(name, job=HOSTILE, node=["a.b", "c|d"], rank=[0, 7])
            exprs[f"{name} (grafana)"] = grafana_for_parser(lib.grafana(name))
        errors = {k: v for k, v in lezer_parse(exprs).items() if v is not None}
        assert errors == {}

    def test_every_rule_expression_parses(self):
        rules = yaml.safe_load((loki.ASSETS / "rules" / "jobtrace-alerts.yaml").read_text())
        exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
        assert len(exprs) == len(lib.alerts) >= 6
        errors = {k: v for k, v in lezer_parse(exprs).items() if v is not None}
        assert errors == {}

    def test_a_syntax_error_is_caught(self):
        """The check is real: broken LogQL is reported, with where it broke."""
        result = lezer_parse({
            "unclosed": '{job="x" | json',
            "bad_unwrap_in_log_query": '{job="x"} | json | unwrap dur',
            "unknown_function": 'quantile by (job) (0.5, count_over_time({job="x"}[5m]))',
            "fine": '{job="x"}',
        })
        assert result["fine"] is None
        assert all(result[k] for k in ("unclosed", "bad_unwrap_in_log_query", "unknown_function"))
        assert "error at" in result["unclosed"]


class TestRendering:
    def test_a_hostile_job_id_cannot_change_the_query(self):
        """The job id comes back intact from the string and matches only itself as a regex."""
        expr = lib.render("job_events", job=HOSTILE)
        m = re.fullmatch(r'\{job=~("(?:[^"\\]|\\.)*")\}', expr)
        assert m, expr
        pattern = go_unquote(m.group(1))
        assert re.fullmatch(pattern, HOSTILE) and not re.fullmatch(pattern, "x")
        assert "\n" not in expr

    def test_lists_become_alternations_and_none_the_default(self):
        assert lib.render("job_timeline", job="j", rank=[2, 3]).endswith('rank=~"2|3"')
        assert 'node=~".*"' in lib.render("job_timeline", job="j")
        assert 'node=~"a\\\\.b"' in lib.render("job_timeline", job="j", node="a.b")
        assert lib.render("job_events", job=loki.Regex("train-.*")) == '{job=~"train-.*"}'

    @pytest.mark.parametrize("params", [{"window": "5m; drop"}, {"window": "5"}, {"k": "3) or vector(1"},
                                        {"factor": "nan"}, {"bogus": 1}, {"job": 1.5}])
    def test_bad_parameters_are_refused(self, params):
        with pytest.raises(ConfigError):
            lib.render("slowest_ranks", **params)

    def test_every_query_documents_what_it_answers(self):
        required = {"job_timeline", "step_durations", "slowest_ranks", "last_seen", "errors_by_node",
                    "nccl_timeouts_by_node", "loss_nan", "loss_spike"}
        assert required <= set(lib.names())
        for name in lib.names():
            q = lib[name]
            assert len(q.answers) > 30 and q.type in ("log", "metric"), name
        assert "unwrap dur" in lib.render("step_durations")

    def test_metric_queries_never_group_by_high_cardinality_metadata(self):
        """span_id, trace_id and step must not become series labels: they are kept out of every metric query."""
        for name in lib.names():
            if lib[name].type != "metric":
                continue
            expr = lib.render(name)
            for group in re.findall(r"by \(([^)]*)\)", expr):
                assert not {"span_id", "trace_id", "step"} & {g.strip() for g in group.split(",")}, name
            # every range aggregation either groups inside, or is reduced by keep/outer sum
            assert re.search(r"\) by \(|\| keep |^count\(", expr), name


class TestGeneratedFiles:
    def test_rules_and_dashboards_are_generated_from_the_library(self):
        """The committed files are exactly what `python -m loki build` writes (no hand-edited copies)."""
        stale = [str(p.relative_to(loki.ASSETS)) for p, text in build().items()
                 if not p.exists() or p.read_text(encoding="utf-8") != text]
        assert stale == [], "run: python -m loki build"

    def test_rules_file_is_a_loki_ruler_rule_group(self):
        doc = yaml.safe_load(rules_yaml())
        (group,) = doc["groups"]
        names = {r["alert"] for r in group["rules"]}
        assert names == {"JobtraceRankSilent", "JobtraceLossNaN", "JobtraceLossSpike", "JobtraceNcclTimeout",
                         "JobtraceCudaOOM", "JobtraceStraggler", "JobtraceStuckInCollective"}
        for r in group["rules"]:
            assert set(r) == {"alert", "expr", "for", "labels", "annotations"}
            assert re.fullmatch(r"\d+[smh]", r["for"]) and r["labels"]["severity"] in ("warning", "critical")
            assert "$" not in r["expr"].replace("$labels", "")  # every parameter substituted
        silent = next(r for r in group["rules"] if r["alert"] == "JobtraceRankSilent")["expr"]
        assert '[5m]' in silent and 'kind="heartbeat"' in silent
        straggler = next(r for r in group["rules"] if r["alert"] == "JobtraceStraggler")["expr"]
        assert "group_left 1.5 *" in straggler

    def test_vlogs_rules_are_the_same_alerts_in_logsql(self):
        """vmalert's file holds the library's alerts that have a LogsQL form, each a ``stats`` query
        (tests/loki/test_vmalert.py runs them against a real VictoriaLogs)."""
        from loki._build import vlogs_rules_yaml

        doc = yaml.safe_load(vlogs_rules_yaml())
        (group,) = doc["groups"]
        assert group["type"] == "vlogs"
        names = {r["alert"] for r in group["rules"]}
        assert names == {"JobtraceRankSilent", "JobtraceStuckInCollective", "JobtraceLossNaN", "JobtraceCudaOOM"}
        loki_rules = {r["alert"]: r for r in yaml.safe_load(rules_yaml())["groups"][0]["rules"]}
        for r in group["rules"]:
            assert "| stats " in r["expr"] and "$" not in r["expr"] and "{param" not in r["expr"]
            assert r["annotations"] == loki_rules[r["alert"]]["annotations"]  # one alert, two languages
        short = yaml.safe_load(vlogs_rules_yaml(overrides={"JobtraceRankSilent": {"silent": "10s"}}))
        silent = next(r for r in short["groups"][0]["rules"] if r["alert"] == "JobtraceRankSilent")["expr"]
        assert "_time:10s" in silent


def _dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (loki.ASSETS / "grafana" / "dashboards").glob("*.json")}


class TestGrafana:
    def test_provisioning_files_are_valid_yaml_with_a_trace_link(self):
        root = loki.ASSETS / "grafana" / "provisioning"
        ds = yaml.safe_load((root / "datasources" / "jobtrace.yaml").read_text())
        assert ds["apiVersion"] == 1
        by_uid = {d["uid"]: d for d in ds["datasources"]}
        assert by_uid[LOKI_DS["uid"]]["type"] == "loki" and by_uid[TRACE_DS["uid"]]["type"] == "tempo"
        (field,) = by_uid[LOKI_DS["uid"]]["jsonData"]["derivedFields"]
        assert field["datasourceUid"] == TRACE_DS["uid"] and field["url"] == "$${__value.raw}"
        # the derived field finds the trace id in a real canonical line, with exactly one group
        rx = re.compile(field["matcherRegex"])
        assert rx.groups == 1
        assert rx.search('{"ts":1,"kind":"log","job":"j","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}').group(1) \
            == "4bf92f3577b34da6a3ce929d0e0e4736"
        t2l = by_uid[TRACE_DS["uid"]]["jsonData"]["tracesToLogsV2"]
        assert t2l["datasourceUid"] == LOKI_DS["uid"]
        prov = yaml.safe_load((root / "dashboards" / "jobtrace.yaml").read_text())
        assert prov["apiVersion"] == 1 and prov["providers"][0]["type"] == "file"

    def test_dashboards_load_and_every_panel_query_comes_from_the_library(self):
        dashboards = _dashboards()
        assert set(dashboards) == set(DASHBOARDS)
        seen = set()
        for uid, d in dashboards.items():
            assert d["uid"] == uid and 8 <= len(uid) <= 40 and d["panels"]
            for panel in d["panels"]:
                name = re.search(r"library: (\w+)$", panel["description"]).group(1)
                (target,) = panel["targets"]
                assert target["expr"] == lib.grafana(name), (uid, panel["title"])
                assert target["datasource"] == PANEL_DS == panel["datasource"]
                assert 1 <= panel["gridPos"]["w"] <= 24
                assert (lib[name].type == "log") == (panel["type"] == "logs")
                seen.add(name)
        assert {"step_durations", "job_timeline", "rank_logs", "errors", "slowest_ranks", "last_seen"} <= seen
        heat = [p for p in dashboards["jobtrace-ranks"]["panels"] if p["type"] == "heatmap"]
        assert heat and "library: step_durations" in heat[0]["description"]

    def test_every_variable_used_is_defined(self):
        for uid, d in _dashboards().items():
            defined = {v["name"] for v in d["templating"]["list"]}
            assert {"job", "node", "rank"} <= defined
            text = json.dumps(d["panels"]) + json.dumps(d["templating"]) + json.dumps(d["links"])
            used = set(re.findall(r"\$\{?(\w+)", text))
            inputs = {i["name"] for i in d["__inputs"]}  # what Grafana's import replaces
            assert used - GRAFANA_BUILTINS <= defined | inputs, uid

    def test_dashboards_run_on_a_datasource_variable_and_import_anywhere(self):
        """Panels and queries use ``${datasource}``, a variable of type datasource over Loki; ``__inputs`` names
        the data source Grafana's import asks for, and the variable's default is it; provisioned, the
        variable falls back to the provisioned Loki (the only one of its type)."""
        ds = yaml.safe_load((loki.ASSETS / "grafana" / "provisioning" / "datasources" / "jobtrace.yaml").read_text())
        provisioned = {d["type"] for d in ds["datasources"]}
        for uid, d in _dashboards().items():
            (var,) = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
            assert var["name"] == "datasource" and var["query"] == "loki" and "loki" in provisioned
            (inp,) = d["__inputs"]
            assert inp["type"] == "datasource" and inp["pluginId"] == "loki"
            assert var["current"]["value"] == "${" + inp["name"] + "}"
            used = {p["datasource"]["uid"] for p in d["panels"]} | {t["datasource"]["uid"] for p in d["panels"]
                                                                      for t in p["targets"]}
            used |= {v["datasource"]["uid"] for v in d["templating"]["list"] if "datasource" in v}
            assert used == {"${datasource}"}, uid


def test_packaged_files_are_in_the_package_data():
    """Data files ship in the wheel: pyproject's package-data covers every asset (the proto's LICENSE too)."""
    import fnmatch
    import tomllib

    conf = tomllib.loads((Path(loki.ASSETS).parent / "pyproject.toml").read_text())
    patterns = conf["tool"]["setuptools"]["package-data"]["*"]
    files = [p for p in loki.ASSETS.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    missing = [str(p) for p in files if not any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]
    assert missing == []
    assert (loki.ASSETS / "proto" / "LICENSE").is_file()
