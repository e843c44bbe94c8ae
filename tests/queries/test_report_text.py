"""The text report reads as English at any width (issue 25, part 3).

Every finding template is rendered with singular, plural, zero and infinite values and read by rules
that catch what the issue saw ("on 4 rank(s)", "ranks 0" for one rank, "(infx; …)", "last finished step
'step'", a logger shown as "None"); the rules are first shown to catch those very phrases. Real reports
(synthetic jobs, the real-log corpus) are rendered at 60, 80 and 120 columns and piped: figures that add
up, steps counted consistently, log text shown literally, the same line from many ranks folded into one.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import math
import re
import shutil
import types
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from jobtrace.cli import trace_job
from jobtrace.synth import SynthJob, write_job
from queries import analyze, load_local, print_report
from queries._text import TEMPLATES, fold

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus"
FINDING_MODULES = ("_failures", "_golden", "_hang", "_health", "_patterns", "_straggler")
for name in FINDING_MODULES:  # registers their templates
    importlib.import_module(f"queries.{name}")


@pytest.fixture(autouse=True)
def no_terminal_size(monkeypatch):
    """Piped means 80 columns here, whatever COLUMNS the test run inherited (rich reads it)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


# --- the rules ---------------------------------------------------------------------------------------------

NOUNS = r"(?:rank|step|node|value|record|collective|window|line|skip|member|byte|run|work|finding|time)"
ADJ = r"(?:(?:long|such|non-finite|I/O-bound|fp16 overflow|outstanding|golden|more) )?"
COUNT = r"(?<![\w.,#=–-])"
RULES: dict[str, re.Pattern[str]] = {
    "a '(s)' plural": re.compile(r"\w\(s\)"),
    "one, then a plural noun": re.compile(rf"{COUNT}1 {ADJ}{NOUNS}s\b"),
    "a plural count, then a singular noun": re.compile(rf"{COUNT}(?:0|[2-9]|[1-9]\d+|\d{{1,3}}(?:,\d{{3}})+) "
                                                       rf"{ADJ}{NOUNS}\b(?!s|-| ms| s\b)"),
    "'ranks' or 'steps' before one number": re.compile(r"\b(?:ranks|steps) \d+(?![\d,–-])"),
    "a range of one ('steps 5–5')": re.compile(r"\b(\d+)[–-]\1\b(?![\d.])"),
    "Python's inf or nan": re.compile(r"(?<![A-Za-z])-?(?:inf|nan)(?![a-wyz_])"),  # "infx" too
    "None shown": re.compile(r"\bNone\b"),
    "a name quoted after itself ('step 'step'')": re.compile(r"\b(\w+) '\1'"),
    "an empty node": re.compile(r"\bon node(?: [,;:)(]|$| ?\()"),
    "two blanks": re.compile(r"\S  +\S"),
    "a blank before punctuation": re.compile(r" [,.;:)]"),
    "an empty or opened bracket": re.compile(r"\(\s*\)|\( "),
    "doubled punctuation": re.compile(r"[,;:]\s*[,;:]|(?<!\.)\.\.(?!\.)"),
    "one rank, a plural verb": re.compile(r"\brank \d+ (?:wait|call|spend|differ|arrive)\b"),
    "many ranks, a singular verb": re.compile(r"\branks [\d,-]+ (?:waits|calls|spends|differs|arrives)\b"),
    "'every rank spend'": re.compile(r"\bevery rank spend\b"),
    "an article before a vowel": re.compile(r"\ba (?:error|info)\b"),
    "no rank, a plural verb": re.compile(r"\bno rank (?:all )?(?:wait|call|spend|differ|arrive)\b"),
}


def broken(text: str) -> list[str]:
    """The rules ``text`` breaks, each with what it matched."""
    return [f"{rule}: {m.group(0)!r}" for rule, rx in RULES.items() if (m := rx.search(text))]


