"""The canonical event model and its JSON-lines encoding."""

import math

import orjson
import pytest

from jobtrace.events import SCHEMA_VERSION, DecodeError, Event, Kind, decode, encode


def make(**kw):
    base = dict(ts=1_700_000_000_123_456_789, kind=Kind.LOG, job="j", trace_id="a" * 32, rank=3, node="n1")
    base.update(kw)
    return Event(**base)


class TestEncoding:
    def test_round_trip_keeps_every_field(self):
        """An event survives encode → decode unchanged, nanoseconds included."""
        ev = make(kind=Kind.SPAN, name="forward", cat="phase", start=1, dur=2, step=7,
                  span_id="b" * 16, parent_id="c" * 16, attrs={"op": "all_reduce", "bytes": 4096})
        assert decode(encode(ev)) == ev

    def test_line_is_one_newline_terminated_json_object_without_none_keys(self):
        """A log event does not pay for span fields, and is exactly one line."""
        line = encode(make(msg="hello"))
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        obj = orjson.loads(line)
        assert "dur" not in obj and "attrs" not in obj
        assert obj["v"] == SCHEMA_VERSION

    def test_nonfinite_metric_stays_distinguishable(self):
        """NaN is kept as the string 'NaN' (JSON has no NaN; orjson would write null)."""
        from otel_instrumentation._recorder import _number

        assert _number(math.nan) == "NaN"
        assert _number(-math.inf) == "-Infinity"
        assert _number(2.5) == 2.5


class TestDecoding:
    @pytest.mark.parametrize("line", [b"", b"{", b"[1,2]", b'{"kind":"nope","ts":1}', b"\xff\xfe junk",
                                      b'{"ts":1,"kind":"log"'])
    def test_junk_raises_decode_error(self, line):
        """Anything that is not a whole event is refused with DecodeError, never another exception."""
        with pytest.raises(DecodeError):
            decode(line)

    def test_newer_schema_is_refused(self):
        """A reader never guesses at a future schema."""
        d = make().to_dict() | {"v": SCHEMA_VERSION + 1}
        with pytest.raises(DecodeError, match="newer"):
            decode(orjson.dumps(d))

    def test_missing_required_key_is_a_decode_error(self):
        with pytest.raises(DecodeError):
            decode(b'{"ts":1,"kind":"log"}')
