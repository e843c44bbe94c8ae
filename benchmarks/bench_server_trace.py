"""``trace-job`` on the real servers at scale: each way of reading a server beside the embedded store (issue 26).

    python benchmarks/bench_server_trace.py                          # 64 and 256 ranks x 1,000 steps, both servers
    python benchmarks/bench_server_trace.py --ranks 64 --steps 200   # a quick sizing run
    python benchmarks/bench_server_trace.py --huge --skip "1024:victorialogs (before)"  # adds 1,024 ranks
    python benchmarks/bench_server_trace.py --backends victorialogs --json out.json

For each size a synthetic job (:class:`jobtrace.synth.SynthJob`: one rank slow by 1.6x, NaN
loss over the last tenth of the steps; nine events per rank and step) is written to an
embedded store, then sent with ``jobtrace export``'s own code (:func:`shippers.export_job`)
to the real VictoriaLogs (Loki push) and OpenSearch (``_bulk``) that the tests start
(``tests.servers``, built once into ``~/.cache/jobtrace-servers``), events first, then each
rank's pack (its rollup, :mod:`jobtrace.store._packs`). Then ``trace-job --json`` runs, each
time in a fresh Python process, on ``--backend local`` and on each server in each way it can be
read (:data:`VARIANTS`): as a user runs it today (through the packs), the ways it reads a job
whose ranks left none (VictoriaLogs: every event parsed by DuckDB, or summed on the server;
OpenSearch: summed by composite aggregations, or the whole pull), and VictoriaLogs' reader as
it was before the servers summed (every event parsed in Python), the baseline. This prints for each:

* **time**: the child process's wall time, as a user waits for it (interpreter start
  included), and of that the ``load_job`` part (reading the events into DuckDB);
* **bytes**: what the client's sockets received and sent (every ``socket.socket``
  read and write in the child is counted, so it is the wire size, whichever HTTP
  client the backend uses), and the number of HTTP requests;
* **client peak RSS** (the child's ``ru_maxrss``) and its CPU time;
* **server CPU**: the server process's user+system time (psutil) across the call.
  The server is first left to go quiet (merges, refreshes after the export), and the
  rate it still burns idle is printed, so the figure can be corrected by hand;
* **verdict**: whether the errors and warnings (kind, ranks) equal the embedded store's.

Everything of one size runs in one invocation, on the same machine, one after the other.
Disk: today's server readers stage every event in a temporary file (about the job's JSON size,
674 MiB at 256 x 1,000) and OpenSearch keeps about twice that; ``--min-free-gib`` stops before
a size when the disk is short. Prints figures (and ``--json`` writes them); asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BACKENDS = ("victorialogs", "elasticsearch")

# The child: count socket bytes and HTTP requests, time load_job, run the real trace-job CLI in-process.
# Patching the classes (not a session) catches requests' and opensearch-py's connections alike.
CHILD = r"""
import http.client, json, resource, socket, sys, time
t_start = time.perf_counter()
counts = {{"rx": 0, "tx": 0, "requests": 0}}
_recv_into, _recv, _send, _sendall = socket.socket.recv_into, socket.socket.recv, socket.socket.send, socket.socket.sendall
def recv_into(self, buf, *a, **k):
    n = _recv_into(self, buf, *a, **k); counts["rx"] += n; return n
def recv(self, *a, **k):
    b = _recv(self, *a, **k); counts["rx"] += len(b); return b
def send(self, data, *a, **k):
    n = _send(self, data, *a, **k); counts["tx"] += n; return n
def sendall(self, data, *a, **k):
    counts["tx"] += len(data); return _sendall(self, data, *a, **k)
socket.socket.recv_into, socket.socket.recv, socket.socket.send, socket.socket.sendall = recv_into, recv, send, sendall
_put = http.client.HTTPConnection.putrequest
def putrequest(self, *a, **k):
    counts["requests"] += 1; return _put(self, *a, **k)
http.client.HTTPConnection.putrequest = putrequest
sys.path.insert(0, {root!r})
import queries
phases = {{}}
_load = queries.load_job
def before(backend, job_id, *, url, time_range, **_):
    # VictoriaLogs as trace-job read it before 2026-12-07: every event parsed in Python, staged, parsed again
    from queries._victorialogs import VictoriaLogsReader, _only_job
    from queries._store import ReadStats, load_events
    from jobtrace.http import HttpConfig, RequestsTransport
    from loki import job_label, logsql_quote
    reader = VictoriaLogsReader(url, RequestsTransport(HttpConfig(url)))
    stats = ReadStats()
    selector = "{{" + job_label() + "=" + logsql_quote(job_id) + ", kind!=" + logsql_quote("rollup") + "}}"  # events, not packs
    events = _only_job(job_id, reader.fetch(selector, time_range.start_ns, time_range.end_ns, stats), stats)
    return load_events(job_id, events, "victorialogs:" + url, stats)
