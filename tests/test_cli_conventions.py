"""The command line's conventions (issue 25, part 4): a versioned, documented `--json`; `jobs` with a state;
one `--backend` spelling; written files named on stderr; examples in every `--help`; completion of job ids."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click
import jsonschema
import orjson
import pytest
from click.shell_completion import ShellComplete
from click.testing import CliRunner

from jobtrace.cli import main, trace_job
from jobtrace.cli.options import BACKENDS
from jobtrace.synth import SynthJob, write_job
from tests.layering import ROOT

SCHEMAS = ROOT / "docs" / "schema"

FAULTY = {
    "straggler-nan": SynthJob(job_id="straggler-nan", ranks=4, steps=30, slow_ranks={2: 2.0}, nan_step=12,
                              leaks={1: (5, 40.0)}),
    "hang": SynthJob(job_id="hang", ranks=4, steps=30, hang_rank=3, hang_step=10),
    "mismatch": SynthJob(job_id="mismatch", ranks=4, steps=30, mismatch_rank=1, mismatch_step=5, stalls={0: (8, 2.0)},
                         data_wait_ms={3: 60.0}),
    "regression": SynthJob(job_id="regression", ranks=8, steps=40, ranks_per_node=4, regress_step=15,
                           slow_from={1: (10, 2.0)}),
    "healthy": SynthJob(job_id="healthy", ranks=4, steps=20),
}
"""Real jobs (the synthetic generator's events, as ranks write them) with every fault it can inject."""

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.3 GiB total capacity)"


def run(cmd, *args, **kw):
    return CliRunner().invoke(cmd, [str(a) for a in args], **kw)


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))


def validator(name: str) -> jsonschema.Draft202012Validator:
    s = schema(name)
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s, format_checker=jsonschema.FormatChecker())


def add_failure(data_dir: Path, job_id: str, rank: int, msg: str) -> None:
    """Append an ERROR log line to ``rank``'s file, as a rank that crashes writes before it exits."""
    [path] = sorted((data_dir / job_id).glob(f"*.r{rank}.p*.jsonl"))
    last = orjson.loads(path.read_bytes().splitlines()[-1])
    line = {k: last[k] for k in ("job", "trace_id", "rank", "local_rank", "world", "node", "pid", "v")}
    line |= {"ts": last["ts"] + 1_000_000, "kind": "log", "level": "ERROR", "logger": "train", "msg": msg}
    with path.open("ab") as fh:
        fh.write(orjson.dumps(line) + b"\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    data = tmp_path_factory.mktemp("store")
    for job in FAULTY.values():
        write_job(data, job)
    write_job(data, SynthJob(job_id="crashed", ranks=4, steps=20))
    add_failure(data, "crashed", 2, OOM)
    return data


@pytest.fixture(scope="module")
def reports(store):
    """Each job's `trace-job --json` output, analysed through the command line."""
    out = {}
    for job_id in [*FAULTY, "crashed"]:
        res = run(trace_job, job_id, "--data-dir", store, "--json")
        assert res.exit_code in (0, 1), res.output
        out[job_id] = json.loads(res.stdout)
    return out


class TestReportJson:
    def test_every_report_validates_against_the_published_schema(self, reports):
        """The JSON of jobs with every fault the generator injects meets docs/schema/report.schema.json."""
        v = validator("report")
        for job_id, doc in reports.items():
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]
            assert [] == errors, job_id

    def test_the_reports_exercise_the_schema(self, reports):
        """The jobs above give findings of many kinds, cited events and every severity, so the validation means something."""
        kinds = {f["kind"] for d in reports.values() for f in d["findings"]}
        assert {"slow_rank", "nan_loss", "stalled_rank", "collective_mismatch", "memory_leak"} <= kinds
        assert any(f["refs"] for d in reports.values() for f in d["findings"])
        assert {"error", "warning"} <= {f["severity"] for d in reports.values() for f in d["findings"]}
        assert reports["healthy"]["healthy"] is True and reports["hang"]["healthy"] is False

    def test_the_schema_version_is_the_schemas(self, reports):
        assert {schema("report")["properties"]["schema_version"]["const"]} == {d["schema_version"] for d in reports.values()}

    def test_every_timestamp_says_its_unit(self, reports):
        """Any epoch-sized integer in the report sits under a key naming nanoseconds (``_ns``)."""
        unnamed = []

        def walk(value, key):
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(v, str(k))
            elif isinstance(value, list):
                for v in value:
                    walk(v, key)
            elif isinstance(value, int) and not isinstance(value, bool) and value > 10**17 and not key.endswith("_ns"):
                unnamed.append(key)

        for doc in reports.values():
            walk(doc, "")
        assert [] == unnamed

    def test_the_timestamps_are_the_jobs(self, reports):
        """t_min_ns/t_max_ns bracket the generator's clock, and every cited event lies between them."""
        t0 = FAULTY["hang"].t0_ns
        for job_id, d in reports.items():
            assert t0 <= d["t_min_ns"] < t0 + 10**9 and d["t_min_ns"] < d["t_max_ns"], job_id
            for f in d["findings"]:
                for ref in f["refs"]:
                    assert d["t_min_ns"] <= ref["ts_ns"] <= d["t_max_ns"], (job_id, f["kind"])
                if f["time_range_ns"]:
                    lo, hi = f["time_range_ns"]
                    assert d["t_min_ns"] <= lo <= hi <= d["t_max_ns"], (job_id, f["kind"])

    @pytest.mark.parametrize("tamper", [
        lambda d: d.update(t_min=d.pop("t_min_ns")),                      # the old, unit-less name
        lambda d: d.pop("schema_version"),
        lambda d: d.update(schema_version=2),
        lambda d: d["per_rank"][0].update(status="sleepy"),
        lambda d: d["findings"][0].update(severity="fatal"),
        lambda d: d["findings"][0]["refs"][0].update(ts="then"),
        lambda d: d.update(undocumented=1),
    ])
    def test_the_schema_rejects_a_report_that_departs_from_it(self, reports, tamper):
        doc = json.loads(json.dumps(reports["straggler-nan"]))
        tamper(doc)
        assert not validator("report").is_valid(doc)


