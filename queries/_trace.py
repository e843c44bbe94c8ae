"""One ``trace-job`` run as a function: load, add Flight Recorder dumps, compare with golden runs, link, write views.

Kept out of the CLI so that the CLI stays a thin layer of options and exit codes, and so
that tests and other front ends (a backend other than the embedded store) get the same
behaviour by handing in their own loaded :class:`JobData`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from jobtrace.errors import JobNotFound, QueryError, Refused
from jobtrace.store import ingest_caveats

from ._analysis import analyze
from ._flight_recorder import add_flight_recorder, load_flight_recorder
from ._golden import choose_golden, golden_dir, profile_job
from ._golden_library import FolderLibrary, GoldenLibrary
from ._links import LinkConfig
from ._model import AnalysisConfig, Report
from ._perfetto import write_perfetto
from ._store import JobData, load_local
from ._timeline import write_timeline_html

__all__ = ["TraceOptions", "mark_golden", "trace_job"]


@dataclass
class TraceOptions:
    flight_recorder: Sequence[str] = ()
    """Flight Recorder dump files or folders to add to (or, for an unknown job, to make) the job."""
    compare_to: Sequence[str] = ()
    """Golden run names (or ``.json`` paths) to compare with."""
    golden_dir: str | None = None
    """Where golden runs live (default ``<data-dir>/.golden``)."""
    golden: bool = False
    """Choose the references from the library by itself (:func:`choose_golden`), besides ``compare_to``."""
    library: GoldenLibrary | None = None
    """The library to read (default: the folder ``golden_dir``); a cluster's for ``--backend elasticsearch``."""
    links: LinkConfig = field(default_factory=LinkConfig)
    timeline: str | None = None
    perfetto: str | None = None


def trace_job(job_id: str, data_dir: str | os.PathLike[str], cfg: AnalysisConfig, opts: TraceOptions | None = None,
          job: JobData | None = None) -> tuple[Report, JobData]:
    """Load (unless ``job`` is given), analyse and write the requested views."""
    opts = opts or TraceOptions()
    if job is None:
        try:
            job = load_local(data_dir, job_id)
            if opts.flight_recorder:
                add_flight_recorder(job, opts.flight_recorder)
        except JobNotFound:
            if not opts.flight_recorder:
                raise
            job = load_flight_recorder(job_id, opts.flight_recorder)
    elif opts.flight_recorder:
        add_flight_recorder(job, opts.flight_recorder)
    lib = opts.library or (FolderLibrary(opts.golden_dir or golden_dir(data_dir))
                           if opts.compare_to or opts.golden else None)
    refs = [lib.load(name) for name in opts.compare_to] if lib is not None else []
    profile, why = None, None
    if opts.golden and lib is not None:
        entries = lib.load_all([n for n in lib.names() if n not in opts.compare_to])
        if not entries and not refs:
            raise QueryError(f"no golden runs in {lib.where}: add known-good jobs with `jobtrace golden add JOB`")
        job.build_tables()  # the profile reads the step tables
        profile = profile_job(job)
        chosen, why = choose_golden(profile, [e for e in entries if e.job_id != job.job_id])
        refs += chosen
    report = analyze(job, cfg, golden=refs, links=opts.links if opts.links.enabled else None, profile=profile)
    report.golden_choice = why
    report.caveats += ingest_caveats(data_dir, job_id, _source_kind(job.source))
    if opts.timeline:
        write_timeline_html(job, report, opts.timeline)
    if opts.perfetto:
        write_perfetto(job, report, opts.perfetto)
    return report, job


def _source_kind(source: str) -> str:
    """The ingest ledger's target kind of a job's source (``local:dir`` → ``local``, ``loki:url`` → ``loki``)."""
    return source.split(":", 1)[0]


def mark_golden(job_id: str, data_dir: str | os.PathLike[str], name: str | None = None,
                directory: str | os.PathLike[str] | None = None, cfg: AnalysisConfig | None = None,
                force: bool = False, tags: Sequence[str] = (), *, job: JobData | None = None,
                library: GoldenLibrary | None = None) -> tuple[str, Report]:
    """Add a finished job (``job``, else ``job_id`` from the embedded store) to the golden library (``library``,
    else the folder ``directory`` or the one beside the store); refuses one whose report has error or warning
    findings unless ``force``. Returns where the entry went and the job's report.

    Raises :class:`~jobtrace.errors.Refused` for such a job (a finding, not a failure), naming the findings.
    """
    job = job if job is not None else load_local(data_dir, job_id)
    report = analyze(job, cfg)
    bad = [f for f in report.findings if f.severity in ("error", "warning")]
    if bad and not force:
        kinds = ", ".join(sorted({f.kind for f in bad}))
        raise Refused(f"job {job_id!r} is not known-good: its report has {len(bad)} error or warning finding(s) "
                      f"({kinds}), the first: {bad[0].summary}; keep it anyway with --force (force=True)")
    profile = profile_job(job, name or job_id)
    profile.tags = sorted(set(tags))
    lib = library or FolderLibrary(directory or golden_dir(data_dir))
    return lib.save(profile), report
