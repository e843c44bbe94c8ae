"""The data a diagnosis is made of: configuration, findings with their evidence, summaries, the report.

Everything here is plain data (dataclasses of numbers, strings, lists and dicts) so a
:class:`Report` turns into JSON without custom encoders and reads the same from the
rich renderer, the HTML timeline and a pipeline that gates on ``--json``. The one
exception is :class:`AnalysisContext`, what the checks are handed while a report is
being made, which holds the job's connection and never leaves the analysis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson

if TYPE_CHECKING:  # annotations only: the store opens the connection, so duckdb is loaded by then anyway
    from duckdb import DuckDBPyConnection

__all__ = [
    "AnalysisConfig",
    "EventRef",
    "Finding",
    "NodeSummary",
    "RankSummary",
    "Report",
]


@dataclass(frozen=True)
class AnalysisConfig:
    """Thresholds of every check, with the defaults the anchors use where they have one.

    Times are in seconds (``*_s``) or milliseconds (``*_ms``) as named; factors are plain ratios.
    """

    # --- hang / stall -------------------------------------------------------------------------
    stall_s: float = 300.0
    """Seconds without progress (silent: without any event) before a rank counts as stalled."""
    # --- stragglers -----------------------------------------------------------------------------
    slow_factor: float = 1.3
    """A rank is slow when its median compute per step is at least this many times the median rank's."""
    min_excess_ms: float = 2.0
    """…and at least this many milliseconds longer (tiny steps make ratios meaningless)."""
    imposed_wait_share: float = 0.5
    """…and the others spend at least this share of its extra compute waiting for it in collectives
    (checked only where collectives are timed; a slower rank nobody waits for does not slow the job)."""
    straggler_score: float = 0.75
    """NVRx's threshold: a score (reference median ÷ this rank's median) below it is flagged."""
    window_steps: int = 0
    """Steps per sliding window; 0 picks ``clamp(steps // 8, 3, 100)``."""
    chronic_fraction: float = 0.5
    """A rank flagged in at least this share of windows (or in every window to the end) is chronic."""
    one_off_factor: float = 3.0
    """A single step whose own time (step minus collective wait) is this many times the rank's median…"""
    one_off_min_ms: float = 100.0
    """…and at least this much longer is a one-off stall."""
    late_share: float = 0.5
    """A rank that arrives last at a collective in at least this share of instances is a late arriver…"""
    late_cost_share: float = 0.02
    """…when the others' waits for it add up to at least this share of the job's time (a rank last by
    2 ms at a 300 ms step is the scheduler's noise on a busy host, not a straggler to chase)."""
    # --- training health ----------------------------------------------------------------------
    spike_factor: float = 10.0
    """Megatron's rule: a loss above this many times the max |loss| of the last ``spike_window`` values."""
    spike_window: int = 100
    spike_z: float = 8.0
    """Robust rule: a loss this many scaled MADs above the trailing median (and ``spike_min_rel`` above it)."""
    spike_min_rel: float = 0.5
    divergence_factor: float = 1.5
    """A loss this many times the lowest before it, to the end of the log, has diverged (``divergence``)."""
    divergence_tail: int = 3
    """…for at least this many values (or rising at each of this many + 1 values)."""
    grad_norm_max: float | None = None
    """Absolute grad-norm limit; ``None`` checks only explosions relative to the history."""
    grad_explode_factor: float = 10.0
    loss_scale_min: float = 1.0
    """fp16 dynamic loss scale at or below this has collapsed (Megatron's default minimum is 1)."""
    overflow_cascade_min: int = 3
    """This many fp16 overflow skips in a row, once training had settled, are a cascade."""
    overflow_gap_steps: int = 10
    """Logged steps allowed between two skips of one cascade (DeepSpeed logs every 10 steps by default)."""
    lr_jump_factor: float = 3.0
    leak_min_mb: float = 32.0
    """Memory that grows by at least this much (and ``leak_min_frac`` of its baseline) and never returns."""
    leak_min_frac: float = 0.02
    throughput_drop: float = 0.25
    """A window whose median step time is this much above the job's best window is a throughput drop…"""
    throughput_min_ms: float = 5.0
    """…and at least this many milliseconds per step slower…"""
    throughput_spread_z: float = 3.0
    """…and this many robust standard deviations of the earlier steps above their median."""
    data_wait_frac: float = 0.2
    """A rank spending at least this share of its step in the ``data`` phase is input-bound…"""
    data_wait_min_ms: float = 5.0
    """…when that is also at least this many milliseconds per step."""
    comm_rise: float = 0.2
    """Communication share of step time rising by this much (absolute) from the first window to the last."""
    warmup_steps: int = 1
    """Leading steps left out of per-step statistics (allocation, compilation, first collectives)."""
    golden_tolerance: float = 0.25
    """Relative headroom above a golden run's (smoothed) series before a deviation counts."""
    golden_smooth_steps: int = 5
    golden_persist_steps: int = 5
    """A departure counts once held this many steps in a row: a busy spell of the machine (or of one rank's
    peer, which a phase that waits on a collective absorbs) lasts a step or three; a regression stays."""
    golden_gate: float | None = None
    """With golden runs: a deviation score above this is a ``golden_deviation`` error (``--gate``)."""
    max_step_time_regression_pct: float | None = None
    """With golden runs: a median step time this many percent above theirs (the median of their medians) is a
    ``step_time_regression`` error, so that a pipeline can gate on it (TraceML's ``--max-step-time-regression-pct``)."""
    max_findings_per_kind: int = 20

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EventRef:
    """One event a finding cites: enough to find it again in any backend."""

    rank: int
    ts: int
    kind: str
    step: int | None = None
    span_id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Finding:
    """One verdict with the evidence behind it. ``kind`` is a stable identifier for machines.

    ``refs`` are the events the verdict rests on (rank, timestamp, step, span id), ``time_range``
    the nanosecond span they cover, and ``links`` open exactly those events in the user's
    backend (Grafana Explore, Kibana Discover) when one is configured.
    """

    kind: str
    severity: str
    summary: str
    ranks: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    refs: list[dict[str, Any]] = field(default_factory=list)
    time_range: list[int] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)

    def cite(self, refs: list[EventRef] | list[dict[str, Any]], limit: int = 20) -> Finding:
        """Attach cited events (at most ``limit``) and widen ``time_range`` to cover them."""
        for ref in refs[:limit]:
            d = ref.to_dict() if isinstance(ref, EventRef) else {k: v for k, v in ref.items() if v is not None}
            self.refs.append(d)
        stamps = [r["ts"] for r in self.refs if isinstance(r.get("ts"), int)] + list(self.time_range)
        if stamps:
            self.time_range = [min(stamps), max(stamps)]
        return self


