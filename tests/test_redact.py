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
