"""The Elasticsearch-flavour code path: the ``elasticsearch`` client, ILM, ``/_pit``, compat media types.

No Elasticsearch runs here; :mod:`tests.elasticsearch.es_shim` answers the parts of its
API that differ from OpenSearch in their documented formats (and validates ILM bodies),
while indexing, templates, data streams and search are done for real by the OpenSearch
node behind it. So everything but ILM *executing* (rollover, deletion) is exercised.
"""

from __future__ import annotations

import pytest

from jobtrace.http import HttpConfig
from kibana._setup import Retention, run_setup
from queries import analyze, load_local
from queries._elasticsearch import load_elasticsearch
from tests.elasticsearch.conftest import (
    all_time,
    report_without_source,
    ship,
    synth_lines,
)
from tests.elasticsearch.es_shim import EsShim


def test_setup_goes_through_the_elasticsearch_client_with_ilm(es_shim):
    """ILM policies with the asked retention, attached by index.lifecycle.name in each index template."""
    report = run_setup(HttpConfig(es_shim.url), retention=Retention(logs=5, metrics=400))
    assert "Elasticsearch 8.15.3" == report.cluster and report.ok, report.warnings
    assert {"jobtrace-logs", "jobtrace-metrics", "jobtrace-traces"} <= set(es_shim.ilm)
    assert "5d" == es_shim.ilm["jobtrace-logs"]["policy"]["phases"]["delete"]["min_age"]
    assert "400d" == es_shim.ilm["jobtrace-metrics"]["policy"]["phases"]["delete"]["min_age"]
    assert {f"jobtrace-{t}": f"jobtrace-{t}" for t in ("logs", "metrics", "traces")}.items() <= \
        es_shim.lifecycle_settings.items()
    assert "jobtrace-logs" == es_shim.lifecycle_settings["/logs-jobtrace-*/_settings"]  # existing data too
    puts = [ct for method, _, ct in es_shim.requests if method == "PUT"]
    assert puts and all("compatible-with=8" in ct for ct in puts)
    again = run_setup(HttpConfig(es_shim.url), retention=Retention(logs=5, metrics=400))
    assert "ILM policy jobtrace-logs" in again.unchanged


def test_the_clients_typed_api_would_send_its_own_major_which_elasticsearch_8_refuses(es_shim):
    """Why setup and queries use perform_request with the server's compat major (elasticsearch-py#2923)."""
    import elasticsearch
    from elasticsearch import BadRequestError, Elasticsearch

    if not elasticsearch.__versionstr__.startswith("9"):
        pytest.skip(reason="only a 9.x client sends compatible-with=9")
    client = Elasticsearch(es_shim.url)
    with pytest.raises(BadRequestError, match="media_type_header_exception"):
        client.indices.get_index_template(name="jobtrace-logs")
    client.close()


def test_ship_and_trace_a_job_through_elasticsearch(es_shim, namespace, tmp_path):
    """Shipper (ES flavour detected) → data streams; trace-job with /_pit + search_after → same report."""
    data, lines = synth_lines(tmp_path, job_id="es-flavour-job", ranks=6, steps=20, ranks_per_node=3,
                              slow_ranks={4: 2.0}, nan_step=15)
    shipper = ship(es_shim.url, lines, tmp_path / "spool", namespace=namespace)
    assert "elasticsearch" == shipper.setup_transport.cluster.flavour
    assert 0 == shipper.stats.rejected
    es = analyze(load_elasticsearch("es-flavour-job", url=es_shim.url, time_range=all_time(), page_size=300))
    local = analyze(load_local(data, "es-flavour-job"))
    assert report_without_source(local) == report_without_source(es)
    assert {"slow_rank", "nan_loss"} <= {f.kind for f in es.findings}
    paths = [(m, p.split("?")[0]) for m, p, _ in es_shim.requests]
    assert ("POST", "/logs-jobtrace-*,metrics-jobtrace-*,traces-jobtrace-*/_pit") in paths
    assert ("DELETE", "/_pit") in paths
    assert sum(1 for m, p in paths if (m, p) == ("POST", "/_search")) >= len(lines) // 300
    assert es_shim.shard_doc_searches >= len(lines) // 300  # paged by _shard_doc, as on Elasticsearch


def test_serverless_gets_data_stream_lifecycle_instead_of_ilm(opensearch):
    shim = EsShim(opensearch.url, version="8.11.0", serverless=True).start()
    try:
        report = run_setup(HttpConfig(shim.url), retention=Retention(logs=3, metrics=90))
        assert "Elasticsearch Serverless 8.11.0" == report.cluster
        assert {} == shim.ilm
        assert {"data_retention": "3d"} == shim.lifecycle_settings["jobtrace-logs"]
        assert {"data_retention": "90d"} == shim.lifecycle_settings["jobtrace-metrics"]
        assert not any("/_ilm/" in p for _, p, _ in shim.requests)
    finally:
        shim.stop()
