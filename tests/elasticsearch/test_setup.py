"""Installing templates, data streams and retention: for real on OpenSearch, by format where it cannot run.

ISM cannot run here: the embedded OpenSearch node has no index-management plugin (it
needs job-scheduler as an extended plugin, which classpath plugins cannot declare), and
the plugin zip is not on Maven Central. So the ISM request bodies are checked against
the documented policy format (opensearch-project/documentation-website
``_im-plugin/ism/policies.md``), the install flow against the documented API answers,
and the missing plugin is detected for real.
"""

from __future__ import annotations

import re
from typing import ClassVar

import orjson
import pytest
import requests
from click.testing import CliRunner

from jobtrace.cli import main
from jobtrace.errors import BackendUnavailable, ConfigError
from jobtrace.http import HttpConfig, RequestsTransport
from kibana._setup import (
    Cluster,
    Retention,
    detect_cluster,
    ilm_policy,
    install,
    ism_policy,
    parse_days,
    parse_root,
    run_setup,
    transport_caller,
)
from tests.elasticsearch.es_shim import validate_ilm

TYPES = ("logs", "metrics", "traces")


def flat_mapping(props, prefix=""):
    out = {}
    for name, spec in props.items():
        path = f"{prefix}{name}"
        if "properties" in spec:
            out.update(flat_mapping(spec["properties"], path + "."))
        if "type" in spec:
            out[path] = spec["type"]
    return out


def event_line(job, ts, **kw):
    ev = {"ts": ts, "job": job, "trace_id": "f" * 32, "rank": 1, "local_rank": 1, "world": 2, "node": "n0",
          "pid": 7, "v": 1, **kw}
    return orjson.dumps(ev) + b"\n"


class TestInstallOnOpenSearch:
    def test_templates_install_and_data_streams_are_created_from_them(self, opensearch, namespace, tmp_path):
        """Index + component templates for real; the first documents create three data streams with our mapping."""
        report = run_setup(HttpConfig(opensearch.url), replicas=0)
        assert report.cluster.startswith("OpenSearch 2.19")
        templates = requests.get(f"{opensearch.url}/_index_template/jobtrace-*", timeout=30).json()["index_templates"]
        by_name = {t["name"]: t["index_template"] for t in templates}
        for t in TYPES:
            tpl = by_name[f"jobtrace-{t}"]
            assert [f"{t}-jobtrace-*"] == tpl["index_patterns"] and 501 == tpl["priority"]
            assert ["jobtrace-mappings", "jobtrace-settings"] == tpl["composed_of"] and "data_stream" in tpl
        from shippers._elasticsearch import ElasticsearchShipper

        lines = [event_line("setup-job", 1_767_225_600_000_000_000, kind="log", level="INFO", logger="x", msg="m"),
                 event_line("setup-job", 1_767_225_600_000_000_001, kind="metric", step=1,
                            metrics={"loss": 1.5, "rss_bytes": 10, "my_metric": 2, "nan_thing": "NaN"}),
                 event_line("setup-job", 1_767_225_600_000_000_002, kind="span", cat="collective", name="all_reduce",
                            start=1_767_225_600_000_000_000, dur=2, step=1,
                            attrs={"op": "all_reduce", "group": "default", "group_size": 2, "seq": 1, "bytes": 8})]
        shipper = ElasticsearchShipper(HttpConfig(opensearch.url), tmp_path / "spool", namespace=namespace)
        shipper.write(lines)
        assert shipper.wait_idle(30)
        shipper.close()
        streams = requests.get(f"{opensearch.url}/_data_stream/*-jobtrace-{namespace}", timeout=30).json()
        assert {f"{t}-jobtrace-{namespace}": f"jobtrace-{t}" for t in TYPES} == \
            {s["name"]: s["template"] for s in streams["data_streams"]}
        mapping = requests.get(f"{opensearch.url}/metrics-jobtrace-{namespace}/_mapping", timeout=30).json()
        fields = flat_mapping(next(iter(mapping.values()))["mappings"]["properties"])
        assert "date_nanos" == fields["@timestamp"]
        assert ("double", "long", "double", "keyword") == (
            fields["jobtrace.metrics.loss"], fields["jobtrace.metrics.rss_bytes"], fields["jobtrace.metrics.my_metric"],
            fields["jobtrace.nonfinite.nan_thing"])
        settings = requests.get(f"{opensearch.url}/logs-jobtrace-{namespace}/_settings", timeout=30).json()
        index_settings = next(iter(settings.values()))["settings"]["index"]
        assert ("0", "best_compression") == (index_settings["number_of_replicas"], index_settings["codec"])

    def test_setup_twice_changes_nothing(self, opensearch):
        run_setup(HttpConfig(opensearch.url), replicas=0)
        again = run_setup(HttpConfig(opensearch.url), replicas=0)
        assert [] == again.installed
        assert 6 == len(again.unchanged)  # 2 component templates, 3 event index templates, the packs' one

    def test_the_missing_ism_plugin_is_detected_and_reported_not_fatal(self, opensearch):
        """The embedded node has no ISM: templates install, retention is reported as not installed."""
        report = run_setup(HttpConfig(opensearch.url))
        assert "not installed" in report.retention
        assert any("Index State Management" in w and "kept until deleted" in w for w in report.warnings)
        result = CliRunner().invoke(main, ["setup", "--url", opensearch.url])
        assert 1 == result.exit_code, result.output
        assert "retention NOT installed" in result.output.replace("\n", " ")

    def test_the_shipper_installs_missing_templates_but_never_overrides_a_policy(self):
        """First-use install is not authoritative: existing policies (an admin's retention) stay."""
        calls = []
        ism = {"jobtrace-logs": {"_seq_no": 3, "_primary_term": 1, "policy": {"description": "admin's 30d"}}}

        def call(method, path, params=None, body=None):
            calls.append((method, path, params))
            name = path.rsplit("/", 1)[-1]
            if path.startswith("/_plugins/_ism/policies/"):
                if method == "GET":
                    return (200, ism[name]) if name in ism else (404, {"error": {"type": "status_exception",
                                                                                 "reason": "Policy not found"}})
                return 201, {"_id": name}
            if method == "GET":
                return 404, {}
            return 200, {"acknowledged": True}

        report = install(call, Cluster("opensearch", "2.19.0"), Retention(), authoritative=False)
        puts = [p for m, p, _ in calls if m == "PUT" and "_ism" in p]
        assert ["/_plugins/_ism/policies/jobtrace-metrics", "/_plugins/_ism/policies/jobtrace-traces"] == puts
        assert "ISM policy jobtrace-logs" in report.unchanged
        assert not any("_ism/add" in p for _, p, _ in calls)  # attaching to old indices is setup's job


