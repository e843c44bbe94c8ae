"""The LogQL library, the alert rules and the Grafana provisioning: parsed by Grafana's grammar, consistent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import loki
from jobtrace.errors import ConfigError
from loki._build import DASHBOARDS, LOKI_DS, METRICS_DS, PANEL_DS, TRACE_DS, build, rules_yaml
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
        m = re.fullmatch(r'\{training_job=~("(?:[^"\\]|\\.)*"), kind!="rollup"\}', expr)
        assert m, expr
        pattern = go_unquote(m.group(1))
        assert re.fullmatch(pattern, HOSTILE) and not re.fullmatch(pattern, "x")
        assert "\n" not in expr

    def test_lists_become_alternations_and_none_the_default(self):
        assert lib.render("job_timeline", job="j", rank=[2, 3]).endswith('rank=~"2|3"')
        assert 'node=~".*"' in lib.render("job_timeline", job="j")
        assert 'node=~"a\\\\.b"' in lib.render("job_timeline", job="j", node="a.b")
        assert lib.render("job_events", job=loki.Regex("train-.*")) == '{training_job=~"train-.*", kind!="rollup"}'

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


_SCRAPE_JOB = re.compile(r"(?<![\w.$])job\s*(=~|!~|!=|=)|(?:by|on|without|keep)\s*\(?[^|\[)]*(?<![\w.])job\b")
"""LogQL that selects or groups on ``job``: the label Promtail and Prometheus give the scrape job."""


class TestJobLabel:
    def test_nothing_jobtrace_ships_or_reads_selects_on_the_scrape_jobs_label(self):
        """Every query (rendered and as Grafana runs it), both rule files, the dashboards' LogQL and the Tempo
        trace-to-logs mapping use ``training_job``."""
        texts = {f"{n} ({form})": text for n in lib.names()
                 for form, text in (("python", lib.render(n, job="j")), ("grafana", lib.grafana(n)))}
        for rules in ("jobtrace-alerts.yaml", "jobtrace-vlogs-alerts.yaml"):
            for r in yaml.safe_load((loki.ASSETS / "rules" / rules).read_text())["groups"][0]["rules"]:
                texts[f"{rules} {r['alert']}"] = r["expr"]
                assert "$labels.job " not in json.dumps(r["annotations"]).replace("}}", " ")
        for uid, d in _dashboards().items():
            texts |= {f"{uid} {p['title']}": t["expr"] for p in d["panels"] for t in p["targets"]}
            texts |= {f"{uid} {a['name']}": a["expr"] for a in d["annotations"]["list"]}
            texts |= {f"{uid} ${v['name']}": v["query"] for v in d["templating"]["list"]
                      if v.get("datasource", {}).get("type") == "loki"}
        bad = {k: v for k, v in texts.items() if _SCRAPE_JOB.search(v)}
        assert bad == {} and all(loki.JOB_LABEL in v for k, v in texts.items() if "golden_library" not in k)
        ds = yaml.safe_load((loki.ASSETS / "grafana" / "provisioning" / "datasources" / "jobtrace.yaml").read_text())
        (tempo,) = [d for d in ds["datasources"] if d["type"] == "tempo"]
        assert tempo["jsonData"]["tracesToLogsV2"]["tags"] == [{"key": "jobtrace.job.id", "value": loki.JOB_LABEL}]

    def test_the_check_finds_the_old_label(self):
        """The scan above is real: the library on the old label trips it everywhere the label is used."""
        old = loki.library("job")
        assert all(_SCRAPE_JOB.search(old.render(n)) for n in old.names() if n != "golden_library")
        assert not _SCRAPE_JOB.search('{training_job=~"j"} | json | logger=~"jobtrace" | keep training_job, node')

    def test_the_library_on_the_old_label_reads_old_data_and_parses(self):
        """``library("job")`` (JOBTRACE_LOKI_JOB_LABEL=job) renames the selectors, the groupings and the alert texts,
        and Grafana's grammar still takes every query."""
        old = loki.library("job")
        assert old.render("job_events", job="j") == '{job=~"j", kind!="rollup"}'
        assert "sum by (job, node) (count_over_time({job=~" in old.render("errors_by_node")
        assert all(loki.JOB_LABEL not in old.render(n) for n in old.names())
        assert all("$labels.job }}" in a.summary for a in old.alerts)
        exprs = {n: old.render(n, job=HOSTILE) for n in old.names()} | {a.alert: old.alert_expr(a) for a in old.alerts}
        assert {k: v for k, v in lezer_parse(exprs).items() if v is not None} == {}

    def test_the_setting_names_the_label_and_refuses_what_cannot_hold_it(self):
        assert loki.job_label({}) == loki.JOB_LABEL == "training_job"
        assert loki.job_label({"JOBTRACE_LOKI_JOB_LABEL": "job"}) == "job"
        for bad in ("node", "rank", "trace_id", "kind", "level", "bad-name", "__name__", "1x"):
            with pytest.raises(ConfigError):
                loki.job_label({"JOBTRACE_LOKI_JOB_LABEL": bad})

    def test_the_shipper_writes_the_label_the_readers_read(self, monkeypatch):
        """Encoder and reader follow the same setting: by default both ``training_job``; ``job`` for both with it."""
        from shippers._loki import LokiEncoder, LokiOptions

        line = b'{"ts":1767225600000000000,"kind":"log","job":"j","node":"n","level":"INFO","rank":0,"msg":"m"}'

        def pushed(options):
            enc = LokiEncoder("http://loki:3100/loki/api/v1/push", options)
            (stream,) = json.loads(enc.request([line]).body)["streams"]
            return stream["stream"]

        monkeypatch.delenv("JOBTRACE_LOKI_JOB_LABEL", raising=False)
        assert pushed(LokiOptions.from_env(format="json")) == {"training_job": "j", "node": "n", "kind": "log",
                                                                "level": "INFO"}
        monkeypatch.setenv("JOBTRACE_LOKI_JOB_LABEL", "job")
        assert pushed(LokiOptions.from_env(format="json"))["job"] == "j"
        assert loki.library(loki.job_label()).render("job_events", job="j") == '{job=~"j", kind!="rollup"}'
        with pytest.raises(ConfigError):
            LokiOptions(static_labels={"job": "scrape"}, job_label="job")
        # the scrape job's name is free for a site's own static label once jobtrace no longer takes it
        assert pushed(LokiOptions(format="json", static_labels={"job": "trainers"}))["job"] == "trainers"


