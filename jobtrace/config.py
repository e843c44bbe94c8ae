"""Every environment variable jobtrace reads, in one place: documented, typed, read once.

Why one module: a training job is configured by its launcher's environment, so
environment variables are jobtrace's main configuration surface. Each one is declared
here once, as a constant holding its name and an entry in :data:`VARIABLES` (type,
default, meaning), and read through the typed helpers below, which share one boolean
dialect and one error style. Components read their variables when they are set up
(``init_tracing``, a shipper's ``from_env``, a reader) into the frozen dataclasses at
the end of this module, never on a hot path. ``docs/configuration.md`` is generated
from :data:`VARIABLES` (``python -m jobtrace.config``), and a test fails when any other
module of the product reads the environment itself.

Precedence, highest first: an argument of the API or a command-line flag, then the
variable, then the configuration file (commands only), then the launcher's own variables
(identity only), then the default.

The configuration file (``jobtrace.toml`` in the working directory, else ``[tool.jobtrace]`` of
its ``pyproject.toml``, else the file :data:`CONFIG_FILE` names) spells the same variables as
TOML keys (``[loki] url = …`` is ``JOBTRACE_LOKI_URL``); :func:`read_config_file` turns it into
variable values and :func:`file_layer` lays them under the environment while a command runs,
so that every reader here and every ``envvar=`` of a click option sees one precedence, set in
one place. See the "Configuration file" section of ``docs/configuration.md`` (:func:`markdown`).

Booleans: ``1 true yes on`` and ``0 false no off`` (any case); empty means unset;
anything else is a :class:`~jobtrace.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .errors import ConfigError

__all__ = [
    "CONFIG_FILE",
    "CONFIG_FILE_NAME",
    "ES",
    "KIBANA",
    "LOKI",
    "REDACT",
    "REDACT_PATTERNS",
    "RedactSettings",
    "ServerVars",
    "TracingSettings",
    "VARIABLES",
    "VL",
    "FileSettings",
    "Variable",
    "environ",
    "file_layer",
    "find_config_file",
    "load_config_file",
    "get_bool",
    "get_choice",
    "get_float",
    "get_int",
    "get_secret",
    "get_str",
    "markdown",
    "parse_duration_s",
    "read_config_file",
    "read_patterns",
    "server_vars",
]


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, the kind of value, its default as a user would write it, and why."""

    name: str
    kind: str
    """``text``, ``path``, ``bool``, ``int``, ``float``, ``choice``, ``secret``, ``url`` or ``list``."""
    default: str | None
    doc: str
    group: str


VARIABLES: dict[str, Variable] = {}
"""Every variable jobtrace reads, by name, in declaration order (the order of the docs)."""


def _var(name: str, kind: str, default: str | None, doc: str, group: str) -> str:
    if name in VARIABLES:
        raise RuntimeError(f"{name} declared twice")  # a programming error, caught by the tests
    VARIABLES[name] = Variable(name, kind, default, doc, group)
    return name


# ---- identity -------------------------------------------------------------------------------------
_G = "Identity"
JOB_ID: Final = _var("JOBTRACE_JOB_ID", "text", None,
                     "Job id shared by all ranks (default: the launcher's: `TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`, "
                     "the Open MPI or MPICH job id).", _G)
RANK: Final = _var("JOBTRACE_RANK", "int", None, "Global rank of this process (overrides the launcher's).", _G)
LOCAL_RANK: Final = _var("JOBTRACE_LOCAL_RANK", "int", None, "Rank within the node (overrides the launcher's).", _G)
WORLD_SIZE: Final = _var("JOBTRACE_WORLD_SIZE", "int", None, "Number of ranks in the job (overrides the launcher's).",
                         _G)
NODE: Final = _var("JOBTRACE_NODE", "text", None, "Node name to report (default: `SLURMD_NODENAME` or the host name).",
                   _G)

# ---- tracing --------------------------------------------------------------------------------------
_G = "Tracing"
DATA_DIR: Final = _var("JOBTRACE_DATA_DIR", "path", "jobtrace-data", "Embedded store directory.", _G)
DISABLE: Final = _var("JOBTRACE_DISABLE", "bool", "0",
                      "Turn tracing off: `init_tracing()` installs nothing and records nothing; `step`/`phase` "
                      "still work as no-ops.", _G)
HEARTBEAT_S: Final = _var("JOBTRACE_HEARTBEAT_S", "float", "2",
                          "Seconds between heartbeats (> 0): what a rank is doing and which collective it waits in, "
                          "so that `jobtrace watch` names a hang within seconds.", _G)
STALL_DUMP_S: Final = _var("JOBTRACE_STALL_DUMP_S", "float", "10",
                           "Seconds without progress before the heartbeat thread records the scene: every Python "
                           "thread's stack and, where torch keeps one, the Flight Recorder buffer (a file beside the "
                           "rank's events).", _G)
