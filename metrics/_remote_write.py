"""Prometheus remote write (protocol 1.0): the sidecar's series pushed to a Prometheus, Mimir or VictoriaMetrics.

For nodes a Prometheus cannot reach (a cluster behind a login node, a short job on a shared queue): the
sidecar pushes what it would serve, every ``interval``. The body is the ``WriteRequest`` message of
``prometheus/prompb/remote.proto``, snappy-compressed (block format), with the protocol's headers. The
four messages it needs are small, so they are encoded here rather than generated:

    WriteRequest { repeated TimeSeries timeseries = 1; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }   // milliseconds

A refused or failed push is counted and retried with the next interval's values (a gauge's latest value
is what matters; a counter's next value includes what was missed).
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Iterable
from typing import Any

from jobtrace.errors import ShipperError
from jobtrace.http import HttpConfig, Request, RequestsTransport, Transport
from jobtrace.protowire import varint as _varint

__all__ = ["RemoteWriter", "encode_write_request"]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings and embedded messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_write_request(series: Iterable[tuple[dict[str, str], float, int]]) -> bytes:
    """``WriteRequest`` bytes for ``(labels with __name__, value, timestamp ms)``, one sample a series."""
    out = bytearray()
    for labels, value, ts_ms in series:
        body = bytearray()
        for name in sorted(labels):  # the protocol wants labels sorted by name
            body += _field(1, _field(1, name.encode()) + _field(2, str(labels[name]).encode()))
        sample = b"\x09" + struct.pack("<d", value) + b"\x10" + _varint(ts_ms)  # 1: fixed64 double, 2: varint
        body += _field(2, sample)
        out += _field(1, bytes(body))
    return bytes(out)


class RemoteWriter:
    """Pushes a collector's samples (``collect()``: ``prometheus_client`` metric families) to ``url``."""

    def __init__(self, url: str | None = None, *, transport: Transport | None = None, timeout_s: float = 30.0) -> None:
        from jobtrace.config import PROM

        self.config = HttpConfig.from_env(PROM.prefix, url)
        self.transport = transport or RequestsTransport(self.config)
        self.timeout_s = timeout_s
        self.pushes = 0
        self.failures = 0
        self.samples = 0
        self.last_error: str | None = None

    def push(self, families: Iterable[Any], now_ms: int | None = None) -> int:
        """One push of every sample of ``families``; the number of samples sent. Raises ShipperError when refused."""
        import cramjam

        now_ms = now_ms or int(time.time() * 1000)
        series = []
        for family in families:
            for s in family.samples:
                if isinstance(s.value, float) and math.isnan(s.value) and family.type in ("counter", "histogram"):
                    continue
                ts = int(s.timestamp * 1000) if s.timestamp is not None else now_ms
                series.append(({"__name__": s.name, **s.labels}, float(s.value), ts))
        body = bytes(cramjam.snappy.compress_raw(encode_write_request(series)))
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                   "X-Prometheus-Remote-Write-Version": "0.1.0", "User-Agent": "jobtrace-metrics"}
        if self.config.tenant:
            headers["X-Scope-OrgID"] = self.config.tenant
        self.pushes += 1
        try:
            response = self.transport.send(Request("POST", self.config.url, body, headers), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - counted; the next interval tries again
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            raise ShipperError(f"remote write: {self.last_error}") from None
        if not 200 <= response.status < 300:
            self.failures += 1
            self.last_error = f"HTTP {response.status}: {response.body[:200].decode(errors='replace')}"
            raise ShipperError(f"remote write refused: {self.last_error}")
        self.samples += len(series)
        return len(series)
