"""``jobtrace ingest PATH... --job ID``: the command, its progress bar and its closing summary.

``format_summary`` returns the text; ``print_summary`` renders it; the click command
comes last; its errors end in the exit codes of :mod:`jobtrace.cli.exitcodes`.
"""

from __future__ import annotations

import importlib
import signal
from typing import TYPE_CHECKING, Any, Final

import click

from jobtrace import config

from .exitcodes import EXIT_ERROR, EXIT_HEALTHY, Command
from .options import backend_option

if TYPE_CHECKING:
    from rich.console import Console

    from ingest import IngestConfig, Ingestor, IngestSummary, SourceBook

INGEST_TARGETS: Final = ("local", "loki", "victorialogs", "elasticsearch")
"""Where ``--backend`` sends the events: ``ingest.SINK_KINDS``, spelled here so that reading this
command's options does not import the ingest package (a test holds the two equal)."""

__all__ = ["format_summary", "ingest_command", "print_summary"]


def format_summary(s: IngestSummary, to: str = "local", data_dir: str = "jobtrace-data") -> str:
    """The closing summary as plain text: lines, events by type, skips by reason, clocks, streams."""
    engine = ", compiled lane" if s.fast_lane else ""
    rate = f" ({s.lines / s.seconds:,.0f} lines/s{engine})" if s.seconds > 0 else ""
    read = len(s.files) - s.files_skipped
    if s.files and not read and not s.errors:
        return "\n".join([f"nothing new for job {s.job}: every file was ingested before (--replace reads them "
                          "again)", *(f"  note: {n}" for n in s.notes)])
    files = f"{read} file(s)" + (f" ({s.files_skipped} skipped)" if s.files_skipped else "")
    out = [f"ingested job {s.job}: {files}, {s.bytes_read:,} bytes, {s.lines:,} lines in "
           f"{s.seconds:.2f}s{rate}"]
    out.append(f"  lines parsed: {s.parsed:,}   skipped: {s.skipped_total:,}")
    for reason, n in sorted(s.skipped.items(), key=lambda kv: -kv[1]):
        out.append(f"    skipped {n:,}: {reason}")
    events = ", ".join(f"{k} {v:,}" for k, v in sorted(s.events.items()))
    out.append(f"  events: {sum(s.events.values()):,} ({events or 'none'})")
    if s.lines_by_parser:
        out.append("  formats: " + ", ".join(f"{k} {v:,} lines" for k, v in sorted(s.lines_by_parser.items())))
    if s.estimated_ts:
        out.append(f"  timestamps estimated from neighbouring lines (marked est): {s.estimated_ts:,}")
    if s.mtime_ts:
        out.append(f"  of those, from the file's mtime (no stamped line in the job): {s.mtime_ts:,}")
    if s.truncated_lines:
        longest = max(s.cut_lines, key=lambda c: c["bytes"])
        out.append(f"  lines cut at the line limit (each kept its head): {s.truncated_lines:,}; the longest "
                   f"{longest['bytes']:,} bytes, in {longest['source']}")
    if s.messages_cut:
        out.append(f"  messages shortened to the message limit: {s.messages_cut:,}")
    if s.parser_errors:
        out.append("  parser errors (lines kept as plain logs): " +
                   ", ".join(f"{k} {v}" for k, v in sorted(s.parser_errors.items())))
    domains = [o for o in s.clock_offsets if o.note != "reference" or len(s.clock_offsets) > 1]
    if len(s.clock_offsets) > 1:
        out.append("  clock offsets (estimated from step ends shared by all ranks; subtracted):")
        for o in domains:
            if o.note == "reference":
                out.append(f"    {o.domain}: reference ({o.points} points)")
            elif o.applied:
                out.append(f"    {o.domain}: {o.offset_ms:+.3f} ms vs {o.reference} "
                           f"({o.points} points, spread {o.spread_ms:.3f} ms)")
            else:
                out.append(f"    {o.domain}: {o.note}")
        if s.alignment_residual_ms is not None:
            out.append(f"    after correction the largest remaining offset is {s.alignment_residual_ms:.3f} ms")
    ranks = sorted({(d["node"], d["rank"]) for d in s.streams}, key=lambda t: t[1])
    guessed = [d for d in s.streams if d["rank_guessed"]]
    out.append(f"  ranks: {len(ranks)}" + (f" ({len(guessed)} stream(s) had no rank in prefixes or file names; "
                                           "numbered in order of appearance)" if guessed else ""))
    for note in s.notes:
        out.append(f"  note: {note}")
    for err in s.errors:
        out.append(f"  error: {err}")
    where = f"{data_dir}/{s.job}" if to == "local" else to
    flags = (f" --data-dir {data_dir}" if data_dir != "jobtrace-data" else "") if to == "local" else f" --backend {to}"
    out.append(f"  written to {where}; next: trace-job {s.job}{flags}")
    return "\n".join(out)


