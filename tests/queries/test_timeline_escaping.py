"""The HTML timeline and the backend links stay safe whatever a job's text holds.

A job's log lines, job id, node name, span and logger names are whatever the training code and
its libraries wrote, so the views must show them as text in every context they land in: an HTML
title, a JSON ``<script>`` block, DOM text, tooltips, attribute values, link URLs. The job here is
made the way real ones are (the instrumentation, in one process per rank, writing to the embedded
store) with script, markup, attribute break-out and ``javascript:`` payloads in every one of those
fields; the timeline is written by the real code (``write_timeline_html``, ``trace-job --timeline``)
and run in a real headless Chromium, where the test clicks the findings and hovers the spans and
log ticks so that every piece of text is rendered. Then no payload may have run or become an
element, and every payload must be on screen, literally. The links' parameters must decode back
to exactly the query asked for.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from click.testing import CliRunner

from jobtrace.cli import trace_job
from jobtrace.errors import ConfigError
from queries import LinkConfig, analyze, grafana_explore_url, kibana_discover_url, load_local, write_timeline_html
from queries._model import Report
from tests.conftest import PYTHON, python_env

from .chromium import Page, open_browser

PAYLOADS = (
    "<script>window.__pwned=1</script>",
    "</script><script>window.__pwned=2</script>",
    '"><img src=x onerror="window.__pwned=3">',
    "'onmouseover='window.__pwned=4",
    "javascript:window.__pwned=5",
    "<svg onload=window.__pwned=6>",
    "<!-- <script>window.__pwned=12</script> -->",
)
"""What a hostile (or just unlucky) log line can hold: each would run if it reached the DOM as markup."""

JOB = ('<svg onload=window.__pwned=6>"><img src=x onerror="window.__pwned=3">'
       "'onmouseover='javascript:window.__pwned=5<script>window.__pwned=1 __DATA__ __TITLE__ <!--")
"""A job id cannot hold ``/`` (it names a directory); everything else it can, template markers included."""

NODE = "node</script><img src=x onerror=window.__pwned=7>"
SPAN = "</script><script>window.__pwned=2</script>" + '"><img src=x onerror="window.__pwned=3">'
LOGGER = "</script><svg onload=window.__pwned=6>"
WARNING = "step {} " + " ".join(PAYLOADS)
OOM = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB " + PAYLOADS[0] + PAYLOADS[3]

BAD_LINKS = {
    "evil": "javascript:window.__pwned=8",
    "data": "data:text/html,<script>window.__pwned=9</script>",
    "spaced": " JaVaScRiPt:window.__pwned=10",
    "tabbed": "java\tscript:window.__pwned=11",
    "relative": "/explore?x=1",
}
"""Links no page may make clickable: what a bad configuration or a tampered report could carry."""

LINKS = LinkConfig(grafana_url="http://grafana.example:3000/", grafana_datasource='loki&"uid',
                   kibana_url="https://kibana.example/", kibana_data_view="dv'1!")

_RANK = textwrap.dedent(
    """
    import json, logging, sys, time
    import otel_instrumentation as oi

    spec = json.load(open(sys.argv[1]))
    rank = int(sys.argv[2])
    oi.init_tracing(spec["job"], data_dir="store", torch=False)
    log = logging.getLogger(spec["logger"])
    for i in range(8):
        with oi.step(i):
            with oi.phase("forward"):
                with oi.span(spec["span"]):
                    time.sleep(0.004)
            with oi.phase("backward"):
                time.sleep(0.002)
        log.warning(spec["warning"].format(i))
    if rank == 1:
        log.error(spec["oom"])
        raise ValueError(spec["warning"].format("last"))
    """)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[Path, Any, Report]:
    """A two-rank job traced by the real instrumentation; rank 1 runs out of GPU memory and dies."""
    d = tmp_path_factory.mktemp("hostile")
    (d / "rank.py").write_text(_RANK)
    (d / "spec.json").write_text(json.dumps({"job": JOB, "logger": LOGGER, "span": SPAN, "warning": WARNING,
                                             "oom": OOM}))
    for rank in (0, 1):
        env = python_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", JOBTRACE_NODE=NODE)
        proc = subprocess.run([PYTHON, "rank.py", "spec.json", str(rank)], cwd=d, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == (1 if rank else 0), proc.stderr
    job = load_local(d / "store", JOB)
    report = analyze(job, links=LINKS)
    assert report.findings and any(OOM in line for f in report.findings for line in f.evidence)
    return d, job, report


# ---- the links ---------------------------------------------------------------------------------

def _unquote_string(literal: str) -> str:
    r"""The text of a LogQL (Go) or KQL double-quoted string body: ``\x``, ``\n``… and ``\c`` for any other c."""
    named = {"n": "\n", "r": "\r", "t": "\t"}
    return re.sub(r"\\(x[0-9a-f]{2}|.)", lambda m: chr(int(m[1][1:], 16)) if len(m[1]) == 3
                  else named.get(m[1], m[1]), literal, flags=re.S)


def _rison(text: str) -> Any:
    """A Rison decoder, written from the spec and not from ``queries._links``, so the two can disagree."""
    pos = 0

    def value() -> Any:
        nonlocal pos
        c = text[pos]
        if c == "'":
            out, pos = [], pos + 1
            while text[pos] != "'":
                if text[pos] == "!":
                    pos += 1
                out.append(text[pos])
                pos += 1
            pos += 1
            return "".join(out)
        if c == "(":
            obj, pos = {}, pos + 1
            while text[pos] != ")":
                key = value()
                assert text[pos] == ":", text[pos:]
                pos += 1
                obj[key] = value()
                pos += text[pos] == ","
            pos += 1
            return obj
        if text.startswith("!(", pos):
            arr, pos = [], pos + 2
            while text[pos] != ")":
                arr.append(value())
                pos += text[pos] == ","
            pos += 1
            return arr
        if text.startswith(("!t", "!f", "!n"), pos):
            pos += 2
            return {"!t": True, "!f": False, "!n": None}[text[pos - 2:pos]]
        m = re.compile(r"-?[0-9][0-9.eE+-]*|[A-Za-z_.~@][A-Za-z0-9_.~@-]*").match(text, pos)
        assert m, text[pos:]
        pos = m.end()
        return m[0]

    out = value()
    assert pos == len(text), text[pos:]
    return out


class TestLinks:
    def test_grafana_link_parameters_are_encoded_and_decode_to_the_query(self, hostile):
        _, _, report = hostile
        f = report.findings[0]
        url = f.links["grafana"]
        parts = urlsplit(url)
        assert (parts.scheme, parts.netloc, parts.path, parts.fragment) == ("http", "grafana.example:3000", "/explore", "")
        # Nothing but unreserved characters and escapes between the parameters' own & and =.
        assert re.fullmatch(r"[A-Za-z0-9%._~-]+(?:=[A-Za-z0-9%._~-]*)?(?:&[A-Za-z0-9%._~-]+=[A-Za-z0-9%._~-]*)*",
                            parts.query), parts.query
        qs = parse_qs(parts.query, strict_parsing=True)
        assert set(qs) == {"schemaVersion", "panes", "orgId"} and all(len(v) == 1 for v in qs.values())
        pane = json.loads(qs["panes"][0])["jt"]
        assert pane["datasource"] == 'loki&"uid' == pane["queries"][0]["datasource"]["uid"]
        expr = pane["queries"][0]["expr"]
        m = re.fullmatch(r'\{training_job="((?:[^"\\]|\\.)*)"\} \| json \| rank=~"1"(?: \| span_id=~"[0-9a-f|]+")?', expr)
        assert m, expr
        assert _unquote_string(m[1]) == JOB

    def test_kibana_link_parameters_are_encoded_and_decode_to_the_query(self, hostile):
        _, _, report = hostile
        url = report.findings[0].links["kibana"]
        head, frag = url.split("#", 1)
        assert head == "https://kibana.example/app/discover" and frag.startswith("/?")
        assert re.fullmatch(r"[A-Za-z0-9%._~!'()*,:@$/&=?-]+", frag), frag  # no quote, space, <, >, # or +
        params = dict(p.split("=", 1) for p in frag[2:].split("&"))
        assert set(params) == {"_g", "_a"}
        a = _rison(unquote(params["_a"]))
        assert a["index"] == "dv'1!" and a["query"]["language"] == "kuery"
        m = re.fullmatch(r'job:"((?:[^"\\]|\\.)*)" and rank:\(1\)(?: and span_id:\(.*\))?', a["query"]["query"])
        assert m, a["query"]["query"]
        assert _unquote_string(m[1]) == JOB
        assert set(_rison(unquote(params["_g"]))["time"]) == {"from", "to"}

    @pytest.mark.parametrize("base", ["javascript:alert(1)//", "data:text/html,x", " http://g", "java\tscript://x",
                                      "//grafana", "grafana:3000", "http://"])
    def test_a_base_url_that_is_not_http_makes_no_link(self, base):
        with pytest.raises(ConfigError, match="http"):
            LinkConfig(grafana_url=base, grafana_datasource="loki")
        with pytest.raises(ConfigError, match="http"):
            LinkConfig(kibana_url=base, kibana_data_view="dv")
        with pytest.raises(ValueError, match="http"):
            grafana_explore_url(base, "uid", "{job=\"j\"}", 0, 1)
        with pytest.raises(ValueError, match="http"):
            kibana_discover_url(base, "dv", "job:\"j\"", 0, 1)

    def test_trace_job_refuses_a_javascript_grafana_url_and_writes_no_page(self, hostile, tmp_path):
        d, _, _ = hostile
        out = tmp_path / "t.html"
        res = CliRunner().invoke(trace_job, [JOB, "--data-dir", str(d / "store"), "--timeline", str(out),
                                             "--grafana-url", "javascript:window.__pwned=5//", "--grafana-datasource",
                                             "loki"])
        assert res.exit_code == 2 and "http(s) URL" in res.output, res.output
        assert not out.exists()


# ---- the page ----------------------------------------------------------------------------------

_INTRUDERS = """(() => {
  const bad = [];
  const scripts = document.querySelectorAll("script");
  if (scripts.length !== 2) bad.push(scripts.length + " script elements");
  for (const e of document.querySelectorAll("img, svg, iframe, object, embed, frame, link, meta[http-equiv], base, form"))
    bad.push(e.outerHTML.slice(0, 200));
  for (const e of document.querySelectorAll("*")) {
    for (const a of e.attributes) {
      if (/^on/i.test(a.name) || /^\\s*(javascript|data|vbscript):/i.test(a.value)) bad.push(e.tagName + " " + a.name + "=" + a.value);
    }
  }
  for (const a of document.querySelectorAll("a")) {
    if (!["http:", "https:"].includes(new URL(a.href).protocol)) bad.push("link " + a.href);
  }
  return bad;
})()"""
"""Every element or attribute the page's own code does not make: what an escaped payload would leave."""