Status = Literal["failed", "silent", "stalled", "mismatch", "waiting", "slow", "stalls", "data", "late", "ok"]
"""What :attr:`RankSummary.status` can say (the renderer colours each; see :data:`STATUS_PRECEDENCE`)."""

STATUS_PRECEDENCE: Final[tuple[Status, ...]] = (
    "failed", "silent", "stalled", "mismatch", "waiting", "slow", "stalls", "data", "late", "ok",
)
"""Which status a rank shows when several checks name it: the one earlier here.

The checks propose statuses independently (:meth:`RankSummary.propose`), so what a rank
shows is the most urgent thing said about it, whichever check ran first. Each beats the next:

* ``failed`` (its log reports a failure: an OOM, an error, a timeout, an exit code) over
  everything: what the rank itself said went wrong outranks what its timing suggests;
* ``silent`` (nothing at all, not even a heartbeat, for ``stall_s``) over ``stalled``: both
  make the rank a hang's culprit, but silence says the process or its host is gone, the
  stronger statement (the hang check proposes only one of the two for a rank);
* ``stalled`` (alive, no progress, outside the wavefront) over ``mismatch``: a mismatched
  collective the job lived through is history, the stall is what the job is stuck on now
  (a rank that hangs *in* a mismatched collective is proposed as ``mismatch`` only);
* ``mismatch`` (called another op, size or sequence number than its group) over
  ``waiting``: a mismatched rank is a cause, a rank in the wavefront only its victim;
* ``waiting`` over ``slow``: while the job hangs its speed is moot, the hang is what to fix;
* ``slow`` (chronic lag or a slow episode, from window medians) over ``stalls``: the
  windows are the stronger evidence than a count of long single steps;
* ``stalls`` (many long single steps) over ``data``: the long steps name where to look,
  while a data share is a median that is often the same on every rank;
* ``data`` (input-bound) over ``late``: late arrival is reported for ranks that nothing
  else explains, so whatever else a rank shows is the reason it arrives last;
* ``late`` over ``ok``.

The order is the one the checks' call order and ``if status == "ok"`` guards produced
before this table existed: statuses set unconditionally (mismatch, then stalled/silent
over it, in the hang check) above the guarded ones, and those in the order analyze()
called them (hang, stragglers, health, late arrival), first come first served. One
case came out the other way: a hang with no culprit set its waiting ranks to ``waiting``
over a ``mismatch`` of an earlier, completed collective; the table keeps ``mismatch``
there as everywhere else.
"""

