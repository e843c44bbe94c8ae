"""The report at 60, 80 and 120 columns and piped (80, no colour): no header or value cut mid-word, no line
wider than the terminal, the less wanted columns dropped first and named, the terms explained."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner
from rich.console import Console

from jobtrace.cli import trace_job
from jobtrace.synth import SynthJob, write_job
from queries import analyze, load_local, print_report


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("render")
    write_job(d, SynthJob(job_id="wide", ranks=8, ranks_per_node=4, steps=40, slow_ranks={5: 2.0}))
    return d, analyze(load_local(d, "wide"))


def render(report, width: int) -> str:
    out = io.StringIO()
    print_report(report, Console(file=out, width=width, color_system=None, legacy_windows=False))
    return out.getvalue()


def table_lines(text: str) -> list[str]:
    start = text.index("per rank (")
    return text[start:].splitlines()


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_rank_table_fits_and_cuts_nothing(report, width):
    _, rep = report
    text = render(rep, width)
    assert all(len(line) <= width for line in text.splitlines()), max(text.splitlines(), key=len)
    rows = table_lines(text)
    assert "…" not in "\n".join(rows)
    header = next(line for line in rows if "rank" in line and "status" in line)
    assert "step ms" in header and "compute ms" in header  # the most wanted columns stay whole
    slow = next(line for line in rows if line.strip("│┃ ").startswith("5 "))
    assert "slow" in slow


def test_columns_drop_by_priority_and_the_report_says_which(report):
    _, rep = report
    narrow, wide = render(rep, 60), render(rep, 120)
    assert "not shown at this width:" in narrow and "not shown at this width" not in wide
    dropped = narrow.split("not shown at this width:", 1)[1].split("(")[0].replace("\n", " ")
    assert "steps" in dropped and "rank" not in dropped.split(",")[0]  # the least wanted go first
    assert "score: the fastest rank's median compute time ÷ this rank's" in wide  # compute: what the score divides
    assert "last arr.: collectives this rank arrived at last" in wide


def test_piped_output_is_80_columns_without_cuts(report):
    d, _ = report
    res = CliRunner().invoke(trace_job, ["wide", "--data-dir", str(d)], terminal_width=80)
    assert res.exit_code == 1
    assert "…" not in "\n".join(table_lines(res.output))
    assert all(len(line) <= 80 for line in res.output.splitlines())