def timed_load(*a, **k):
    variant = {variant!r}
    t = time.perf_counter()
    job = before(*a, **k) if variant == "before" else _load(*a, **(k | variant))
    phases["load_s"] = time.perf_counter() - t
    phases["fetched_events"] = job.stats.fetched_events
    phases["events"] = job.stats.events; return job
queries.load_job = timed_load
from jobtrace.cli.trace import trace_job
rc = None
t0 = time.perf_counter()
try:
    trace_job.main(args={args!r}, prog_name="trace-job")
except SystemExit as exc:
    rc = exc.code
t1 = time.perf_counter()
ru = resource.getrusage(resource.RUSAGE_SELF)
with open({out!r}, "w") as fh:
    json.dump({{"rc": rc, "in_process_s": t1 - t0, "imports_s": t0 - t_start, **phases, **counts,
               "peak_mib": ru.ru_maxrss / 1024, "cpu_s": ru.ru_utime + ru.ru_stime}}, fh)
"""


def synth_job(data: Path, ranks: int, steps: int) -> tuple[str, int, int]:
    """The job's id, its events and its canonical bytes; written once per size and kept in ``data``.

    Only the Parquet segments are kept (the raw lines pruned, as a short raw retention does):
    the disk this runs on is small, and ``export`` rebuilds the lines from the segments.
    """
    import duckdb

    from jobtrace.store import job_files
    from jobtrace.synth import SynthJob, write_job

    job_id = f"scale-{ranks}x{steps}"
    directory = data / job_id
    marker = directory / ".bench-complete"
    if not marker.exists():
        t0 = time.perf_counter()
        write_job(data, SynthJob(job_id=job_id, ranks=ranks, steps=steps, ranks_per_node=8,
                                 slow_ranks={ranks // 3: 1.6}, nan_step=steps - steps // 10, logs_per_step=1),
                  keep_lines=False, processes=min(4, os.cpu_count() or 1))
        segments = job_files(directory).segments
        events = duckdb.connect().execute("SELECT count(*) FROM read_parquet(?)", [segments]).fetchall()[0][0]
        size = int((directory / ".synth-raw-bytes").read_text())
        marker.write_text(json.dumps({"events": events, "bytes": size}))
        print(f"  wrote {job_id}: {events:,} events ({size / 2**20:,.0f} MiB as JSON lines, kept as segments) in "
              f"{time.perf_counter() - t0:.0f}s", flush=True)
    info = json.loads(marker.read_text())
    return job_id, int(info["events"]), int(info["bytes"])


def server_cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def settle(pid: int, quiet: float = 0.1, window: float = 1.0, timeout: float = 45.0) -> float:
    """Wait until the server burns under ``quiet`` CPU-seconds per second; return the last rate seen."""
    deadline = time.monotonic() + timeout
    last = server_cpu(pid)
    rate = float("inf")
    while time.monotonic() < deadline:
        time.sleep(window)
        now = server_cpu(pid)
        rate, last = (now - last) / window, now
        if rate < quiet:
            break
    return rate


def ship(backend: str, server: Any, data: Path, job_id: str) -> dict[str, Any]:
    """The job to ``backend`` with ``jobtrace export``'s code, then made searchable; seconds and events/s."""
    from shippers import export_job

    t0 = time.perf_counter()
    summary = export_job(data, job_id, backend, url=server.url, timeout_s=3 * 3600)
    seconds = time.perf_counter() - t0
    if not summary.complete:
        raise RuntimeError(f"export to {backend} incomplete: {summary.to_dict()}")
    if backend == "victorialogs":
        server.force_flush()
    else:
        server.refresh("*-jobtrace-*")
    return {"seconds": round(seconds, 2), "events_per_s": round(summary.sent / seconds), "sent": summary.sent}


VARIANTS: dict[str, dict[str, Any]] = {
    # name shown: (backend, load_job options, or "before" for the old VictoriaLogs reader)
    "victorialogs": {"backend": "victorialogs", "options": {}},
    "victorialogs (no packs)": {"backend": "victorialogs", "options": {"packs": False}},
    "victorialogs (server sums)": {"backend": "victorialogs", "options": {"packs": False, "aggregate": True}},
    "victorialogs (before)": {"backend": "victorialogs", "options": "before"},
    "elasticsearch": {"backend": "elasticsearch", "options": {}},
    "elasticsearch (no packs)": {"backend": "elasticsearch", "options": {"packs": False}},
    "elasticsearch (whole)": {"backend": "elasticsearch", "options": {"whole": True}},
}
"""Each way a backend is read: today's default (the ranks' packs, which ``export`` sends after the events),
the ways it reads a job without packs (a killed rank, a running job), and the reader before any of this."""


