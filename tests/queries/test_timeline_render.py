"""The HTML timeline drawn in a real headless Chromium, its pixels checked against the job's data.

Each test writes the page of a job whose shape is known (a synthetic job with a slow rank, NaN
losses and a leak; one that hangs; one too large to keep every span; a real torch job), opens it,
zooms it, takes real screenshots and reads the pixels back: the slow rank's heatmap row must be the
darkest and its lane the one that waits least, each rank's waiting in a zoomed-in collective as
wide as the data says, the loss curve where the metric events put it, the hang's waiting ranks
drawn as waiting, every rank present far out. The expected values come from the job's events
(SQL over the ``events`` table or the raw metric points), never from the page's own data.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter

import pytest

from jobtrace.synth import SynthJob, write_job
from queries import AnalysisConfig, analyze, load_local, timeline_data, write_timeline_html

from .chromium import Image, Page, open_browser


def rgb(hex_color: str) -> tuple[int, int, int]:
    return int(hex_color[1:3], 16), int(hex_color[3:5], 16), int(hex_color[5:7], 16)


def near(p: tuple[int, int, int], c: tuple[int, int, int], tol: int = 40) -> bool:
    return sum(abs(a - b) for a, b in zip(p, c)) <= tol


def is_wait(p: tuple[int, int, int]) -> bool:
    """The waiting hatch: stripes of #e57373 on #ffcdd2 and the blend between them (red, with green ≈ blue)."""
    r, g, b = p
    return r >= 220 and 100 <= g <= 215 and abs(g - b) <= 14


SEVERITY = ("#c62828", "#f9a825", "#0277bd")
"""The findings' flags on the axis: error, warning, info."""


def painted(p: tuple[int, int, int]) -> bool:
    """Drawn on, not the background, a lane's tint or its separator line."""
    return luminance(p) < 235


def luminance(p: tuple[int, int, int]) -> float:
    return 0.2126 * p[0] + 0.7152 * p[1] + 0.0722 * p[2]


@pytest.fixture(scope="module")
def browser():
    with open_browser() as page:
        yield page


def open_page(browser: Page, path) -> dict:
    browser.errors.clear()
    browser.open(path)
    assert browser.eval("document.body.dataset.drawn") == "1"
    return browser.eval("""(() => { const j = window.jobtrace;
        return {lane: j.lane, width: j.width(), t0: j.state.t0, t1: j.state.t1, colors: j.colors, curves: j.curves,
                t_min_ns: j.data.t_min_ns, view: j.data.view, ranks: j.data.lanes.map((l) => l.rank)}; })()""")


def zoom(browser: Page, t0: float, t1: float) -> dict:
    browser.eval(f"window.jobtrace.zoom({t0}, {t1})")
    return browser.eval("({t0: window.jobtrace.state.t0, t1: window.jobtrace.state.t1, width: window.jobtrace.width(),"
                        " stats: Object.assign({}, window.jobtrace.stats)})")


def px(t_us: float, v: dict) -> float:
    return (t_us - v["t0"]) / (v["t1"] - v["t0"]) * v["width"]


def check_axis(browser: Page) -> None:
    """Every tick reads differently, reads its own time, and is drawn where that time falls."""
    st = browser.eval("({t0: window.jobtrace.state.t0, t1: window.jobtrace.state.t1, width: window.jobtrace.width()})")
    ticks = browser.eval("window.jobtrace.ticks()")
    assert len(ticks) >= 3, ticks
    labels = [t["label"] for t in ticks]
    assert len(set(labels)) == len(labels), labels
    values = [float(re.fullmatch(r"(-?[0-9.]+) s", label)[1]) for label in labels]
    step = values[1] - values[0]
    assert step > 0 and all(abs((b - a) - step) < step * 1e-6 + 1e-9 for a, b in zip(values, values[1:])), labels
    axis = browser.screenshot("#axis")
    for tick, value in zip(ticks, values):
        assert abs(value * 1e6 - tick["t"]) <= step * 1e6 / 1000 + 1e-6, (value, tick)
        at = round((value * 1e6 - st["t0"]) / (st["t1"] - st["t0"]) * st["width"])
        if 0 <= at < axis.width:  # the tick's mark (or a finding's flag over it)
            assert any(near(axis.pixel(at, 19), rgb(c), 60) for c in ("#555555", *SEVERITY)), (tick, axis.pixel(at, 19))