RUN_NONCE_TIMEOUT_S: Final = _var("JOBTRACE_RUN_NONCE_TIMEOUT_S", "float", "300",
                                  "Where no launcher names the run, the longest a rank other than 0 waits in "
                                  "`init_tracing` for the run's nonce in the store rank 0 serves (as long as rank 0 "
                                  "takes to start, like `init_process_group`). A rank that gives up keeps the id "
                                  "derived from MASTER_ADDR/PORT, and says so.", _G)
MEMORY_INTERVAL_S: Final = _var("JOBTRACE_MEMORY_INTERVAL_S", "float", "0.1",
                                "Least seconds between two host-RSS samples at step ends (0: every step; CUDA "
                                "counters are read every step).", _G)
FLUSH_INTERVAL_S: Final = _var("JOBTRACE_FLUSH_INTERVAL_S", "float", "1",
                               "Seconds between the export thread's batches (> 0). Longer spares each rank a wake-up "
                               "a second, but a SIGKILL loses what came after the last batch.", _G)
NATIVE: Final = _var("JOBTRACE_NATIVE", "bool", "1",
                     "Use the compiled recorder where it is built (`0`: the Python recorder).", _G)
COLLECTIVES: Final = _var("JOBTRACE_COLLECTIVES", "choice", "auto",
                          "How torch collectives are recorded: `hooks` (c10d's process-group hooks, torch 2.15 on: "
                          "every collective of every group, DDP's and FSDP's too, timed to completion), `wrap` (the "
                          "Python `torch.distributed` functions only), `auto` (hooks where torch has them).", _G)
NATIVE_HOOKS: Final = _var("JOBTRACE_NATIVE_HOOKS", "bool", "1",
                           "Record collectives of host-timed groups (gloo) with the compiled process-group hooks where "
                           "they are built for this torch (`python -m otel_instrumentation.native_hooks`): no GIL per "
                           "collective. `0`: the Python hooks.", _G)
CACHE_DIR: Final = _var("JOBTRACE_CACHE_DIR", "text", None,
                        "Where builds made for this machine are kept (the compiled process-group hooks); default "
                        "`~/.cache/jobtrace`.", _G)
AUTO_STEPS: Final = _var("JOBTRACE_AUTO_STEPS", "bool", "1",
                         "Steps and phases from the training loop's own calls where the script marks none: optimizer "
                         "steps end steps, DataLoader batches are data, the top-level module's call is forward, "
                         "`backward()` is backward. The first `oi.step` of the script's own turns them off.", _G)
INTEGRATIONS: Final = _var("JOBTRACE_INTEGRATIONS", "bool", "1",
                           "Attach jobtrace's callback to every Hugging Face `Trainer` and Lightning `Trainer` the "
                           "script makes (their loss, learning rate, grad norm and logged scalars as metrics).", _G)
LOCAL: Final = _var("JOBTRACE_LOCAL", "bool", "1",
                    "Write the embedded store; `0` with a server configured ships to the server only.", _G)
COMPACT: Final = _var("JOBTRACE_COMPACT", "bool", "1",
                      "Each rank writes a Parquet segment and rollup of its lines when it exits (`0`: JSON lines "
                      "only), and ships that rollup to Loki, VictoriaLogs or Elasticsearch/OpenSearch as a pack "
                      "(docs/server-scale.md).", _G)

# ---- redaction ------------------------------------------------------------------------------------
_G = "Redaction"
REDACT: Final = _var("JOBTRACE_REDACT", "bool", "1",
                     "Replace secrets in every event (Hugging Face, GitHub, Slack and AWS keys, bearer tokens, "
                     "passwords in URLs, W&B keys, private-key blocks, `password=`/`token=`/`secret=`/`api_key=` "
                     "values) with `[REDACTED:<kind>]` before any sink, the embedded store included; `0` keeps "
                     "them. Applies to traced processes, `jobtrace ingest` and `jobtrace export`. See "
                     "`docs/redaction.md`.", _G)
REDACT_PATTERNS: Final = _var("JOBTRACE_REDACT_PATTERNS", "path", None,
                              "A file of your own secret patterns besides the built-in ones: one `kind<TAB>regex` "
                              "a line (Python syntax, matched against each event line as JSON text); `#` starts a "
                              "comment line.", _G)

# ---- retention ------------------------------------------------------------------------------------
_G = "Retention"
RETENTION_LOGS: Final = _var("JOBTRACE_RETENTION_LOGS", "text", "7d",
                             "How long raw log lines are kept: `jobtrace prune`'s default `--older-than`, and Loki's "
                             "`retention_period` in the deploy stack (`168h` there). Elasticsearch/OpenSearch: the "
                             "ILM/ISM policies' delete age.", _G)
RETENTION_METRICS: Final = _var("JOBTRACE_RETENTION_METRICS", "text", "365d",
                                "How long per-step aggregates are kept: Prometheus' `--storage.tsdb.retention.time` "
                                "in the deploy stack.", _G)

