"""Secrets never reach a sink, on every path an event takes: a traced process, `jobtrace ingest`, `jobtrace export`.

tests/test_redact.py tests the redactor itself; here the real paths run end to end and the test reads
back everything they wrote (JSON lines, Parquet segments, a real VictoriaLogs) for the secrets of
tests/redaction_samples.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobtrace.cli import main
from jobtrace.store import segment_lines
from tests import redaction_samples as s

ROOT = Path(__file__).resolve().parent.parent
SECRETS = [part for _, parts in s.LINES.values() for part in parts]


def _stored(data_dir: Path) -> bytes:
    """Every line the store holds for any job: JSON lines and the lines of each Parquet segment."""
    out = []
    for path in sorted(data_dir.rglob("*")):
        if path.suffix == ".jsonl":
            out.append(path.read_bytes())
        elif path.suffix == ".parquet":
            out.extend(b"".join(batch) for batch in segment_lines(path))
    return b"".join(out)


def _leaked(text: bytes) -> list[str]:
    return [x for x in SECRETS if x.encode() in text]


def _native_built() -> bool:
    import importlib.util

    return importlib.util.find_spec("jobtrace_native") is not None


RECORDERS = [pytest.param("1", id="compiled", marks=pytest.mark.skipif(not _native_built(), reason="jobtrace_native not built")),
             pytest.param("0", id="python")]


@pytest.mark.parametrize("native", RECORDERS)
def test_a_traced_process_stores_no_secret(tmp_path, native):
    """Log records (messages, arguments, `extra` attributes) of a real traced process, both recorders."""
    script = textwrap.dedent(f"""
        import logging, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests import redaction_samples as s
        import otel_instrumentation as oi
        t = oi.init_tracing("redact-proc", data_dir={str(tmp_path)!r}, torch=False, console=False)
        log = logging.getLogger("train")
        log.setLevel(logging.INFO)
        for text, _ in s.LINES.values():
            log.info(text)
        log.info("loaded %s", s.HF)
        log.warning("bad creds", extra={{"password": s.PASSWORD, "hub": "token=" + s.DB_TOKEN}})
        for i, normal in enumerate(s.NORMAL):
            log.info(normal)
        t.shutdown()
    """)
    env = dict(os.environ, JOBTRACE_NATIVE=native, JOBTRACE_REDACT="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    stored = _stored(tmp_path)
    assert b"[REDACTED:" in stored and not _leaked(stored)
    for normal in s.NORMAL:  # what is not secret is stored as it was
        assert json.dumps(normal)[1:-1].encode() in stored, normal


@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_ingest_stores_no_secret(tmp_path, engine):
    """`jobtrace ingest` of a log file holding every kind of secret, in each engine."""
    if engine == "compiled" and not _native_built():
        pytest.skip(reason="jobtrace_native not built")
    log = tmp_path / "train.log"
    lines = []
    for step, (text, _) in enumerate(s.LINES.values()):
        lines.append(f"2026-01-05 12:00:{step:02d},000 - INFO - train - step {step} loss 1.5\n")
        lines += [f"2026-01-05 12:00:{step:02d},500 - INFO - train - {part}\n" for part in text.split("\n")]
    log.write_text("".join(lines))
    res = CliRunner().invoke(main, ["ingest", str(log), "--job", "redact-ingest", "--data-dir", str(tmp_path / "d"),
                                    "--engine", engine])
    assert res.exit_code == 0, res.output
    stored = _stored(tmp_path / "d")
    assert stored.count(b"[REDACTED:") >= len(s.LINES) and not _leaked(stored)
    assert b"step 3 loss 1.5" in stored


@pytest.mark.servers
def test_export_of_an_unredacted_job_sends_no_secret(tmp_path, victorialogs, monkeypatch):
    """A job stored with JOBTRACE_REDACT=0 keeps its secrets locally; `jobtrace export` sends none of them."""
    job = f"redact-exp-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "train.log"
    t0 = time.time() - 600
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0))
    log.write_text("".join(f"{stamp},{i:03d} - INFO - train - {text.splitlines()[0]}\n"
                           for i, (text, _) in enumerate(s.LINES.values())))
    monkeypatch.setenv("JOBTRACE_REDACT", "0")
    res = CliRunner().invoke(main, ["ingest", str(log), "--job", job, "--data-dir", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert s.HF.encode() in _stored(tmp_path / "d")  # kept, as asked
    monkeypatch.setenv("JOBTRACE_REDACT", "1")
    res = CliRunner().invoke(main, ["export", job, "--backend", "victorialogs", "--url", victorialogs.url,
                                    "--data-dir", str(tmp_path / "d"), "--json"])
    assert res.exit_code == 0, res.output
    victorialogs.force_flush()
    rows = victorialogs.query(f'training_job:="{job}"', start=f"{int(t0) - 3600}", end=f"{int(t0) + 3600}", limit="1000")
    text = json.dumps(rows).encode()
    assert len(rows) >= len(s.LINES) - 1 and b"REDACTED:" in text and not _leaked(text)
