"""The same shipper into VictoriaLogs' Elasticsearch bulk endpoint (a real VictoriaLogs)."""

from __future__ import annotations

import json

from tests.elasticsearch.conftest import ship, synth_lines


def test_the_bulk_shipper_feeds_victorialogs_with_time_and_message_fields(victorialogs, tmp_path):
    """``…/insert/elasticsearch`` is recognised: no templates, ``_time_field=@timestamp``, ``_msg_field=message``."""
    _, lines = synth_lines(tmp_path, job_id="es-into-vl", ranks=2, steps=4)
    shipper = ship(victorialogs.es_base_url, lines, tmp_path / "spool")
    assert "victorialogs" == shipper.setup_transport.cluster.flavour
    assert 0 == shipper.stats.rejected
    rows = victorialogs.query('jobtrace.job:="es-into-vl" | stats count() as n')
    assert str(len(lines)) == rows[0]["n"]
    logs = victorialogs.query('jobtrace.job:="es-into-vl" AND jobtrace.kind:=log | sort by (_time) limit 1')
    first_log = next(json.loads(x) for x in lines if b'"kind":"log"' in x)
    assert first_log["msg"] == logs[0]["_msg"]
    assert logs[0]["_time"].startswith("2026-01-01T00:00:00")