def print_summary(s: IngestSummary, console: Console, to: str = "local", data_dir: str = "jobtrace-data") -> None:
    """Render :func:`format_summary` (as written: no markup, no highlighting)."""
    console.print(format_summary(s, to, data_dir), highlight=False, markup=False)


def _load_plugins(plugins: tuple[str, ...]) -> None:
    for name in plugins:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import failure is a usage error
            raise click.BadParameter(f"cannot import plugin {name!r}: {exc}", param_hint="--plugin") from exc


@click.command(name="ingest", cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True)
@click.option("--job", "job_id", required=True, help="Job id for the events (trace-job JOB afterwards).")
@backend_option(INGEST_TARGETS, default="local", help="Where the events go.")
@click.option("--url", default=None,
              help="Server URL for a server backend (default JOBTRACE_LOKI_URL / JOBTRACE_VL_URL / JOBTRACE_ES_URL).")
@click.option("--data-dir", envvar=config.DATA_DIR, default="jobtrace-data", show_default=True,
              help="Embedded store directory (--backend local; the spool for servers lives there too).")
@click.option("--follow", "-f", is_flag=True, help="Keep reading as the files grow (a running job); Ctrl-C stops.")
@click.option("--idle-exit", type=click.FloatRange(0, min_open=True), default=None, help="With --follow: stop after this many seconds without new lines.")
@click.option("--tz", default="UTC", show_default=True,
              help="Zone of timestamps that carry none: UTC, local, +HH:MM or a name like Europe/Paris.")
@click.option("--year", type=click.IntRange(1970, 9999), default=None, help="Year for formats without one (glog/c10 lines).")
@click.option("--rank-from-filename", default=None,
              help="Regex with groups rank/node/local_rank (or one group = rank) applied to each file path.")
@click.option("--node", default=None, help="Node name for every line (when the logs do not say).")
@click.option("--rank", type=click.IntRange(0), default=None, help="Rank for a single-rank input.")
@click.option("--world-size", type=click.IntRange(1), default=None, help="World size (default: highest rank seen + 1).")
@click.option("--max-line-bytes", type=click.IntRange(1024), default=1 << 20, show_default=True,
              help="Longest line read whole; a longer one keeps its head and is counted, with its length, as cut.")
@click.option("--no-align", is_flag=True, help="Do not estimate and correct clock offsets between nodes.")
@click.option("--replace", "--overwrite", "replace", is_flag=True,
              help="Read every file again from its start: the job's earlier ingested events are removed first "
                   "(embedded store; a server keeps what it was sent).")
@click.option("--append", is_flag=True,
              help="Read every file whole and add its events to the job, even content ingested before (the job "
                   "then holds those events twice). Without it, content already ingested is skipped and a file "
                   "that grew, or whose ingest stopped, is read on from where it was.")
@click.option("--plugin", multiple=True, help="Import this module first (it registers its own parsers).")
@click.option("--engine", type=click.Choice(["auto", "compiled", "python"]), default="auto", show_default=True,
              help="Which engine reads the lines: the compiled lane where built (auto), required, or Python's.")
