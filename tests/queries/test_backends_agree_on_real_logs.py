"""The same verdicts on real logs (tests/corpus) from the embedded store, VictoriaLogs and OpenSearch.

Each excerpt is ingested three times, as a user would (``jobtrace ingest --backend …``), and analysed from
each place it went. The failure, hang and health rules read log text, attributes and metrics: a backend
that loses or retypes any of them (a JSON attribute read back as text, a metric without a step, an exit
summary's fields) changes the verdict.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobtrace.cli import main
from queries import TimeRange, analyze, load_job, load_local

pytestmark = pytest.mark.servers

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
EXCERPTS = [  # one or two per kind of verdict
    "collective_timeout/axolotl-1670-rank1-allgather-300s",
    "collective_timeout/axolotl-1495-qwen-moe-rank7-numel-differs",
    "exit/mmseg-3106-three-ranks-sigabrt-root-rank0",
    "hardware/deepspeed-4648-watchdog-cuda-unknown-error-rank0",
    "hang/deim-105-heartbeat-ranks-1-0-2-rank0-fewer-works",
    "hang/horovod-1442-stall-inspector-rank4",  # four byte-identical lines: ids told apart by time (ns)
    "nccl/nccl-tests-208-named-symbol-not-found",
    "health/hf-deepspeed-overflow-cascade-loss-scale-to-2",
    "health/apex-overflow-cascade-to-half",
    "health/xtuner-mmengine-grad-norm-nan",
    "health/bigscience-tr8-104B-exp2-loss-rise",
    "healthy/bigscience-meg-gpt2-n8-pp8-iterations-validation",
]
ALL_TIME = TimeRange(0, 2**62)  # the excerpts are stamped from 2019 on; lines of a job without stamps get the file's time


def _verdicts(report) -> list[tuple[str, str, list[int]]]:
    return sorted((f.kind, f.severity, f.ranks) for f in report.findings)


@pytest.mark.parametrize("excerpt", EXCERPTS)
def test_each_backend_reaches_the_same_verdict(excerpt, tmp_path, victorialogs, opensearch):
    log = tmp_path / "in" / "console.log"  # a neutral name: ingest reads a rank from names like rank3.log
    log.parent.mkdir()
    shutil.copyfile(CORPUS / f"{excerpt}.log", log)
    job = f"real-{uuid.uuid4().hex[:10]}"
    for backend, url in (("local", None), ("victorialogs", victorialogs.url), ("elasticsearch", opensearch.url)):
        args = ["ingest", str(log), "--job", job, "--backend", backend, "--data-dir", str(tmp_path / "d")]
        res = CliRunner().invoke(main, args + (["--url", url] if url else []))
        assert res.exit_code == 0, res.output
    victorialogs.force_flush()
    here = load_local(tmp_path / "d", job)
    want = _verdicts(analyze(here))
    for backend, url in (("victorialogs", victorialogs.url), ("elasticsearch", opensearch.url)):
        there = load_job(backend, job, url=url, time_range=ALL_TIME)
        assert there.stats.events == here.stats.events, backend
        assert _verdicts(analyze(there)) == want, backend