_PRECEDENCE: Final[dict[str, int]] = {s: i for i, s in enumerate(STATUS_PRECEDENCE)}


@dataclass
class RankSummary:
    rank: int
    node: str
    steps: int
    step_ms: float | None
    compute_ms: float | None
    collective_ms: float | None
    data_ms: float | None
    last_step: int | None
    last_seen_s: float
    status: str = "ok"
    """One of :data:`STATUS_PRECEDENCE`; checks set it with :meth:`propose` only."""
    score: float | None = None
    """Relative straggler score: the fastest rank's median compute ÷ this rank's (1 = fastest)."""
    individual_score: float | None = None
    """This rank's best window median ÷ its latest window median (1 = as fast as it ever was)."""
    slow_windows: int = 0
    windows: int = 0
    last_arrivals: int = 0
    """Collectives this rank arrived at last (clock-free: it waited least)."""
    late_ms: float | None = None
    """Median lead of the median rank over this rank when it arrived last."""
    comm_share: float | None = None
    data_share: float | None = None
    idle_ms: float | None = None

    def propose(self, status: Status) -> None:
        """Show ``status`` unless the rank already shows one :data:`STATUS_PRECEDENCE` puts first.

        Every check names a rank through here, never by assigning :attr:`status`, so the
        verdict does not depend on the order the checks run in.
        """
        if _PRECEDENCE[status] < _PRECEDENCE.get(self.status, len(_PRECEDENCE)):
            self.status = status


@dataclass
class NodeSummary:
    node: str
    ranks: list[int]
    compute_ms: float | None
    score: float | None
    slow_ranks: list[int] = field(default_factory=list)
    last_arrivals: int = 0


