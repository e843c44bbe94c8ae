"""The Perfetto trace is complete: decoded with Perfetto's own compiled protos, it holds every span of every rank.

The file is read back with ``perfetto_trace_pb2`` from the ``perfetto`` package (Perfetto's published
``Trace`` proto, compiled by its authors), not with the writer's encoder, and each count is checked
against the job's own DuckDB tables: spans, ranks, nodes, matched collectives, metric values and findings.
Slices are rebuilt the way Perfetto's trace processor builds them: per track, events in time order
(file order breaking ties), an end closing the innermost open slice. A slice that came out with
another span's duration, an end with nothing open or a slice left open would show up here.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2",
                         reason="the perfetto package is part of the test dependencies (jobtrace[dev])")
from google.protobuf.unknown_fields import UnknownFieldSet  # noqa: E402

from jobtrace.synth import SynthJob, write_job  # noqa: E402
from queries import AnalysisConfig, analyze, load_local, write_perfetto  # noqa: E402

TE = pb.TrackEvent


@dataclass
class Decoded:
    """What the trace processor would import from the file, rebuilt from the decoded packets."""

    packets: int = 0
    tracks: dict[int, pb.TrackDescriptor] = field(default_factory=dict)
    slices: list[dict] = field(default_factory=list)  # track, name, cat, ts, dur, args, flows
    instants: list[dict] = field(default_factory=list)
    counters: list[dict] = field(default_factory=list)
    unmatched_ends: int = 0
    left_open: int = 0

    def name(self, uuid: int) -> str:
        t = self.tracks[uuid]
        return t.thread.thread_name or t.process.process_name or t.name

    def rank_track(self, uuid: int) -> int:
        """The rank thread track a track belongs to (itself, or its parent chain's thread)."""
        while not self.tracks[uuid].HasField("thread"):
            uuid = self.tracks[uuid].parent_uuid
        return uuid

    def process_of(self, uuid: int) -> pb.ProcessDescriptor:
        while not self.tracks[uuid].HasField("process"):
            uuid = self.tracks[uuid].parent_uuid
        return self.tracks[uuid].process


def decode(path: Path) -> Decoded:
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    out = Decoded(packets=len(trace.packet))
    names: dict[int, str] = {}
    cats: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    events = []
    seqs = set()
    for i, p in enumerate(trace.packet):
        # Every byte was a field Perfetto's proto knows: a wrong field number would land here.
        assert len(UnknownFieldSet(p)) == 0, p
        seqs.add(p.trusted_packet_sequence_id)
        if p.HasField("interned_data"):
            assert i == 0 and p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            names.update({e.iid: e.name for e in p.interned_data.event_names})
            cats.update({e.iid: e.name for e in p.interned_data.event_categories})
            arg_names.update({e.iid: e.name for e in p.interned_data.debug_annotation_names})
        if p.HasField("track_descriptor"):
            assert p.track_descriptor.uuid not in out.tracks, "a track declared twice"
            out.tracks[p.track_descriptor.uuid] = p.track_descriptor
        if p.HasField("track_event"):
            assert len(UnknownFieldSet(p.track_event)) == 0
            assert p.track_event.track_uuid in out.tracks, "an event before its track's descriptor"
            events.append((p.timestamp, i, p.track_event))
    assert seqs == {1}
    events.sort(key=lambda x: (x[0], x[1]))  # the trace processor's sort: by time, ties in file order
    stacks: dict[int, list[dict]] = defaultdict(list)
    for ts, _, ev in events:
        args = {}
        for a in ev.debug_annotations:
            kind = a.WhichOneof("value")
            args[arg_names[a.name_iid]] = getattr(a, kind)
        name = names[ev.name_iid] if ev.name_iid else ev.name
        if ev.type == TE.TYPE_SLICE_BEGIN:
            stacks[ev.track_uuid].append({"track": ev.track_uuid, "name": name,
                                          "cat": cats.get(ev.category_iids[0]) if ev.category_iids else None,
                                          "ts": ts, "args": args, "flows": list(ev.flow_ids)})
        elif ev.type == TE.TYPE_SLICE_END:
            if not stacks[ev.track_uuid]:
                out.unmatched_ends += 1
                continue
            s = stacks[ev.track_uuid].pop()
            s["dur"] = ts - s["ts"]
            out.slices.append(s)
        elif ev.type == TE.TYPE_INSTANT:
            out.instants.append({"track": ev.track_uuid, "name": name, "ts": ts, "args": args})
        elif ev.type == TE.TYPE_COUNTER:
            assert out.tracks[ev.track_uuid].HasField("counter")
            out.counters.append({"track": ev.track_uuid, "ts": ts, "value": ev.double_counter_value})
    out.left_open = sum(len(s) for s in stacks.values())
    return out


def spans_in_db(job) -> Counter:
    return Counter(job.con.execute(
        "SELECT rank, name, start, dur, span_id FROM events WHERE kind = 'span'").fetchall())


def spans_in_trace(d: Decoded, rank_of: dict[int, int]) -> Counter:
    """The slices that are spans (they have a category; findings and stalls have none), keyed as in the store."""
    return Counter((rank_of[d.rank_track(s["track"])], s["name"], s["ts"], s["dur"], s["args"].get("span_id"))
                   for s in d.slices if s["cat"] is not None)


def rank_tracks(d: Decoded) -> dict[int, int]:
    """Thread track uuid -> rank, from the thread names ("rank 5" or "rank 5 (stalled)")."""
    return {u: int(t.thread.thread_name.split()[1]) for u, t in d.tracks.items() if t.HasField("thread")}


def matched_pairs(job) -> int:
    """Arrows a flow per collective gives: one fewer than the ranks that ran it, from the store's ``colls`` table."""
    return job.con.execute("SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM colls "
                           "WHERE seq IS NOT NULL GROUP BY grp, seq HAVING count(*) > 1)").fetchone()[0]


def flow_arrows(d: Decoded) -> int:
    uses = Counter(f for s in d.slices for f in s["flows"])
    return sum(n - 1 for n in uses.values())


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """Twelve ranks on three nodes: a slow rank, NaN loss from step 30, a leak, a mismatched collective."""
    d = tmp_path_factory.mktemp("perfetto")
    write_job(d, SynthJob(job_id="faulty", ranks=12, ranks_per_node=4, steps=40, slow_ranks={5: 1.8}, nan_step=30,
                          leaks={2: (10, 50.0)}, mismatch_rank=7, mismatch_step=33))
    job = load_local(d, "faulty")
    report = analyze(job, AnalysisConfig())
    path = write_perfetto(job, report, d / "faulty.pftrace")
    return job, report, decode(path)


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    d = tmp_path_factory.mktemp("perfetto-hang")
    write_job(d, SynthJob(job_id="hang</b>", ranks=6, ranks_per_node=3, steps=25, hang_rank=4, hang_step=15,
                          hang_s=400))
    job = load_local(d, "hang</b>")
    report = analyze(job, AnalysisConfig())
    return job, report, decode(write_perfetto(job, report, d / "hang.pftrace"))


class TestCompleteness:
    def test_every_span_of_every_rank_is_a_slice_with_its_own_start_and_duration(self, faulty):
        """Each span of the store comes back once, on its rank, with its start, duration and span id."""
        job, _, d = faulty
        assert d.unmatched_ends == 0 and d.left_open == 0
        db = spans_in_db(job)
        assert sum(db.values()) == 12 * 40 * 6
        assert spans_in_trace(d, rank_tracks(d)) == db

    def test_every_rank_has_a_thread_in_its_nodes_process(self, faulty):
        job, report, d = faulty
        ranks = rank_tracks(d)
        assert sorted(ranks.values()) == list(range(12))
        node_of = dict(job.con.execute("SELECT DISTINCT rank, node FROM events").fetchall())
        for uuid, r in ranks.items():
            assert d.process_of(uuid).process_name == f"node {node_of[r]}"
        pids = {d.process_of(u).pid for u in ranks}
        assert len(pids) == 3 and 0 not in pids
        assert {t.thread.thread_name for t in d.tracks.values() if t.HasField("thread")} >= {"rank 5 (slow)"}

    def test_matched_collectives_are_linked_by_flows_in_arrival_order(self, faulty):
        job, _, d = faulty
        assert flow_arrows(d) == matched_pairs(job) == 40 * 11
        by_flow = defaultdict(list)
        for s in d.slices:
            for f in s["flows"]:
                by_flow[f].append(s)
        for chain in by_flow.values():
            # one collective: one group and sequence number, on as many ranks as slices
            assert len({(s["args"]["group"], s["args"]["seq"]) for s in chain}) == 1
            assert len({rank_tracks(d)[d.rank_track(s["track"])] for s in chain}) == len(chain) == 12
        # the mismatched rank's all_gather is linked to the others' all_reduce of the same sequence number
        ops = {frozenset(s["args"]["op"] for s in chain) for chain in by_flow.values()}
        assert frozenset({"all_reduce", "all_gather"}) in ops
        # a chain runs in the order the ranks entered: the slow rank 5 enters last, every step
        last = Counter(rank_tracks(d)[d.rank_track(max(chain, key=lambda s: s["ts"])["track"])]
                       for chain in by_flow.values())
        assert last == {5: 40}

    def test_each_finite_metric_value_is_a_counter_and_each_nan_an_instant(self, faulty):
        job, _, d = faulty
        expected = Counter()
        nan = Counter()
        for r, loss, lr, grad, rss in job.con.execute(
                "SELECT rank, metrics->>'loss', metrics->>'lr', metrics->>'grad_norm', metrics->>'rss_bytes' "
                "FROM events WHERE kind = 'metric'").fetchall():
            for key, v in (("loss", loss), ("lr", lr), ("grad_norm", grad), ("rss_bytes", rss)):
                if v is not None:
                    (expected if math.isfinite(float(v)) else nan)[(r, key)] += 1
        got = Counter()
        for c in d.counters:
            key, rank = d.name(c["track"]).removesuffix(")").split(" (rank ")
            assert d.tracks[c["track"]].parent_uuid in rank_tracks(d)
            got[(int(rank), key)] += 1
        assert got == expected and {k for _, k in got} == {"loss", "lr", "grad_norm", "rss_bytes"}
        assert sum(nan.values()) == 12 * 10
        instants = Counter((rank_tracks(d)[i["track"]], i["name"].split(" = ")[0]) for i in d.instants
                           if i["name"].endswith("= nan"))
        assert instants == nan
        # the leaking rank's memory counter climbs
        rss = [c["value"] for c in sorted(d.counters, key=lambda c: c["ts"]) if d.name(c["track"]) == "rss_bytes (rank 2)"]
        assert rss[-1] - rss[0] > 25 * 50 * 2**20

    def test_findings_are_instants_on_a_named_findings_process(self, faulty):
        _, report, d = faulty
        assert report.findings
        procs = {u: t for u, t in d.tracks.items() if t.process.process_name == "jobtrace findings"}
        assert len(procs) == 1
        (proc_uuid, proc), = procs.items()
        assert proc.process.pid not in (0, *(d.process_of(u).pid for u in rank_tracks(d)))
        marks = [i for i in d.instants if d.name(i["track"]) == "findings"]
        assert all(d.tracks[i["track"]].parent_uuid == proc_uuid for i in marks)
        (about,) = [i for i in d.instants if d.name(i["track"]) == "job"]
        assert about["name"] == "job faulty" and about["args"]["verdict"] == "problem found"
        assert about["args"]["trace_ids"] == ", ".join(report.trace_ids) and report.trace_ids
        assert sorted(i["name"] for i in marks) == sorted(f"{f.severity}: {f.kind}" for f in report.findings)
        assert {i["args"]["summary"] for i in marks} == {f.summary for f in report.findings}
        kinds = {f.kind for f in report.findings}
        assert {"slow_rank", "nan_loss"} <= kinds


class TestHungJob:
    def test_the_stalled_rank_is_named_and_what_it_is_inside_drawn(self, hung):
        job, report, d = hung
        assert d.unmatched_ends == 0 and d.left_open == 0
        assert spans_in_trace(d, rank_tracks(d)) == spans_in_db(job)
        names = {t.thread.thread_name for t in d.tracks.values() if t.HasField("thread")}
        assert "rank 4 (stalled)" in names and len(names) == 6
        stalled = [f for f in report.findings if f.kind == "stalled_rank"]
        assert stalled
        still = [s for s in d.slices if s["name"].startswith("still: ")]
        assert {rank_tracks(d)[d.rank_track(s["track"])] for s in still} >= {4}
        assert any(s["ts"] == stalled[0].time_range[0] and s["dur"] == stalled[0].time_range[1] - stalled[0].time_range[0]
                   for s in still)


class TestOverlappingSpans:
    def test_spans_that_overlap_without_nesting_go_to_another_track_of_their_rank(self, tmp_path):
        """Async collectives overlap the backward pass and each other (DDP buckets): every one still comes back whole."""
        write_job(tmp_path, SynthJob(job_id="ddp", ranks=2, steps=5))
        job = load_local(tmp_path, "ddp")
        job.writable()
        rows = job.con.execute("SELECT rank, node, start, dur, step FROM events WHERE name = 'backward'").fetchall()
        for r, node, start, dur, step in rows:
            for b in range(3):  # each bucket starts inside backward and ends after it: partial overlaps
                s = start + dur * (b + 1) // 4
                job.con.execute(
                    "INSERT INTO events (ts, kind, rank, node, span_id, name, cat, start, dur, step, attrs) "
                    "VALUES (?, 'span', ?, ?, ?, 'all_reduce', 'collective', ?, ?, ?, ?)",
                    [s + dur, r, node, f"b{r}-{step}-{b}", s, dur, step,
                     f'{{"group": "ddp", "seq": {step * 3 + b}, "async": true}}'])
        report = analyze(job, AnalysisConfig())
        d = decode(write_perfetto(job, report, tmp_path / "ddp.pftrace"))
        assert d.unmatched_ends == 0 and d.left_open == 0
        assert spans_in_trace(d, rank_tracks(d)) == spans_in_db(job)
        extra = [t for t in d.tracks.values() if "overlapping" in t.name]
        assert len(extra) >= 2 * 2  # buckets 2 and 3 each overlap the one before: two more tracks a rank
        assert flow_arrows(d) == matched_pairs(job)


@pytest.mark.torchjob
def test_a_real_torch_job_is_complete(tmp_path):
    """A real torchrun job (gloo, CPU) with a slow rank: its real spans, collectives and metrics, all in the file."""
    pytest.importorskip("torch", reason="torch is part of the test dependencies (jobtrace[torch])")
    from jobtrace.demo import DemoConfig, run_job

    assert run_job(DemoConfig(job_id="pf-real", data_dir=str(tmp_path), ranks=3, steps=10, slow_ranks=[2])) == 0
    job = load_local(tmp_path, "pf-real")
    report = analyze(job, AnalysisConfig())
    d = decode(write_perfetto(job, report, tmp_path / "real.pftrace"))
    assert d.unmatched_ends == 0 and d.left_open == 0
    db = spans_in_db(job)
    assert sum(db.values()) > 3 * 10 * 5
    assert spans_in_trace(d, rank_tracks(d)) == db
    assert sorted(rank_tracks(d).values()) == [0, 1, 2]
    assert flow_arrows(d) == matched_pairs(job) >= 2 * 10
    counters = {d.name(c["track"]).split(" (rank ")[0] for c in d.counters}
    metric_keys = {k for (m,) in job.con.execute("SELECT metrics FROM events WHERE kind = 'metric'").fetchall()
                   for k, v in json.loads(m).items() if isinstance(v, int | float) and not isinstance(v, bool)}
    assert counters == metric_keys and "loss" in counters
    findings = [i for i in d.instants if d.name(i["track"]) == "findings"]
    assert len(findings) == len(report.findings) >= 1


def test_unknown_options_are_refused(faulty, tmp_path):
    job, report, _ = faulty
    with pytest.raises(TypeError):
        write_perfetto(job, report, tmp_path / "x.pftrace", max_spanz=3)


def _shell() -> str | None:
    import os
    import shutil

    return os.environ.get("PERFETTO_TP_SHELL") or shutil.which("trace_processor_shell")


@pytest.mark.skipif(_shell() is None, reason="no trace_processor_shell: the perfetto package downloads it from "
                    "Google's storage at run time, which these machines cannot reach, and no package registry ships it")
def test_perfettos_trace_processor_imports_every_slice_and_flow_without_errors(faulty, tmp_path):
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    job, report, _ = faulty
    path = write_perfetto(job, report, tmp_path / "tp.pftrace")
    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=_shell()))
    try:
        def one(sql):
            return next(iter(tp.query(sql))).n

        assert one("SELECT count(*) AS n FROM slice WHERE category IN ('step', 'phase', 'collective')") == 12 * 40 * 6
        assert one("SELECT count(*) AS n FROM flow") == matched_pairs(job)
        assert one("SELECT count(DISTINCT utid) AS n FROM thread WHERE name LIKE 'rank %'") == 12
        assert one("SELECT count(*) AS n FROM counter") > 0
        assert one("SELECT count(*) AS n FROM stats WHERE severity IN ('error', 'data_loss') AND value > 0") == 0
    finally:
        tp.close()
