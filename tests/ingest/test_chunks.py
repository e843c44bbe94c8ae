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
