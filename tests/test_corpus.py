"""The real-log corpus (``tests/corpus``) is what its README promises: every excerpt has its
provenance and an expected verdict in the shared vocabulary, and nothing in it is a secret.

The verdicts themselves are scored by ``benchmarks/bench_verdicts.py`` (issue 19); this file
keeps the corpus usable as evidence: an excerpt without a source, or a verdict with a kind the
analysis does not know, would make the figures meaningless.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "corpus"
KINDS = {
    "cuda_oom", "host_oom", "collective_timeout", "collective_mismatch", "hang", "hardware_fault", "nccl_error",
    "process_exit", "python_exception", "nan_loss", "loss_spike", "divergence", "grad_explosion", "overflow_cascade",
    "loss_scale_collapse", "throughput_drop", "slow_rank", "slow_node", "data_wait", "memory_leak",
}
SOURCE = re.compile(r"^(https://github\.com/[\w.-]+/[\w.-]+/(issues|pull|discussions|blob)/\S+"
                    r"|[\w.-]+/[\w.-]+@[0-9a-f]{7,40}:\S+)$")
# Token shapes that must never be committed (a real log that carried one was skipped, not masked).
SECRET = re.compile(rb"(hf_[A-Za-z0-9]{30,}|ghp_[A-Za-z0-9]{30,}|AKIA[0-9A-Z]{16}|xox[bp]-[A-Za-z0-9-]{20,}"
                    rb"|-----BEGIN [A-Z ]*PRIVATE KEY-----)")

METAS = sorted(CORPUS.glob("*/*.json"))


def test_the_corpus_is_there():
    assert len(METAS) >= 150, f"{len(METAS)} excerpts; issue 19 asks for at least 150"
    assert not [p for p in CORPUS.glob("*/*.log") if not p.with_suffix(".json").exists()], "a .log without its .json"


@pytest.mark.parametrize("meta", METAS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_excerpt_has_provenance_and_a_verdict(meta: Path):
    d = json.loads(meta.read_text())
    log = meta.with_suffix(".log")
    text = log.read_bytes()
    assert text.strip(), "empty excerpt"
    assert SOURCE.match(d["source"]), d["source"]
    assert d.get("where") and d.get("retrieved")
    assert isinstance(d["healthy"], bool)
    findings = d.get("findings") or []
    if d["healthy"]:
        assert not findings, "a healthy excerpt with findings"
    else:
        assert findings, "a problem without a finding"
    for f in findings + (d.get("consequences") or []):
        assert f["kind"] in KINDS, f["kind"]
        ranks = f.get("ranks")
        assert ranks is None or all(r is None or (isinstance(r, int) and r >= 0) for r in ranks), ranks
    assert not SECRET.search(text), "a token-like string in the excerpt"


def test_sources_are_not_repeated():
    seen: dict[tuple[str, str], str] = {}
    for meta in METAS:
        d = json.loads(meta.read_text())
        key = (d["source"], d["where"])
        assert key not in seen, f"{meta.stem} repeats {seen[key]}"
        seen[key] = meta.stem


# --- the verdicts (issue 19): every excerpt's expected verdict, through ingest and trace-job's analysis -------------
KNOWN_WRONG_FILE = CORPUS / "known_wrong.txt"


def _known_wrong() -> dict[str, str]:
    """``family/slug  why`` per line: the excerpts the analysis still gets wrong, each with what it says instead."""
    out = {}
    for line in KNOWN_WRONG_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            slug, _, why = line.partition(" ")
            out[slug] = why.strip()
    return out


KNOWN_WRONG = _known_wrong()


def _verdict_params():
    for meta in METAS:
        slug = f"{meta.parent.name}/{meta.stem}"
        marks = [pytest.mark.xfail(strict=True, reason=f"issue 19, still wrong: {KNOWN_WRONG[slug]}")] \
            if slug in KNOWN_WRONG else []
        yield pytest.param(meta, id=slug, marks=marks)


@pytest.mark.parametrize("meta", list(_verdict_params()))
def test_the_verdict_on_a_real_log_is_the_expected_one(meta: Path, tmp_path: Path):
    """Scored as ``benchmarks/bench_verdicts.py`` scores it (one rule for both): a healthy excerpt gets no
    error or warning; any other gets a finding of its root cause's kind naming its ranks. A known-wrong
    excerpt is a strict xfail: the day the analysis gets it right, this fails until the list says so."""
    from benchmarks.bench_verdicts import score, verdict

    expected = json.loads(meta.read_text())
    findings, outcome = verdict(meta.with_suffix(".log"), "v", tmp_path)
    assert findings is not None, outcome
    assert score(expected, findings, outcome), [(f.kind, f.severity, f.ranks, f.summary[:100]) for f in findings]


def test_the_known_wrong_list_names_only_excerpts_that_exist():
    slugs = {f"{m.parent.name}/{m.stem}" for m in METAS}
    assert set(KNOWN_WRONG) <= slugs, set(KNOWN_WRONG) - slugs
