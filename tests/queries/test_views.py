"""The views: backend links (escaping) and the HTML timeline rendered in headless Chromium.

The Perfetto trace has its own tests (``test_perfetto.py``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from jobtrace.synth import SynthJob, write_job
from queries import (
    AnalysisConfig,
    LinkConfig,
    analyze,
    grafana_explore_url,
    kibana_discover_url,
    kql_query,
    load_local,
    logql_query,
    write_timeline_html,
)
from queries._links import rison

from .chromium import open_browser

NASTY = 'job"x\\y | {a="b"} & #frag %20 \'q\' !bang\n'


class TestLinks:
    def test_logql_escapes_the_job_id_and_selects_ranks_and_spans(self):
        q = logql_query(NASTY, [3, 1], ["00ab", "ff01"])
        assert q.startswith('{training_job="job\\"x\\\\y | {a=\\"b\\"} & #frag %20 \'q\' !bang\\n"} | json')
        assert q.endswith('| rank=~"1|3" | span_id=~"00ab|ff01"')
        with pytest.raises(ValueError):
            logql_query("j", job_label='job"} |= "x')

    def test_grafana_url_round_trips_through_the_query_string(self):
        expr = logql_query(NASTY, [2])
        url = grafana_explore_url("http://grafana:3000/", "uid&1", expr, 1_700_000_000_123_456_789, 1_700_000_001_000_000_001)
        parts = urlsplit(url)
        assert parts.path == "/explore" and "&" not in parts.query.split("panes=")[1].split("&orgId")[0]
        qs = parse_qs(parts.query)
        assert qs["schemaVersion"] == ["1"] and qs["orgId"] == ["1"]
        pane = json.loads(qs["panes"][0])["jt"]
        assert pane["datasource"] == "uid&1" and pane["queries"][0]["expr"] == expr
        assert pane["range"] == {"from": "1700000000123", "to": "1700000001001"}

    def test_kql_and_rison_escape_quotes_and_bangs(self):
        kql = kql_query(NASTY, [1, 2], ["ab"])
        assert kql == 'job:"job\\"x\\\\y | {a=\\"b\\"} & #frag %20 \'q\' !bang\n" and rank:(1 or 2) and span_id:("ab")'
        assert rison({"a": "it's!", "b": [1, True, None], "c d": "x"}) == "(a:'it!'s!!',b:!(1,!t,!n),'c d':'x')"
        with pytest.raises(ValueError):
            kql_query("j", fields={"job": "job or *"})

    def test_kibana_url_keeps_the_state_inside_its_parameters(self):
        url = kibana_discover_url("https://kibana.example/", "view'1", kql_query(NASTY), 1_700_000_000_000_000_000,
                                  1_700_000_060_000_000_000)
        head, frag = url.split("#", 1)
        assert head == "https://kibana.example/app/discover" and frag.startswith("/?_g=")
        params = dict(p.split("=", 1) for p in frag[2:].split("&"))
        assert set(params) == {"_g", "_a"}
        g, a = unquote(params["_g"]), unquote(params["_a"])
        assert g == "(time:(from:'2023-11-14T22:13:20.000Z',to:'2023-11-14T22:14:20.000Z'))"
        assert "index:'view!'1'" in a and "language:'kuery'" in a and "!!bang" in a

    def test_findings_get_links_for_their_own_events(self, tmp_path):
        write_job(tmp_path, SynthJob(job_id="slow&co", ranks=8, steps=30, slow_ranks={5: 2.0}))
        cfg = LinkConfig(grafana_url="http://g", grafana_datasource="loki", kibana_url="http://k", kibana_data_view="dv")
        report = analyze(load_local(tmp_path, "slow&co"), links=cfg)
        (f,) = report.findings
        pane = json.loads(parse_qs(urlsplit(f.links["grafana"]).query)["panes"][0])["jt"]
        expr = pane["queries"][0]["expr"]
        assert expr.startswith('{training_job="slow&co"} | json | rank=~"5" | span_id=~"') and all(
            r["span_id"] in expr for r in f.refs)
        lo, hi = int(pane["range"]["from"]), int(pane["range"]["to"])
        assert lo * 1_000_000 <= f.time_range[0] and hi * 1_000_000 >= f.time_range[1]
        assert "rank:(5)" in unquote(f.links["kibana"])


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory):
    d = tmp_path_factory.mktemp("views")
    write_job(d, SynthJob(job_id="hang</script><b>x", ranks=6, ranks_per_node=3, steps=25, hang_rank=4, hang_step=15,
                          hang_s=400))
    job = load_local(d, "hang</script><b>x")
    return job, analyze(job, AnalysisConfig())


@pytest.fixture
def browser():
    with open_browser() as page:
        yield page


class TestTimelineInChromium:
    def test_page_renders_marks_the_culprit_lane_and_zooms_without_errors(self, hung_job, tmp_path, browser):
        job, report = hung_job
        html = write_timeline_html(job, report, tmp_path / "timeline.html")
        text = html.read_text()
        assert "<b>x" not in text and "hang</script>" not in text
        # Self-contained: nothing in the page loads a resource (the script may name http(s) to vet links).
        assert not re.search(r"""\b(?:src|href)\s*=|<link\b|@import|url\(""", text)
        browser.open(html)
        lanes = browser.eval("[...document.querySelectorAll('.lane[data-rank]')].map(e => [e.dataset.rank, e.className])")
        assert len(lanes) == 6
        assert [r for r, cls in lanes if "culprit" in cls] == ["4"]
        lane_h = browser.eval("window.jobtrace.lane")
        assert browser.eval("document.title") == "jobtrace timeline: hang</script><b>x"
        assert browser.eval("document.querySelectorAll('b').length") == 0  # the job id stayed text
        kinds = browser.eval("[...document.querySelectorAll('#findings li')].map(e => e.dataset.kind)")
        assert kinds == ["stalled_rank"]
        # Something was drawn in the culprit's lane.
        painted = browser.eval(
            "(() => { const c = document.getElementById('lanes'); const d = c.getContext('2d')"
            f".getImageData(0, 4 * {lane_h} + 2, c.width, {lane_h - 4}).data; let n = 0;"
            " for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0) n++; return n; })()")
        assert painted > 100
        # Zoom with the wheel, pan by dragging, focus a finding, reset.
        t1 = browser.eval("window.jobtrace.state.t1 - window.jobtrace.state.t0")
        browser.eval("document.getElementById('lanes').dispatchEvent(new WheelEvent('wheel', "
                     "{deltaY: -500, clientX: 600, clientY: 100, bubbles: true, cancelable: true}))")
        assert browser.eval("window.jobtrace.state.t1 - window.jobtrace.state.t0") < t1
        browser.eval("document.querySelector('#findings li').click()")
        assert browser.eval("window.jobtrace.state.highlight.kind") == "stalled_rank"
        browser.eval("document.getElementById('lanes').dispatchEvent(new MouseEvent('dblclick', {bubbles: true}))")
        assert browser.eval("window.jobtrace.state.t1 - window.jobtrace.state.t0") == pytest.approx(t1)
        assert browser.eval("window.jobtrace.state.highlight") is None
        browser.pump(0.5)
        if os.environ.get("JOBTRACE_SCREENSHOT"):
            import base64

            shot = browser.call("Page.captureScreenshot", format="png")["data"]
            Path(os.environ["JOBTRACE_SCREENSHOT"]).write_bytes(base64.b64decode(shot))
        assert browser.errors == []