def trace(backend: str, server: Any, data: Path, job_id: str, work: Path, variant: str | None = None) -> dict[str, Any]:
    """``trace-job JOB --json`` on ``backend`` in a fresh process: figures, plus the report's verdicts.

    ``variant``: a name in :data:`VARIANTS` (how ``load_job`` is called); default: as a user runs it.
    """
    options = VARIANTS[variant]["options"] if variant else {}
    from jobtrace.synth import SynthJob
    from tests.conftest import python_env

    t0_s = SynthJob().t0_ns // 1_000_000_000
    args = [job_id, "--json", "--backend", backend]
    if backend == "local":
        args += ["--data-dir", str(data)]
    else:
        args += ["--url", server.url, "--since", str(t0_s - 60), "--until", str(t0_s + 86_400)]
    out = work / f"child-{backend}-{job_id}.json"
    out.unlink(missing_ok=True)
    code = CHILD.format(root=str(ROOT), args=args, out=str(out), variant=options)
    pid = server.proc.pid if server is not None else None
    idle = settle(pid) if pid else 0.0
    cpu0 = server_cpu(pid) if pid else 0.0
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, env=python_env(), check=False,
                          timeout=3 * 3600)
    wall = time.perf_counter() - t0
    cpu1 = server_cpu(pid) if pid else 0.0
    if proc.returncode not in (0, 1) or not out.exists():
        raise RuntimeError(f"trace-job --backend {backend} exited {proc.returncode}:\n"
                           f"{proc.stderr.decode(errors='replace')[-3000:]}")
    figures = json.loads(out.read_text())
    report = json.loads(proc.stdout)
    verdicts = sorted((f["kind"], f["ranks"]) for f in report["findings"] if f["severity"] in ("error", "warning"))
    row = {"backend": variant or backend, "wall_s": round(wall, 2), **figures,
           "events_reported": report.get("events"),
           "verdicts": verdicts}
    if pid:
        import psutil

        row |= {"server_cpu_s": round(cpu1 - cpu0, 2), "server_idle_cpu_per_s": round(idle, 3),
                "server_rss_mib": round(psutil.Process(pid).memory_info().rss / 2**20)}
    return row


def show(row: dict[str, Any], local: dict[str, Any] | None) -> None:
    same = "" if local is None else ("same verdicts" if row["verdicts"] == local["verdicts"]
                                    else f"DIFFERENT verdicts: {row['verdicts']}")
    server = (f"  server cpu {row['server_cpu_s']:6.1f}s (idle {row['server_idle_cpu_per_s']:.2f}/s, "
              f"rss {row['server_rss_mib']} MiB)" if "server_cpu_s" in row else "")
    fetched = f", {row['fetched_events']:,} fetched" if row.get("fetched_events") is not None else ""
    print(f"  {row['backend']:21s} {row['wall_s']:7.1f}s (load {row.get('load_s', 0):6.1f}s)  "
          f"rx {row['rx'] / 2**20:8.1f} MiB  tx {row['tx'] / 2**10:7.0f} KiB  {row['requests']:5d} req  "
          f"peak {row['peak_mib']:6.0f} MiB  cpu {row['cpu_s']:6.1f}s{server}  {row['events_reported']:,} events{fetched}  "
          f"{same}", flush=True)