class TestTheRules:
    @pytest.mark.parametrize("phrase", [
        "from step 10 on ranks 0 (77 non-finite values in all, on 4 rank(s))",
        "(infx; band up to 1.0 ms)",
        "rank 1 stalled for 30s: last finished step 'step'",
        "last log: INFO None: hello",
        "slow in 1 of 1 windows",
        "2 step over the median",
        "rank 3 on node : slow",
        "over steps 5–5",
        "every rank spend 40% of the step",
        "a error the golden runs never logged",
        "ranks 0-2 waits in all_reduce",
        "loss spike at step 5: 2.1, nanx the recent median",
    ])
    def test_the_rules_catch_the_phrases_the_issue_saw(self, phrase):
        """Each broken phrase (from issue 25, or of its kind) breaks at least one rule: the rules can fail."""
        assert broken(phrase)

    @pytest.mark.parametrize("phrase", [
        "rank 0 (77 non-finite values in all, on 1 rank)",
        "ranks 0-3,5 wait in all_reduce #12 (group default); never joined: rank 4",
        "2.50× the median rank over steps 0–29 (190.8 ms vs 95.9 ms per step)",
        "a one-off stall at step 5, 1.20 s over its median",
        "an error the golden runs never logged (1 line on 1 rank, first at step 3)",
    ])
    def test_the_rules_pass_good_english(self, phrase):
        """Correct phrases break no rule (the rules are not so wide that everything fails)."""
        assert [] == broken(phrase)


# --- every template at its edges ---------------------------------------------------------------------------

INF, NAN = math.inf, math.nan
#: per case, a value for each type; "big" stands in for infinity where a type has none
VALUES: dict[object, dict[str, object]] = {
    int: {"zero": 0, "one": 1, "many": 2, "inf": 123_456, "nan": 7},
    float: {"zero": 0.0, "one": 1.0, "many": 2.5, "inf": INF, "nan": NAN},
    bool: {"zero": False, "one": True, "many": False, "inf": True, "nan": False},
    list[int]: {"zero": [], "one": [3], "many": [0, 1, 2, 5], "inf": list(range(1000)), "nan": [7, 9]},
    list[str]: {"zero": [], "one": ["a"], "many": ["a", "b"], "inf": [f"r{i}" for i in range(50)], "nan": ["b"]},
    dict[int, str]: {"zero": {}, "one": {3: "all_gather #5"}, "many": {3: "all_gather #5", 4: "broadcast #5"},
                     "inf": {i: "all_gather #5" for i in range(100)}, "nan": {1: "x"}},
}
#: free-text parameters that real callers leave empty (the others always say something)
MAY_BE_EMPTY = {"_failures._say_failure": {"what", "note"}, "_failures._say_never_arrived": {"at", "doing"},
                "_hang._say_stalled": {"wave"}}
#: what real callers pass as free text, where a placeholder would not read as the sentence does
SAMPLES = {"what": ": RuntimeError: CUDA error", "at": " in ALLREDUCE SeqNum 5", "level": "warning",
           "limit": "band up to", "got": "12.0 ms", "want": "6.0 ms", "band": "7.5 ms", "name": "step_ms",
           "label": "host RSS", "op": "all_reduce", "title": "NCCL error", "phase": "forward", "cat": "phase",
           "last_cat": "step", "span": "forward", "last_span": "step", "rule": "stays", "worst": "rank 3 (2.1: step_ms)",
           "msg": "NaN or Inf found in input tensor", "example": "NCCL WARN Call to connect returned Connection refused"}
CASES = ("zero", "one", "many", "inf", "nan")


def _values(template: str, name: str, hint: object) -> dict[str, object]:
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = True, args[0]
    if hint is str:
        vals: dict[str, object] = {c: SAMPLES.get(name, f"{name}-text") for c in CASES}
        if name in MAY_BE_EMPTY.get(template, ()):
            vals["zero"] = ""
    else:
        vals = dict(VALUES[hint])
    if optional:
        vals["none"] = None
    return vals


def calls(name: str) -> list[dict[str, object]]:
    """Every parameter at one case at a time (zero, one, many, infinite, NaN), then each parameter through all
    its values while the others are plural: the edges of each figure, alone and together."""
    fn = TEMPLATES[name]
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters)
    table = {p: _values(name, p, hints[p]) for p in params}
    out = [{p: table[p][c] for p in params} for c in CASES]
    for p in params:
        for v in table[p].values():
            out.append({q: (v if q == p else table[q]["many"]) for q in params})
    return out


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_template_reads_right_with_singular_plural_zero_and_infinite_values(name):
    """No template breaks a rule for any of its values."""
    fn = TEMPLATES[name]
    bad = []
    for kwargs in calls(name):
        text = fn(**kwargs)
        assert isinstance(text, str) and text.strip()
        if problems := broken(text):
            bad.append((kwargs, text, problems))
    assert not bad, bad[:3]