@pytest.fixture(scope="module")
def listing(store):
    res = run(main, "jobs", "--data-dir", store, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


class TestJobs:

    def test_jobs_json_validates_against_its_schema(self, listing):
        errors = [e.message for e in validator("jobs").iter_errors(listing)]
        assert [] == errors
        assert listing["schema_version"] == schema("jobs")["properties"]["schema_version"]["const"]

    def test_each_job_has_its_times_ranks_and_state(self, listing):
        """Fresh files: running, unless trace-job finds a hang (hung) or a rank's own failure (failed)."""
        by_id = {j["job_id"]: j for j in listing["jobs"]}
        assert sorted(by_id) == sorted([*FAULTY, "crashed"])
        assert "hung" == by_id["hang"]["state"] and "3" in by_id["hang"]["reason"]
        assert "failed" == by_id["crashed"]["state"] and "2" in by_id["crashed"]["reason"]
        assert "running" == by_id["healthy"]["state"]
        assert 8 == by_id["regression"]["ranks"] and 2 == by_id["regression"]["nodes"]
        assert 40 == by_id["regression"]["steps"]
        for job in by_id.values():
            assert FAULTY["hang"].t0_ns <= job["first_ns"] < job["last_ns"]
            assert job["first"].startswith("2026-01-01T00:00:00") and job["first"].endswith("Z")

    def test_settled_files_make_a_job_finished(self, store):
        """Once the files have been quiet longer than JOBTRACE_CACHE_SETTLED_S, a job that did not hang or fail is finished."""
        res = run(main, "jobs", "--data-dir", store, "--json", env={"JOBTRACE_CACHE_SETTLED_S": "0"})
        states = {j["job_id"]: j["state"] for j in json.loads(res.stdout)["jobs"]}
        assert {"healthy": "finished", "hang": "hung", "crashed": "failed"}.items() <= states.items()
        assert "finished" == states["straggler-nan"]

    def test_the_table_shows_each_job_on_one_line(self, store):
        res = run(main, "jobs", "--data-dir", store, "--format", "table")
        header, *lines = res.stdout.splitlines()
        assert header.split()[:5] == ["JOB", "STATE", "RANKS", "STEPS", "FIRST"]
        rows = {line.split()[0]: line.split() for line in lines}
        assert ["hang", "hung", "4", "10"] == rows["hang"][:4]
        assert ["crashed", "failed", "4", "20"] == rows["crashed"][:4]
        assert "2026-01-01" == rows["hang"][4]

    def test_piped_without_a_format_it_prints_the_names_alone(self, store):
        """As ls does: scripts that read one job id a line keep working."""
        assert sorted([*FAULTY, "crashed"]) == run(main, "jobs", "--data-dir", store).stdout.split()

    def test_an_unreadable_job_is_listed_as_unknown(self, tmp_path):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "n.r0.p1.jsonl").write_text("{torn\n")
        res = run(main, "jobs", "--data-dir", tmp_path, "--json")
        doc = json.loads(res.stdout)
        assert validator("jobs").is_valid(doc)
        assert [("empty", "unknown")] == [(j["job_id"], j["state"]) for j in doc["jobs"]]
        assert "no readable rank events (lines skipped: 0 torn, 1 corrupt)" in doc["jobs"][0]["reason"]