def lane_rows(shot: Image, lane: int, height: int, x0: int = 0, x1: int | None = None):
    x1 = shot.width if x1 is None else x1
    for y in range(lane * height, (lane + 1) * height):
        for x in range(max(0, x0), min(shot.width, x1)):
            yield x, y, shot.pixel(x, y)


class TestTimelineData:
    def test_every_rank_and_step_is_a_block_with_its_waiting_and_detail_is_whole_steps_on_every_rank(self, tmp_path):
        """No browser: what the page is given, against the job's spans counted and measured by SQL."""
        write_job(tmp_path, SynthJob(job_id="d", ranks=8, steps=40, slow_ranks={3: 1.5}, compact=False))
        job = load_local(tmp_path, "d")
        data = timeline_data(job, analyze(job, AnalysisConfig()), max_spans=8 * 6 * 10)
        per_rank = dict(job.con.execute("SELECT rank, count(*) FROM events WHERE kind = 'span' AND cat = 'step' "
                                        "GROUP BY rank").fetchall())
        assert {r: len(b["step"]) for r, b in data["blocks"].items()} == per_rank
        assert [lane["rank"] for lane in data["lanes"]] == list(range(8))
        # Waiting: from each rank's arrival at its all_reduce to the last rank's, capped at its duration.
        colls = job.con.execute("SELECT rank, step, start, dur FROM events WHERE kind = 'span' AND cat = 'collective'")
        got = colls.fetchall()
        last = {}
        for _, step, start, _ in got:
            last[step] = max(last.get(step, start), start)
        for rank, step, start, dur in got:
            b = data["blocks"][rank]
            w = b["w"][b["step"].index(step)]
            assert abs(w - min(max(last[step] - start, 0), dur) / 1000) <= 1, (rank, step)
        # Detail: ten whole steps (step, three phases, optimizer, all_reduce) on all eight ranks, spread out.
        kept = data["detail"]["steps"]
        total = job.con.execute("SELECT count(*) FROM events WHERE kind = 'span'").fetchone()[0]
        assert len(kept) == 10 and min(kept) < 10 and max(kept) >= 30
        assert (data["detail"]["spans"], data["detail"]["spans_total"]) == (480, total) and data["truncated"]
        counts = Counter((s["rank"], s["step"]) for s in data["spans"])
        assert set(counts) == {(r, k) for r in range(8) for k in kept} and set(counts.values()) == {6}


# ---- a job with a slow rank, NaN losses from step 40 and a leaking rank ---------------------------

SLOW = 5
LEAK = 2
NAN_STEP = 40


@pytest.fixture(scope="module")
def slow_job(tmp_path_factory):
    d = tmp_path_factory.mktemp("render")
    write_job(d, SynthJob(job_id="slow<job>", ranks=8, steps=60, slow_ranks={SLOW: 1.6}, nan_step=NAN_STEP,
                          leaks={LEAK: (10, 40.0)}))
    job = load_local(d, "slow<job>")
    report = analyze(job, AnalysisConfig())
    return job, report, write_timeline_html(job, report, d / "slow.html")


def metric_points(job, key: str) -> dict[int, list[tuple[int, int, float]]]:
    """Per step, every rank's raw (ts, rank, value) of one metric, read from the metric events themselves."""
    out: dict[int, list[tuple[int, int, float]]] = {}
    for ts, rank, step, metrics in job.con.execute(
            "SELECT ts, rank, step, CAST(metrics AS VARCHAR) FROM events WHERE kind = 'metric'").fetchall():
        value = json.loads(metrics).get(key)
        if value is not None:
            out.setdefault(step, []).append((ts, rank, float(value)))
    return out


def own_time_by_rank(job) -> dict[int, float]:
    """Each rank's median step time less its waiting in the step's all_reduce (from the spans, by SQL)."""
    got = job.con.execute("""
        WITH c AS (SELECT rank, step, start, dur, json_extract_string(attrs, '$.seq') AS seq FROM events
                   WHERE kind = 'span' AND cat = 'collective'),
        w AS (SELECT c.rank, c.step, least(greatest(max(c.start) OVER (PARTITION BY c.seq) - c.start, 0), c.dur) AS w
              FROM c)
        SELECT s.rank, median(s.dur - coalesce(w.w, 0)) FROM events s LEFT JOIN w USING (rank, step)
        WHERE s.kind = 'span' AND s.cat = 'step' GROUP BY s.rank""").fetchall()
    return {int(r): float(v) for r, v in got}