def test_the_templates_cover_every_finding_module():
    """Each module that words findings registers templates (an import that stopped registering would pass)."""
    assert {n.split(".")[0] for n in TEMPLATES} >= set(FINDING_MODULES)


def _summary_arg(call: ast.Call) -> ast.expr | None:
    if len(call.args) >= 3:
        return call.args[2]
    return next((k.value for k in call.keywords if k.arg == "summary"), None)


@pytest.mark.parametrize("module", FINDING_MODULES)
def test_every_finding_summary_comes_from_a_registered_template(module):
    """Every ``Finding(…)`` in the modules takes its summary from a ``_say_*`` template (or a variable set from
    one): a summary written inline would escape the test above."""
    tree = ast.parse((ROOT / "queries" / f"{module}.py").read_text())
    registered = {n.split(".", 1)[1] for n in TEMPLATES if n.startswith(module + ".")}
    found = 0
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        assigned = {t.id: node.value for node in ast.walk(fn) if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            if not (isinstance(call.func, ast.Name) and call.func.id == "Finding"):
                continue
            arg = _summary_arg(call)
            if isinstance(arg, ast.Name):
                arg = assigned.get(arg.id)
            assert isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name), (module, fn.name, ast.dump(call)[:200])
            assert arg.func.id in registered, (module, fn.name, arg.func.id)
            found += 1
    assert found, f"no Finding in {module}"


# --- real reports ------------------------------------------------------------------------------------------


def render(report, width: int | None) -> str:
    """What a user sees: a terminal ``width`` wide, or piped (``None``: a file, no terminal, no colour)."""
    out = io.StringIO()
    console = (Console(file=out, width=width, color_system=None, legacy_windows=False) if width
               else Console(file=out, color_system=None))
    print_report(report, console)
    return out.getvalue()


def unwrapped(text: str) -> str:
    """The report's text with the box drawing gone and wrapped lines joined, for rules that read phrases."""
    lines = [re.sub(r"[│╭╮╰╯─┃┏┓┗┛━┡┩╇┳┻┣┫╋└┘├┤┼┬┴]", " ", line).strip() for line in text.splitlines()]
    return re.sub(r"\s+", " ", " ".join(lines))


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """A job with many faults at once (slow ranks, a stall, a data-loader wait, a leak, NaN loss), on two nodes."""
    d = tmp_path_factory.mktemp("faults")
    write_job(d, SynthJob(job_id="many", ranks=8, ranks_per_node=4, steps=60, slow_ranks={5: 2.0},
                          stalls={2: (30, 1.5)}, data_wait_ms={6: 80.0}, leaks={3: (10, 8.0)}, nan_step=50))
    write_job(d, SynthJob(job_id="hung", ranks=4, steps=20, hang_rank=2, hang_step=9))
    return d, analyze(load_local(d, "many")), analyze(load_local(d, "hung"))


WIDTHS = [60, 80, 120, None]