@click.option("--no-hyperscan", is_flag=True, help="Match with Python's re even when Hyperscan is installed.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def ingest_command(paths: tuple[str, ...], job_id: str, backend: str, url: str | None, data_dir: str, follow: bool, idle_exit: float | None,
                   tz: str, year: int | None, rank_from_filename: str | None, node: str | None, rank: int | None,
                   world_size: int | None, max_line_bytes: int, no_align: bool, replace: bool, append: bool, plugin: tuple[str, ...],
                   engine: str, no_hyperscan: bool, as_json: bool, quiet: bool) -> None:
    """Turn the log files of a job (PATH: files, directories, globs, .gz/.zst, - for stdin) into events.

    Megatron-LM, DeepSpeed, Hugging Face Trainer, torchrun/NCCL failures and plain
    "step N loss x time T ms" lines are recognised from the lines themselves.

    \b
    Examples:
      jobtrace ingest logs/ --job run-17    # then: trace-job run-17
      jobtrace ingest 'n*/rank*.log.gz' --job run-17 \\
          --rank-from-filename 'rank([0-9]+)'
      jobtrace ingest train.log --job run-17 --follow --idle-exit 600
      kubectl logs pod/trainer-0 | jobtrace ingest - --job run-17 --rank 0
      jobtrace ingest logs/ --job run-17 --backend loki --url http://loki:3100

    Exit status: 0 done, 2 usage error, 3 error (a path that is not there, a server without a URL,
    nothing read, store or server unusable), 4 internal error (rerun with --debug).
    """
    import orjson
    from rich.console import Console

    from ingest import IngestConfig, SourceBook, local_files, open_sink
    from jobtrace.store import IngestLedger

    err = Console(stderr=True)
    _load_plugins(plugin)
    if rank_from_filename:
        import re

        try:
            re.compile(rank_from_filename)
        except re.error as exc:
            raise click.BadParameter(str(exc), param_hint="--rank-from-filename") from exc
    cfg = IngestConfig(job=job_id, tz=tz, year=year, align=not no_align, follow=follow, idle_exit_s=idle_exit,
                       rank_from_filename=rank_from_filename, node=node, rank=rank, world_size=world_size,
                       use_hyperscan=False if no_hyperscan else None,
                       native={"auto": None, "compiled": True, "python": False}[engine],
                       max_line_bytes=max_line_bytes, chunk_bytes=min(1 << 20, max_line_bytes))
    if replace and append:
        raise click.UsageError("--replace and --append ask for opposite things: give one of them")
    factory = open_sink(backend, job_id, data_dir=data_dir, overwrite=replace, url=url)
    book = SourceBook(IngestLedger(data_dir, job_id), ingest_target(backend, url),
                      "replace" if replace else "append" if append else "check",
                      store_files=(lambda: local_files(data_dir, job_id)) if backend == "local" else None)
    summary = _run(cfg, factory, list(paths), err, show=not quiet and not as_json and err.is_terminal, book=book)
    if as_json:
        click.echo(orjson.dumps(summary.to_dict(), option=orjson.OPT_INDENT_2, default=str).decode())
    else:
        print_summary(summary, Console(), backend, data_dir)
    # every input failed (the summary says why): an error, not an empty success
    raise click.exceptions.Exit(EXIT_ERROR if summary.errors and not summary.lines else EXIT_HEALTHY)


def ingest_target(backend: str, url: str | None) -> str:
    """The ledger's name for where the events go: ``local``, or the server kind and its URL (no credentials)."""
    if backend == "local":
        return "local"
    from jobtrace.redact import url_for_display

    prefix = {"loki": config.LOKI, "victorialogs": config.VL, "elasticsearch": config.ES}[backend]
    url = url or config.get_str(prefix.url)
    return f"{backend} {url_for_display(url)}" if url else backend


def _run(cfg: IngestConfig, factory: Any, paths: list[str], console: Console, show: bool,
         book: SourceBook | None = None) -> IngestSummary:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from ingest import Ingestor, keep_freed_memory

    keep_freed_memory()  # this process is ours: megabyte buffers reuse their pages (see ingest.keep_freed_memory)
    if not show:
        ing = Ingestor(cfg, factory, book=book)
        return _with_sigint(ing, paths)
    with Progress(TextColumn("[bold]ingest[/]"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[lines]} lines"),
                  TextColumn("{task.fields[events]} events"), TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("ingest", total=None, lines="0", events="0")

        def progress(done: int, total: int, lines: int, events: int) -> None:
            bar.update(task, completed=done, total=total or None, lines=f"{lines:,}", events=f"{events:,}")

        ing = Ingestor(cfg, factory, progress=progress, book=book)
        return _with_sigint(ing, paths)


def _with_sigint(ing: Ingestor, paths: list[str]) -> IngestSummary:
    """Ctrl-C in follow mode ends the ingest cleanly (everything read so far is written)."""
    if not ing.cfg.follow:
        return ing.run(paths)
    previous = signal.getsignal(signal.SIGINT)

    def stop(signum: int, frame: Any) -> None:
        ing.stop()

    try:
        signal.signal(signal.SIGINT, stop)
    except ValueError:  # not the main thread
        return ing.run(paths)
    try:
        return ing.run(paths)
    finally:
        signal.signal(signal.SIGINT, previous)
