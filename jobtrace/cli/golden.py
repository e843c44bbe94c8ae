"""``jobtrace golden add|list|show|remove``: the library of known-good runs that ``trace-job --golden``
chooses from (and ``--compare-to NAME`` names directly).

``jobtrace golden JOB`` (the form before the library) still adds JOB.
"""

from __future__ import annotations

import datetime
from typing import Any

import click

from jobtrace import config

from .exitcodes import Command, Group
from .options import job_id_argument

__all__ = ["golden"]

_DATA_DIR = click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
_GOLDEN_DIR = click.option("--golden-dir", default=None, help="Where the library is kept (default <data-dir>/.golden).")


def _where(f: Any) -> Any:
    """``--backend``/``--url``: the library on an Elasticsearch/OpenSearch cluster (its ``jobtrace-golden`` index)
    or on Loki (one stream), where the jobs are; ``--data-dir``/``--golden-dir``: the folder beside the store."""
    f = _GOLDEN_DIR(f)
    f = click.option("--url", default=None, help="The server's URL (default JOBTRACE_ES_URL / JOBTRACE_LOKI_URL).")(f)
    f = click.option("--backend", type=click.Choice(["local", "elasticsearch", "loki"]), default="local",
                     show_default=True, envvar=config.BACKEND,
                     help="Where the library is kept: beside the store, or on the server the jobs ship to.")(f)
    return _DATA_DIR(f)


def _library(backend: str, url: str | None, data_dir: str, golden_dir: str | None) -> Any:
    from queries import open_library

    return open_library(backend, url=url, data_dir=data_dir, directory=golden_dir)


class _Library(Group):
    """A group whose unknown first word is a job id to add (``jobtrace golden JOB``, as before)."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["add", *args]
        return super().resolve_command(ctx, args)


@click.group(cls=_Library, context_settings={"help_option_names": ["-h", "--help"]})
def golden() -> None:
    """The library of known-good runs: add, list, show, remove.

    \b
    Examples:
      jobtrace golden add run-41 --tag llama-7b --tag nightly
      jobtrace golden list
      trace-job run-42 --golden     # the nearest entries, by shape and profile
      trace-job run-42 --golden --gate 6 --max-step-time-regression-pct 5

    Exit status: 0 done, 1 refused (add: the job's report has problems; --force keeps it), 2 usage
    error, 3 error (job or entry not found), 4 internal error (rerun with --debug).
    """


@golden.command("add", cls=Command)
@job_id_argument
@_where
@click.option("--since", default=None, help="With a server: start of the job's time range (default 7d).")
@click.option("--until", default=None, help="With a server: end of the job's time range (default now).")
@click.option("--name", default=None, help="Name of the entry (default: the job id).")
@click.option("--tag", "tags", multiple=True, help="A label to find it by (repeatable).")
@click.option("--force", is_flag=True, help="Keep the job even though its own report found problems.")
def add(job_id: str, data_dir: str, backend: str, url: str | None, golden_dir: str | None, since: str | None,
        until: str | None, name: str | None, tags: tuple[str, ...], force: bool) -> None:
    """Add the finished job JOB_ID to the library (its features only: series, log templates, shape).
    With --backend elasticsearch or loki the job is read from the server and the entry kept there.

    \b
    Examples:
      jobtrace golden add run-41 --tag llama-7b --tag nightly
      jobtrace golden add run-41 --name baseline-8xH100 --force
      jobtrace golden add run-41 --backend loki --url http://loki:3100

    Exit status: 0 added, 1 refused (the job's report has error or warning findings, named in the
    message; --force keeps it), 2 usage error, 3 error (job not found), 4 internal error.
    """
    from queries import TimeRange, load_job, mark_golden

    job = None
    if backend != "local":
        job = load_job(backend, job_id, data_dir=data_dir, url=url, time_range=TimeRange.parse(since, until),
                       whole=True)
    library = _library(backend, url, data_dir, golden_dir)
    where, _ = mark_golden(job_id, data_dir, name, force=force, tags=list(tags), job=job, library=library)  # Refused: 1
    click.echo(f"golden run {name or job_id} added: {where}")


@golden.command("list", cls=Command)
@_where
@click.option("--json", "as_json", is_flag=True)
def list_command(data_dir: str, backend: str, url: str | None, golden_dir: str | None, as_json: bool) -> None:
    """The library's entries: name, job, shape, steps, tags, when added.

    \b
    Examples:
      jobtrace golden list
      jobtrace golden list --json | jq -r '.[].name'
      jobtrace golden list --backend loki --url http://loki:3100

    Exit status: 0 listed, 2 usage error, 3 error (library unreadable), 4 internal error (rerun with --debug).
    """
    import orjson

    library = _library(backend, url, data_dir, golden_dir)
    where = library.where
    entries = library.load_all(library.names())
    if as_json:
        click.echo(orjson.dumps([_summary(e) for e in entries], option=orjson.OPT_INDENT_2).decode())
        return
    if not entries:
        click.echo(f"no golden runs in {where}")
        return
    for e in entries:
        d = _summary(e)
        click.echo(f"{d['name']}  job {d['job_id']}  {d['ranks']} rank(s) on {d['nodes']} node(s)  {d['steps']} steps"
                   f"  median step {d['median_step_ms']} ms  added {d['added']}"
                   + (f"  tags {','.join(d['tags'])}" if d["tags"] else ""))


@golden.command("show", cls=Command)
@click.argument("name")
@_where
def show(name: str, data_dir: str, backend: str, url: str | None, golden_dir: str | None) -> None:
    """One entry, as JSON: its summary and its log templates (most frequent first).

    \b
    Examples:
      jobtrace golden show run-41
      jobtrace golden show baseline-8xH100 | jq '.templates[:5]'

    Exit status: 0 shown, 2 usage error, 3 error (no such entry), 4 internal error (rerun with --debug).
    """
    import orjson

    e = _library(backend, url, data_dir, golden_dir).load(name)
    templates = sorted(((e.patterns or {}).get("templates") or {}).items(), key=lambda kv: -kv[1]["count"])
    out = {**_summary(e), "series": sorted(e.series), "templates": [
        {"template": t, "count": v["count"], "level": v["level"], "ranks": v["ranks"]} for t, v in templates]}
    click.echo(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


@golden.command("remove", cls=Command)
@click.argument("name")
@_where
def remove(name: str, data_dir: str, backend: str, url: str | None, golden_dir: str | None) -> None:
    """Take an entry out of the library.

    \b
    Examples:
      jobtrace golden remove run-41
      jobtrace golden remove run-41 --backend elasticsearch --url https://es:9200

    Exit status: 0 removed, 2 usage error, 3 error (no entry by that name), 4 internal error (rerun with --debug).
    """
    click.echo(f"golden run {name} removed: {_library(backend, url, data_dir, golden_dir).remove(name)}")


def _summary(e: Any) -> dict[str, Any]:
    added = datetime.datetime.fromtimestamp(e.created, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    med = e.median("step_ms")
    return {"name": e.name, "job_id": e.job_id, "ranks": e.shape.get("ranks"), "nodes": e.shape.get("nodes"),
            "world": e.shape.get("world"), "steps": len(e.steps),
            "median_step_ms": None if med is None else round(med, 3), "tags": e.tags, "added": added,
            "templates": len((e.patterns or {}).get("templates") or {}),
            **{k: e.shape[k] for k in ("model", "config_hash", "versions") if e.shape.get(k)}}