@pytest.mark.parametrize("width", WIDTHS, ids=lambda w: f"{w or 'piped'}")
class TestRealReports:
    def test_no_line_is_wider_than_the_terminal_and_no_word_is_cut(self, faults, width):
        """Every line fits; no "…" anywhere in the tables; every column header is a whole column name."""
        _, *reports = faults
        limit = width or 80
        for report in reports:
            text = render(report, width)
            assert max(len(line) for line in text.splitlines()) <= limit
            tables = text[text.index("per rank ("):]
            assert "…" not in tables
            for header in (line for line in tables.splitlines() if line.startswith("┃")):
                cells = [c.strip() for c in header.strip("┃").split("┃")]
                known = {"rank", "status", "step ms", "compute ms", "collective ms", "node", "score", "last step",
                         "data ms", "last arr.", "steps", "ranks", "flagged ranks", "last arrivals"}
                assert set(cells) <= known, cells

    def test_the_findings_read_as_english(self, faults, width):
        """The rules hold on every summary of real jobs, and on the rendered report as a whole."""
        _, *reports = faults
        for report in reports:
            for f in report.findings:
                assert [] == broken(f.summary), f.summary
            text = render(report, width)
            panel = unwrapped(text[text.index(" findings "):text.index("per rank (")])
            problems = [p for p in broken(panel) if not p.startswith(("two blanks", "a blank before"))]
            assert [] == problems, panel

    def test_the_score_and_last_arrival_columns_are_explained_where_shown(self, faults, width):
        """A column the table shows has its legend (the ms columns: medians that need not add up); one it
        dropped is named as not shown."""
        _, report, _ = faults
        text = render(report, width)
        flat = unwrapped(text)
        header = next(line for line in text.splitlines() if line.startswith("┃") and "rank" in line)
        for column, legend in (("compute ms", "ms columns: each its own median over the steps, so they need not add up"),
                               ("score", "score: the fastest rank's median compute time"),
                               ("last arr.", "last arr.: collectives this rank arrived at last")):
            if column in header:
                assert legend in flat
            else:
                assert column in flat.split("not shown at this width:", 1)[1]


def shares_of(text: str) -> dict[str, int]:
    row = unwrapped(text).split("time shares", 1)[1].split(" of step time", 1)[0]
    return {k: int(v) for k, v in re.findall(r"([a-z]+) (\d+)%", row)}


def test_time_shares_add_up_and_idle_is_not_added_in(faults):
    """The shares the report states sum to 100 %; the issue's job (53 + 44 + 3 and 29 % idle, 129 % in all)
    now says the idle time overlaps them rather than listing it as a fourth share."""
    _, report, _ = faults
    assert sum(shares_of(render(report, 80)).values()) == 100
    b = dict(report.breakdown, compute_share=0.5349, comm_share=0.4351, data_share=0.03, idle_share=0.29)
    text = render(dataclasses.replace(report, breakdown=b), 120)
    got = shares_of(text)
    assert set(got) == {"compute", "communication", "data"} and sum(got.values()) == 100
    assert "29% of it outside any phase span (part of the above, not added)" in unwrapped(text)
    thirds = dict(report.breakdown, compute_share=1 / 3, comm_share=1 / 3, data_share=1 / 3, idle_share=None)
    assert sum(shares_of(render(dataclasses.replace(report, breakdown=thirds), 120)).values()) == 100  # not 99


def test_the_steps_line_says_why_the_per_rank_counts_are_one_short(faults):
    """"steps 60 (0–59)" beside a per-rank steps column of 59 says the medians leave out the warm-up step."""
    _, report, _ = faults
    text = render(report, 160)
    counted = max(r.steps for r in report.per_rank)
    assert report.steps == 60 and counted == 59
    flat = unwrapped(text)
    assert "steps 60 (0–59); the per-rank medians leave out the first step (warm-up)" in flat
    assert "steps: the steps in this rank's medians (the first step of the job, the warm-up, left out)" in flat


def test_piped_output_is_plain_80_columns(faults):
    """Through the CLI into a pipe: 80 columns, no escape codes, nothing cut."""
    d, _, _ = faults
    res = CliRunner().invoke(trace_job, ["many", "--data-dir", str(d)])
    assert res.exit_code == 1
    assert "\x1b" not in res.output and max(len(line) for line in res.output.splitlines()) <= 80
    assert "…" not in res.output[res.output.index("per rank ("):]


# --- log text: literal, and folded -------------------------------------------------------------------------


def ingest(tmp_path: Path, job: str, *logs: Path | str) -> object:
    from ingest import IngestConfig, Ingestor, open_sink

    paths = []
    for i, log in enumerate(logs):
        path = tmp_path / f"{job}-input" / f"console{i}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(log, Path):
            shutil.copyfile(log, path)
        else:
            path.write_text(log)
        paths.append(str(path))
    Ingestor(IngestConfig(job=job), open_sink("local", job, data_dir=tmp_path)).run(paths)
    return analyze(load_local(tmp_path, job))


