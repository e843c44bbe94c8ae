"""One redaction helper for every URL that reaches a message, an error or a report."""

from __future__ import annotations

import pytest

from jobtrace.errors import BackendUnavailable
from jobtrace.http import HttpConfig, Request, RequestsTransport
from jobtrace.redact import MASK, is_secret_name, redact_url, url_for_display


class TestRedactUrl:
    def test_user_info_is_masked_and_the_rest_kept(self):
        assert "https://***@es.example:9200/_bulk?refresh=false" == \
            redact_url("https://elastic:hunter2@es.example:9200/_bulk?refresh=false")

    @pytest.mark.parametrize("name", ["access_token", "token", "api_key", "apikey", "X-Amz-Signature",
                                      "X-Amz-Credential", "X-Amz-Security-Token", "password", "sig", "auth"])
    def test_secret_query_parameters_are_masked(self, name):
        out = redact_url(f"http://loki:3100/loki/api/v1/push?{name}=SECRET-123&org=team-a")
        assert "SECRET-123" not in out and f"={MASK}" in out and "org=team-a" in out

    def test_a_url_without_secrets_is_unchanged(self):
        url = "http://vl:9428/insert/loki/api/v1/push?disable_message_parsing=1&_stream_fields=job"
        assert url == redact_url(url)

    def test_a_url_that_cannot_be_parsed_shows_nothing_after_its_credentials(self):
        out = redact_url("http://user:pw@host:notaport/path?token=x")
        assert "pw" not in out and "token" not in out

    def test_names_that_are_not_secret(self):
        assert not any(map(is_secret_name, ["refresh", "org", "limit", "query", "direction"]))


class TestUrlForDisplay:
    def test_only_scheme_host_port_and_path(self):
        assert "https://es:9200/logs" == url_for_display("https://u:p@es:9200/logs?api_key=k#frag")


class TestTransportErrorsAreRedacted:
    def test_an_unreachable_server_error_names_the_url_without_secrets(self):
        """The requests transport's error for a closed port carries the URL, never its secrets."""
        transport = RequestsTransport(HttpConfig(url="http://127.0.0.1:9", timeout_s=0.5))
        with pytest.raises(BackendUnavailable) as info:
            transport.send(Request("GET", "http://user:pw-XYZ@127.0.0.1:9/x?access_token=TOK-XYZ"), 0.5)
        text = str(info.value)
        assert "pw-XYZ" not in text and "TOK-XYZ" not in text and "127.0.0.1:9/x" in text


# ---- secrets in event lines (Redactor) ---------------------------------------------------------------------

import logging  # noqa: E402 - the second half of this file tests the second half of the module
import re  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import orjson  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jobtrace import config  # noqa: E402
from jobtrace.errors import ConfigError  # noqa: E402
from jobtrace.redact import DEFAULT_KINDS, Redactor, RedactState, UserPattern, redactor_from_env  # noqa: E402
from shippers import BatchWorker  # noqa: E402
from tests import redaction_samples as s  # noqa: E402

ENGINES = [pytest.param(True, id="hyperscan"), pytest.param(False, id="re")]
CORPUS = Path(__file__).parent / "corpus"


def _hyperscan(flag: bool) -> None:
    if flag:
        pytest.importorskip("hyperscan", reason="the Hyperscan prefilter needs hyperscan (installed with jobtrace on x86-64)")


@pytest.fixture(params=ENGINES)
def redactor(request):
    _hyperscan(request.param)
    r = Redactor(hyperscan=request.param)
    assert r.engine == ("hyperscan" if request.param else "re")
    return r


def line_of(msg: str, **more) -> bytes:
    return orjson.dumps({"ts": 1, "kind": "log", "job": "j", "rank": 0, "level": "INFO", "msg": msg, **more}) + b"\n"


