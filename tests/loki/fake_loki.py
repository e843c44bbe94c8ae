"""A Loki stand-in that follows Loki's documented HTTP API, for the tests of ``trace-job`` on Loki.

There is no Loki server here; this fake implements exactly the documented behaviour
the reader depends on (docs/sources/reference/loki-http-api.md, shared/reference/backends.md §2):

* ``GET /loki/api/v1/query_range`` with a stream selector: entries with
  ``start <= ts < end`` (start inclusive, end exclusive), sorted by time in
  ``direction`` (forward/backward, default backward), at most ``limit`` (default
  100; above ``max_entries_limit_per_query`` → 400 "max entries limit per query
  exceeded"), grouped into ``{"stream": labels, "values": [["<ns>", line], …]}``;
  with ``X-Loki-Response-Encoding-Flags: categorize-labels`` each value carries a
  third element ``{"structuredMetadata": {…}}`` and streams are the indexed labels only;
  without it, structured metadata is merged into the stream labels (so entries with
  different metadata land in different streams, as in Loki 3.x).
* ``sum(count_over_time(<selector> [<n>s]))`` with ``step``: a matrix with one point
  per step from ``start`` to ``end``, each counting entries in ``(t - range, t]``,
  points with no entry left out.
* ``GET /loki/api/v1/query`` (an instant query at ``time``, ns): ``sum [by (<label>)]
  (count_over_time(<log query> [<n>s|ms]))`` as a vector, one sample per group (a group
  whose label is missing has it absent from ``metric``); more series than ``max_series``
  (Loki's ``max_query_series``, 500) or a range over ``max_query_length`` (721h) is a 400.
* Log queries may carry label filter stages (``| rank >= 0``, ``| rank=~"3|17" or (rank >= 5
  and rank < 9) or rank=""``) on stream labels and structured metadata, as Loki 3.x evaluates
  them: string matchers see a missing label as ``""`` (regexes fully anchored), a numeric
  comparison drops a line without the label.
* ``POST /loki/api/v1/push``: snappy protobuf (decoded with the classes compiled from
  Loki's push.proto) or JSON; 204.

Selectors are parsed the way Loki does (Go string unquoting, RE2-compatible regex
fully anchored); anything else is a 400, so a malformed query fails the test.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from shippers import Request, Response

_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")')
_METRIC = re.compile(r"^sum(?: by \((\w+)\))? ?\(count_over_time\((\{.*)\s*\[(\d+)(s|ms)\]\)\)$")
_FILTER_TOKEN = re.compile(r'\s*(\(|\)|\band\b|\bor\b|(\w+)\s*(=~|!~|!=|==|>=|<=|=|>|<)\s*("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?))')
_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000}


def go_unquote(text: str) -> str:
    """Go's strconv.Unquote for a double-quoted string (what Loki's lexer applies)."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise ValueError(f"not a quoted string: {text!r}")
    body, out, i = text[1:-1], [], 0
    simple = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
              "'": "'"}
    while i < len(body):
        ch = body[i]
        if ch == '"':
            raise ValueError("unescaped quote inside a string")
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in simple:
            out.append(simple[nxt])
            i += 2
        elif nxt == "x":
            out.append(chr(int(body[i + 2:i + 4], 16)))
            i += 4
        elif nxt == "u":
            out.append(chr(int(body[i + 2:i + 6], 16)))
            i += 6
        else:
            raise ValueError(f"invalid escape \\{nxt}")
    return "".join(out)


@dataclass
class Entry:
    labels: dict[str, str]
    ts: int
    line: str
    metadata: dict[str, str] = field(default_factory=dict)