def test_log_text_is_shown_literally_never_as_markup_or_terminal_codes(tmp_path):
    """A log line with rich markup and terminal escapes prints as written: "[bold]" stays, ESC is spelled out."""
    lines = "".join(
        f"[rank{r}]:Traceback (most recent call last):\n"
        f"[rank{r}]:  File \"/w/train.py\", line 9, in <module>\n"
        f"[rank{r}]:RuntimeError: [bold red]boom[/bold red] \x1b]0;pwned\x07 [link=http://x]y[/link]\n"
        for r in range(4))
    report = ingest(tmp_path, "esc", lines)
    text = render(report, 120)
    assert "[bold red]boom[/bold red]" in text and "[link=http://x]y[/link]" in text
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]0;pwned\\x07" in text


def test_a_log_record_without_a_logger_shows_none_and_its_markup_literally(tmp_path):
    """A hung rank's last logs, written without a logger (as plain console lines are) and with markup and an
    escape in their text: "last log: INFO: …", never "INFO None:", the text as written."""
    write_job(tmp_path, SynthJob(job_id="nolog", ranks=4, steps=20, hang_rank=2, hang_step=9))
    for path in (tmp_path / "nolog").glob("*.jsonl"):
        text = path.read_text().replace(',"logger":"train"', "")
        path.write_text(re.sub(r'"msg":"step (\d+) loss', r'"msg":"step \1 [bold]loss[/bold] \\u001b[2J', text))
    report = analyze(load_local(tmp_path, "nolog"))
    stalled = next(f for f in report.findings if f.kind == "stalled_rank")
    logs = [e for e in stalled.evidence if e.startswith("last log")]
    assert logs and all(e.startswith("last log: INFO: step ") for e in logs), logs
    text = render(report, 120)
    assert "None" not in text and "[bold]loss[/bold] \\x1b[2J" in text and "\x1b" not in text


def test_the_same_error_from_many_ranks_is_one_line(tmp_path):
    """Four ranks printing one traceback give one evidence line naming ranks 0-3, not four copies."""
    lines = "".join(f"[rank{r}]:RuntimeError: NCCL error in: ../nccl.cpp:1, unhandled system error\n" for r in range(4))
    report = ingest(tmp_path, "fold", lines)
    text = unwrapped(render(report, 120))
    assert text.count("unhandled system error") <= 2  # the summary's and one folded evidence line
    assert "ranks 0-3: RuntimeError: NCCL error in" in text


@pytest.mark.parametrize("slug", ["collective_timeout/nccl-1111-megatron-reduce-scatter-ranks64-67",
                                  "collective_timeout/ace-348-perlmutter-ranks123-allreduce"])
def test_watchdog_lines_of_a_real_log_fold_into_one(tmp_path, slug):
    """Real watchdog timeouts (one per rank, their durations differing) fold into one line with the range."""
    report = ingest(tmp_path, "wd", CORPUS / f"{slug}.log")
    timeout = next(f for f in report.findings if f.kind == "collective_timeout")
    folded = [e for e in timeout.evidence if "Watchdog caught collective operation timeout" in e]
    assert len(folded) == 1, timeout.evidence
    ranks = timeout.ranks
    assert folded[0].startswith(f"ranks {ranks[0]}-{ranks[-1]}: ") and "[Rank" not in folded[0]
    assert re.search(r"ran for \d+–\d+ milliseconds", folded[0])


@pytest.mark.parametrize("slug", ["collective_timeout/megatron-1142-second-iteration-allreduce",
                                  "nccl/nccl-795-aws-broken-pipe-proxy-rank9",
                                  "collective_timeout/ace-348-perlmutter-ranks123-allreduce"])
def test_findings_of_real_logs_break_no_rule(tmp_path, slug):
    """Real published logs (a desync whose watchdog lines name no numel, an NCCL error of rank 9 and unknown
    ranks) give summaries that break no rule; the log's own text, quoted in them, is left as written."""
    report = ingest(tmp_path, "real", CORPUS / f"{slug}.log")
    assert report.findings
    for f in report.findings:
        ours = f.summary.replace(" : ", ": ")  # NCCL's own "failed : Broken pipe", quoted as the log wrote it
        assert [] == broken(ours), f.summary