class TestEachKind:
    @pytest.mark.parametrize("name", list(s.LINES))
    def test_the_secret_becomes_its_kind_and_the_rest_stays(self, redactor, name):
        text, secrets = s.LINES[name]
        out = redactor.redact(line_of(text))
        msg = orjson.loads(out)["msg"]
        kind = s.KIND_OF.get(name, name)
        assert f"[REDACTED:{kind}]" in msg, msg
        assert not [x for x in secrets if x in msg], msg
        assert kind in DEFAULT_KINDS

    def test_only_the_value_goes_the_key_stays(self, redactor):
        msg = orjson.loads(redactor.redact(line_of(s.LINES["password"][0])))["msg"]
        assert msg == "connecting with user=trainer password=[REDACTED:password]"
        msg = orjson.loads(redactor.redact(line_of(s.LINES["bearer_header"][0])))["msg"]
        assert msg == "Authorization: Bearer [REDACTED:bearer]"
        msg = orjson.loads(redactor.redact(line_of(s.LINES["url_password"][0])))["msg"]
        assert msg == "checkpoint store postgresql://trainer:[REDACTED:url_password]@db.internal:5432/runs"

    def test_a_key_block_inside_one_message_keeps_its_markers(self, redactor):
        msg = orjson.loads(redactor.redact(line_of(s.LINES["private_key"][0])))["msg"]
        assert msg == ("loaded deploy key:\n-----BEGIN OPENSSH PRIVATE KEY-----[REDACTED:private_key]"
                       "-----END OPENSSH PRIVATE KEY-----\n")

    def test_attributes_are_redacted_as_json_and_numbers_are_left(self, redactor):
        line = orjson.dumps({"kind": "span", "name": "upload", "attrs": {"password": s.PASSWORD, "token": 42,
                                                                         "url": f"s3://k:{s.URL_PW}@bucket/x"}}) + b"\n"
        ev = orjson.loads(redactor.redact(line))
        assert ev["attrs"] == {"password": "[REDACTED:password]", "token": 42,
                               "url": "s3://k:[REDACTED:url_password]@bucket/x"}

    def test_a_quoted_value_with_escaped_quotes_is_taken_whole(self, redactor):
        text = 'settings {"password": "pa\\"ss\\\\", "next": 1}'  # JSON inside a message, with escapes in the value
        msg = orjson.loads(redactor.redact(line_of(text)))["msg"]
        assert msg == 'settings {"password": "[REDACTED:password]", "next": 1}'

    def test_a_key_printed_line_by_line_is_redacted_across_lines_and_batches(self, redactor):
        lines = [line_of(text) for text in ["-----BEGIN RSA PRIVATE KEY-----", "Proc-Type: 4,ENCRYPTED",
                                           *s.PEM_BODY[:2]]]
        rest = [line_of(text) for text in [*s.PEM_BODY[2:], "-----END RSA PRIVATE KEY-----", "step 1 loss 0.5"]]
        state = RedactState()
        first = redactor.redact(b"".join(lines), state)
        assert state.open_block
        second = redactor.redact(b"".join(rest), state)
        assert not state.open_block
        msgs = [orjson.loads(x)["msg"] for x in (first + second).splitlines()]
        assert msgs == ["-----BEGIN RSA PRIVATE KEY-----", "Proc-Type: 4,ENCRYPTED", *["[REDACTED:private_key]"] * 5,
                        "-----END RSA PRIVATE KEY-----", "step 1 loss 0.5"]

    def test_a_block_ends_at_the_first_line_that_is_not_base64(self, redactor):
        state = RedactState()
        data = b"".join(line_of(t) for t in ["-----BEGIN PRIVATE KEY-----", "step 3 loss 0.1", "AAAA"])
        msgs = [orjson.loads(x)["msg"] for x in redactor.redact(data, state).splitlines()]
        assert msgs == ["-----BEGIN PRIVATE KEY-----", "step 3 loss 0.1", "AAAA"] and not state.open_block

    def test_redact_text_for_plain_messages(self, redactor):
        assert redactor.redact_text(f"token={s.DB_TOKEN}") == "token=[REDACTED:token]"
        assert redactor.redact_text("nothing here") == "nothing here"


class TestNothingElseChanges:
    @pytest.mark.parametrize("text", s.NORMAL)
    def test_a_normal_training_line_is_left_as_it_is(self, redactor, text):
        line = line_of(text)
        assert redactor.redact(line) is line

    def test_every_real_log_excerpt_of_the_corpus_is_left_as_it_is(self, redactor):
        """Each line of tests/corpus as a message, and each file as one message (a traceback kept whole)."""
        logs = sorted(CORPUS.glob("*/*.log"))
        assert len(logs) > 50
        for path in logs:
            text = path.read_bytes().decode("utf-8", "replace")
            data = b"".join(line_of(t) for t in [*text.splitlines(), text])
            out = redactor.redact(data)
            if out is not data:
                changed = [b for a, b in zip(data.splitlines(), out.splitlines()) if a != b]
                pytest.fail(f"{path.name}: {changed[:3]}")

    def test_a_batch_without_secrets_is_the_same_object(self, redactor):
        lines = [line_of(t) for t in s.NORMAL]
        assert redactor.redact_lines(lines) is lines
        data = b"".join(lines)
        assert redactor.redact(data) is data

    def test_redacting_twice_changes_nothing_more(self, redactor):
        data = b"".join(line_of(t) for t, _ in s.LINES.values())
        once = redactor.redact(data)
        assert once != data and redactor.redact(once) == once


