"""``load_job``'s table of backends: each name has a loader, a server's loader is imported only when used."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from jobtrace.errors import ConfigError
from jobtrace.synth import SynthJob, write_job
from queries import BACKENDS, TimeRange, load_job
from queries._backends import LOADERS

SERVER_MODULES = ("queries._loki", "queries._victorialogs", "queries._elasticsearch")


def test_the_backends_are_the_loaders_table_in_its_order():
    assert BACKENDS == ("local", "loki", "victorialogs", "elasticsearch", "archive") == tuple(LOADERS)


def test_an_unknown_backend_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown backend 'nope'; choose one of local, loki, victorialogs, elasticsearch, archive"):
        load_job("nope", "j")


def test_a_server_loader_gets_the_url_the_range_and_its_own_options(monkeypatch):
    import queries._elasticsearch
    import queries._loki
    import queries._victorialogs

    calls = []
    rng = TimeRange.parse("2h", None)
    for module, name in ((queries._loki, "load_loki"), (queries._victorialogs, "load_victorialogs"),
                         (queries._elasticsearch, "load_elasticsearch")):
        monkeypatch.setattr(module, name, lambda job_id, name=name, **kw: calls.append((name, job_id, kw)) or name)
    assert load_job("loki", "j", url="http://l", time_range=rng, limit=5) == "load_loki"
    assert load_job("victorialogs", "j", data_dir="ignored", url="http://v", parallel=2) == "load_victorialogs"
    assert load_job("elasticsearch", "j", time_range=rng, namespace="ns") == "load_elasticsearch"
    (_, _, loki), (_, _, vl), (_, _, es) = calls
    assert loki == {"url": "http://l", "time_range": rng, "limit": 5}
    assert es == {"url": None, "time_range": rng, "namespace": "ns"}
    assert set(vl) == {"url", "time_range", "parallel"}
    week = vl["time_range"]  # no range given: the last seven days
    assert isinstance(week, TimeRange) and abs((week.end_ns - week.start_ns) - 7 * 86400 * 10**9) < 10**9


def test_the_embedded_store_takes_the_data_dir_and_ignores_server_options(tmp_path):
    write_job(tmp_path, SynthJob(job_id="loaders", ranks=2, steps=3))
    job = load_job("local", "loaders", data_dir=str(tmp_path), url="http://unused", limit=1)
    assert job.job_id == "loaders" and job.con.execute("SELECT count(DISTINCT rank) FROM events").fetchone() == (2,)


def test_reading_the_embedded_store_imports_no_server_loader(tmp_path):
    write_job(tmp_path, SynthJob(job_id="lazy", ranks=1, steps=2))
    code = textwrap.dedent(f"""
        import sys
        from queries import load_job
        load_job("local", "lazy", data_dir={str(tmp_path)!r})
        print(sorted(m for m in {SERVER_MODULES!r} if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
