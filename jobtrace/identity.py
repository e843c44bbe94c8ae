"""Who this process is within the job: job id, rank, world, node, and the shared TraceID.

Every rank must arrive at the same job id and the same 128-bit TraceID *without
talking to the others* (there may be no process group yet, or it may be the thing
that hangs). So both are derived only from what the launcher put in the environment.

Precedence, highest first: explicit arguments, ``JOBTRACE_*`` variables, the
torch launchers (torchrun/torchelastic, DeepSpeed: they describe the process group
torch will actually build), MPI (Open MPI, MPICH/Hydra, PMIx), SLURM. When two
sources disagree the higher one wins and the disagreement is reported in
``Identity.warnings`` so it reaches the log instead of being silently resolved.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import config
from .errors import ConfigError

__all__ = ["Identity", "job_root_span_id", "resolve_identity", "trace_id_for_job"]

# (source name, job id, rank, local rank, world size) variable names per launcher.
_SOURCES: tuple[tuple[str, tuple[str, ...], str, str, str], ...] = (
    ("jobtrace", (config.JOB_ID,), config.RANK, config.LOCAL_RANK, config.WORLD_SIZE),
    ("torchrun", ("TORCHELASTIC_RUN_ID",), "RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("openmpi", ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"), "OMPI_COMM_WORLD_RANK",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("mpich", ("PMI_JOBID",), "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
    ("slurm", ("SLURM_JOB_ID",), "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
)

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


@dataclass(frozen=True, slots=True)
class Identity:
    """Where this process sits in the job. ``trace_id``/``parent_span_id`` are lowercase hex."""

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    node: str
    pid: int
    trace_id: str
    parent_span_id: str | None = None
    launcher: str = "none"
    warnings: tuple[str, ...] = field(default=())
    forked: bool = False  # a child forked from the rank's process (a DataLoader worker), not the rank itself
    job_derived: bool = False
    """The job id was derived from MASTER_ADDR/PORT (no launcher named the run): the same for the next run on
    the same port, unless the tracing layer adds a run nonce (``otel_instrumentation._runid``)."""
    slurm_step: str | None = None
    """``<job>.<step>`` where SLURM started this process: what a watcher asks ``scontrol`` about when it dies."""


def trace_id_for_job(job_id: str) -> str:
    """The 128-bit TraceID every rank derives from the job id alone (never all zeros)."""
    digest = hashlib.sha256(b"jobtrace:" + job_id.encode("utf-8")).hexdigest()[:32]
    return digest if int(digest, 16) else "0" * 31 + "1"


def job_root_span_id(job_id: str) -> int:
    """The span every rank's step spans hang under: one id per job, the same on every rank, no communication."""
    return int(hashlib.sha256(b"jobtrace-root:" + job_id.encode("utf-8")).hexdigest()[:16], 16) or 1


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def _job_id_from(env: Mapping[str, str], names: tuple[str, ...], source: str) -> str | None:
    for name in names:
        value = env.get(name)
        if value and value.lower() != "none":
            if source == "slurm" and env.get("SLURM_ARRAY_TASK_ID"):
                return f"{env.get('SLURM_ARRAY_JOB_ID', value)}_{env['SLURM_ARRAY_TASK_ID']}"
            return value
    return None


def resolve_identity(
    env: Mapping[str, str] | None = None,
    *,
    job_id: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    node: str | None = None,
) -> Identity:
    """Resolve this process's identity from arguments and the launcher's environment."""
    env = config.environ() if env is None else env
    warnings: list[str] = []
    found: dict[str, tuple[int | str, str]] = {}  # key: (value, where it came from)

    def take(key: str, value: int | str | None, source: str) -> None:
        if value is None:
            return
        if key not in found:
            found[key] = (value, source)
        elif found[key][0] != value and key != "job_id":
            warnings.append(
                f"{key}: {found[key][1]} says {found[key][0]!r}, {source} says {value!r}; "
                f"using {found[key][1]}"
            )

    take("job_id", job_id, "argument")
    take("rank", rank, "argument")
    take("local_rank", local_rank, "argument")
    take("world_size", world_size, "argument")
    launcher = "none"
    for source, job_vars, rank_var, local_var, world_var in _SOURCES:
        src_rank = _int(env, rank_var)
        src_world = _int(env, world_var)
        src_job = _job_id_from(env, job_vars, source)
        if source == "torchrun" and src_rank is not None and "TORCHELASTIC_RUN_ID" not in env:
            source = "deepspeed" if "CROSS_RANK" in env or "CROSS_SIZE" in env else "torch-env"
        if launcher == "none" and source != "jobtrace" and (src_rank is not None or src_job):
            launcher = source
        take("job_id", src_job, source)
        take("rank", src_rank, source)
        take("local_rank", _int(env, local_var), source)
        take("world_size", src_world, source)

    r = int(found.get("rank", (0, ""))[0])
    w = int(found.get("world_size", (1, ""))[0])
    lr = int(found.get("local_rank", (r if w == 1 else 0, ""))[0])
    if "local_rank" not in found and w > 1:
        warnings.append("local rank not given by any launcher variable; assuming 0")
    if w < 1:
        raise ConfigError(f"world size {w} (from {found['world_size'][1]}) must be at least 1")
    if not 0 <= r < w:
        raise ConfigError(
            f"rank {r} (from {found.get('rank', (0, 'default'))[1]}) is outside world size {w} "
            f"(from {found.get('world_size', (1, 'default'))[1]}); set {config.RANK}/{config.WORLD_SIZE}"
        )

    resolved_job = found.get("job_id", (None, ""))[0]
    derived = False
    if resolved_job is None:
        if w > 1 and env.get("MASTER_ADDR"):
            # Same on every rank of this launch, different for the next launch on another port.
            key = f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT', '')}:{w}"
            resolved_job = "job-" + hashlib.sha1(key.encode()).hexdigest()[:12]
            derived = True
            warnings.append(
                f"no launcher job id found; derived {resolved_job} from MASTER_ADDR/PORT. "
                f"Set {config.JOB_ID} to name the job."
            )
        else:
            resolved_job = time.strftime("local-%Y%m%d-%H%M%S-", time.gmtime()) + str(os.getpid())
    job = str(resolved_job)
    if not job or len(job) > 200 or any(c in job for c in "/\\\0\n"):
        raise ConfigError(f"job id {job!r} must be 1-200 characters without '/', '\\\\' or newlines")

    trace_id = trace_id_for_job(job)
    parent: str | None = None
    tp = env.get(config.TRACEPARENT) or env.get(config.TRACEPARENT.lower())
    if tp:
        m = _TRACEPARENT.match(tp.strip().lower())
        if m and int(m.group(1), 16):
            trace_id, parent = m.group(1), m.group(2)
        else:
            warnings.append(f"ignoring malformed TRACEPARENT {tp!r}")

    host = node or env.get(config.NODE) or env.get("SLURMD_NODENAME") or socket.gethostname()
    return Identity(
        job_id=job,
        rank=r,
        local_rank=lr,
        world_size=w,
        node=host,
        pid=os.getpid(),
        trace_id=trace_id,
        parent_span_id=parent,
        launcher=launcher,
        warnings=tuple(warnings),
        job_derived=derived,
        slurm_step=(f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
                    if env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID") else None),
    )