fragments = st.sampled_from([
    "password=", "password: ", '"token": "', "\\", '"', "'", "\n", "\t", " ", "=", ":", "@", "://u:", "Bearer ",
    "Authorization: ", "--api-key ", s.HF, s.AWS_ID, s.GH, s.SLACK, s.WANDB, "wandb login ", "-----BEGIN RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----", "hf_", "AKIA", "é", "\u2028", "\x01", "{}", "[REDACTED:x]", "secret_key=", "abc", "123",
])


class TestAlwaysValidJson:
    @settings(max_examples=300, deadline=None)
    @given(st.lists(fragments, max_size=14), st.dictionaries(st.sampled_from(["password", "token", "api_key", "n"]),
                                                              st.lists(fragments, max_size=5).map("".join), max_size=3))
    def test_any_line_stays_json_with_the_same_keys_and_both_engines_agree(self, parts, attrs):
        line = line_of("".join(parts), attrs=attrs)
        outs = [Redactor(hyperscan=False).redact(line)]
        try:
            import hyperscan  # noqa: F401

            outs.append(Redactor(hyperscan=True).redact(line))
        except ImportError:
            pass
        assert len(set(outs)) == 1
        ev, before = orjson.loads(outs[0]), orjson.loads(line)
        assert list(ev) == list(before) and list(ev["attrs"]) == list(before["attrs"])

    @pytest.mark.parametrize("msg, regex", [("\x01é", r".{3}"), ("é", r"."), ("日本", r".{2}")])
    def test_a_user_pattern_never_splits_a_character(self, msg, regex):
        """Found by the property below on a loaded machine: ``.{3}`` over ``\u0001é`` took half of the é."""
        out = Redactor([("mine", regex)], defaults=False).redact(line_of(msg))
        assert orjson.loads(out)["msg"].startswith("[REDACTED:mine]")

    @settings(max_examples=200, deadline=None)
    @given(st.lists(fragments, max_size=10), st.sampled_from([r".{3}", r"\S+", r'"', r"\\", r"u:.", r"[^a]{2,5}",
                                                              r"(?P<secret>E.)", r"(K)"]))
    def test_any_user_pattern_keeps_the_line_json(self, parts, regex):
        line = line_of("".join(parts), logger="train")
        out = Redactor([("mine", regex)], defaults=False).redact(line)
        ev, before = orjson.loads(out), orjson.loads(line)
        assert list(ev) == list(before) and (ev["kind"], ev["job"], ev["level"]) == ("log", "j", "INFO")