# ---- reading a job --------------------------------------------------------------------------------
_G = "trace-job"
BACKEND: Final = _var("JOBTRACE_BACKEND", "choice", "local",
                      "Where `trace-job` reads: `local`, `loki`, `victorialogs`, `elasticsearch` or `archive`; "
                      "also where `jobtrace watch` follows a job and `jobtrace golden` keeps its library, among the "
                      "names each accepts (docs/cli.md).", _G)
MEMORY_LIMIT: Final = _var("JOBTRACE_MEMORY_LIMIT", "text", None,
                           "DuckDB's memory limit while reading a job (`4GB`); past it, DuckDB spills to disk.", _G)
THREADS: Final = _var("JOBTRACE_THREADS", "int", None, "DuckDB threads while reading a job (default: all cores).", _G)
CACHE_SETTLED_S: Final = _var("JOBTRACE_CACHE_SETTLED_S", "float", "60",
                              "A job whose files have not changed for this long counts as finished and gets a "
                              "columnar cache.", _G)
GRAFANA_URL: Final = _var("JOBTRACE_GRAFANA_URL", "url", None, "Grafana URL: findings link to Explore.", _G)
GRAFANA_DATASOURCE: Final = _var("JOBTRACE_GRAFANA_DATASOURCE", "text", None,
                                 "The Loki data source uid in Grafana, for the links.", _G)
KIBANA_DATA_VIEW: Final = _var("JOBTRACE_KIBANA_DATA_VIEW", "text", None,
                               "The Kibana data view id, for the links.", _G)


# ---- the configuration file ------------------------------------------------------------------------
CONFIG_FILE: Final = _var("JOBTRACE_CONFIG", "path", None,
                          "The configuration file the commands read, instead of looking for `jobtrace.toml`, then "
                          "`pyproject.toml`'s `[tool.jobtrace]`, in the working directory; `none` reads no file. "
                          "See \"Configuration file\" above.", "Commands")


# ---- servers --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerVars:
    """The names of one server's connection variables (``JOBTRACE_<PREFIX>_URL`` and the rest)."""

    prefix: str
    url: str
    username: str
    password: str
    token: str
    api_key: str
    tenant: str
    ca_file: str
    client_cert: str
    client_key: str
    insecure: str

    def file_of(self, secret: str) -> str:
        """The ``_FILE`` variable that holds ``secret`` (a Docker or Kubernetes secret file)."""
        return secret + "_FILE"


def _server(prefix: str, label: str, tenant_doc: str, url_doc: str) -> ServerVars:
    g = label
    p = f"JOBTRACE_{prefix}"
    names = ServerVars(
        prefix=p,
        url=_var(f"{p}_URL", "url", None, url_doc, g),
        username=_var(f"{p}_USERNAME", "text", None, "Basic-auth user name.", g),
        password=_var(f"{p}_PASSWORD", "secret", None, "Basic-auth password.", g),
        token=_var(f"{p}_TOKEN", "secret", None, "Bearer token (`Authorization: Bearer …`).", g),
        api_key=_var(f"{p}_API_KEY", "secret", None, "API key (`Authorization: ApiKey …`).", g),
        tenant=_var(f"{p}_TENANT", "text", None, tenant_doc, g),
        ca_file=_var(f"{p}_CA_FILE", "path", None, "A private CA bundle to verify the server with.", g),
        client_cert=_var(f"{p}_CLIENT_CERT", "path", None, "Client certificate for mutual TLS.", g),
        client_key=_var(f"{p}_CLIENT_KEY", "path", None, "Client key for mutual TLS.", g),
        insecure=_var(f"{p}_INSECURE", "bool", "0", "Do not verify the server's TLS certificate.", g),
    )
    for secret in (names.password, names.token, names.api_key):
        _var(names.file_of(secret), "path", None, f"A file holding `{secret}` (read at start, stripped).", g)
    return names


LOKI: Final = _server("LOKI", "Loki", "Tenant (`X-Scope-OrgID`).",
                      "Ship every rank's events to this Loki (or VictoriaLogs' `…/insert/loki`).")
_G = "Loki"
LOKI_FORMAT: Final = _var("JOBTRACE_LOKI_FORMAT", "choice", "protobuf",
                          "Push encoding: `protobuf` (snappy) or `json`.", _G)
LOKI_GZIP: Final = _var("JOBTRACE_LOKI_GZIP", "bool", "0", "Gzip JSON pushes.", _G)
LOKI_STRUCTURED_METADATA: Final = _var("JOBTRACE_LOKI_STRUCTURED_METADATA", "bool", "1",
                                       "Send rank, trace id, span id and step as structured metadata (Loki 3.x); "
                                       "`0` for older Loki.", _G)
LOKI_LABELS: Final = _var("JOBTRACE_LOKI_LABELS", "list", None,
                          "Extra static stream labels, `cluster=a,env=prod`.", _G)
LOKI_JOB_LABEL: Final = _var("JOBTRACE_LOKI_JOB_LABEL", "text", "training_job",
                             "The stream label that holds the job id, shipped and read (Loki, VictoriaLogs); `job` "
                             "reads data that earlier versions shipped under `job` (docs/loki.md).", _G)