def bench_size(ranks: int, steps: int, backends: list[str], servers: dict[str, Any], work: Path,
               repeat: int, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    data = work / "data"
    print(f"\n{ranks} ranks x {steps} steps", flush=True)
    job_id, events, size = synth_job(data, ranks, steps)
    print(f"  {job_id}: {events:,} events, {size / 2**20:,.0f} MiB canonical JSON", flush=True)
    result: dict[str, Any] = {"ranks": ranks, "steps": steps, "events": events, "canonical_bytes": size,
                              "ship": {}, "trace": []}
    for backend in backends:
        result["ship"][backend] = shipped = ship(backend, servers[backend], data, job_id)
        print(f"  shipped to {backend}: {shipped['seconds']:.0f}s ({shipped['events_per_s']:,} events/s)",
              flush=True)
    local = None
    for r in range(repeat):
        runs = [("local", None)] + [(v["backend"], name) for name, v in VARIANTS.items()
                                    if v["backend"] in backends and name not in skip]
        for backend, variant in runs:
            row = trace(backend, servers.get(backend), data, job_id, work, variant) | {"round": r + 1}
            local = row if backend == "local" and local is None else local
            show(row, None if backend == "local" else local)
            result["trace"].append(row)
    return result


def start_servers(backends: list[str], heap: str, steady_jvm: bool) -> dict[str, Any]:
    from tests.servers import OpenSearchServer, VictoriaLogsServer

    servers: dict[str, Any] = {}
    if "victorialogs" in backends:
        servers["victorialogs"] = VictoriaLogsServer().start()
        print(f"VictoriaLogs at {servers['victorialogs'].url}", flush=True)
    if "elasticsearch" in backends:
        os.environ["JOBTRACE_OPENSEARCH_HEAP"] = heap
        node: Any = OpenSearchServer
        if steady_jvm:  # bench_elasticsearch's node: C2 JIT and G1, as a production JVM runs
            import importlib.util

            spec = importlib.util.spec_from_file_location("bench_elasticsearch", ROOT / "benchmarks" /
                                                          "bench_elasticsearch.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            node = module.bench_node_class()
        servers["elasticsearch"] = node().start()
        from jobtrace.http import HttpConfig
        from kibana._setup import run_setup

        run_setup(HttpConfig(servers["elasticsearch"].url), replicas=0)
        os.environ["JOBTRACE_ES_SETUP"] = "off"  # set up once, above: the export only sends
        import requests

        found = requests.get(servers["elasticsearch"].url + "/_cluster/settings", timeout=30,
                             params={"include_defaults": "true", "flat_settings": "true"}).json()
        print(f"OpenSearch search.max_buckets: {found.get('persistent', {}).get('search.max_buckets') or found.get('defaults', {}).get('search.max_buckets')}", flush=True)
        print(f"OpenSearch at {servers['elasticsearch'].url} (heap {heap}, "
              f"{'C2 + G1' if steady_jvm else 'the tests JVM flags: C1 only, serial GC'})", flush=True)
    return servers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256], help="job sizes in ranks (default 64 256)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--huge", action="store_true", help="also 1,024 ranks (9.2 million events at 1,000 steps)")
    ap.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    ap.add_argument("--repeat", type=int, default=1, help="trace-job rounds per backend and size")
    ap.add_argument("--heap", default="1g", help="the OpenSearch node's heap (JOBTRACE_OPENSEARCH_HEAP)")
    ap.add_argument("--steady-jvm", action="store_true", help="run OpenSearch with C2 and G1 (bench_elasticsearch's "
                    "node) instead of the tests' fast-start flags")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "jobtrace-bench-server-trace",
                    help="where the synthetic jobs are kept between runs")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--skip", nargs="*", default=[], metavar="RANKS:VARIANT",
                    help="skip a way of reading at a size, e.g. '1024:victorialogs (before)' (at 1,024 ranks the old "
                         "reader takes minutes and ~13 GiB of client memory); variants: " + ", ".join(VARIANTS))
    ap.add_argument("--min-free-gib", type=float, default=1.5, help="stop before a size when the disk has less free")
    args = ap.parse_args(argv)
    for var in [v for v in os.environ if v.startswith("JOBTRACE_") and v != "JOBTRACE_SERVERS_CACHE"]:
        del os.environ[var]  # the export reads its settings from the environment: this run's only
    ranks = sorted(set(args.ranks + ([1024] if args.huge else [])))
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"bench_server_trace: {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"sizes {ranks} x {args.steps}, backends {args.backends}", flush=True)
    out: dict[str, Any] = {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                           "heap": args.heap, "steady_jvm": args.steady_jvm, "sizes": []}
    servers = start_servers(args.backends, args.heap, args.steady_jvm)
    try:
        for n in ranks:
            free = shutil.disk_usage(args.dir).free
            if free < args.min_free_gib * 2**30:
                print(f"stopping before {n} ranks: {free / 2**30:.1f} GiB free on {args.dir} (--min-free-gib "
                      f"{args.min_free_gib})", flush=True)
                break
            out["sizes"].append(bench_size(n, args.steps, args.backends, servers, args.dir, args.repeat,
                                           skip=tuple(v for k, _, v in (x.partition(":") for x in args.skip)
                                                      if k == str(n))))
            if "elasticsearch" in servers:  # the node's copy is the biggest: drop it before the next size
                import requests

                requests.delete(servers["elasticsearch"].url + "/_data_stream/*-jobtrace-*", timeout=300)
            if args.json:  # after each size, so a run stopped early keeps what it measured
                args.json.write_text(json.dumps(out, indent=2))
    finally:
        for server in servers.values():
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