def _commands():
    """Every command, with the words that run it: ``("jobtrace", "golden", "add")``."""
    out = [(("trace-job",), trace_job)]

    def walk(cmd, path):
        out.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name))

    walk(main, ("jobtrace",))
    return out


def _option_names(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params if isinstance(p, click.Option) and not p.hidden for o in (*p.opts, *p.secondary_opts)}


class TestBackendOption:
    def _backend_choices(self):
        for path, cmd in _commands():
            for p in cmd.params:
                if isinstance(p, click.Option) and "--backend" in p.opts:
                    yield path, tuple(p.type.choices)

    def test_every_backend_name_is_one_of_the_names(self):
        """Every command spells the backends alike: the names trace-job reads (queries.BACKENDS)."""
        import queries

        assert tuple(queries.BACKENDS) == BACKENDS
        seen = dict(self._backend_choices())
        assert {"trace-job", "jobtrace trace", "jobtrace ingest", "jobtrace export", "jobtrace replay",
                "jobtrace watch", "jobtrace golden add"} <= {" ".join(p) for p in seen}
        assert {} == {p: c for p, c in seen.items() if not set(c) <= set(BACKENDS)}

    def test_victorialogs_is_accepted_wherever_a_server_is(self):
        """Reading, following, ingesting, exporting and replaying all take victorialogs (the golden library lives
        only where it can be stored: the folder, Elasticsearch or Loki)."""
        for path, choices in self._backend_choices():
            if "golden" not in path:
                assert "victorialogs" in choices, path

    @pytest.mark.parametrize("argv,new", [
        (("export", "nope", "--to", "loki", "--url", "http://127.0.0.1:9", "--data-dir", "{tmp}"), "--backend"),
        (("ingest", "{tmp}/none.log", "--job", "j", "--to", "local", "--data-dir", "{tmp}"), "--backend"),
        (("archive", "nope", "--to", "s3://bucket/prefix", "--data-dir", "{tmp}"), "--url"),
    ])
    def test_the_old_to_still_works_and_warns_on_stderr(self, tmp_path, argv, new):
        res = run(main, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
        assert f"warning: --to is deprecated (it still works, for now): use {new}" in res.stderr
        assert res.exit_code == 3, res.stderr  # understood: it fails later, on the missing job or file

    def test_the_old_to_is_hidden_from_help(self):
        for name in ("export", "replay", "ingest", "archive"):
            assert "--to" not in run(main, name, "--help").stdout, name

    def test_the_command_line_beats_the_variable_in_either_spelling(self, tmp_path):
        """JOBTRACE_BACKEND=loki, `--to local`: the command line wins, as with `--backend local`."""
        log = tmp_path / "a.log"
        log.write_text("2026-01-05 12:00:00,250 - INFO - __main__ - step 1 loss 1.5\n")
        for spelling in ("--to", "--backend"):
            res = run(main, "ingest", log, "--job", f"j{spelling}", spelling, "local", "--data-dir", tmp_path / "d",
                      "-q", env={"JOBTRACE_BACKEND": "loki"})
            assert res.exit_code == 0, res.output
        assert (tmp_path / "d" / "j--to").is_dir() and (tmp_path / "d" / "j--backend").is_dir()

    def test_archive_url_is_required(self, tmp_path):
        res = run(main, "archive", "x", "--data-dir", tmp_path)
        assert res.exit_code == 2 and "Missing option '--url'" in res.stderr


class TestWrittenFiles:
    def test_timeline_and_perfetto_are_named_on_stderr(self, store, tmp_path, monkeypatch):
        """Each file written is named on stderr with its absolute path; stdout stays the JSON report alone."""
        monkeypatch.chdir(tmp_path)
        res = run(trace_job, "hang", "--data-dir", store, "--json", "--timeline", "t.html", "--perfetto", "p.json")
        json.loads(res.stdout)
        named = re.findall(r"^wrote (.+?): (\S+) \(", res.stderr, re.M)
        assert [w for w, _ in named] == ["the timeline", "the Perfetto trace"]
        for _what, path in named:
            assert Path(path).is_absolute() and Path(path).is_file() and Path(path).stat().st_size > 0
        assert {Path(p).name for _, p in named} == {"t.html", "p.json"}


def _example_commands(help_text: str) -> list[list[str]]:
    """The command lines of a help text's Examples section, split as a shell would (comments, pipes and
    ``VAR=value`` prefixes taken off)."""
    lines = help_text.split("Examples:", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ").splitlines()[1:]
    out = []
    for line in lines:
        if "_COMPLETE=" in line:
            continue
        words = shlex.split(line, comments=True)
        for seg in " ".join(shlex.quote(w) for w in words).split(" '|' "):
            argv = shlex.split(seg)
            while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
                argv.pop(0)
            if argv and argv[0] in ("jobtrace", "trace-job"):
                out.append(argv)
    return out


class TestHelp:
    @pytest.mark.parametrize("path,cmd", _commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
    def test_every_help_has_examples_of_that_command(self, path, cmd):
        """Each --help shows an Examples section; its examples run this command, with options it has."""
        args = list(path[1:]) + ["--help"]
        res = run(main if path[0] == "jobtrace" else trace_job, *args)
        assert res.exit_code == 0, res.output
        assert "Examples:" in res.stdout, path
        examples = _example_commands(res.stdout)
        assert examples, path
        same = ("trace-job",) if path == ("jobtrace", "trace") else path  # one command, two names
        mine = [argv for argv in examples if _resolve(argv)[0][:len(same)] == same]  # a group's: its commands'
        assert mine, (path, examples)
        for argv in examples:
            _words, target = _resolve(argv)
            unknown = {w.split("=")[0] for w in argv if w.startswith("--")} - _option_names(target)
            assert set() == unknown, (path, argv)

    def test_the_examples_parse_to_this_command_line(self):
        ex = _example_commands("Examples:\n  A=1 jobtrace jobs --json | jq -r '.x'  # note\n  trace-job a \\\n"
                               "    --json\n\nmore")
        assert [["jobtrace", "jobs", "--json"], ["trace-job", "a", "--json"]] == ex

    @pytest.mark.parametrize("path,cmd", _commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
    def test_every_help_fits_80_columns(self, path, cmd):
        """Examples are not rewrapped by click: each must fit a terminal of 80 columns as written."""
        res = run(main if path[0] == "jobtrace" else trace_job, *path[1:], "--help", terminal_width=80)
        assert [] == [line for line in res.stdout.splitlines() if len(line) > 80]


def _resolve(argv: list[str]) -> tuple[tuple[str, ...], click.Command]:
    """The words naming the command an example runs (``("jobtrace", "golden", "add")``), and that command."""
    if argv[0] == "trace-job":
        return ("trace-job",), trace_job
    cmd: click.Command = main
    words = ["jobtrace"]
    for word in argv[1:]:
        subs = getattr(cmd, "commands", {})
        if word not in subs:
            break
        cmd = subs[word]
        words.append(word)
    return tuple(words), cmd


class TestCompletion:
    def _complete(self, cli, prog, args, incomplete):
        comp = ShellComplete(cli, {}, prog, f"_{prog.replace('-', '_').upper()}_COMPLETE")
        return [c.value for c in comp.get_completions(args, incomplete)]

    def test_job_ids_complete_from_the_data_dir_given(self, store):
        assert ["hang", "healthy"] == self._complete(trace_job, "trace-job", ["--data-dir", str(store)], "h")
        assert ["hang", "healthy"] == self._complete(main, "jobtrace", ["trace", "--data-dir", str(store)], "h")

    @pytest.mark.parametrize("words", [["watch"], ["export"], ["archive"], ["golden", "add"]])
    def test_every_command_taking_a_job_completes_it(self, store, words):
        assert ["crashed"] == self._complete(main, "jobtrace", [*words, "--data-dir", str(store)], "cr")

    def test_the_data_dir_comes_from_the_environment(self, store, monkeypatch):
        monkeypatch.setenv("JOBTRACE_DATA_DIR", str(store))
        assert ["mismatch"] == self._complete(trace_job, "trace-job", [], "mi")

    def test_a_server_backend_completes_nothing(self, store):
        assert [] == self._complete(trace_job, "trace-job", ["--data-dir", str(store), "--backend", "loki"], "h")

    def test_the_documented_bash_line_completes_job_ids_from_the_config_file(self, store, tmp_path, monkeypatch):
        """`_JOBTRACE_COMPLETE=bash_source jobtrace` prints the script; its calls complete job ids, with the
        data dir of the working directory's jobtrace.toml."""
        monkeypatch.chdir(tmp_path)
        (tmp_path / "jobtrace.toml").write_text(f"data_dir = {json.dumps(str(store))}\n")
        source = CliRunner().invoke(main, [], prog_name="jobtrace", env={"_JOBTRACE_COMPLETE": "bash_source"})
        assert "complete -o nosort -F _jobtrace_completion jobtrace" in source.stdout
        res = CliRunner().invoke(main, [], prog_name="jobtrace", env={
            "_JOBTRACE_COMPLETE": "bash_complete", "COMP_WORDS": "jobtrace trace cr", "COMP_CWORD": "2"})
        assert ["plain,crashed"] == res.stdout.split()

    def test_completion_is_documented(self):
        text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
        for shell in ("bash_source", "zsh_source", "fish_source"):
            assert f"_JOBTRACE_COMPLETE={shell} jobtrace" in text
            assert f"_TRACE_JOB_COMPLETE={shell} trace-job" in text
