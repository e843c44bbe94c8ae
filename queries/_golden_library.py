"""Where the golden library lives: a folder beside the store, an index on the Elasticsearch/OpenSearch
cluster the jobs came from, or a stream on their Loki.

A team whose jobs ship to a cluster keeps its library there too, so that every machine that runs
``trace-job --backend elasticsearch --golden`` chooses from the same entries without sharing a folder.
An entry is the same :class:`GoldenProfile` either way; on a cluster it is one document of the
``jobtrace-golden`` index (``JOBTRACE_GOLDEN_INDEX``), its id the entry's name: the fields to list and
filter by (name, job, tags, world size, nodes, model, when added) are mapped, and the entry itself is
kept compressed in a ``binary`` field (stored, never indexed). Writes are refreshed at once, so an entry
added is listed by the next command.

Loki keeps lines, not documents, and deletes none on request; there the library is one stream,
``{jobtrace_library="golden"}`` (the query library's ``golden_library``), of records: ``add`` records carry
the entry compressed and cut into parts of at most :data:`LOKI_PART` characters (under Loki's default
``max_line_size`` of 256 KB), ``remove`` records a name's removal; the latest record of a name wins.
The library is read back over the last :data:`LOKI_LOOKBACK` (Loki's default ``max_query_length`` is
721 h): entries older than that, or than the tenant's retention, fall out of it; keep a folder copy
(``--golden-dir``) of a library meant to outlive them.
"""

from __future__ import annotations

import base64
import os
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from jobtrace.config import ES, GOLDEN_INDEX, get_str
from jobtrace.errors import ConfigError, QueryError
from jobtrace.http import HttpConfig, RequestsTransport
from jobtrace.redact import redact_url

from ._golden import GoldenProfile, golden_dir, list_golden, load_golden, remove_golden, save_golden

__all__ = ["FolderLibrary", "GoldenLibrary", "LokiLibrary", "SearchLibrary", "open_library"]

MGET_BATCH = 20  # entries of a few hundred KiB each: a few MB a request

MAPPING: dict[str, Any] = {
    "dynamic": False,
    "properties": {
        "name": {"type": "keyword"}, "job_id": {"type": "keyword"}, "tags": {"type": "keyword"},
        "created": {"type": "date", "format": "epoch_second"}, "world": {"type": "integer"},
        "nodes": {"type": "integer"}, "model": {"type": "keyword"}, "config_hash": {"type": "keyword"},
        "version": {"type": "integer"}, "entry": {"type": "binary"},
    },
}


class GoldenLibrary(Protocol):
    """A library of golden entries, wherever it is kept."""

    where: str
    """Where, in words (a folder, or a cluster's index with its URL's secrets redacted)."""

    def names(self) -> list[str]: ...

    def load(self, name: str) -> GoldenProfile: ...

    def save(self, profile: GoldenProfile) -> str:
        """Add or replace the entry; returns where it went."""

    def remove(self, name: str) -> str: ...

    def load_all(self, names: list[str]) -> list[GoldenProfile]: ...