class TestSlowRankJob:
    def test_the_heatmap_row_of_the_slow_rank_is_the_darkest(self, slow_job, browser):
        job, _, html = slow_job
        g = open_page(browser, html)
        own = own_time_by_rank(job)
        assert max(own, key=own.get) == SLOW  # the data: the slow rank's own time is the longest
        heat = browser.screenshot("#heat")
        rows = heat.height // len(g["ranks"])
        mean = {}
        for i, rank in enumerate(g["ranks"]):
            pixels = [heat.pixel(x, y) for y in range(i * rows + 1, (i + 1) * rows - 1) for x in range(0, heat.width, 3)]
            mean[rank] = statistics.fmean(luminance(p) for p in pixels)
        assert min(mean, key=mean.get) == SLOW, mean
        # Darker goes with slower, rank by rank (not only the extreme).
        order_drawn = sorted(mean, key=mean.get)
        order_data = sorted(own, key=own.get, reverse=True)
        assert order_drawn[0] == order_data[0] and order_drawn[-1] in order_data[len(order_data) // 2:]
        assert browser.errors == []

    def test_at_three_zooms_the_slow_rank_waits_least_and_each_wait_is_as_long_as_the_data(self, slow_job, browser,
                                                                                            tmp_path):
        job, _, html = slow_job
        g = open_page(browser, html)
        lane_h, ranks = g["lane"], g["ranks"]
        step_row = job.con.execute("SELECT min(start), max(ts) FROM events WHERE kind = 'span' AND cat = 'step' "
                                   "AND step = 30").fetchone()
        t_step = ((step_row[0] - g["t_min_ns"]) / 1000, (step_row[1] - g["t_min_ns"]) / 1000)
        zooms = [("far", g["t0"], g["t1"]),
                 ("steps 28-33", t_step[0] - 2 * (t_step[1] - t_step[0]), t_step[1] + 3 * (t_step[1] - t_step[0])),
                 ("step 30", t_step[0] - 1000, t_step[1] + 1000)]
        for name, a, b in zooms:
            v = zoom(browser, a, b)
            shot = browser.screenshot("#lanes")
            waiting = {r: sum(is_wait(p) for _, _, p in lane_rows(shot, i, lane_h)) for i, r in enumerate(ranks)}
            own = {r: sum(not is_wait(p) and p != (255, 255, 255) and p[2] > p[0] for _, _, p in lane_rows(shot, i, lane_h))
                   for i, r in enumerate(ranks)}
            assert min(waiting, key=waiting.get) == SLOW, (name, waiting)
            assert max(own, key=own.get) == SLOW, (name, own)
            assert all(waiting[r] > 0 for r in ranks if r != SLOW), (name, waiting)
            check_axis(browser)
            if name == "step 30":
                assert v["stats"]["detail"] and v["stats"]["spans"] > 0
                # Each rank's all_reduce of step 30: waiting from its arrival to the last rank's, by the data.
                colls = job.con.execute("SELECT rank, start, dur FROM events WHERE kind = 'span' AND cat = 'collective' "
                                        "AND step = 30").fetchall()
                last = max(start for _, start, _ in colls)
                for rank, start, dur in colls:
                    expect = min(max(last - start, 0), dur) / 1000 / (v["t1"] - v["t0"]) * v["width"]
                    i = ranks.index(rank)
                    x0 = int(px((start - g["t_min_ns"]) / 1000, v)) - 2
                    row = i * lane_h + 3 + 14 + 3  # the collectives' row in the lane
                    drawn = sum(is_wait(shot.pixel(x, row)) for x in range(max(0, x0), min(shot.width, x0 + int(expect) + 40)))
                    assert abs(drawn - expect) <= 3, (rank, drawn, expect)
        assert browser.errors == []

    def test_loss_and_memory_curves_are_drawn_where_the_metric_events_put_them(self, slow_job, browser):
        job, _, html = slow_job
        g = open_page(browser, html)
        v = zoom(browser, g["t0"], g["t1"])
        shot = browser.screenshot("#curves")
        geo = {c["key"]: c for c in g["curves"]}
        assert {"loss", "grad_norm", "lr", "rss_bytes"} <= set(geo)
        loss = metric_points(job, "loss")
        finite = [val for pts in loss.values() for _, _, val in pts if val == val]
        lo, hi = min(finite), max(finite)
        assert geo["loss"]["lo"] == pytest.approx(lo) and geo["loss"]["hi"] == pytest.approx(hi)
        cl = geo["loss"]

        def y_of(c, val):
            return c["top"] + 4 + (1 - (val - c["lo"]) / (c["hi"] - c["lo"])) * (c["h"] - 8)

        median_color = rgb(g["colors"]["median"])
        for step in range(2, NAN_STEP, 5):
            pts = loss[step]
            x = round(px((statistics.median(ts for ts, _, _ in pts) - g["t_min_ns"]) / 1000, v))
            y = y_of(cl, statistics.median(val for _, _, val in pts))
            column = [shot.pixel(x, yy) for yy in range(int(y) - 3, int(y) + 4)]
            assert any(near(p, median_color, 130) for p in column), (step, y, column)
        bad = rgb(g["colors"]["bad"])
        for step, expect in ((NAN_STEP + 5, True), (20, False)):
            x = round(px((statistics.median(ts for ts, _, _ in loss[step]) - g["t_min_ns"]) / 1000, v))
            marked = any(near(shot.pixel(xx, cl["top"] + 3), bad, 60) for xx in range(x - 1, x + 2))
            assert marked is expect, step
        # The leaking rank's own memory line, above everyone else's band, where its rss says.
        rss, cm = metric_points(job, "rss_bytes"), geo["rss_bytes"]
        series = rgb(g["colors"]["series"])
        for step in (30, 50):
            ts, _, val = next(p for p in rss[step] if p[1] == LEAK)
            x, y = round(px((ts - g["t_min_ns"]) / 1000, v)), y_of(cm, val)
            assert any(near(shot.pixel(x, yy), series, 130) for yy in range(int(y) - 3, int(y) + 4)), step
            others = statistics.median(val for _, r, val in rss[step] if r != LEAK)
            assert y < y_of(cm, others) - 5
        assert browser.errors == []

    def test_findings_are_marked_on_the_axis_and_focusing_one_keeps_every_tick_distinct(self, slow_job, browser):
        _, report, html = slow_job
        g = open_page(browser, html)
        assert sorted(browser.eval("[...document.querySelectorAll('#findings li')].map(e => e.dataset.kind)")) == sorted(
            f.kind for f in report.findings)
        v = zoom(browser, g["t0"], g["t1"])
        axis = browser.screenshot("#axis")
        for f in report.findings:
            x = round(px((f.time_range[0] - g["t_min_ns"]) / 1000, v))
            if 0 <= x < axis.width:
                assert any(near(axis.pixel(x, 20), rgb(c), 60) for c in SEVERITY), (f.kind, axis.pixel(x, 20))
        # Click the first finding's marker with the real mouse: it is focused, and the axis still reads right.
        f = report.findings[0]
        browser.eval("document.getElementById('axis').scrollIntoView()")
        box = browser.eval("(() => { const r = document.getElementById('axis').getBoundingClientRect(); "
                           "return [r.left, r.top]; })()")
        browser.click(box[0] + px((f.time_range[0] - g["t_min_ns"]) / 1000, v), box[1] + 19)
        assert browser.eval("window.jobtrace.state.highlight !== null")
        for i in range(len(report.findings)):
            browser.eval(f"window.jobtrace.focusFinding({i})")
            check_axis(browser)
        # The old bug: a millisecond around 12.56 s read "12.56 s" at every tick.
        zoom(browser, 12_560_000, 12_561_000)
        check_axis(browser)
        assert browser.errors == []

    def test_matched_collectives_are_linked_across_ranks_at_their_last_arrival(self, slow_job, browser):
        job, _, html = slow_job
        g = open_page(browser, html)
        colls = job.con.execute("SELECT rank, start, ts FROM events WHERE kind = 'span' AND cat = 'collective' "
                                "AND step = 12").fetchall()
        first, last, end = min(c[1] for c in colls), max(c[1] for c in colls), max(c[2] for c in colls)
        span = (end - first) / 1000
        v = zoom(browser, (first - g["t_min_ns"]) / 1000 - span, (end - g["t_min_ns"]) / 1000 + span)
        assert v["stats"]["links"] >= 1
        shot = browser.screenshot("#lanes")
        x = round(px((last - g["t_min_ns"]) / 1000, v))
        link = rgb(g["colors"]["link"])
        rows = len(g["ranks"]) * g["lane"]
        linked = sum(any(near(shot.pixel(xx, y), link, 60) for xx in (x - 1, x, x + 1)) for y in range(rows))
        assert linked >= 0.8 * rows, (linked, rows)
        # Far out there is nothing to link (instances are sub-pixel): no lines over the lanes.
        assert zoom(browser, g["t0"], g["t1"])["stats"]["links"] == 0
        assert browser.errors == []


# ---- a hang: rank 4 stops in forward, the others wait in all_reduce --------------------------------

class TestHang:
    def test_the_ranks_left_waiting_are_drawn_waiting_and_the_culprit_stuck(self, tmp_path, browser):
        write_job(tmp_path, SynthJob(job_id="hang", ranks=6, ranks_per_node=3, steps=25, hang_rank=4, hang_step=15,
                                     hang_s=400))
        job = load_local(tmp_path, "hang")
        report = analyze(job, AnalysisConfig())
        html = write_timeline_html(job, report, tmp_path / "hang.html")
        # The data: who was inside a collective at its last heartbeat, and when the last step ended.
        beats = dict(job.con.execute("SELECT rank, arg_max(CAST(attrs AS VARCHAR), ts) FROM events "
                                     "WHERE kind = 'heartbeat' GROUP BY rank").fetchall())
        in_op = {r for r, a in beats.items() if json.loads(a).get("in_op")}
        assert in_op == {0, 1, 2, 3, 5}
        last_end = job.con.execute("SELECT max(ts) FROM events WHERE kind = 'span'").fetchone()[0]
        g = open_page(browser, html)
        v = zoom(browser, g["t0"], g["t1"])
        x_end = px((last_end - g["t_min_ns"]) / 1000, v)
        assert x_end < v["width"] * 0.9  # the default view shows the steps and the hang after them
        shot = browser.screenshot("#lanes")
        stuck = rgb(g["colors"]["stuck"])
        for i, rank in enumerate(g["ranks"]):
            pixels = [p for _, _, p in lane_rows(shot, i, g["lane"], int(x_end) + 10, shot.width) if painted(p)]
            share_wait = sum(map(is_wait, pixels)) / len(pixels)
            share_stuck = sum(near(p, stuck, 40) for p in pixels) / len(pixels)
            if rank in in_op:
                assert share_wait > 0.8, (rank, share_wait)
            else:
                assert share_stuck > 0.8 and share_wait < 0.05, (rank, share_stuck)
        assert browser.errors == []


# ---- too big to keep every span: level of detail, every rank, and what was left out said -------

class TestLevelOfDetail:
    def test_every_rank_is_drawn_far_out_detail_on_zoom_and_the_page_says_what_it_left_out(self, tmp_path, browser):
        n_ranks, n_steps, slow = 96, 500, 70
        write_job(tmp_path, SynthJob(job_id="wide", ranks=n_ranks, steps=n_steps, compute_ms=20, slow_ranks={slow: 1.5},
                                     logs_per_step=0, memory=False, compact=False))
        job = load_local(tmp_path, "wide")
        report = analyze(job, AnalysisConfig())
        html = write_timeline_html(job, report, tmp_path / "wide.html", max_spans=20_000)
        total = job.con.execute("SELECT count(*) FROM events WHERE kind = 'span'").fetchone()[0]
        g = open_page(browser, html)
        note = browser.eval("document.getElementById('note').innerText")
        m = re.search(r"kept for ([0-9,]+) of ([0-9,]+) steps, on every rank: ([0-9,]+) of ([0-9,]+) spans "
                      r"\(([0-9,]+) left out\)", note)
        assert m, note
        kept_steps, all_steps, kept, spans, left = (int(x.replace(",", "")) for x in m.groups())
        assert (all_steps, spans) == (n_steps, total) and kept + left == total and 0 < kept <= 20_000
        assert kept == kept_steps * n_ranks * 6  # whole steps (step, 3 phases, optimizer, all_reduce) on every rank

        # Far out: every rank's lane is drawn, and the slow rank's waits least (its columns are the least red).
        v = zoom(browser, g["t0"], g["t1"])
        assert v["stats"]["binned"] > 0
        shot = browser.screenshot("#lanes")
        step_c, wait_c = rgb(g["colors"]["step"]), rgb(g["colors"]["wait"])
        axis = [b - a for a, b in zip(step_c, wait_c)]
        norm = sum(c * c for c in axis)
        share = {}
        for i, rank in enumerate(g["ranks"]):
            pixels = [p for _, _, p in lane_rows(shot, i, g["lane"]) if painted(p)]
            assert len(pixels) > 0.8 * shot.width * g["lane"] * 0.9, rank  # drawn across the training
            share[rank] = statistics.fmean(sum((p[k] - step_c[k]) * axis[k] for k in range(3)) / norm for p in pixels)
        assert min(share, key=share.get) == slow, sorted(share.items(), key=lambda kv: kv[1])[:3]

        # Zoomed to a kept step, every rank shows its phases; to a step left out, whole steps with their waiting.
        kept_list = browser.eval("window.jobtrace.data.detail.steps")
        assert len(kept_list) == kept_steps
        other = next(s for s in range(n_steps // 2, n_steps) if s not in kept_list)
        forward = rgb(g["colors"]["forward"])
        for step, detailed in ((kept_list[len(kept_list) // 2], True), (other, False)):
            a, b = job.con.execute("SELECT min(start), max(ts) FROM events WHERE kind = 'span' AND cat = 'step' "
                                   "AND step = ?", [step]).fetchone()
            v = zoom(browser, (a - g["t_min_ns"]) / 1000, (b - g["t_min_ns"]) / 1000)
            shot = browser.screenshot("#lanes")
            for i, rank in enumerate(g["ranks"]):
                pixels = [p for _, _, p in lane_rows(shot, i, g["lane"])]
                has_forward = sum(near(p, forward, 30) for p in pixels) > 20
                assert has_forward is detailed, (step, rank)
                if rank != slow:
                    assert sum(map(is_wait, pixels)) > 5, (step, rank)
            assert (v["stats"]["spans"] > 0) is detailed
        assert browser.errors == []


# ---- a real job: torch.distributed on CPU, one rank slowed ------------------------------------

@pytest.mark.torchjob
def test_a_real_torch_job_opens_on_its_training_and_names_its_slow_rank(tmp_path, browser):
    pytest.importorskip("torch")
    from jobtrace.demo import DemoConfig, run_job

    assert run_job(DemoConfig(job_id="real", data_dir=str(tmp_path), ranks=3, steps=24, slow_ranks=[2],
                              slow_ms=40)) == 0
    job = load_local(tmp_path, "real")
    report = analyze(job, AnalysisConfig())
    html = write_timeline_html(job, report, tmp_path / "real.html")
    g = open_page(browser, html)
    first, last = job.con.execute("SELECT min(start), max(ts) FROM events WHERE kind = 'span' AND cat = 'step'").fetchone()
    t_first, t_last = (first - g["t_min_ns"]) / 1000, (last - g["t_min_ns"]) / 1000
    # The default view is the training: it starts at the first step, not at the process start-up before it.
    assert t_first - 0.02 * (t_last - t_first) <= g["t0"] <= t_first
    assert g["t1"] >= t_last and g["t1"] - g["t0"] <= 1.1 * (t_last - t_first)
    heat = browser.screenshot("#heat")
    rows = heat.height // len(g["ranks"])
    mean = {r: statistics.fmean(luminance(heat.pixel(x, y)) for y in range(i * rows + 1, (i + 1) * rows - 1)
                                for x in range(heat.width))
            for i, r in enumerate(g["ranks"])}
    assert min(mean, key=mean.get) == 2, mean
    v = zoom(browser, g["t0"], g["t1"])
    geo = {c["key"]: c for c in g["curves"]}
    assert "loss" in geo
    shot = browser.screenshot("#curves")
    loss, cl = metric_points(job, "loss"), geo["loss"]
    median_color = rgb(g["colors"]["median"])
    hits = 0
    for step in sorted(loss)[1:-1:3]:
        pts = loss[step]
        x = round(px((statistics.median(ts for ts, _, _ in pts) - g["t_min_ns"]) / 1000, v))
        val = statistics.median(val for _, _, val in pts)
        y = cl["top"] + 4 + (1 - (val - cl["lo"]) / (cl["hi"] - cl["lo"])) * (cl["h"] - 8)
        hits += any(near(shot.pixel(x, yy), median_color, 130) for yy in range(int(y) - 3, int(y) + 4))
        assert 0 <= x < shot.width
    assert hits >= 0.8 * len(sorted(loss)[1:-1:3])
    check_axis(browser)
    assert browser.errors == []