LOKI_BATCH_LINES: Final = _var("JOBTRACE_LOKI_BATCH_LINES", "int", "8192", "Most lines in one push.", _G)
LOKI_BATCH_BYTES: Final = _var("JOBTRACE_LOKI_BATCH_BYTES", "int", "1048576", "Most bytes in one push.", _G)
LOKI_MAX_LINE_BYTES: Final = _var("JOBTRACE_LOKI_MAX_LINE_BYTES", "int", "262144",
                                  "Longer lines go to the dead-letter file unsent (Loki's `max_line_size`).", _G)
LOKI_QUERY_LIMIT: Final = _var("JOBTRACE_LOKI_QUERY_LIMIT", "int", "5000",
                               "Lines per query when `trace-job` reads Loki (at most the server's "
                               "`max_entries_limit_per_query`).", _G)
LOKI_QUERY_PARALLEL: Final = _var("JOBTRACE_LOKI_QUERY_PARALLEL", "int", "4",
                                  "Queries in flight when `trace-job` reads Loki.", _G)

VL: Final = _server("VL", "VictoriaLogs", "Tenant, `<AccountID>[:<ProjectID>]`.",
                    "VictoriaLogs URL for `trace-job --backend victorialogs`, and for `--backend victorialogs` "
                    "of `jobtrace export`, `replay` and `ingest` (pushed to its `/insert/loki`).")
VL_QUERY_PARALLEL: Final = _var("JOBTRACE_VL_QUERY_PARALLEL", "int", "4",
                                "Queries in flight when `trace-job` reads VictoriaLogs.", "VictoriaLogs")
VL_AGGREGATE: Final = _var("JOBTRACE_VL_AGGREGATE", "bool", "false",
                           "`trace-job` asks VictoriaLogs for per-step sums instead of every event: less client "
                           "memory and transfer, more server CPU, slower on the machines measured (docs/server-scale.md).",
                           "VictoriaLogs")

ES: Final = _server("ES", "Elasticsearch and OpenSearch", "Not used by Elasticsearch.",
                    "Ship every rank's events to this Elasticsearch 8/9 or OpenSearch 2.x.")
_G = "Elasticsearch and OpenSearch"
ES_NAMESPACE: Final = _var("JOBTRACE_ES_NAMESPACE", "text", "default",
                           "Data stream namespace: `logs-jobtrace-<namespace>` and the rest.", _G)
ES_SETUP: Final = _var("JOBTRACE_ES_SETUP", "choice", "auto",
                       "`auto`: the shipper installs missing templates on first use; `off`: never.", _G)
ES_FLAVOR: Final = _var("JOBTRACE_ES_FLAVOR", "choice", None,
                        "`elasticsearch`, `opensearch` or `victorialogs` (default: detected from `GET /`).", _G)
GOLDEN_INDEX: Final = _var("JOBTRACE_GOLDEN_INDEX", "text", "jobtrace-golden",
                           "The index that keeps the golden library on the cluster (`jobtrace golden --backend "
                           "elasticsearch`, `trace-job --backend elasticsearch --golden`).", _G)
ES_BATCH_LINES: Final = _var("JOBTRACE_ES_BATCH_LINES", "int", "2000", "Most documents in one `_bulk` request.", _G)
ES_BATCH_BYTES: Final = _var("JOBTRACE_ES_BATCH_BYTES", "int", "4194304", "Most bytes in one `_bulk` request.", _G)
ES_COMPRESS: Final = _var("JOBTRACE_ES_COMPRESS", "bool", "0", "Gzip `_bulk` requests.", _G)
ES_LOGS_RETENTION: Final = _var("JOBTRACE_ES_LOGS_RETENTION", "text", "7d",
                                "How long logs and heartbeats are kept (`7d`, `2w`, `1y`).", _G)
ES_METRICS_RETENTION: Final = _var("JOBTRACE_ES_METRICS_RETENTION", "text", "365d",
                                   "How long metric points and step spans are kept.", _G)
ES_TRACES_RETENTION: Final = _var("JOBTRACE_ES_TRACES_RETENTION", "text", None,
                                  "How long phase, collective and user spans are kept (default: as logs).", _G)

KIBANA: Final = _server("KIBANA", "Kibana", "Not used by Kibana.",
                        "Kibana or OpenSearch Dashboards: `jobtrace setup` imports the saved objects, and findings "
                        "link to Discover. Credentials default to the `JOBTRACE_ES_*` ones.")

PROM: Final = _server("PROM", "Prometheus remote write", "Tenant (`X-Scope-OrgID`: Mimir, Cortex).",
                      "Where `jobtrace metrics --remote-write` pushes (Prometheus' `…/api/v1/write`, Mimir, "
                      "VictoriaMetrics).")
_SERVERS: Final = {s.prefix: s for s in (LOKI, VL, ES, KIBANA, PROM)}