def _value_meaning(alert: loki.Alert) -> str:
    """What an alert's ``$value`` is, read from its expression: a comparison filters, so it is the left-hand side's
    value; the library query there says what that is (its unit, or a count of lines, or the loss)."""
    m = re.fullmatch(r"@\{(\w+)\}(?:\s*[<>]=?\s*[\d.]+)?", alert.expr.strip())
    assert m, f"{alert.alert}: not a library query, optionally compared with a number: {alert.expr}"
    name = m.group(1)
    expr = lib[name].template
    while expr.startswith("@{"):  # stragglers = @{rank_compute} > ...: the left operand's query
        name = re.match(r"@\{(\w+)\}", expr).group(1)
        expr = lib[name].template
    if lib[name].unit == "ms" or "op_age_ms" in expr:
        return "ms"
    if re.match(r"(\(\s*)?sum by \([^)]*\) \(count_over_time\(", expr):
        return "count"
    if re.match(r"max_over_time\(.*metrics\.loss", expr):
        return "loss"
    return "unknown"


class TestAlertTexts:
    WORDS = {"ms": re.compile(r"\{\{ \$value \}\} ms\b"),
             "count": re.compile(r"\{\{ \$value \}\} [\w-]+ ?[\w-]* ?(line|record)\(s\)"),
             "loss": re.compile(r"loss[^.]* is \{\{ \$value \}\} \(the loss itself")}

    def test_every_annotation_says_what_value_is_as_its_expression_computes_it(self):
        """Where an alert shows ``{{ $value }}``, its words fit what the expression returns: milliseconds for a wait
        or compute time, a count for a count of lines, the loss itself for the spike; never "times the threshold"
        (a filter returns the left operand, not a ratio)."""
        shown = 0
        for a in lib.alerts:
            text = f"{a.summary} {a.description}"
            assert "times the threshold" not in text and "x the threshold" not in text, a.alert
            if "$value" not in text:
                continue
            shown += 1
            meaning = _value_meaning(a)
            assert meaning in self.WORDS and self.WORDS[meaning].search(text), (a.alert, meaning, text)
        assert shown >= 5

    def test_the_value_check_catches_a_wrong_text(self):
        """The check is real: the old loss-spike text (the loss called a multiple of the threshold) fails it."""
        spike = next(a for a in lib.alerts if a.alert == "JobtraceLossSpike")
        assert _value_meaning(spike) == "loss"
        assert not self.WORDS["loss"].search("Largest loss in the last 2 minutes: {{ $value }} times the threshold.")
        straggler = next(a for a in lib.alerts if a.alert == "JobtraceStraggler")
        assert _value_meaning(straggler) == "ms" and not self.WORDS["ms"].search("{{ $value }}x the mean")

    def test_vmalert_forms_share_only_texts_whose_value_they_compute_alike(self):
        """vmalert's ``stats`` result is the alert's value there: an alert with a LogsQL form shows ``$value`` only
        when that result means the same (one result, milliseconds or a count)."""
        for a in lib.alerts:
            if a.logsql is None or "$value" not in f"{a.summary} {a.description}":
                continue
            results = re.findall(r"\bas (\w+)", a.logsql_expr().split("| stats", 1)[1].split("| filter")[0])
            assert len(results) == 1, (a.alert, results)
            assert {"ms": "max(attrs.op_age_ms)", "count": "count()"}[_value_meaning(a)] in a.logsql_expr(), a.alert


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
        """Panels, queries and annotations use ``${datasource}``, a variable of type datasource over Loki;
        ``__inputs`` names the one data source Grafana's import asks for, and the variable's default is it;
        provisioned, the variable falls back to the provisioned Loki. No data-source uid is pinned anywhere."""
        ds = yaml.safe_load((loki.ASSETS / "grafana" / "provisioning" / "datasources" / "jobtrace.yaml").read_text())
        provisioned = {d["type"] for d in ds["datasources"]}
        pinned = {d["uid"] for d in ds["datasources"]}
        for uid, d in _dashboards().items():
            variables = {v["name"]: v for v in d["templating"]["list"]}
            var, metrics = variables["datasource"], variables["metrics"]
            assert var["type"] == metrics["type"] == "datasource" and "loki" in provisioned
            assert (var["query"], metrics["query"]) == ("loki", "prometheus")
            (inp,) = d["__inputs"]  # the Prometheus rank list is optional: the import does not ask for it
            assert inp["type"] == "datasource" and inp["pluginId"] == "loki"
            assert var["current"]["value"] == "${" + inp["name"] + "}" and "current" not in metrics
            used = {p["datasource"]["uid"] for p in d["panels"]} | {t["datasource"]["uid"] for p in d["panels"]
                                                                      for t in p["targets"]}
            used |= {a["datasource"]["uid"] for a in d["annotations"]["list"]}
            used |= {v["datasource"]["uid"] for v in d["templating"]["list"] if "datasource" in v and v["name"] != "rank"}
            assert used == {"${datasource}"}, uid
            assert variables["rank"]["datasource"] == METRICS_DS
            assert not pinned & set(re.findall(r'"uid": "([^"]+)"', json.dumps(d))), uid


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
