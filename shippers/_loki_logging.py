"""A plain stdlib ``logging`` handler to Loki, for scripts that do not use ``init_tracing``/OpenTelemetry.

    import logging
    from shippers._loki_logging import LokiHandler
    logging.getLogger().addHandler(LokiHandler("http://loki:3100", tags={"job": "etl-nightly"}))

It takes python-logging-loki's constructor (``url, tags=None, auth=None, version=None``)
so that moving from ``logging_loki.LokiHandler`` is an import change, and it reuses
that package's label-name sanitizer for ``tags`` (the same label names come out). What
differs is everything behind ``emit``:

* ``emit`` appends the record to a queue and returns (microseconds); python-logging-loki's
  handler posts one HTTP request per record inside ``emit`` (milliseconds, no timeout).
* One export thread batches records into canonical jobtrace events and hands them to a
  :class:`LokiShipper`: protobuf+snappy pushes, a disk spool (an outage loses nothing),
  retries with backoff and ``Retry-After``, a dead-letter file for refusals.
* ``tags`` become stream labels (keep them few and static); per-record
  ``extra={"tags": {...}}`` go into the line (``attrs``), never into labels, so a
  request id cannot explode Loki's stream count. The level is the ``level`` label; the
  logger name is in the line.
* Each record is a full jobtrace event (job, trace id derived from the job id, rank,
  node, pid), so ``trace-job`` and the dashboards read these logs too.
* ``tags={"job": …}`` names the job, as it did in python-logging-loki, but the job id is
  shipped in the ``training_job`` label (``JOBTRACE_LOKI_JOB_LABEL``), like every jobtrace
  stream: ``job`` is the scrape job's label for Promtail and Prometheus (docs/loki.md).
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobtrace import config
from jobtrace.events import encode, identity_block
from jobtrace.http import HttpConfig, RequestsTransport
from jobtrace.identity import trace_id_for_job
from loki import LABEL_KEYS, METADATA_KEYS

from ._batch import BatchWorker
from ._loki import LokiEncoder, LokiOptions, LokiShipper, push_url

__all__ = ["LokiHandler"]

_IMMUTABLE = (int, float, str, bool, type(None), bytes)


def _sanitize(name: str) -> str:
    """python-logging-loki's label-name rule when it is installed (``.``, ``-``, space → ``_``)."""
    try:
        from logging_loki.emitter import LokiEmitterV1  # type: ignore[import-untyped, unused-ignore]

        return str(LokiEmitterV1.format_label(LokiEmitterV1("http://unused"), name))
    except Exception:  # noqa: BLE001 - not installed, or its internals changed: the same rule, ours
        cleaned = "".join(c if c.isalnum() or c == "_" else "_" if c in ".- " else "" for c in name)
        return cleaned


class LokiHandler(logging.Handler):
    """Ships stdlib log records to Loki off the calling thread, losslessly (see the module docstring).

    Args:
        url: Loki base or push URL (``JOBTRACE_LOKI_*`` supply credentials, tenant, TLS).
        tags: static stream labels; ``job`` (or ``training_job``) names the job, shipped in the
            ``training_job`` label (default ``$JOBTRACE_JOB_ID`` or ``python``).
        auth: ``(username, password)`` for basic auth, as in python-logging-loki.
        version: accepted for compatibility; only the v1 push API exists.
        spool_dir: where unsent records wait (default: a per-process directory under the temp dir).
    """

    def __init__(self, url: str, tags: Mapping[str, Any] | None = None, auth: tuple[str, str] | None = None,
                 version: str | None = None, *, spool_dir: str | os.PathLike[str] | None = None,
                 level: int = logging.NOTSET, options: LokiOptions | None = None, **sender_options: Any) -> None:
        super().__init__(level)
        tags = dict(tags or {})
        env = config.environ()
        named, legacy = tags.pop("training_job", None), tags.pop("job", None)
        self.job = str(named or legacy or config.get_str(config.JOB_ID, env) or "python")
        labels = {_sanitize(k): str(v) for k, v in tags.items()}
        base = options or LokiOptions.from_env()
        labels = {k: v for k, v in labels.items()
                  if k and k not in LABEL_KEYS and k not in METADATA_KEYS and k != base.job_label}
        opts = LokiOptions(**{**base.__dict__, "static_labels": {**base.static_labels, **labels}})
        overrides: dict[str, Any] = {}
        if auth:
            overrides = {"username": auth[0], "password": auth[1]}
        http = HttpConfig.from_env(config.LOKI.prefix, url, **overrides)
        node = config.get_str(config.NODE, env) or socket.gethostname()
        # The torch launchers' variables, as python-logging-loki users run under torchrun without init_tracing.
        self._base: dict[str, Any] = identity_block(
            job=self.job, trace_id=trace_id_for_job(self.job), rank=int(env.get("RANK", "0") or 0),
            local_rank=int(env.get("LOCAL_RANK", "0") or 0), world=int(env.get("WORLD_SIZE", "1") or 1),
            node=node, pid=os.getpid()).fields
        directory = Path(spool_dir or Path(tempfile.gettempdir()) / f"jobtrace-loki-handler-{os.getpid()}")
        encoder = LokiEncoder(push_url(http.url), opts, tenant=http.tenant,
                              defaults={"job": self.job, "node": node})
        self.shipper = LokiShipper(encoder, sender_options.pop("transport", None) or RequestsTransport(http),
                                   directory, **sender_options)
        self.worker: BatchWorker[logging.LogRecord] = BatchWorker(self._encode, [self.shipper],
                                                                  name="jobtrace-loki-handler")

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if args:
            values = args.values() if isinstance(args, Mapping) else args
            if isinstance(args, Mapping) or not all(isinstance(a, _IMMUTABLE) for a in values):
                try:
                    record.msg, record.args = record.getMessage(), None
                except Exception:  # noqa: BLE001, S110 - reported by the export thread as a format error
                    pass
        self.worker.emit(record)

    def _encode(self, records: list[logging.LogRecord]) -> list[bytes]:
        out = []
        for r in records:
            try:
                msg = r.getMessage()
            except Exception as exc:  # noqa: BLE001
                msg = f"{r.msg!r} % {r.args!r} (format error: {exc})"
            d: dict[str, Any] = {"ts": int(r.created * 1e9), "kind": "log", **self._base, "level": r.levelname,
                                 "logger": r.name, "msg": msg}
            if r.exc_info and r.exc_info[0] is not None:
                d["exc"] = "".join(traceback.format_exception(*r.exc_info))
            extra = getattr(r, "tags", None)
            if isinstance(extra, Mapping) and extra:
                d["attrs"] = {str(k): v for k, v in extra.items()}
            out.append(encode(d))
        return out

    def flush(self) -> None:
        """Hand every record emitted so far to the shipper's spool (sending continues in the background)."""
        self.worker.force_flush()

    def close(self) -> None:
        """Flush, then try to send what is spooled for the shipper's shutdown timeout."""
        try:
            self.worker.shutdown()
        finally:
            super().close()