# ---- installing -------------------------------------------------------------------------------------
REQUIRE_NATIVE: Final = _var("JOBTRACE_REQUIRE_NATIVE", "bool", "0",
                             "At install time (`pip install .`): fail when the compiled parts cannot be built, instead "
                             "of installing without them (read by `setup.py`; CI sets it).", "Installing")

# ---- read from the OpenTelemetry standard, not ours --------------------------------------------------
_G = "OpenTelemetry (standard variables)"
OTLP_ENDPOINT: Final = _var("OTEL_EXPORTER_OTLP_ENDPOINT", "url", None,
                            "Also send spans over OTLP/HTTP to this Collector, Tempo or Jaeger (`/v1/traces` is "
                            "added).", _G)
OTLP_TRACES_ENDPOINT: Final = _var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "url", None,
                                   "The same, the full traces URL.", _G)
OTEL_SERVICE_NAME: Final = _var("OTEL_SERVICE_NAME", "text", None,
                                "`service.name` of the job's spans (default `training`) and documents (default "
                                "`jobtrace`).", _G)
TRACEPARENT: Final = _var("TRACEPARENT", "text", None,
                          "A W3C trace context from the launcher: its trace id is used for the job.", _G)
OTLP_METRICS_ENDPOINT: Final = _var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "url", None,
                                    "Where `jobtrace metrics` pushes its series as OTLP metrics (the OpenTelemetry "
                                    "standard variable; else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/metrics`).", _G)


# ---- reading ------------------------------------------------------------------------------------------
def environ() -> Mapping[str, str]:
    """The process environment: the one place the product reads it (tests pass their own mappings)."""
    return os.environ


def _raw(name: str, env: Mapping[str, str] | None) -> str | None:
    value = (environ() if env is None else env).get(name)
    return None if value is None or value.strip() == "" else value.strip()


