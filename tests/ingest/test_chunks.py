"""The chunk reader gives the same lines however its input is cut into chunks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest._chunks import ChunkReader


def _lines(data: bytes, cuts: list[int], joined: bool, max_line: int = 1 << 20) -> list[tuple[bytes, bool]]:
    reader = ChunkReader(max_line)
    out: list[tuple[bytes, bool]] = []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for a, b in zip(bounds, bounds[1:]):
        for buf, begin, end, truncated in reader.feed(data[a:b], joined=joined):
            out.extend((line, truncated) for line in buf[begin:end].split(b"\n"))
    tail = reader.finish()
    if tail is not None:
        out.append((tail[0], tail[3]))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r\n", b"x" * 7]), max_size=40),
       st.lists(st.integers(0, 400), max_size=8), st.booleans())
def test_lines_do_not_depend_on_chunking(parts, cuts, joined):
    data = b"".join(parts)
    whole = _lines(data, [], joined)
    assert _lines(data, cuts, joined) == whole
    expected = data.replace(b"\r\n", b"\n").split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert [line for line, _ in whole] == expected


def test_over_long_lines_are_cut_and_the_rest_dropped():
    data = b"short\n" + b"y" * 25 + b"\nlast"
    assert [(b"short", False), (b"y" * 10, True), (b"last", False)] == _lines(data, [3, 12, 20], False, 10)


def test_every_line_once_cut_at_the_limit_with_its_length_whatever_the_chunking():
    """Lines ended by LF, CRLF or a lone CR, some over the limit, read in random chunks: each line comes out once,
    an over-long one cut to its head and flagged, and its whole length noted once (issue 20: counted once)."""
    import random
    import re

    rng = random.Random(20)
    for _ in range(4000):
        maxb = rng.randint(1, 12)
        parts = [b"x" * rng.choice([0, 1, 2, 5, maxb, maxb + 1, maxb + 3, 30]) for _ in range(rng.randint(1, 12))]
        seps = [rng.choice([b"\n", b"\r\n", b"\r"]) for _ in parts]
        data = b"".join(p + s for p, s in zip(parts, seps))
        if rng.random() < 0.5:
            data = data[:-len(seps[-1])]  # no line end at the very end
        reader = ChunkReader(maxb)
        got: list[tuple[bytes, bool]] = []
        at = 0
        while at < len(data):
            step = rng.randint(1, 20)
            for buf, begin, end, cut in reader.feed(data[at:at + step], joined=rng.random() < 0.5):
                got += [(buf[begin:end], True)] if cut else [(line, False) for line in buf[begin:end].split(b"\n")]
            at += step
        tail = reader.finish()
        if tail is not None:
            got.append((tail[0][tail[1]:tail[2]], tail[3]))
        lines = re.split(rb"\r\n|\r|\n", data)
        if data.endswith((b"\n", b"\r")) or not data:
            lines = lines[:-1]
        assert got == [(line[:maxb], len(line) > maxb) for line in lines], data
        assert reader.cut == [len(line) for line in lines if len(line) > maxb], data