class TestIsmPolicyFormat:
    """Bodies checked against the documented ISM policy format (docs: _im-plugin/ism/policies.md)."""

    ROLLOVER: ClassVar = frozenset({"min_size", "min_primary_shard_size", "min_doc_count", "min_index_age",
                                    "copy_alias"})
    CONDITIONS: ClassVar = frozenset({"min_index_age", "min_rollover_age", "min_doc_count", "min_size", "cron"})
    TIME = re.compile(r"^\d+(d|h|m|s|ms|micros|nanos)$")

    @pytest.mark.parametrize("type_,days,rollover", [("logs", 7, 1), ("metrics", 365, 30), ("traces", 7, 1)])
    def test_policy_has_documented_shape_and_the_asked_retention(self, type_, days, rollover):
        body = ism_policy(type_, Retention(logs=7, metrics=365))
        assert {"policy"} == set(body)
        policy = body["policy"]
        assert set(policy) <= {"policy_id", "description", "default_state", "states", "ism_template",
                               "error_notification", "last_updated_time", "schema_version"}
        names = [s["name"] for s in policy["states"]]
        assert policy["default_state"] in names and len(set(names)) == len(names)
        for state in policy["states"]:
            assert {"name", "actions", "transitions"} == set(state)
            for action in state["actions"]:
                (kind, params), = action.items()
                assert kind in ("rollover", "delete")
                if kind == "rollover":
                    assert params and set(params) <= self.ROLLOVER and self.TIME.match(params["min_index_age"])
                else:
                    assert {} == params
            for tr in state["transitions"]:
                assert tr["state_name"] in names and set(tr["conditions"]) <= self.CONDITIONS
        hot, delete = policy["states"]
        assert f"{rollover}d" == hot["actions"][0]["rollover"]["min_index_age"]
        assert f"{days}d" == hot["transitions"][0]["conditions"]["min_rollover_age"]
        assert [{"delete": {}}] == delete["actions"]
        (template,) = policy["ism_template"]
        assert {"index_patterns", "priority"} == set(template)
        pattern = template["index_patterns"][0]
        # ISM matches the pattern against the data stream name of a backing index
        assert re.fullmatch(pattern.replace("*", ".*"), f"{type_}-jobtrace-default")
        assert f"delete {days}d after rollover" in policy["description"]

    def test_an_existing_policy_is_updated_with_seq_no_and_primary_term_then_reattached(self):
        """ISM refuses an update without if_seq_no/if_primary_term; managed indices move with change_policy."""
        calls = []

        def call(method, path, params=None, body=None):
            calls.append((method, path, params, body))
            if method == "GET" and "/_ism/policies/" in path:
                return 200, {"_id": "x", "_seq_no": 7, "_primary_term": 2, "policy": {"description": "old"}}
            if "_ism/add" in path:
                return 200, {"updated_indices": 0, "failures": True,
                             "failed_indices": [{"index_name": ".ds-logs-jobtrace-default-000001",
                                                 "reason": "This index already has a policy"}]}
            if method == "GET":
                return 404, {}
            return 200, {"acknowledged": True}

        install(call, Cluster("opensearch", "2.19.0"), Retention(logs=3))
        puts = [(p, params) for m, p, params, _ in calls if m == "PUT" and "_ism" in p]
        assert all({"if_seq_no": 7, "if_primary_term": 2} == params for _, params in puts) and 3 == len(puts)
        assert ["/_plugins/_ism/change_policy/.ds-logs-jobtrace-*", "/_plugins/_ism/change_policy/.ds-metrics-jobtrace-*",
                "/_plugins/_ism/change_policy/.ds-metrics-jobtrace.rollup-*",  # the packs: kept as the metrics
                "/_plugins/_ism/change_policy/.ds-traces-jobtrace-*"] == \
            [p for m, p, _, _ in calls if "change_policy" in p]