@dataclass
class Report:
    job_id: str
    trace_ids: list[str]
    source: str
    ranks: int
    world_size: int
    nodes: list[str]
    steps: int
    first_step: int | None
    last_step: int | None
    wall_s: float
    step_ms_median: float | None
    steps_per_s: float | None
    throughput: dict[str, float]
    events: int
    skipped: dict[str, int]
    per_rank: list[RankSummary]
    per_step: list[dict[str, Any]]
    findings: list[Finding]
    per_node: list[NodeSummary] = field(default_factory=list)
    breakdown: dict[str, Any] = field(default_factory=dict)
    """Job-wide time shares (compute, communication, data, idle), the communication share per window."""
    collectives: dict[str, Any] = field(default_factory=dict)
    """Collective matching: groups, instances, last arrivers, the wavefront when the job hangs."""
    golden: list[str] = field(default_factory=list)
    """Reference runs this job was compared with."""
    golden_choice: str | None = None
    """Why ``--golden`` chose the references it did (shape, distance), where it chose them."""
    clocks: dict[str, Any] = field(default_factory=dict)
    """Clock offsets between nodes (``reference``, ``offsets_ms`` per node, ``applied``), where estimated."""
    caveats: list[str] = field(default_factory=list)
    """What limits the report, said before it: an ingest that did not finish ("ingest incomplete: 92 % of x.log")."""
    t_min: int = 0
    t_max: int = 0

    @property
    def healthy(self) -> bool:
        return not any(f.severity in ("error", "warning") for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """The report as ``trace-job --json`` prints it: ``docs/schema/report.schema.json``, version
        :data:`REPORT_SCHEMA_VERSION`.

        Every timestamp carries its unit in its name there (``t_min_ns``, a finding's
        ``time_range_ns``, a cited event's ``ts_ns``: nanoseconds since the Unix epoch), as the
        durations already did (``step_ms``, ``wall_s``); the attributes keep their short names.
        """
        d = asdict(self)
        d["healthy"] = self.healthy
        d["t_min_ns"], d["t_max_ns"] = d.pop("t_min"), d.pop("t_max")
        for f in d["findings"]:
            f["time_range_ns"] = f.pop("time_range")
            f["refs"] = [{("ts_ns" if k == "ts" else k): v for k, v in ref.items()} for ref in f["refs"]]
        return {"schema_version": REPORT_SCHEMA_VERSION, **{k: _finite(v) for k, v in d.items()}}


REPORT_SCHEMA_VERSION: Final = 1
"""``schema_version`` of :meth:`Report.to_dict` (``trace-job --json``), the ``const`` of
``docs/schema/report.schema.json``. Raised when a key is renamed or removed or its meaning
changes; new keys do not raise it (the schema allows them)."""


def _finite(obj: Any) -> Any:
    """JSON has no NaN: non-finite floats become the strings ``"NaN"``/``"Infinity"`` like the events."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# ---- helpers shared by the analysis modules --------------------------------------------------


def rows(con: DuckDBPyConnection, sql: str,
         params: Sequence[object] | Mapping[str, object] | None = None) -> list[dict[str, Any]]:
    """Run a query and return its rows as dicts keyed by column name.

    ``params`` are DuckDB's: a sequence for ``?`` placeholders, a mapping for ``$name`` ones.
    Rows stay ``Any``-valued: a column's type is the query's, which mypy cannot see.
    """
    cur = con.execute(sql, params if params is not None else [])
    names = [c[0] for c in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


@dataclass(frozen=True)
class AnalysisContext:
    """What every check of one :func:`analyze` call reads, built once there.

    One object instead of positional bundles (``con, cfg, ranks, by_rank, warm, n_steps,
    late``, each check taking a different slice in a different order): a check names what
    it reads, and an input added for one check does not reshuffle the others' arguments.
    Frozen because the checks share it; what they may change is the summaries in
    :attr:`by_rank`, and a rank's status only through :meth:`mark`.
    """

    con: DuckDBPyConnection
    """The job's connection, its derived tables (``ranks``, ``steps``, ``colls``, ``mets``) built."""
    cfg: AnalysisConfig
    ranks: list[dict[str, Any]]
    """One row per rank, by rank: the ``ranks`` table with its medians per step after warm-up."""
    by_rank: dict[int, RankSummary]
    """The summaries the report carries; the checks fill in scores, counts and shares."""
    t_max: int
    """The job's last event (ns): stalls are measured back from it, not from the wall clock."""
    n_steps: int
    first_step: int | None
    window: int
    """Steps per sliding window (``window_size``), the same for speed and health checks."""
    warm_from: int | None
    """The first step per-step statistics count; ``None`` counts every step (see :data:`AFTER_WARMUP`)."""
    late: dict[str, Any]
    """Who arrived last at each collective instance, per rank and op (``late_arrivals``)."""
    clock: dict[str, int] = field(default_factory=dict)
    """Per node, its clock's offset (ns) from the reference node's, where large enough to apply
    (:mod:`queries._clocks`); :attr:`t_max` is on the reference clock."""

    def now(self, rank: dict[str, Any]) -> int:
        """:attr:`t_max` in ``rank``'s own clock (a row of :attr:`ranks`): what its stamps are compared with."""
        return self.t_max + self.clock.get(rank["node"], 0)

    def warm_params(self, **more: object) -> dict[str, object]:
        """Named parameters for a query that filters with :data:`AFTER_WARMUP`, plus ``more``."""
        return {"warm_from": self.warm_from, **more}

    def mark(self, rank: int, status: Status) -> None:
        """Propose ``status`` for ``rank``; which one it shows is :data:`STATUS_PRECEDENCE`'s call."""
        self.by_rank[rank].propose(status)


AFTER_WARMUP: Final = "($warm_from IS NULL OR step >= $warm_from)"
"""The filter that leaves the warm-up steps out, for a query bound with ``{"warm_from": ...}``.

The bound travels as data (:attr:`AnalysisContext.warm_from`: an int, or ``None`` when
the job is too short to spare its first steps) and only this fixed text goes into SQL. ``None`` keeps every row, those
without a step too, as the filter ``true`` did before the bound was a parameter.
"""


def ms(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def as_json(value: Any) -> dict[str, Any]:
    """A JSON column value (text or already a dict) as a dict; anything else as ``{}``."""
    if value is None:
        return {}
    if isinstance(value, (bytes, str)):
        try:
            out = orjson.loads(value)
            return out if isinstance(out, dict) else {}
        except orjson.JSONDecodeError:
            return {}
    return dict(value)


def span_list(ranks: list[int]) -> str:
    """Compact ``0-3,5,7-9`` list of ranks."""
    parts: list[list[int]] = []
    for r in sorted(set(ranks)):
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def ids(values: list[int]) -> str:
    """An SQL list of integers (values are ints we produced, never user text)."""
    return ",".join(str(int(v)) for v in values) or "NULL"