def _pwned(page: Page) -> Any:
    return page.eval("window.__pwned === undefined ? null : window.__pwned")


def _hover(page: Page, rank: int, t_us: float) -> str:
    """Zoom so ``t_us`` is mid-screen on ``rank``'s lane, move the real mouse there, and return the tooltip's text."""
    page.eval(f"window.jobtrace.zoom({t_us} - 400, {t_us} + 400)")
    page.eval("document.getElementById('lanes').scrollIntoView()")
    x, y = page.eval(f"""(() => {{ const r = document.getElementById('lanes').getBoundingClientRect();
        const i = window.jobtrace.data.lanes.findIndex((l) => l.rank === {rank}), h = window.jobtrace.lane;
        return [r.left + r.width / 2, r.top + i * h + h / 2]; }})()""")
    page.mouse("mouseMoved", x, y)
    tip = page.eval("(() => { const t = document.getElementById('tip'); return [getComputedStyle(t).display, t.innerText]; })()")
    assert tip[0] == "block", f"no tooltip at rank {rank}, t={t_us}"
    return str(tip[1])


class TestTimelineInChromium:
    def test_no_payload_runs_or_becomes_markup_and_every_one_is_shown(self, hostile, tmp_path):
        _, job, report = hostile
        report = copy.deepcopy(report)
        for f in report.findings:
            f.links.update(BAD_LINKS)
        html = write_timeline_html(job, report, tmp_path / "timeline.html")
        text = html.read_text(encoding="utf-8")
        # The file itself: the page's two script blocks, a data block with no "<" in it at all, no markup.
        assert text.count("<script") == 2 and not any(p in text for p in ("<img", "<svg", "<!--"))
        block = text.split('<script id="data" type="application/json">', 1)[1].split("</script>", 1)[0]
        assert "<" not in block and json.loads(block)["job"] == JOB

        with open_browser() as page:
            page.open(html)
            assert page.eval("document.title") == f"jobtrace timeline: {JOB}"
            assert page.eval("document.getElementById('title').textContent") == f"jobtrace: {JOB}"
            assert page.eval("window.jobtrace.data.job") == JOB  # the JSON block gave back exactly the text
            labels = page.eval("[...document.querySelectorAll('.lane[data-rank]')].map((e) => e.textContent)")
            assert labels and all(NODE in label for label in labels)

            # Every finding clicked with the real mouse: its summary, evidence and links shown.
            n = page.eval("document.querySelectorAll('#findings li').length")
            assert n == len(report.findings)
            shown: list[str] = []
            for i in range(n):
                x, y = page.eval(f"""(() => {{ const r = document.querySelectorAll('#findings li')[{i}]
                    .getBoundingClientRect(); return [r.left + 20, r.top + r.height / 2]; }})()""")
                page.click(x, y)
                assert page.eval("window.jobtrace.state.highlight.kind") == report.findings[i].kind
                detail = page.eval("document.getElementById('detail').innerText")
                shown.append(detail)
                links = page.eval("[...document.querySelectorAll('#detail a')].map((a) => [a.textContent, a.href])")
                assert [name for name, _ in links] == ["grafana", "kibana"]
                assert [href for _, href in links] == [report.findings[i].links["grafana"],
                                                       report.findings[i].links["kibana"]]
                as_text = page.eval("[...document.querySelectorAll('#detail .links span')].map((e) => e.textContent)")
                assert as_text == [f"{name}: {raw}" for name, raw in BAD_LINKS.items()]  # shown, as text
                assert all(" ".join(f"{name}: {raw}".split()) in detail for name, raw in BAD_LINKS.items())

            # Hover a span with the hostile name and a warning tick with the hostile logger and message.
            data = page.eval("window.jobtrace.data")
            spans = page.eval("Array.from({length: window.jobtrace.data.spans.d.length}, (_, i) => window.jobtrace.span(i))")
            span = next(s for s in spans if s["name"] == SPAN and s["rank"] == 0)
            shown.append(_hover(page, 0, span["s"] + span["d"] / 2))
            mark = next(m for m in data["marks"] if m["logger"] == LOGGER and m["rank"] == 1)
            shown.append(_hover(page, 1, mark["t"]))
            page.pump(1.0)  # an <img src=x> would fail to load and fire onerror by now
            bad, pwned, errors = page.eval(_INTRUDERS), _pwned(page), list(page.errors)
            visible = page.eval("document.body.innerText")

        assert pwned is None and bad == [] and errors == []
        everything = "\n".join([visible, *shown])
        for needle in (JOB, NODE, SPAN, LOGGER, OOM, *PAYLOADS):
            assert needle in everything, f"not shown: {needle!r}"
        assert SPAN in shown[-2] and LOGGER in shown[-1] and all(p in shown[-1] for p in PAYLOADS)
        assert any(OOM in d and NODE in d for d in shown[:-2])

    def test_trace_job_timeline_of_the_job_is_inert(self, hostile, tmp_path):
        """The page ``trace-job --timeline`` writes (links from the real options): nothing runs, nothing added."""
        d, _, _ = hostile
        out = tmp_path / "cli.html"
        res = CliRunner().invoke(trace_job, [JOB, "--data-dir", str(d / "store"), "--timeline", str(out),
                                             "--grafana-url", "http://grafana.example:3000", "--grafana-datasource",
                                             "loki", "--kibana-url", "https://kibana.example",
                                             "--kibana-data-view", "dv"])
        assert res.exit_code == 1, res.output  # a problem found: rank 1 ran out of memory
        with open_browser() as page:
            page.open(out)
            x, y = page.eval("""(() => { const r = document.querySelector('#findings li').getBoundingClientRect();
                return [r.left + 20, r.top + r.height / 2]; })()""")
            page.click(x, y)
            page.pump(0.5)
            assert page.eval("document.title") == f"jobtrace timeline: {JOB}"
            assert len(page.eval("[...document.querySelectorAll('#detail a')].map((a) => a.href)")) == 2
            assert (_pwned(page), page.eval(_INTRUDERS), page.errors) == (None, [], [])