class TestFold:
    def test_one_rank_keeps_its_line_and_says_rank(self):
        """A line from one rank reads "rank 3: …", never "ranks 3: …"."""
        assert ["rank 3: NCCL WARN Net : Broken pipe"] == fold([(3, "NCCL WARN Net : Broken pipe")])

    def test_lines_that_differ_in_more_than_numbers_stay_apart(self):
        """Different messages are not folded, and beyond the limit the rest is counted."""
        lines = [(r, f"error {chr(97 + r)}") for r in range(7)]
        out = fold(lines, limit=5)
        assert len(out) == 6 and out[-1] == "and 2 more lines unlike these"

    def test_a_traceback_keeps_its_lines(self):
        """Folding joins blanks within a line, never the lines of a multi-line record, nor its indentation."""
        tb = "Traceback (most recent call last):\n  File \"train.py\", line 9\nRuntimeError: x"
        assert [f"ranks 0-1: {tb}"] == fold([(0, tb), (1, tb.replace("line 9", "line  9"))])

    def test_unknown_ranks_fold_without_a_rank_list(self):
        """Lines whose rank is unknown fold too, and claim no rank."""
        assert ["NCCL WARN x"] == fold([(None, "NCCL WARN x"), (None, "NCCL WARN x")])


# --- the demo's banner -------------------------------------------------------------------------------------


class TestDemoBanner:
    @pytest.mark.parametrize(("change", "words"), [
        ({"nan_step": 10}, "NaN loss on rank 0 from step 10"),
        ({"slow_ranks": [1]}, "rank 1 slow by 40 ms a step"),
        ({"slow_ranks": [1, 3]}, "ranks 1, 3 slow"),
        ({"hang_rank": 2}, "rank 2 hangs at step 8"),
        ({"stall_rank": 1}, "rank 1 stalls 1.5 s at step 5"),
        ({"data_ranks": [0]}, "rank 0 waits 30 ms a step for data"),
        ({"data_ranks": [0, 1]}, "ranks 0, 1 wait 30 ms"),
        ({"mismatch_rank": 3}, "rank 3 calls another collective at step 5"),
        ({"leak_ranks": [2]}, "rank 2 leaks 16 MB a step from step 4"),
        ({"regress_step": 12}, "every rank's backward 25 ms slower from step 12"),
        ({"noise_step": 6}, "noisier labels from step 6"),
    ])
    def test_every_injected_fault_is_named_never_no_fault(self, change, words):
        """Each fault the demo can inject is said in its banner; "no fault" only when none is set."""
        from jobtrace.demo import DemoConfig

        said = DemoConfig(job_id="d", **change).faults()
        assert words in said and "no fault" not in said

    def test_a_job_without_faults_says_so(self):
        """The healthy demo says "no fault"; two faults are both said."""
        from jobtrace.demo import DemoConfig

        assert "no fault" == DemoConfig(job_id="d").faults()
        assert DemoConfig(job_id="d", nan_step=3, hang_rank=1).faults() == "rank 1 hangs at step 8; NaN loss on rank 0 from step 3"


# --- a real torch job --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    """A real DDP job (torchrun, gloo) with a slow rank and NaN loss from step 10: the kind of job whose time
    shares the issue saw add up to 129 %."""
    pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")
    from jobtrace.demo import DemoConfig, run_job

    d = tmp_path_factory.mktemp("ddp")
    run_job(DemoConfig(job_id="ddp", data_dir=str(d), ranks=4, steps=20, slow_ranks=[2], nan_step=10, wrap="ddp"))
    return analyze(load_local(d, "ddp"))


@pytest.mark.torchjob
@pytest.mark.parametrize("width", WIDTHS, ids=lambda w: f"{w or 'piped'}")
def test_a_real_ddp_report_fits_adds_up_and_reads_right(ddp_job, width):
    """At every width: nothing cut or too wide, shares that sum to 100 %, findings that break no rule."""
    assert {"slow_rank", "nan_loss"} <= {f.kind for f in ddp_job.findings}
    text = render(ddp_job, width)
    assert max(len(line) for line in text.splitlines()) <= (width or 80)
    assert "…" not in text[text.index("per rank ("):]
    assert sum(shares_of(text).values()) == 100
    panel = unwrapped(text[text.index(" findings "):text.index("per rank (")])
    assert [] == [p for p in broken(panel) if not p.startswith(("two blanks", "a blank before"))], panel