class FolderLibrary:
    """One JSON file per entry in a folder (``<data-dir>/.golden`` by default)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.where = str(self.directory)

    def names(self) -> list[str]:
        return list_golden(self.directory)

    def load(self, name: str) -> GoldenProfile:
        return load_golden(self.directory, name)

    def save(self, profile: GoldenProfile) -> str:
        return str(save_golden(profile, self.directory))

    def remove(self, name: str) -> str:
        return str(remove_golden(self.directory, name))

    def load_all(self, names: list[str]) -> list[GoldenProfile]:
        return [self.load(n) for n in names]


Call = Callable[..., "tuple[int, Any]"]


class SearchLibrary:
    """Entries as documents of one index on Elasticsearch 8/9 or OpenSearch 2.x (see the module docstring)."""

    def __init__(self, call: Call, where: str, index: str | None = None, close: Callable[[], None] | None = None):
        self._call = call
        self.index = index or get_str(GOLDEN_INDEX, default="jobtrace-golden") or "jobtrace-golden"
        self.where = f"{where} index {self.index}"
        self._close = close

    @classmethod
    def connect(cls, url: str | None = None, index: str | None = None, config: HttpConfig | None = None
                ) -> SearchLibrary:
        """The cluster at ``url`` (or ``JOBTRACE_ES_URL``), with the credentials the backend reader uses."""
        from kibana import client_caller, detect_cluster, make_client

        cfg = config or HttpConfig.from_env(ES.prefix, url=url)
        raw = RequestsTransport(cfg)
        try:
            cluster = detect_cluster(raw, cfg.url, cfg.timeout_s)
        finally:
            raw.close()
        if cluster.flavour == "victorialogs":
            raise ConfigError(f"{redact_url(cfg.url)} is VictoriaLogs: it keeps no golden library (use --golden-dir)")
        client = make_client(cfg, cluster)
        return cls(client_caller(client, cluster), f"{redact_url(cfg.url)} ({cluster.label})", index, client.close)

    def close(self) -> None:
        if self._close is not None:
            self._close()

    # ---- the library -------------------------------------------------------------------------
    def names(self) -> list[str]:
        status, body = self._call("POST", f"/{self.index}/_search", body={
            "size": 10_000, "_source": ["name"], "sort": [{"name": "asc"}], "query": {"match_all": {}}})
        if status == 404:
            return []  # no library yet
        self._check(status, body, "listing the golden library")
        return [str(h["_source"]["name"]) for h in body["hits"]["hits"] if h.get("_source", {}).get("name")]

    def load(self, name: str) -> GoldenProfile:
        status, body = self._call("GET", f"/{self.index}/_doc/{_id(name)}")
        if status == 404:
            known = self.names()
            raise QueryError(f"no golden run {name!r} in {self.where}" + (f"; known: {', '.join(known)}" if known
                                                                           else ""))
        self._check(status, body, f"reading golden run {name!r}")
        return _entry(body, name, self.where)

    def load_all(self, names: list[str]) -> list[GoldenProfile]:
        """Entries by name, ``MGET_BATCH`` a request; those gone meanwhile are skipped."""
        out = []
        for i in range(0, len(names), MGET_BATCH):
            batch = names[i:i + MGET_BATCH]
            status, body = self._call("POST", f"/{self.index}/_mget", body={"ids": batch})
            self._check(status, body, "reading the golden library")
            out += [_entry(doc, doc.get("_id", "?"), self.where) for doc in body.get("docs", []) if doc.get("found")]
        return out

    def save(self, profile: GoldenProfile) -> str:
        self._ensure_index()
        status, body = self._call("PUT", f"/{self.index}/_doc/{_id(profile.name)}", params={"refresh": "true"},
                                  body=_document(profile))
        self._check(status, body, f"adding golden run {profile.name!r}")
        return f"{self.where}, id {profile.name}"

    def remove(self, name: str) -> str:
        status, body = self._call("DELETE", f"/{self.index}/_doc/{_id(name)}", params={"refresh": "true"})
        if status == 404:
            raise QueryError(f"no golden run {name!r} in {self.where}")
        self._check(status, body, f"removing golden run {name!r}")
        return f"{self.where}, id {name}"

    def _ensure_index(self) -> None:
        status, body = self._call("PUT", f"/{self.index}", body={"mappings": MAPPING})
        if status == 400 and "already_exists" in str(body):
            return
        self._check(status, body, f"creating the index {self.index}")

    def _check(self, status: int, body: Any, what: str) -> None:
        from kibana import check

        check(status, body, f"{what} ({self.where})")


def _id(name: str) -> str:
    return quote(name, safe="")


def _document(p: GoldenProfile) -> dict[str, Any]:
    packed = _pack(p)
    doc: dict[str, Any] = {"name": p.name, "job_id": p.job_id, "tags": p.tags, "created": int(p.created),
                           "version": p.version, "entry": packed}
    for key in ("world", "nodes", "model", "config_hash"):
        if p.shape.get(key) is not None:
            doc[key] = p.shape[key]
    return doc


def _entry(doc: dict[str, Any], name: str, where: str) -> GoldenProfile:
    try:
        packed = doc["_source"]["entry"]
    except (KeyError, TypeError) as exc:
        raise QueryError(f"golden run {name!r} in {where} is unreadable: {exc}") from exc
    return _unpack(packed, name, where)


LOKI_PART = 200_000
"""Characters of compressed entry per line of the Loki library."""
LOKI_LOOKBACK = "30d"
LOKI_LABELS = {"jobtrace_library": "golden"}


class LokiLibrary:
    """Entries as records of one Loki stream (see the module docstring)."""

    def __init__(self, url: str | None = None, transport: Any = None) -> None:
        import loki
        from jobtrace import config

        from ._loki import LokiReader

        http = HttpConfig.from_env(config.LOKI.prefix, url)
        self._own_transport = transport is None
        self._reader = LokiReader(http.url, transport or RequestsTransport(http), tenant=http.tenant)
        self._selector = loki.library().render("golden_library")
        self.where = f"Loki at {redact_url(self._reader.base)} stream {self._selector}"

    def close(self) -> None:
        if self._own_transport:
            self._reader.transport.close()

    def _records(self) -> dict[str, dict[str, Any]]:
        """Per name, its latest record: ``{"op": "add", "entry": bytes}`` or ``{"op": "remove"}``."""
        import orjson

        from ._reading import TimeRange

        rng = TimeRange.parse(LOKI_LOOKBACK, None)
        parts: dict[tuple[str, str], dict[int, str]] = {}
        latest: dict[str, tuple[int, dict[str, Any]]] = {}
        for ts, line in self._reader.fetch(self._selector, rng.start_ns, rng.end_ns):
            try:
                rec = orjson.loads(line)
                name, op = str(rec["name"]), rec["op"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # not ours: a line someone else pushed to the stream
            if op == "add":
                parts.setdefault((name, str(rec.get("rev"))), {})[int(rec.get("part", 0))] = str(rec.get("data", ""))
                if int(rec.get("part", 0)) != int(rec.get("parts", 1)) - 1:
                    continue  # the last part dates the record
            if name not in latest or ts >= latest[name][0]:
                latest[name] = (ts, rec)
        out: dict[str, dict[str, Any]] = {}
        for name, (_, rec) in latest.items():
            if rec["op"] != "add":
                out[name] = {"op": "remove"}
                continue
            got = parts.get((name, str(rec.get("rev"))), {})
            if len(got) != int(rec.get("parts", 1)):
                continue  # a record whose parts did not all arrive: not an entry
            out[name] = {"op": "add", "entry": "".join(got[i] for i in range(len(got)))}
        return out

    def names(self) -> list[str]:
        return sorted(n for n, r in self._records().items() if r["op"] == "add")

    def load(self, name: str) -> GoldenProfile:
        rec = self._records().get(name)
        if rec is None or rec["op"] != "add":
            known = self.names()
            raise QueryError(f"no golden run {name!r} in {self.where}" + (f"; known: {', '.join(known)}" if known
                                                                           else ""))
        return _unpack(rec["entry"], name, self.where)

    def load_all(self, names: list[str]) -> list[GoldenProfile]:
        records = self._records()
        return [_unpack(records[n]["entry"], n, self.where) for n in names
                if n in records and records[n]["op"] == "add"]

    def save(self, profile: GoldenProfile) -> str:
        packed = _pack(profile)
        chunks = [packed[i:i + LOKI_PART] for i in range(0, len(packed), LOKI_PART)] or [""]
        rev = uuid.uuid4().hex[:12]
        self._push([{"op": "add", "name": profile.name, "rev": rev, "part": i, "parts": len(chunks), "data": c}
                    for i, c in enumerate(chunks)])
        return f"{self.where}, {len(chunks)} line(s)"

    def remove(self, name: str) -> str:
        if name not in self.names():
            raise QueryError(f"no golden run {name!r} in {self.where}")
        self._push([{"op": "remove", "name": name}])
        return self.where

    def _push(self, records: list[dict[str, Any]]) -> None:
        """One push request (Loki's JSON push format), lines a nanosecond apart in order."""
        import orjson

        from jobtrace.http import Request

        from ._reading import read_request

        t0 = time.time_ns()
        body = orjson.dumps({"streams": [{"stream": LOKI_LABELS, "values": [
            [str(t0 + i), orjson.dumps(r).decode()] for i, r in enumerate(records)]}]})
        headers = {**self._reader.headers, "Content-Type": "application/json"}
        push = self._reader.base.rsplit("/api/v1", 1)[0] + "/api/v1/push"
        read_request(self._reader.transport, Request("POST", push, body, headers), timeout_s=60.0, retries=4,
                     backend="Loki", base=self._reader.base, ok=(200, 204),
                     credentials_hint="JOBTRACE_LOKI_USERNAME/_PASSWORD/_TOKEN/_TENANT")


def _pack(p: GoldenProfile) -> str:
    return base64.b64encode(zlib.compress(p.to_json(), 6)).decode()


def _unpack(packed: str, name: str, where: str) -> GoldenProfile:
    try:
        return GoldenProfile.from_json(zlib.decompress(base64.b64decode(packed)))
    except (KeyError, TypeError, ValueError, zlib.error) as exc:
        raise QueryError(f"golden run {name!r} in {where} is unreadable: {exc}") from exc


def open_library(backend: str = "local", *, url: str | None = None, data_dir: str | os.PathLike[str] = "jobtrace-data",
                 directory: str | os.PathLike[str] | None = None) -> GoldenLibrary:
    """The library a command uses: ``directory`` where one is named; on the cluster for the ``elasticsearch``
    backend, on Loki for ``loki``; else the folder beside the store."""
    if directory is not None:
        return FolderLibrary(directory)
    if backend == "elasticsearch":
        return SearchLibrary.connect(url)
    if backend == "loki":
        return LokiLibrary(url)
    return FolderLibrary(golden_dir(data_dir))
