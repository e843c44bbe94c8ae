"""Shipping to a real Loki-compatible server: jobtrace's Loki shipper against python-logging-loki.

    python benchmarks/bench_loki.py [--records 200000] [--url http://127.0.0.1:9428] [--json out.json]

Without ``--url`` a VictoriaLogs is started with the test harness (``tests/servers``);
every case pushes through its Loki API (``/insert/loki/api/v1/push``) and the number
of records that arrived is counted back with LogsQL, so "shipped" means stored.
Each case runs in a fresh subprocess (logging and tracing are process-global):

* ``ours_ship``: throughput of the shipper alone (spool → encode → push), protobuf+snappy
  and JSON: records/s on the wall clock, and records per CPU-second of our process
  (the sender is one thread, so this is "per core").
* ``ours_emit``: calling-thread cost of ``logger.info(...)`` with ``init_tracing`` shipping
  to Loki (no embedded store), and total CPU per record including the export and
  sender threads; the stdlib-only ``LokiHandler`` too.
* ``pll_sync``: python-logging-loki's ``LokiHandler`` (one HTTP POST per record in ``emit``).
* ``pll_queue``: its ``LokiQueueHandler``: the calling thread only enqueues; the listener
  thread drains at one request per record: drain rate and listener CPU per record.
* ``down``: the server unreachable: calling-thread cost and what is kept (ours: spooled
  on disk, sent later; python-logging-loki: each record lost with a traceback on stderr).
* ``outage_memory``: ours with the server down for ``--outage-records`` records: Python
  heap growth (tracemalloc) and RSS growth against the bytes waiting on disk.

Prints a table and the ratios the goals are stated in; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = """
import json, logging, os, sys, tempfile, time, threading, uuid
sys.path.insert(0, {root!r})
URL = {url!r}
N = {n}
JOB = {job!r}
def out(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
def count(job):
    import requests
    requests.get(URL + "/internal/force_flush", timeout=60)
    r = requests.post(URL + "/select/logsql/query", data={{"query": '{{training_job="%s"}} | stats count() as n' % job}}, timeout=120)
    rows = [json.loads(x) for x in r.text.splitlines() if x.strip()]
    return int(rows[0]["n"]) if rows else 0
log = logging.getLogger("bench")
log.setLevel(logging.INFO)
log.propagate = False
"""

CASES: dict[str, str] = {
    # The shipper alone: N canonical lines (a training mix) written to the spool, time until all are accepted.
    "ours_ship": """
import random, orjson
from pathlib import Path
from shippers._loki import LokiShipper, LokiOptions
from shippers._registry import ProcessInfo
fmt = os.environ["BENCH_FORMAT"]
t0 = time.time_ns(); lines = []
for i in range(N):
    base = {{"ts": t0 + i * 1000, "job": JOB, "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "rank": i % 64,
            "local_rank": i % 8, "world": 64, "node": "node%d" % (i % 64 // 8), "pid": 4000 + i % 64,
            "span_id": "%016x" % random.getrandbits(64), "step": i // 640}}
    k = i % 10
    if k < 6:
        d = dict(base, kind="span", parent_id="%016x" % random.getrandbits(64), name=["data", "forward", "backward", "optimizer"][k % 4],
                 cat="phase", start=t0 + i * 1000 - 500, dur=12345)
    elif k < 8:
        d = dict(base, kind="span", parent_id="%016x" % random.getrandbits(64), name="all_reduce", cat="collective",
                 start=t0, dur=5000, attrs={{"op": "all_reduce", "group": "default", "group_size": 64, "seq": i, "bytes": 4194304}})
    elif k == 8:
        d = dict(base, kind="log", level="INFO", logger="train", msg="step %d loss %.4f" % (i // 640, 1.0 / (i + 1)))
    else:
        d = dict(base, kind="metric", metrics={{"loss": 1.0 / (i + 1), "lr": 0.001, "grad_norm": 1.5}})
    lines.append(orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE))
info = ProcessInfo(JOB, "node0", 0, os.getpid(), Path(tempfile.mkdtemp()))
s = LokiShipper.from_env(info, url=URL + "/insert/loki", options=LokiOptions(format=fmt))
cpu0 = time.process_time(); w0 = time.perf_counter()
for i in range(0, N, 4096):
    s.write(lines[i:i + 4096])
assert s.wait_idle(600)
wall = time.perf_counter() - w0; cpu = time.process_time() - cpu0
requests_ = s.stats.requests
s.close()
out(records=N, wall_s=wall, cpu_s=cpu, per_s=N / wall, per_cpu_s=N / cpu, requests=requests_,
    bytes_per_record=sum(map(len, lines)) / N, arrived=count(JOB))
""",
    # init_tracing → BatchWorker → LokiShipper, logger.info on the calling thread.
    "ours_emit": """
import otel_instrumentation as oi
for v in [v for v in os.environ if v.startswith("JOBTRACE_") or v in ("RANK", "WORLD_SIZE", "LOCAL_RANK")]:
    os.environ.pop(v)
os.environ["JOBTRACE_LOKI_URL"] = URL + "/insert/loki"
os.environ["JOBTRACE_LOCAL"] = "0"
t = oi.init_tracing(JOB, data_dir=tempfile.mkdtemp(), torch=False, otel=False, console=False, heartbeat_s=3600)
for i in range(2000):
    log.info("warm %d", i)
t.force_flush()
cpu0 = time.process_time(); t0 = time.perf_counter(); th0 = time.thread_time()
for i in range(N):
    log.info("step %d loss %.4f", i, 0.5)
call = time.perf_counter() - t0; call_cpu = time.thread_time() - th0
t.force_flush(120)
shipper = t.worker._sinks[0]
assert shipper.wait_idle(600)
cpu = time.process_time() - cpu0
requests_ = shipper.stats.requests
t.shutdown()
out(records=N, call_us=call / N * 1e6, call_cpu_us=call_cpu / N * 1e6, cpu_us=cpu / N * 1e6,
    requests_per_record=requests_ / N, arrived=count(JOB) - 2000 - 2)
""",
    # The stdlib path (no init_tracing): our LokiHandler.
    "ours_handler": """
from shippers._loki_logging import LokiHandler
h = LokiHandler(URL + "/insert/loki", tags={{"job": JOB}}, spool_dir=tempfile.mkdtemp())
log.addHandler(h)
cpu0 = time.process_time(); t0 = time.perf_counter(); th0 = time.thread_time()
for i in range(N):
    log.info("step %d loss %.4f", i, 0.5)
call = time.perf_counter() - t0; call_cpu = time.thread_time() - th0
h.flush()
assert h.shipper.wait_idle(600)
cpu = time.process_time() - cpu0
requests_ = h.shipper.stats.requests
h.close()
out(records=N, call_us=call / N * 1e6, call_cpu_us=call_cpu / N * 1e6, cpu_us=cpu / N * 1e6,
    requests_per_record=requests_ / N, arrived=count(JOB))
""",
    # python-logging-loki, synchronous: one POST per record inside emit().
    "pll_sync": """
import warnings; warnings.simplefilter("ignore")
import logging_loki
h = logging_loki.LokiHandler(url=URL + "/insert/loki/api/v1/push?disable_message_parsing=1", tags={{"job": JOB}}, version="1")
log.addHandler(h)
log.info("warm")
cpu0 = time.process_time(); t0 = time.perf_counter()
for i in range(N):
    log.info("step %d loss %.4f", i, 0.5)
call = time.perf_counter() - t0
cpu = time.process_time() - cpu0
out(records=N, call_us=call / N * 1e6, cpu_us=cpu / N * 1e6, requests_per_record=1.0, arrived=count(JOB) - 1)
""",
    # python-logging-loki, queue handler: the listener thread does one POST per record.
    "pll_queue": """
import queue, warnings; warnings.simplefilter("ignore")
import logging_loki
q = queue.Queue(-1)
h = logging_loki.LokiQueueHandler(q, url=URL + "/insert/loki/api/v1/push?disable_message_parsing=1", tags={{"job": JOB}}, version="1")
log.addHandler(h)
main = threading.main_thread()
cpu0 = time.process_time(); tcpu0 = time.thread_time(); t0 = time.perf_counter()
for i in range(N):
    log.info("step %d loss %.4f", i, 0.5)
call = time.perf_counter() - t0
main_cpu = time.thread_time() - tcpu0
while not q.empty():
    time.sleep(0.01)
h.listener.stop()  # joins the listener after the last record
drain = time.perf_counter() - t0
listener_cpu = time.process_time() - cpu0 - (time.thread_time() - tcpu0)
out(records=N, call_us=call / N * 1e6, call_cpu_us=main_cpu / N * 1e6, drain_per_s=N / drain, listener_cpu_us=listener_cpu / N * 1e6,
    requests_per_record=1.0, arrived=count(JOB))
""",
    # The server unreachable (a closed port).
    "down": """
import socket, warnings; warnings.simplefilter("ignore")
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
dead = "http://127.0.0.1:%d" % port
which = os.environ["BENCH_WHO"]
if which == "ours":
    import otel_instrumentation as oi
    os.environ["JOBTRACE_LOKI_URL"] = dead
    os.environ["JOBTRACE_LOCAL"] = "0"
    t = oi.init_tracing(JOB, data_dir=tempfile.mkdtemp(), torch=False, otel=False, console=False, heartbeat_s=3600)
    logging.getLogger("jobtrace").setLevel(logging.CRITICAL)
    t0 = time.perf_counter()
    for i in range(N):
        log.info("step %d", i)
    call = time.perf_counter() - t0
    t.force_flush(60)
    shipper = t.worker._sinks[0]
    kept = shipper.spool.pending_bytes()
    out(records=N, call_us=call / N * 1e6, kept=f"{{kept / 1e6:.1f}} MB spooled on disk, sent when the server is back",
        lost=0)
    os._exit(0)
else:
    import logging_loki
    sys.stderr = open(os.devnull, "w")  # one traceback per record
    h = logging_loki.LokiHandler(url=dead + "/loki/api/v1/push", tags={{"job": JOB}}, version="1")
    log.addHandler(h)
    t0 = time.perf_counter()
    for i in range(N):
        log.info("step %d", i)
    call = time.perf_counter() - t0
    out(records=N, call_us=call / N * 1e6, kept="nothing (a traceback per record on stderr)", lost=N)
""",
    # A long outage: memory against disk, measured after a fifth of the outage and at its end.
    "outage_memory": """
import socket, tracemalloc, psutil
import otel_instrumentation as oi
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
os.environ["JOBTRACE_LOKI_URL"] = "http://127.0.0.1:%d" % port
os.environ["JOBTRACE_LOCAL"] = "0"
t = oi.init_tracing(JOB, data_dir=tempfile.mkdtemp(), torch=False, otel=False, console=False, heartbeat_s=3600)
logging.getLogger("jobtrace").setLevel(logging.CRITICAL)
proc = psutil.Process()
for i in range(20000):
    log.info("warm %d", i)
t.force_flush(60)
shipper = t.worker._sinks[0]
tracemalloc.start()
base, _ = tracemalloc.get_traced_memory()
marks = []
for i in range(N):
    with t.step(i):
        log.info("step %d loss %.4f", i, 0.5)
    if (i + 1) % 10000 == 0:
        t.force_flush(60)  # what a training loop's pace allows the export thread; the queue is bounded anyway
    if (i + 1) in (N // 5, N):
        t.force_flush(60)
        marks.append(((tracemalloc.get_traced_memory()[0] - base) / 1e6, shipper.spool.pending_bytes() / 1e6,
                      proc.memory_info().rss / 1e6))
peak = (tracemalloc.get_traced_memory()[1] - base) / 1e6
out(records=2 * N, heap_mb_at_fifth=marks[0][0], spooled_mb_at_fifth=marks[0][1], heap_mb_at_end=marks[1][0],
    spooled_mb=marks[1][1], heap_peak_mb=peak, rss_mb_at_fifth=marks[0][2], rss_mb_at_end=marks[1][2])
os._exit(0)
""",
    # The floor: logger.info with a NullHandler (record creation alone).
    "null": """
log.addHandler(logging.NullHandler())
for i in range(2000):
    log.info("warm %d", i)
t0 = time.perf_counter(); th0 = time.thread_time()
for i in range(N):
    log.info("step %d loss %.4f", i, 0.5)
out(records=N, call_us=(time.perf_counter() - t0) / N * 1e6, call_cpu_us=(time.thread_time() - th0) / N * 1e6)
""",
}


def run_case(name: str, url: str, n: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    import os

    job = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    code = textwrap.dedent(PRELUDE.format(root=str(ROOT), url=url, n=n, job=job)) + textwrap.dedent(CASES[name].format())
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise RuntimeError(f"case {name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="records per throughput case")
    p.add_argument("--pll-records", type=int, default=1000, help="records for python-logging-loki's handlers")
    p.add_argument("--outage-records", type=int, default=500_000)
    p.add_argument("--url", default=None, help="a running VictoriaLogs (default: start one with tests/servers)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)

    server = None
    url = args.url
    if url is None:
        sys.path.insert(0, str(ROOT))
        from tests.servers import VictoriaLogsServer

        server = VictoriaLogsServer().start()
        url = server.url
    results: dict[str, Any] = {"url": url, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        import os

        results["machine"] = {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
        n, m = args.records, args.pll_records
        results["ours_ship_protobuf"] = run_case("ours_ship", url, n, {"BENCH_FORMAT": "protobuf"})
        results["ours_ship_json"] = run_case("ours_ship", url, n, {"BENCH_FORMAT": "json"})
        results["null"] = run_case("null", url, n)
        results["ours_emit"] = run_case("ours_emit", url, n)
        results["ours_handler"] = run_case("ours_handler", url, n)
        results["pll_sync"] = run_case("pll_sync", url, m)
        results["pll_queue"] = run_case("pll_queue", url, m * 3)
        results["ours_down"] = run_case("down", url, n, {"BENCH_WHO": "ours"})
        results["pll_down"] = run_case("down", url, m, {"BENCH_WHO": "pll"})
        results["outage_memory"] = run_case("outage_memory", url, args.outage_records)
    finally:
        if server is not None:
            server.close()
    print(format_results(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def format_results(r: dict[str, Any]) -> str:
    pb, js, emit, hnd = r["ours_ship_protobuf"], r["ours_ship_json"], r["ours_emit"], r["ours_handler"]
    sync, que, od, pd, om = r["pll_sync"], r["pll_queue"], r["ours_down"], r["pll_down"], r["outage_memory"]
    lines = [
        f"VictoriaLogs at {r['url']} ({r['machine']['cpus']} CPUs, load average {r['machine']['load_avg_1m']:.1f})",
        "",
        "shipping throughput (stored records, counted back with LogsQL)",
        f"  jobtrace protobuf+snappy : {pb['per_s']:>10,.0f} rec/s wall   {pb['per_cpu_s']:>10,.0f} rec per CPU-s   "
        f"{pb['records'] / pb['requests']:,.0f} rec/request   arrived {pb['arrived']:,}/{pb['records']:,}",
        f"  jobtrace JSON            : {js['per_s']:>10,.0f} rec/s wall   {js['per_cpu_s']:>10,.0f} rec per CPU-s   "
        f"{js['records'] / js['requests']:,.0f} rec/request   arrived {js['arrived']:,}/{js['records']:,}",
        f"  python-logging-loki queue: {que['drain_per_s']:>10,.0f} rec/s drained   listener CPU {que['listener_cpu_us']:,.0f} µs/rec"
        f"   1 request/rec   arrived {que['arrived']:,}/{que['records']:,}",
        "",
        "calling-thread cost per record (logger.info): wall clock, and CPU time of the calling thread",
        f"  floor (a NullHandler)        : {r['null']['call_us']:8.2f} µs   {r['null']['call_cpu_us']:8.2f} µs CPU",
        f"  jobtrace init_tracing → Loki : {emit['call_us']:8.2f} µs   {emit['call_cpu_us']:8.2f} µs CPU   "
        f"(all threads: {emit['cpu_us']:.2f} µs CPU/rec; "
        f"{emit['requests_per_record']:.5f} requests/rec; arrived {emit['arrived']:,}/{emit['records']:,})",
        f"  jobtrace LokiHandler (stdlib): {hnd['call_us']:8.2f} µs   {hnd['call_cpu_us']:8.2f} µs CPU   "
        f"(all threads: {hnd['cpu_us']:.2f} µs CPU/rec; "
        f"arrived {hnd['arrived']:,}/{hnd['records']:,})",
        f"  python-logging-loki sync     : {sync['call_us']:8.2f} µs   (1 request/rec; arrived {sync['arrived']:,}/{sync['records']:,})",
        f"  python-logging-loki queue    : {que['call_us']:8.2f} µs   {que['call_cpu_us']:8.2f} µs CPU   "
        f"(+ {que['listener_cpu_us']:,.0f} µs listener CPU/rec)",
        "",
        "server down",
        f"  jobtrace            : {od['call_us']:8.2f} µs/rec on the calling thread; kept: {od['kept']}",
        f"  python-logging-loki : {pd['call_us']:8.2f} µs/rec on the calling thread; kept: {pd['kept']}",
        "",
        f"long outage, server down ({om['records']:,} events: a step span and a log line per step):",
        f"  after a fifth: {om['spooled_mb_at_fifth']:.0f} MB on disk, Python heap +{om['heap_mb_at_fifth']:.1f} MB, "
        f"RSS {om['rss_mb_at_fifth']:.0f} MB",
        f"  at the end   : {om['spooled_mb']:.0f} MB on disk, Python heap +{om['heap_mb_at_end']:.1f} MB, "
        f"RSS {om['rss_mb_at_end']:.0f} MB (peak heap +{om['heap_peak_mb']:.1f} MB)",
        "",
        "goals",
        f"  ≥100,000 rec/s shipped per core: {pb['per_cpu_s']:,.0f} rec per CPU-s "
        f"({pb['per_cpu_s'] / que['drain_per_s']:.0f}x python-logging-loki's drain rate)",
        f"  calling-thread cost a few µs: {emit['call_cpu_us'] - r['null']['call_cpu_us']:.2f} µs CPU above the "
        f"NullHandler floor ({emit['call_us']:.2f} µs wall in all, {sync['call_us'] / emit['call_us']:.0f}x below its "
        f"synchronous handler)",
        f"  bounded memory during a long outage: heap +{om['heap_mb_at_fifth']:.1f} MB → +{om['heap_mb_at_end']:.1f} MB "
        f"while the backlog on disk grew {om['spooled_mb_at_fifth']:.0f} → {om['spooled_mb']:.0f} MB",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