class TestIlmPolicyFormat:
    @pytest.mark.parametrize("type_,days,rollover", [("logs", 7, 1), ("metrics", 365, 30), ("traces", 14, 2)])
    def test_ilm_body_is_valid_and_deletes_after_the_retention(self, type_, days, rollover):
        body = ilm_policy(type_, Retention(logs=7, metrics=365, traces=14))
        assert validate_ilm(body) is None
        phases = body["policy"]["phases"]
        assert f"{days}d" == phases["delete"]["min_age"]
        assert f"{rollover}d" == phases["hot"]["actions"]["rollover"]["max_age"]
        assert "max_size" not in phases["hot"]["actions"]["rollover"]  # deprecated since 9.3

    def test_retention_values_are_read_like_a_person_writes_them(self):
        assert (7, 14, 365, 30) == (parse_days("7d"), parse_days("2w"), parse_days("1y"), parse_days("30"))
        with pytest.raises(ConfigError):
            parse_days("soon")


class TestErrors:
    def test_unsupported_versions_are_named(self):
        es7 = {"version": {"number": "7.17.9", "build_flavor": "default"}, "tagline": "You Know, for Search"}
        with pytest.raises(ConfigError, match="Elasticsearch 7.17.9 .* needs Elasticsearch 8 or 9"):
            parse_root(200, {"X-Elastic-Product": "Elasticsearch"}, es7, "http://es")
        os1 = {"version": {"number": "1.3.14", "distribution": "opensearch"}}
        with pytest.raises(ConfigError, match="OpenSearch 1.3.14 .* 2.4 or newer"):
            parse_root(200, {}, os1, "http://os")
        with pytest.raises(ConfigError, match="neither Elasticsearch nor OpenSearch"):
            parse_root(200, {}, {"version": {"number": "1.0"}}, "http://other")
        assert "elasticsearch" == parse_root(200, {"x-elastic-product": "Elasticsearch"},
                                             {"version": {"number": "9.1.0"}}, "u").flavour

    def test_wrong_credentials_give_a_clear_error_without_the_secret(self, opensearch, fault_proxy, monkeypatch):
        proxy = fault_proxy(opensearch)
        proxy.respond(401, '{"error":"unauthorized"}', headers={"WWW-Authenticate": "Basic"})
        monkeypatch.setenv("JOBTRACE_ES_USERNAME", "trainer")
        monkeypatch.setenv("JOBTRACE_ES_PASSWORD", "s3cr3t-pa55")
        result = CliRunner().invoke(main, ["setup", "--url", proxy.url])
        assert 3 == result.exit_code
        assert "authentication failed" in result.output and "s3cr3t-pa55" not in result.output

    def test_an_unreachable_server_is_an_error_naming_it(self, monkeypatch):
        monkeypatch.setenv("JOBTRACE_ES_PASSWORD", "s3cr3t-pa55")
        result = CliRunner().invoke(main, ["setup", "--url", "http://user:pw-in-url@127.0.0.1:9"])
        assert 3 == result.exit_code and "127.0.0.1:9" in result.output
        assert "s3cr3t-pa55" not in result.output and "pw-in-url" not in result.output

    def test_detection_through_the_raw_transport(self, opensearch):
        cluster = detect_cluster(RequestsTransport(HttpConfig(opensearch.url)), opensearch.url)
        assert ("opensearch", 2) == (cluster.flavour, cluster.major)
        assert "victorialogs" == detect_cluster(None, "http://vl:9428/insert/elasticsearch").flavour  # type: ignore[arg-type]
        with pytest.raises(BackendUnavailable):
            detect_cluster(RequestsTransport(HttpConfig("http://127.0.0.1:9")), "http://127.0.0.1:9")

    def test_transport_caller_speaks_json(self, opensearch):
        call = transport_caller(RequestsTransport(HttpConfig(opensearch.url)), opensearch.url)
        status, body = call("GET", "/_cluster/health", params={"wait_for_status": "yellow"})
        assert 200 == status and body["status"] in ("green", "yellow")
