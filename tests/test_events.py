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


class TestFieldTable:
    """FIELDS is the one table of the encoding's keys: the columns, the identity block and the key order follow it."""

    # The order every writer writes, the compiled recorder (jobtrace_native) included: changing it means
    # changing that recorder's encoder too (tests/otel_instrumentation/test_native_recorder.py compares the two).
    # ``rank_est`` (ingest only: a rank numbered in order of appearance) is written by no recorder.
    ORDER = ("ts", "kind", "job", "trace_id", "rank", "local_rank", "world", "node", "pid", "v", "rank_est", "span_id",
             "parent_id", "name", "cat", "start", "dur", "level", "logger", "msg", "exc", "metrics", "step", "attrs",
             "est")

    def test_the_table_is_the_order_the_recorders_write(self):
        from jobtrace.events import FIELDS

        assert tuple(f.key for f in FIELDS) == self.ORDER
        assert all(f.meaning and f.kinds <= Kind.ALL for f in FIELDS)

    def test_columns_are_the_tables_keys_and_types_in_its_order(self):
        from jobtrace.events import COLUMNS, FIELDS

        assert list(COLUMNS.items()) == [(f.key, f.column) for f in FIELDS]
        assert {"ts": "BIGINT", "rank": "INTEGER", "attrs": "JSON", "est": "BOOLEAN"}.items() <= COLUMNS.items()

    def test_every_event_attribute_is_a_row_and_every_row_an_attribute(self):
        import dataclasses

        from jobtrace.events import FIELDS

        assert {f.name for f in dataclasses.fields(Event)} == {f.key for f in FIELDS}

    def test_to_dict_and_encode_write_the_keys_in_the_tables_order(self):
        ev = make(kind=Kind.SPAN, name="forward", cat="phase", start=1, dur=2, step=7, span_id="b" * 16,
                  parent_id="c" * 16, attrs={"op": "x"}, est=True, level="INFO", msg="m", metrics={"a": 1.0})
        keys = list(ev.to_dict())
        assert keys == [k for k in self.ORDER if k not in ("logger", "exc", "rank_est")]
        assert list(orjson.loads(encode(ev))) == keys  # orjson keeps the key order it reads

    def test_the_identity_block_is_the_identity_rows_one_run_encoded_once(self):
        from jobtrace.events import FIELDS, IDENTITY_KEYS, identity_block

        assert IDENTITY_KEYS == ("job", "trace_id", "rank", "local_rank", "world", "node", "pid", "v")
        keys = [f.key for f in FIELDS]
        start = keys.index(IDENTITY_KEYS[0])
        assert tuple(keys[start:start + len(IDENTITY_KEYS)]) == IDENTITY_KEYS  # one run: spliced in one piece
        block = identity_block(job='j "q" é', trace_id="a" * 32, rank=3, local_rank=1, world=8, node="n1", pid=42)
        assert tuple(block.fields) == IDENTITY_KEYS and block.fields["v"] == SCHEMA_VERSION
        assert block.json == orjson.dumps(block.fields)[1:-1]
        assert b'{"ts":1,"kind":"log",' + block.json + b"}" == orjson.dumps({"ts": 1, "kind": "log", **block.fields})
