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

__all__ = ["golden"]

_DATA_DIR = click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True)
_GOLDEN_DIR = click.option("--golden-dir", default=None, help="Where the library is kept (default <data-dir>/.golden).")


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
      trace-job run-42 --golden          # the nearest entries, chosen by shape and profile
      trace-job run-42 --golden --gate 6 --max-step-time-regression-pct 5

    Exit status: 0 done, 1 refused (add: the job's report has problems; --force keeps it), 2 usage
    error, 3 error (job or entry not found), 4 internal error (rerun with --debug).
    """


@golden.command("add", cls=Command)
@click.argument("job_id")
@_DATA_DIR
@click.option("--name", default=None, help="Name of the entry (default: the job id).")
@click.option("--tag", "tags", multiple=True, help="A label to find it by (repeatable).")
@_GOLDEN_DIR
@click.option("--force", is_flag=True, help="Keep the job even though its own report found problems.")
def add(job_id: str, data_dir: str, name: str | None, tags: tuple[str, ...], golden_dir: str | None,
        force: bool) -> None:
    """Add the finished job JOB_ID to the library (its features only: series, log templates, shape).

    Exit status: 0 added, 1 refused (the job's report has error or warning findings, named in the
    message; --force keeps it), 2 usage error, 3 error (job not found), 4 internal error.
    """
    from queries import mark_golden

    path, _ = mark_golden(job_id, data_dir, name, golden_dir, force=force, tags=list(tags))  # Refused: exit 1
    click.echo(f"golden run {name or job_id} added: {path}")


@golden.command("list", cls=Command)
@_DATA_DIR
@_GOLDEN_DIR
@click.option("--json", "as_json", is_flag=True)
def list_command(data_dir: str, golden_dir: str | None, as_json: bool) -> None:
    """The library's entries: name, job, shape, steps, tags, when added."""
    import orjson

    from queries import golden_dir as default_dir
    from queries import list_golden, load_golden

    where = golden_dir or default_dir(data_dir)
    entries = [load_golden(where, n) for n in list_golden(where)]
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
@_DATA_DIR
@_GOLDEN_DIR
def show(name: str, data_dir: str, golden_dir: str | None) -> None:
    """One entry: its summary and its log templates (most frequent first)."""
    import orjson

    from queries import golden_dir as default_dir
    from queries import load_golden

    e = load_golden(golden_dir or default_dir(data_dir), name)
    templates = sorted(((e.patterns or {}).get("templates") or {}).items(), key=lambda kv: -kv[1]["count"])
    out = {**_summary(e), "series": sorted(e.series), "templates": [
        {"template": t, "count": v["count"], "level": v["level"], "ranks": v["ranks"]} for t, v in templates]}
    click.echo(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


@golden.command("remove", cls=Command)
@click.argument("name")
@_DATA_DIR
@_GOLDEN_DIR
def remove(name: str, data_dir: str, golden_dir: str | None) -> None:
    """Take an entry out of the library (exit 3 if there is none by that name)."""
    from queries import golden_dir as default_dir
    from queries import remove_golden

    click.echo(f"golden run {name} removed: {remove_golden(golden_dir or default_dir(data_dir), name)}")


def _summary(e: Any) -> dict[str, Any]:
    added = datetime.datetime.fromtimestamp(e.created, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    med = e.median("step_ms")
    return {"name": e.name, "job_id": e.job_id, "ranks": e.shape.get("ranks"), "nodes": e.shape.get("nodes"),
            "world": e.shape.get("world"), "steps": len(e.steps),
            "median_step_ms": None if med is None else round(med, 3), "tags": e.tags, "added": added,
            "templates": len((e.patterns or {}).get("templates") or {})}