class TestLinearTime:
    @pytest.mark.parametrize("unit", ["password=", "password= ", "token:", "hf_", "hf_" + "A" * 29 + " ", "Bearer ",
                                      "Bearer abcdefg ", "://", "://a:", "-----BEGIN RSA PRIVATE KEY-----",
                                      "wandb login ", "Authorization: ", "--password ", 'password=\\"', "AKIA", "gh",
                                      '\\"password\\": \\"', "\\"])
    def test_a_megabyte_of_one_adversarial_fragment_takes_a_bounded_time(self, redactor, unit):
        """Linear: a quadratic pattern would take hours on a 1 MB line, these take well under a second."""
        line = line_of(unit * (1_000_000 // len(unit)))
        t0 = time.process_time()
        out = redactor.redact(line)
        assert time.process_time() - t0 < 10
        orjson.loads(out)

    def test_a_long_value_is_read_once(self, redactor):
        line = line_of("hf_" + "A" * 1_000_000 + " password=" + "x" * 1_000_000)
        t0 = time.process_time()
        msg = orjson.loads(redactor.redact(line))["msg"]
        assert time.process_time() - t0 < 2 and msg == "[REDACTED:hf_token] password=[REDACTED:password]"


class TestUserPatterns:
    def test_a_pattern_its_group_and_its_kind(self):
        r = Redactor([("ticket", r"TKT-\d{6}"), UserPattern("internal", r"itk=(?P<secret>[0-9a-f]{16})")])
        msg = orjson.loads(r.redact(line_of("ticket TKT-123456 itk=0123456789abcdef and password=x1")))["msg"]
        assert msg == "ticket [REDACTED:ticket] itk=[REDACTED:internal] and password=[REDACTED:password]"

    def test_a_pattern_file_from_the_environment(self, tmp_path):
        path = tmp_path / "patterns.tsv"
        path.write_text("# mine\n\nticket\tTKT-\\d{6}\n")
        r = redactor_from_env({config.REDACT_PATTERNS: str(path)})
        assert r is not None and [p.where for p in r.user] == [f"{path}, line 3"]
        assert orjson.loads(r.redact(line_of("TKT-654321")))["msg"] == "[REDACTED:ticket]"
        assert redactor_from_env({config.REDACT: "0", config.REDACT_PATTERNS: str(path)}) is None
        assert redactor_from_env({config.REDACT: "0"}, force=True) is not None

    @pytest.mark.parametrize("text,error", [("ticket TKT-[0-9", "line 1"), ("no tab here", "line 1"),
                                            ("bad kind!\tsekrit-literal", "kind"), ("empty\tx*", "empty text")])
    def test_errors_name_the_file_and_line_never_the_pattern(self, tmp_path, text, error):
        path = tmp_path / "p.tsv"
        path.write_text(text.replace(" TKT", "\tTKT") + "\n")
        with pytest.raises(ConfigError) as info:
            redactor_from_env({config.REDACT_PATTERNS: str(path)})
        message = str(info.value)
        assert error in message and str(path) in message
        assert "TKT" not in message and "sekrit" not in message

    def test_a_missing_file_is_a_config_error(self, tmp_path):
        with pytest.raises(ConfigError, match="JOBTRACE_REDACT_PATTERNS"):
            redactor_from_env({config.REDACT_PATTERNS: str(tmp_path / "missing")})


class ListSink:
    takes_chunks = False

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, lines):
        self.lines.extend(lines)

    def flush(self):
        pass

    def close(self):
        pass


class TestExportThread:
    """The batch worker redacts once for every sink: lines, a compiled recorder's buffer, the spill file."""

    def _worker(self, **kw):
        sink = ListSink()
        return BatchWorker(lambda items: [line_of(m) for m in items], [sink], flush_interval_s=60, **kw), sink

    def test_lines_buffers_and_the_spill_file_reach_the_sinks_redacted(self, tmp_path):
        spill = tmp_path / "spill.jsonl"
        worker, sink = self._worker(max_queue=1, spill_path=str(spill), redact=Redactor())
        buffers = [line_of(f"from a buffer {s.HF}")]  # a source hands each buffer over once, as a recorder does
        worker.add_source(lambda: (buffers.pop(), 1, 0) if buffers else (b"", 0, 0))
        worker.emit(f"queued password={s.PASSWORD}")
        worker.emit(f"spilled token={s.DB_TOKEN}")  # the queue holds one: this one goes to the spill file
        assert s.DB_TOKEN.encode() not in spill.read_bytes()
        worker.force_flush()
        worker.shutdown()
        text = b"".join(sink.lines)
        assert text.count(b"[REDACTED:") == 3 and not [x for x in (s.HF, s.PASSWORD, s.DB_TOKEN) if x.encode() in text]
        assert worker.stats.exported == 3 and worker.stats.redact_errors == 0

    def test_redact_false_keeps_every_line_as_it_is(self):
        worker, sink = self._worker(redact=False)
        worker.emit(f"password={s.PASSWORD}")
        worker.shutdown()
        assert s.PASSWORD.encode() in sink.lines[0]

    def test_the_environment_decides_by_default(self, monkeypatch):
        monkeypatch.setenv(config.REDACT, "0")
        assert self._worker()[0].redactor is None
        monkeypatch.setenv(config.REDACT, "1")
        assert isinstance(self._worker()[0].redactor, Redactor)

    def test_a_failing_redactor_drops_the_batch_counted_and_says_only_its_type(self, caplog):
        class Broken(Redactor):
            def redact(self, data, state=None):
                raise ValueError(f"cannot {data!r}")

        worker, sink = self._worker(redact=Broken())
        with caplog.at_level(logging.WARNING, logger="jobtrace.export"):
            worker.emit(f"password={s.PASSWORD}")
            worker.shutdown()
        assert sink.lines == [] and worker.stats.redact_errors == 1
        assert s.PASSWORD not in caplog.text and "redact failed: ValueError" in caplog.text


def test_the_kinds_are_documented():
    page = (Path(__file__).parent.parent / "docs" / "redaction.md").read_text(encoding="utf-8")
    assert all(f"`{k}`" in page for k in DEFAULT_KINDS)
    assert re.search(r"JOBTRACE_REDACT_PATTERNS", page) and "JOBTRACE_REDACT=0" in page