DURATION_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration_s(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (or plain seconds) as seconds; ValueError otherwise. The one
    reading of a duration: ``--since 7d``, ``--older-than 2w``, ``JOBTRACE_RETENTION_LOGS``."""
    text = text.strip().lower()
    unit = DURATION_UNITS.get(text[-1:]) if text else None
    return float(text[:-1] if unit else text) * (unit or 1)


def get_str(name: str, env: Mapping[str, str] | None = None, default: str | None = None) -> str | None:
    """The variable's text, or ``default`` when unset or empty."""
    value = _raw(name, env)
    return default if value is None else value


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def get_bool(name: str, env: Mapping[str, str] | None = None, default: bool = False) -> bool:
    """The variable as a boolean in the one dialect (see the module docstring)."""
    value = _raw(name, env)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean: use 1/true/yes/on or 0/false/no/off")


def get_int(name: str, env: Mapping[str, str] | None = None, default: int | None = None, *,
            minimum: int | None = None) -> int | None:
    """The variable as a whole number of at least ``minimum``, or ``default`` when unset."""
    value = _raw(name, env)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a whole number") from None
    if minimum is not None and number < minimum:
        raise ConfigError(f"{name}={value!r} must be at least {minimum}")
    return number


def get_float(name: str, env: Mapping[str, str] | None = None, default: float | None = None, *,
              minimum: float | None = None, positive: bool = False) -> float | None:
    """The variable as a finite number (``positive``: above 0; ``minimum``: at least that), or ``default``."""
    value = _raw(name, env)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(f"{name}={value!r} is not a finite number")
    if positive and number <= 0:
        raise ConfigError(f"{name}={value!r} must be above 0")
    if minimum is not None and number < minimum:
        raise ConfigError(f"{name}={value!r} must be at least {minimum:g}")
    return number


def get_choice(name: str, choices: tuple[str, ...], env: Mapping[str, str] | None = None,
               default: str | None = None) -> str | None:
    """The variable as one of ``choices`` (compared in lower case), or ``default``."""
    value = _raw(name, env)
    if value is None:
        return default
    if value.lower() not in choices:
        raise ConfigError(f"{name}={value!r}: use {' or '.join(choices)}")
    return value.lower()


def get_secret(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """A secret from ``<name>_FILE`` (a mounted secret file, stripped) or from ``<name>`` itself.

    The error names the variable and the reason, never the value.
    """
    path = _raw(name + "_FILE", env)
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {name}_FILE: {exc.strerror}") from None
    return _raw(name, env)


def server_vars(prefix: str) -> ServerVars:
    """The connection variables of the server whose variables start with ``prefix`` (``JOBTRACE_LOKI``…)."""
    try:
        return _SERVERS[prefix.rstrip("_")]
    except KeyError:
        raise ConfigError(f"no server variables start with {prefix!r}; one of {', '.join(_SERVERS)}") from None


# ---- the configuration file --------------------------------------------------------------------------
CONFIG_FILE_NAME: Final = "jobtrace.toml"
"""The file the commands look for in the working directory (before ``pyproject.toml``'s ``[tool.jobtrace]``)."""

_NOT_IN_FILE: Final = frozenset({CONFIG_FILE, REQUIRE_NATIVE})
"""Variables a file cannot set: the file's own name, and the install-time switch (``setup.py`` reads no file)."""
_NOT_IN_FILE_GROUPS: Final = frozenset({"Identity"})
"""Per-process identity (rank, job id) differs between processes; one file shared by them cannot say it."""


@dataclass(frozen=True)
class FileSettings:
    """What a configuration file says, as the environment would spell it: ``{"JOBTRACE_LOKI_URL": "http://…"}``."""

    path: Path | None = None
    """The file read (``None``: none was found, or :data:`CONFIG_FILE` said ``none``)."""
    values: Mapping[str, str] = field(default_factory=dict)


def find_config_file(cwd: str | os.PathLike[str] | None = None,
                     env: Mapping[str, str] | None = None) -> tuple[Path, str | None] | None:
    """The configuration file and its table (``"tool.jobtrace"`` in a ``pyproject.toml``), or ``None``.

    :data:`CONFIG_FILE` first (a file that is not there is an error, not a silent default);
    else ``jobtrace.toml`` in ``cwd``; else ``cwd``'s ``pyproject.toml`` if it has a
    ``[tool.jobtrace]`` table. Only the working directory is looked in, never its parents:
    what a command reads should not change with where a repository happens to be checked out.
    """
    named = _raw(CONFIG_FILE, env)
    if named is not None:
        if named.lower() == "none":
            return None
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigError(f"{CONFIG_FILE}={named!r}: no such file")
        return path, "tool.jobtrace" if path.name == "pyproject.toml" else None
    here = Path(cwd) if cwd is not None else Path.cwd()
    own = here / CONFIG_FILE_NAME
    if own.is_file():
        return own, None
    pyproject = here / "pyproject.toml"
    if pyproject.is_file():
        try:
            with pyproject.open("rb") as fh:
                tool = tomllib.load(fh).get("tool")
        except (OSError, tomllib.TOMLDecodeError):
            return None  # somebody else's pyproject.toml: not ours to judge
        if isinstance(tool, dict) and "jobtrace" in tool:
            return pyproject, "tool.jobtrace"
    return None


def _file_variables() -> dict[str, Variable]:
    """The variables a file may set, by name."""
    return {name: v for name, v in VARIABLES.items()
            if name.startswith("JOBTRACE_") and name not in _NOT_IN_FILE and v.group not in _NOT_IN_FILE_GROUPS}


def _file_key(name: str) -> str:
    """``JOBTRACE_LOKI_URL`` as a file spells it at the top level: ``loki_url``."""
    return name.removeprefix("JOBTRACE_").lower()


def _is_private(path: Path) -> bool:
    """Whether only the owner (the user running the command) can read ``path``: as ssh and libpq demand of
    their key and password files. Never on Windows, whose modes say nothing about it."""
    if os.name == "nt":
        return False
    st = path.stat()
    return st.st_mode & 0o077 == 0 and st.st_uid == os.getuid()


def read_config_file(path: str | os.PathLike[str], table: str | None = None) -> FileSettings:
    """Read a configuration file into the variables it sets.

    Keys are the variables' names without ``JOBTRACE_``, in lower case; a table stands for
    the part before ``_``: ``data_dir = "store"`` and ``[loki] url = "http://loki:3100"``,
    or ``loki_url = …``, set ``JOBTRACE_DATA_DIR`` and ``JOBTRACE_LOKI_URL``. Values are
    TOML strings, numbers or booleans (written ``1``/``0``); a list variable takes a list,
    or for ``loki.labels`` a table of label = value. A relative path (a ``path`` variable,
    the ``*_file`` secrets) is relative to the file, not to where the command runs.

    Secrets (``password``, ``token``, ``api_key``): their ``*_file`` form, a path, is
    always accepted; the secret itself only in a file only its owner can read (mode
    ``0600``) and never in ``pyproject.toml``, which is made to be committed. Errors name
    the file and the key, never a value.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data: Any = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    for part in (table.split(".") if table else []):
        data = data.get(part, {}) if isinstance(data, dict) else {}
    if not isinstance(data, dict):
        raise ConfigError(f"configuration file {path}: [{table}] is not a table")
    allowed = _file_variables()
    values: dict[str, str] = {}
    for key, value in _flatten(data):
        where = f"configuration file {path}: {'.'.join(key)}"
        name = "JOBTRACE_" + "_".join(key).upper().replace("-", "_")
        var = allowed.get(name)
        if var is None:
            reason = ("is not read from a file (each process says its own)" if name in VARIABLES
                      else "is not a setting jobtrace knows")
            near = difflib.get_close_matches(_file_key(name), [_file_key(n) for n in allowed], n=1)
            raise ConfigError(f"{where} {reason}" + (f"; did you mean {near[0]!r}?" if near and name not in VARIABLES
                                                     else ""))
        if var.kind == "secret":
            if table is not None:
                raise ConfigError(f"{where}: a secret in pyproject.toml, which is made to be committed; set "
                                  f"{'.'.join(key)}_file to a file holding it, or use {name} or {CONFIG_FILE_NAME}")
            if not _is_private(path):
                raise ConfigError(f"{where}: a secret in a file others can read; chmod 600 {path}, or set "
                                  f"{'.'.join(key)}_file to a file holding it")
        values[name] = _file_value(value, var, path.parent, where)
    return FileSettings(path, values)


def _flatten(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(key path, value)`` for each value; a table whose path names a list variable is that value whole."""
    for key, value in data.items():
        path = (*prefix, str(key))
        name = "JOBTRACE_" + "_".join(path).upper().replace("-", "_")
        if isinstance(value, dict) and not (name in VARIABLES and VARIABLES[name].kind == "list"):
            yield from _flatten(value, path)
        else:
            yield path, value


def _file_value(value: Any, var: Variable, base: Path, where: str) -> str:
    """A TOML value as the environment would spell it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, str):
        if var.kind == "path" and value and not Path(value).expanduser().is_absolute():
            return str(base / value)
        return value
    if var.kind == "list" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if var.kind == "list" and isinstance(value, dict) and all(isinstance(v, (str, int, float)) for v in value.values()):
        return ",".join(f"{k}={v}" for k, v in value.items())
    raise ConfigError(f"{where}: expected a string, a number or a boolean, not {type(value).__name__}")


def load_config_file(cwd: str | os.PathLike[str] | None = None,
                     env: Mapping[str, str] | None = None) -> FileSettings:
    """The configuration file :func:`find_config_file` finds, read (empty settings where there is none)."""
    found = find_config_file(cwd, env)
    return read_config_file(*found) if found else FileSettings()


@contextmanager
def file_layer(settings: FileSettings) -> Iterator[FileSettings]:
    """While the block runs, the configuration file's values under the environment's: arguments > environment > file.

    The commands run inside it (:class:`jobtrace.cli.exitcodes.Command` and ``Group``), so a
    click option's ``envvar`` and every reader of this module see the file through one
    mechanism: a variable the environment does not set is set from the file, and taken out
    again afterwards (what the block's code set itself stays). The processes a command starts
    (the demo's ranks) inherit the values, as they would the environment's.
    """
    env = os.environ
    added = {name: (value, env.get(name)) for name, value in settings.values.items() if _raw(name, None) is None}
    for name, (value, _before) in added.items():
        env[name] = value
    try:
        yield settings
    finally:
        for name, (value, before) in added.items():
            if env.get(name) != value:
                continue  # the block set it itself
            if before is None:
                del env[name]
            else:
                env[name] = before  # an empty value, which counts as unset


# ---- settings, read once ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TracingSettings:
    """What ``init_tracing`` reads from the environment (arguments win over these)."""

    data_dir: str = "jobtrace-data"
    disabled: bool = False
    heartbeat_s: float = 2.0
    stall_dump_s: float = 10.0
    memory_interval_s: float = 0.1
    flush_interval_s: float = 1.0
    native: bool = True
    collectives: str = "auto"
    auto_steps: bool = True
    integrations: bool = True
    local_store: bool = True
    compact: bool = True
    otlp_endpoint: str | None = None
    otlp_traces_endpoint: str | None = None
    service_name: str | None = None
    servers: dict[str, str] = field(default_factory=dict)
    """The network backends with a URL configured: ``{"loki": url, "elasticsearch": url}``."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TracingSettings:
        servers = {backend: url for backend, url in (("loki", get_str(LOKI.url, env)),
                                                      ("elasticsearch", get_str(ES.url, env))) if url}
        return cls(
            data_dir=get_str(DATA_DIR, env, cls.data_dir) or cls.data_dir,
            disabled=get_bool(DISABLE, env, False),
            heartbeat_s=_float(get_float(HEARTBEAT_S, env, positive=True), cls.heartbeat_s),
            stall_dump_s=_float(get_float(STALL_DUMP_S, env, minimum=0.0), cls.stall_dump_s),
            memory_interval_s=_float(get_float(MEMORY_INTERVAL_S, env, minimum=0.0), cls.memory_interval_s),
            flush_interval_s=_float(get_float(FLUSH_INTERVAL_S, env, positive=True), cls.flush_interval_s),
            native=get_bool(NATIVE, env, True),
            collectives=get_choice(COLLECTIVES, ("auto", "hooks", "wrap"), env) or "auto",
            auto_steps=get_bool(AUTO_STEPS, env, True),
            integrations=get_bool(INTEGRATIONS, env, True),
            local_store=get_bool(LOCAL, env, True),
            compact=get_bool(COMPACT, env, True),
            otlp_endpoint=get_str(OTLP_ENDPOINT, env),
            otlp_traces_endpoint=get_str(OTLP_TRACES_ENDPOINT, env),
            service_name=get_str(OTEL_SERVICE_NAME, env),
            servers=servers,
        )


@dataclass(frozen=True)
class RedactSettings:
    """Whether events are redacted, and the user's patterns as ``(kind, regex, where)`` (read once)."""

    enabled: bool = True
    patterns: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RedactSettings:
        path = get_str(REDACT_PATTERNS, env)
        return cls(enabled=get_bool(REDACT, env, True), patterns=read_patterns(path) if path else ())


def read_patterns(path: str) -> tuple[tuple[str, str, str], ...]:
    """``kind<TAB>regex`` lines of ``path`` as ``(kind, regex, "path, line n")``; blank and ``#`` lines skipped.

    Errors name the file and the line, never its text: a pattern may spell out the secret it hides.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {REDACT_PATTERNS} file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{REDACT_PATTERNS} file {path} is not UTF-8 text") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        kind, tab, regex = line.partition("\t")
        regex = regex.lstrip("\t")
        if not tab or not kind.strip() or not regex:
            raise ConfigError(f"{REDACT_PATTERNS} file {path}, line {n}: expected kind<TAB>regex")
        out.append((kind.strip(), regex, f"{path}, line {n}"))
    return tuple(out)


def _float(value: float | None, default: float) -> float:
    return default if value is None else value


# ---- the reference page --------------------------------------------------------------------------------
def markdown() -> str:
    """``docs/configuration.md``: every variable by group, generated from :data:`VARIABLES`."""
    out = [
        "# Configuration",
        "",
        "<!-- Generated by `python -m jobtrace.config > docs/configuration.md`; a test fails when it is stale. -->",
        "",
        "Every environment variable jobtrace reads. Arguments of `init_tracing()` and command-line flags win over",
        "these; these win over the launcher's own variables (`RANK`, `SLURM_PROCID`, …; identity only).",
        "",
        "Booleans: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case); an empty value is unset; anything",
        "else stops with an error that names the variable. Secrets (`*_PASSWORD`, `*_TOKEN`, `*_API_KEY`) may",
        "instead be read from a file named by the same variable with `_FILE` appended; they never appear in",
        "logs, errors or reports.",
        "",
        "## Configuration file",
        "",
        "The commands (`jobtrace …`, `trace-job`) also read an optional TOML file, for what would otherwise be",
        "exported in every shell. Which file, the first found:",
        "",
        f"1. the file `{CONFIG_FILE}` names (`none`: no file at all);",
        f"2. `{CONFIG_FILE_NAME}` in the working directory;",
        "3. the `[tool.jobtrace]` table of `pyproject.toml` in the working directory.",
        "",
        "Only one file is read, and only in the working directory (never its parents).",
        "",
        "**Precedence**, highest first: command-line arguments > environment variables > the file > the",
        "defaults below. A variable set in the environment (even to the same value) wins over the file; an",
        "empty variable counts as unset, so the file's value applies.",
        "",
        "**Keys** are the variables below without `JOBTRACE_`, in lower case; a table stands for the part",
        "before `_`, so these two spell the same settings:",
        "",
        "```toml",
        "# jobtrace.toml",
        'data_dir = "/scratch/jobtrace"       # JOBTRACE_DATA_DIR',
        'backend = "loki"                     # JOBTRACE_BACKEND',
        "",
        "[loki]",
        'url = "https://loki.example:3100"    # JOBTRACE_LOKI_URL',
        'username = "trainer"',
        'password_file = "/run/secrets/loki"  # JOBTRACE_LOKI_PASSWORD_FILE',
        'labels = { cluster = "a", env = "prod" }',
        "```",
        "",
        "```toml",
        "# pyproject.toml",
        "[tool.jobtrace]",
        'data_dir = "/scratch/jobtrace"',
        'loki_url = "https://loki.example:3100"',
        "```",
        "",
        "Values are strings, numbers or booleans (`true` is `1`); `loki.labels` also takes a table. A",
        "relative path (`data_dir`, `*_file`, `ca_file`, …) is relative to the file, not to where the command",
        "runs. An unknown key, a key the file cannot set (the identity variables: each process says its own;",
        f"`{CONFIG_FILE}`; `{REQUIRE_NATIVE}`) or a value of the wrong type stops the command with exit status 3",
        "and a message naming the file and the key.",
        "",
        "**Secrets.** `password`, `token` and `api_key` are best given as paths, `password_file = …` (a Docker",
        "or Kubernetes secret, a file of mode 0600). The secret itself is accepted only in a `jobtrace.toml`",
        "(or a file named by the variable) that only its owner can read, mode `0600` or `0400`, as ssh and",
        "libpq demand of their key and password files; never in `pyproject.toml`, which is made to be",
        "committed. Either refusal names the key and the remedy, never the value.",
        "",
        "The file configures the commands, and the processes they start (`jobtrace demo`'s ranks); a training",
        "job started by its own launcher reads its environment only.",
    ]
    groups: dict[str, list[Variable]] = {}
    for v in VARIABLES.values():
        groups.setdefault(v.group, []).append(v)
    for group, variables in groups.items():
        out += ["", f"## {group}", "", "| variable | kind | default | meaning |", "| --- | --- | --- | --- |"]
        for v in variables:
            default = f"`{v.default}`" if v.default is not None else ""
            out.append(f"| `{v.name}` | {v.kind} | {default} | {v.doc} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
