"""A job's store in object storage: ``jobtrace archive <job> --url s3://bucket/prefix``, and back for ``trace-job``.

The archive is the cold tier of the retention policy: a job's raw lines, its segments and rollups, its
Flight Recorder dumps and ingest ledger, as objects under ``<prefix>/<job directory>/``. Lines files are
zstd-compressed (``.jsonl.zst``, level 10: JSON lines shrink 10-20x); Parquet files are zstd inside already
and go as they are. A ``MANIFEST.json`` written last lists every object with its size and SHA-256, so an
archive is complete only once it exists, and a reader checks what it downloads against it. The derived
cache and the unshipped spool are left out (the one is rebuilt, the other is not the job's yet).

Any S3-compatible store: credentials, region and endpoint come the standard AWS way (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` for MinIO, SeaweedFS or Ceph), read by boto3.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from jobtrace.errors import ConfigError, JobNotFound, StoreError

from ._layout import job_dir, safe_name

__all__ = ["ArchiveReport", "archive_job", "parse_s3_url", "restore_job"]

MANIFEST = "MANIFEST.json"
_SKIP_DIRS = (".cache", ".spool")


@dataclass
class ArchiveReport:
    url: str
    objects: int = 0
    bytes_local: int = 0
    bytes_stored: int = 0


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix without slashes at either end)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigError(f"{url!r}: expected s3://bucket/prefix")
    return parts.netloc, parts.path.strip("/")


def _client() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigError("archiving needs boto3: pip install 'jobtrace[archive]'") from None
    return boto3.client("s3", config=Config(retries={"max_attempts": 5, "mode": "standard"}))


def _s3_errors() -> tuple[type[Exception], ...]:
    """What a boto3 call raises when the store refuses or cannot be reached."""
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def _files(directory: Path) -> Iterator[Path]:
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_file() and rel.parts[0] not in _SKIP_DIRS and not path.name.endswith(".tmp"):
            yield path


def archive_job(data_dir: str | os.PathLike[str], job_id: str, url: str, *, client: Any = None) -> ArchiveReport:
    """Upload ``job_id``'s store to ``url`` (``s3://bucket/prefix``); the manifest goes last."""
    import zstandard

    directory = job_dir(data_dir, job_id)
    if not directory.is_dir():
        raise JobNotFound(f"no job {job_id!r} in the embedded store at {data_dir}")
    bucket, prefix = parse_s3_url(url)
    base = "/".join(p for p in (prefix, safe_name(job_id)) if p)
    s3 = client or _client()
    report = ArchiveReport(f"s3://{bucket}/{base}/")
    entries = []
    compressor = zstandard.ZstdCompressor(level=10)
    for path in _files(directory):
        data = path.read_bytes()
        report.bytes_local += len(data)
        name = path.relative_to(directory).as_posix()
        if name.endswith(".jsonl"):
            data, name = compressor.compress(data), name + ".zst"
        _put(s3, bucket, f"{base}/{name}", data)
        entries.append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "mtime_ns": path.stat().st_mtime_ns})
        report.objects += 1
        report.bytes_stored += len(data)
    if not entries:
        raise StoreError(f"job {job_id!r} has no files to archive in {directory}")
    manifest = orjson.dumps({"job": job_id, "objects": entries}, option=orjson.OPT_INDENT_2)
    _put(s3, bucket, f"{base}/{MANIFEST}", manifest)
    return report


def _put(s3: Any, bucket: str, key: str, data: bytes) -> None:
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    except _s3_errors() as exc:  # refused (ClientError), unreachable (EndpointConnectionError)…
        raise StoreError(f"archiving to s3://{bucket}/{key}: {type(exc).__name__}: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    error = getattr(exc, "response", {}).get("Error", {}) if hasattr(exc, "response") else {}
    return str(error.get("Code") or error.get("Message") or exc)[:200]


def restore_job(url: str, job_id: str, *, into: str | os.PathLike[str] | None = None, client: Any = None) -> Path:
    """Download an archived job into a store directory (a fresh temporary one by default) and return the data dir.

    Every object is checked against the manifest's size and SHA-256; a job without a manifest (an archive
    that did not finish) is an error, never a partial job.
    """
    import zstandard

    bucket, prefix = parse_s3_url(url)
    base = "/".join(p for p in (prefix, safe_name(job_id)) if p)
    s3 = client or _client()
    try:
        manifest = orjson.loads(s3.get_object(Bucket=bucket, Key=f"{base}/{MANIFEST}")["Body"].read())
    except _s3_errors() as exc:
        code = _reason(exc)
        if code in ("NoSuchKey", "404", "NoSuchBucket"):
            raise JobNotFound(f"no archived job {job_id!r} at s3://{bucket}/{base}/ (no {MANIFEST})") from None
        raise StoreError(f"reading s3://{bucket}/{base}/{MANIFEST}: {type(exc).__name__}: {code}") from None
    data_dir = Path(into) if into is not None else Path(tempfile.mkdtemp(prefix="jobtrace-archive-"))
    directory = job_dir(data_dir, job_id)
    directory.mkdir(parents=True, exist_ok=True)
    decompressor = zstandard.ZstdDecompressor()
    for entry in manifest["objects"]:
        name = str(entry["name"])
        if name.startswith("/") or ".." in Path(name).parts:
            raise StoreError(f"archive of {job_id!r}: refusing the object name {name!r}")
        try:
            data = s3.get_object(Bucket=bucket, Key=f"{base}/{name}")["Body"].read()
        except _s3_errors() as exc:
            raise StoreError(f"reading s3://{bucket}/{base}/{name}: {type(exc).__name__}: {_reason(exc)}") from None
        if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise StoreError(f"s3://{bucket}/{base}/{name} does not match the archive's manifest")
        if name.endswith(".jsonl.zst"):
            data, name = decompressor.decompress(data), name[: -len(".zst")]
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if entry.get("mtime_ns"):  # a segment is named after its lines file's length and mtime: keep them matching
            os.utime(target, ns=(int(entry["mtime_ns"]), int(entry["mtime_ns"])))
    return data_dir