class FakeLoki:
    """``InMemoryTransport(FakeLoki())`` answers like a Loki 3.x server."""

    def __init__(self, *, max_entries: int = 5000, push_pb2: Any = None, max_series: int = 500,
                 max_query_length_ns: int = 721 * 3600 * 10**9) -> None:
        self.entries: list[Entry] = []
        self.max_entries = max_entries
        self.max_series = max_series
        self.max_query_length_ns = max_query_length_ns
        self.push_pb2 = push_pb2
        self.queries: list[dict[str, str]] = []
        self.pushes = 0

    def add(self, labels: dict[str, str], ts: int, line: str, metadata: dict[str, str] | None = None) -> None:
        self.entries.append(Entry(dict(labels), ts, line, dict(metadata or {})))

    def _sorted(self) -> tuple[list[Entry], list[int]]:
        """Entries by time (stable: insertion order within a timestamp), and their timestamps."""
        if getattr(self, "_index_n", -1) != len(self.entries) or getattr(self, "_index_src", None) is not self.entries:
            self._index = sorted(self.entries, key=lambda e: e.ts)
            self._stamps = [e.ts for e in self._index]
            self._index_n, self._index_src = len(self.entries), self.entries
        return self._index, self._stamps

    # ---- transport handler --------------------------------------------------------------------------
    def __call__(self, request: Request) -> Response:
        parts = urlsplit(request.url)
        if parts.path.endswith("/loki/api/v1/push") and request.method == "POST":
            return self._push(request)
        if parts.path.endswith("/loki/api/v1/query_range") and request.method == "GET":
            params = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            self.queries.append(params)
            try:
                return self._query_range(params, dict(request.headers))
            except ValueError as exc:
                return Response(400, str(exc).encode())
        if parts.path.endswith("/loki/api/v1/query") and request.method == "GET":
            params = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            self.queries.append(params)
            try:
                return self._instant(params)
            except ValueError as exc:
                return Response(400, str(exc).encode())
        if parts.path.endswith("/loki/api/v1/series"):
            params = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            self.queries.append(params)
            return self._series(params)
        return Response(404, b"404 page not found\n")

    def _series(self, params: dict[str, str]) -> Response:
        match = self._matcher(params["match[]"])
        start, end = int(params["start"]), int(params["end"])
        found = {tuple(sorted(e.labels.items())) for e in self.entries if start <= e.ts < end and match(e)}
        return Response(200, orjson.dumps({"status": "success", "data": [dict(k) for k in sorted(found)]}))

    def _matcher(self, selector: str) -> Any:
        """A predicate on entries for a log query: a stream selector, then label filter stages."""
        from queries._loki import split_pipeline

        streams, pipeline = split_pipeline(selector.strip())
        text = streams.strip()
        if not (text.startswith("{") and text.endswith("}")):
            raise ValueError(f"parse error: cannot parse selector {selector!r}")
        parts = _MATCHER.findall(text[1:-1])
        rebuilt = ", ".join(f"{n}{op}{q}" for n, op, q in parts)
        if not parts or rebuilt.replace(" ", "") != text[1:-1].replace(" ", ""):
            raise ValueError(f"parse error: cannot parse selector {selector!r}")
        checks = [self._one(*p) for p in parts]
        if pipeline.strip() and not pipeline.strip().startswith("|"):
            raise ValueError(f"parse error: unexpected {pipeline!r}")
        stages = [self._label_filter(stage) for stage in _stages(pipeline)]
        return lambda e: all(c(e) for c in checks) and all(f({**e.labels, **e.metadata}) for f in stages)

    def _label_filter(self, stage: str) -> Any:
        """One ``| <label filter expression>`` stage: matchers and numeric comparisons joined by ``and``/``or``
        (``and`` binds tighter) and parentheses, as LogQL's grammar has them."""
        return _FilterParser(stage).parse()

    def _one(self, name: str, op: str, quoted: str) -> Any:
        value = go_unquote(quoted)
        ok: Callable[[str], bool]
        if op in ("=~", "!~"):
            rx = re.compile(value)  # Loki anchors label regexes
            ok = (lambda v: rx.fullmatch(v) is not None) if op == "=~" else (lambda v: rx.fullmatch(v) is None)
        else:
            ok = (lambda v: v == value) if op == "=" else (lambda v: v != value)
        return lambda e: ok(e.labels.get(name, ""))

    def _query_range(self, params: dict[str, str], headers: dict[str, str]) -> Response:
        query = params["query"]
        start = int(params.get("start", 0))
        end = int(params.get("end", 2**63 - 1))
        metric = _METRIC.match(query)
        if metric:
            if metric.group(1) or metric.group(4) != "s":
                raise ValueError("this fake answers only sum(count_over_time(… [Ns])) over a range")
            return self._count(metric.group(2), int(metric.group(3)), start, end, params)
        limit = int(params.get("limit", 100))
        if limit > self.max_entries:
            raise ValueError(f"max entries limit per query exceeded, limit > max_entries_limit_per_query "
                             f"({limit} > {self.max_entries})")
        match = self._matcher(query)
        forward = params.get("direction", "backward") == "forward"
        index, stamps = self._sorted()
        lo, hi = bisect.bisect_left(stamps, start), bisect.bisect_left(stamps, end)
        picked: list[Entry] = []
        for i in (range(lo, hi) if forward else range(hi - 1, lo - 1, -1)):
            if match(index[i]):
                picked.append(index[i])
                if len(picked) == limit:
                    break
        categorize = "categorize-labels" in headers.get("X-Loki-Response-Encoding-Flags", "")
        streams: dict[tuple[tuple[str, str], ...], list[list[Any]]] = {}
        for e in picked:
            labels = dict(e.labels) if categorize else {**e.labels, **e.metadata}
            value: list[Any] = [str(e.ts), e.line]
            if categorize and e.metadata:
                value.append({"structuredMetadata": dict(e.metadata)})
            streams.setdefault(tuple(sorted(labels.items())), []).append(value)
        result = [{"stream": dict(k), "values": v} for k, v in streams.items()]
        data: dict[str, Any] = {"resultType": "streams", "result": result, "stats": {}}
        if categorize:
            data["encodingFlags"] = ["categorize-labels"]
        return Response(200, orjson.dumps({"status": "success", "data": data}))

    def _count(self, selector: str, range_s: int, start: int, end: int, params: dict[str, str]) -> Response:
        match = self._matcher(selector)
        step = int(params["step"].rstrip("s")) * 1_000_000_000
        rng = range_s * 1_000_000_000
        stamps = sorted(e.ts for e in self.entries if match(e))
        values = []
        t = start
        while t <= end:
            n = bisect.bisect_right(stamps, t) - bisect.bisect_right(stamps, t - rng)
            if n:
                values.append([t / 1e9, str(n)])
            t += step
        result = [{"metric": {}, "values": values}] if values else []
        return Response(200, orjson.dumps({"status": "success",
                                           "data": {"resultType": "matrix", "result": result, "stats": {}}}))

    def _instant(self, params: dict[str, str]) -> Response:
        metric = _METRIC.match(params["query"])
        if metric is None:
            raise ValueError(f"parse error: this fake answers only sum [by (label)] (count_over_time(…)) at an "
                             f"instant, not {params['query']!r}")
        by, inner, amount, unit = metric.groups()
        rng = int(amount) * _UNIT_NS[unit]
        if rng > self.max_query_length_ns:
            raise ValueError(f"the query time range exceeds the limit (query length: {rng // 10**9}s, limit: "
                             f"{self.max_query_length_ns // 10**9}s)")
        t = int(params["time"])
        match = self._matcher(inner)
        groups: dict[str, int] = {}
        for e in self.entries:
            if t - rng < e.ts <= t and match(e):
                key = {**e.labels, **e.metadata}.get(by, "") if by else ""
                groups[key] = groups.get(key, 0) + 1
        if len(groups) > self.max_series:
            raise ValueError(f"maximum of series ({self.max_series}) reached for a single query")
        result = [{"metric": ({by: k} if by and k else {}), "value": [t / 1e9, str(n)]} for k, n in groups.items()]
        return Response(200, orjson.dumps({"status": "success",
                                           "data": {"resultType": "vector", "result": result, "stats": {}}}))

    def _push(self, request: Request) -> Response:
        import gzip

        import cramjam

        self.pushes += 1
        body = request.body
        ctype = dict(request.headers).get("Content-Type", "application/x-protobuf")
        if ctype == "application/json":
            if dict(request.headers).get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            doc = orjson.loads(body)
            for s in doc["streams"]:
                for value in s["values"]:
                    self.add(s["stream"], int(value[0]), value[1], value[2] if len(value) > 2 else None)
            return Response(204)
        req = self.push_pb2.PushRequest.FromString(bytes(cramjam.snappy.decompress_raw(body)))
        for s in req.streams:
            labels = {k: go_unquote(v) for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*")', s.labels)}
            for e in s.entries:
                ts = e.timestamp.seconds * 1_000_000_000 + e.timestamp.nanos
                self.add(labels, ts, e.line, {p.name: p.value for p in e.structuredMetadata})
        return Response(204)


class FakeLokiHTTP:
    """``FakeLoki`` behind a real HTTP listener on 127.0.0.1, for processes that ship or read over the network
    (a real job's ranks, ``jobtrace watch``). Requests are answered one at a time, under one lock."""

    def __init__(self, fake: FakeLoki) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(self.command, f"http://127.0.0.1{self.path}", body, dict(self.headers.items()))
                with lock:
                    try:
                        response = fake(request)
                    except Exception as exc:
                        response = Response(400, f"{type(exc).__name__}: {exc}".encode())
                self.send_response(response.status)
                self.send_header("Content-Length", str(len(response.body)))
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(response.body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.fake = fake
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _stages(pipeline: str) -> list[str]:
    """The stages of a pipeline, split at each ``|`` outside a quoted string (a regex's ``|`` stays)."""
    stages: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in pipeline:
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "|":
            stages.append("".join(current))
            current = []
            continue
        current.append(ch)
    stages.append("".join(current))
    return stages[1:]


class _FilterParser:
    """LogQL label filter expressions (the subset trace-job sends): ``or`` of ``and`` of terms, a term being
    ``( … )``, ``name <op> "string"`` (=, !=, =~, !~) or ``name <op> number`` (==, !=, >, >=, <, <=)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[Any] = []
        pos = 0
        while pos < len(text.rstrip()):
            m = _FILTER_TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"parse error: cannot parse label filter {text!r} at {pos}")
            self.tokens.append((m.group(2), m.group(3), m.group(4)) if m.group(2) else m.group(1))
            pos = m.end()
        self.i = 0

    def parse(self) -> Any:
        expr = self._or()
        if self.i != len(self.tokens):
            raise ValueError(f"parse error: unexpected {self.tokens[self.i]!r} in {self.text!r}")
        return expr

    def _or(self) -> Any:
        terms = [self._and()]
        while self.i < len(self.tokens) and self.tokens[self.i] == "or":
            self.i += 1
            terms.append(self._and())
        return lambda labels: any(t(labels) for t in terms)

    def _and(self) -> Any:
        terms = [self._term()]
        while self.i < len(self.tokens) and self.tokens[self.i] == "and":
            self.i += 1
            terms.append(self._term())
        return lambda labels: all(t(labels) for t in terms)

    def _term(self) -> Any:
        if self.i >= len(self.tokens):
            raise ValueError(f"parse error: unexpected end of {self.text!r}")
        tok = self.tokens[self.i]
        self.i += 1
        if tok == "(":
            inner = self._or()
            if self.i >= len(self.tokens) or self.tokens[self.i] != ")":
                raise ValueError(f"parse error: unbalanced parentheses in {self.text!r}")
            self.i += 1
            return inner
        if not isinstance(tok, tuple):
            raise ValueError(f"parse error: unexpected {tok!r} in {self.text!r}")
        name, op, value = tok
        if value.startswith('"'):
            if op not in ("=", "!=", "=~", "!~"):
                raise ValueError(f"parse error: {op} needs a number in {self.text!r}")
            text = go_unquote(value)
            if op in ("=~", "!~"):
                rx = re.compile(text)
                return lambda labels: (rx.fullmatch(labels.get(name, "")) is not None) == (op == "=~")
            return lambda labels: (labels.get(name, "") == text) == (op == "=")
        if op in ("=~", "!~"):
            raise ValueError(f"parse error: {op} needs a string in {self.text!r}")
        number = float(value)
        compare = {"=": float.__eq__, "==": float.__eq__, "!=": float.__ne__, ">": float.__gt__,
                   ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__}[op]

        def numeric(labels: dict[str, str]) -> bool:
            if name not in labels:
                return False  # Loki's NumericLabelFilter: a line without the label does not pass
            try:
                return bool(compare(float(labels[name]), number))
            except ValueError:
                return True  # Loki keeps it with __error__ set (a metric query over it then fails)
        return numeric
