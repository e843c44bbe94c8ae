"""Where ``jobtrace watch`` sends its alerts: Alertmanager's API, a Slack webhook, or JSON lines.

* **Alertmanager** (``POST /api/v2/alerts``, a list of alerts, each with ``labels``, ``annotations``,
  ``startsAt``, ``endsAt`` and ``generatorURL``; the format of Alertmanager's OpenAPI spec). An alert is
  identified by its labels (``alertname`` ``jobtrace_<kind>``, ``job``, ``key``, ``severity``), sent
  when it fires and again every ``resend_s`` while it lasts (Alertmanager resolves an alert it has not
  heard of for ``resolve_timeout``), and once more with ``endsAt`` when it clears.
* **Slack** (an incoming webhook): one message ``{"text": …}`` when an alert fires and one when it clears.

A webhook that fails is reported once per failure kind and never stops the watcher; its URL is never
printed whole (a Slack webhook's path is its secret).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

import orjson

from jobtrace.redact import url_for_display

from ._live import Alert

__all__ = ["Webhook", "alertmanager_payload", "slack_payload"]


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alertmanager_payload(job: str, alerts: list[Alert], generator_url: str = "") -> list[dict[str, Any]]:
    """Alertmanager's ``postableAlerts``: the firing ones without ``endsAt``, the resolved ones with it."""
    out = []
    for a in alerts:
        item: dict[str, Any] = {
            "labels": {"alertname": f"jobtrace_{a.kind}", "job": job, "key": a.key, "severity": a.severity,
                       "ranks": ",".join(map(str, a.ranks))},
            "annotations": {"summary": a.summary[:1000],
                            "description": orjson.dumps(a.evidence, default=str,
                                                        option=orjson.OPT_NON_STR_KEYS).decode()[:4000]},
            "startsAt": _iso(a.started_ns),
        }
        if a.resolved_ns is not None:
            item["endsAt"] = _iso(a.resolved_ns)
        if generator_url:
            item["generatorURL"] = generator_url
        out.append(item)
    return out


def slack_payload(job: str, alert: Alert) -> dict[str, Any]:
    state = "resolved" if alert.resolved_ns is not None else alert.severity.upper()
    return {"text": f"[{state}] jobtrace {job}: {alert.summary}"}


class Webhook:
    """Posts alerts to ``url`` in ``fmt`` (``alertmanager`` or ``slack``)."""

    def __init__(self, url: str, fmt: str, job: str, *, resend_s: float = 60.0, timeout_s: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook URL must be http(s): {url_for_display(url)}")
        self.url, self.fmt, self.job = url, fmt, job
        self.resend_s, self.timeout_s = resend_s, timeout_s
        self.sent = 0
        self.errors: dict[str, int] = {}
        self._last_sent: dict[str, float] = {}

    def send(self, fired: list[Alert], cleared: list[Alert], active: list[Alert]) -> None:
        now = time.monotonic()
        if self.fmt == "slack":
            for a in fired + cleared:
                self._post(slack_payload(self.job, a))
            return
        due = [a for a in active if a not in fired and now - self._last_sent.get(a.key, 0.0) >= self.resend_s]
        batch = fired + cleared + due
        if batch:
            self._post(alertmanager_payload(self.job, batch))
            for a in fired + due:
                self._last_sent[a.key] = now

    def _post(self, payload: Any) -> None:
        request = urllib.request.Request(self.url, data=orjson.dumps(payload), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
            self.sent += 1
        except urllib.error.HTTPError as exc:
            self.errors[f"HTTP {exc.code}"] = self.errors.get(f"HTTP {exc.code}", 0) + 1
        except (urllib.error.URLError, OSError) as exc:
            self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1

    def describe(self) -> str:
        return f"{self.fmt} webhook at {url_for_display(self.url)}"
