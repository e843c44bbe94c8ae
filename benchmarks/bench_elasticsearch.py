"""Elasticsearch/OpenSearch: shipping throughput against the plain bulk helper, and ``trace-job`` at scale.

    python benchmarks/bench_elasticsearch.py                         # both parts, a fresh embedded node
    python benchmarks/bench_elasticsearch.py --url http://host:9200  # an existing OpenSearch
    python benchmarks/bench_elasticsearch.py --part ship --events 300000 --repeat 3
    python benchmarks/bench_elasticsearch.py --part trace --ranks 1000 --steps 1000

Part ``ship``: the same synthetic job's events, into the real OpenSearch node, by

* **ours**: :class:`shippers._elasticsearch.ElasticsearchShipper` from canonical lines
  (ECS mapping, deterministic ids, the disk spool, per-item outcomes, retry logic), one
  sender thread, i.e. at most one core of ours;
* **helper**: ``opensearchpy.helpers.bulk`` of the *same documents* (already mapped,
  the mapping not timed), ``create`` actions with the same ids, at its default
  ``chunk_size=500`` and at ours (2,000). (``elasticsearch.helpers.bulk`` cannot be
  pointed at OpenSearch: the client refuses a server that is not Elasticsearch.)

Each into its own namespace, alternating, ``--repeat`` times; events/s is wall time from
the first event handed over to the last one acknowledged, CPU is this process's.

Part ``trace``: a ``--ranks`` × ``--steps`` synthetic job (step, phases, all_reduce, metrics
per rank and step) is written to the embedded store, shipped to the node with our
shipper, then ``trace-job`` is timed on both stores in fresh processes (peak RSS included).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRACE_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from queries import AnalysisConfig, analyze, load_local
from queries._backends import TimeRange
t0 = time.perf_counter()
if {url!r}:
    from queries._elasticsearch import load_elasticsearch
    job = load_elasticsearch({job!r}, url={url!r}, time_range=TimeRange(1_600_000_000_000_000_000, 2_000_000_000_000_000_000))
else:
    job = load_local({data!r}, {job!r}, verify=False)
t1 = time.perf_counter()
report = analyze(job, AnalysisConfig())
t2 = time.perf_counter()
print(json.dumps({{"load_s": t1 - t0, "analyze_s": t2 - t1, "events": job.stats.events,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "findings": sorted({{f.kind for f in report.findings}})}}))
"""


def synth(data: Path, job_id: str, ranks: int, steps: int) -> list[Path]:
    from jobtrace.synth import SynthJob, write_job

    directory = data / job_id
    if not (directory / ".complete").exists():
        write_job(data, SynthJob(job_id=job_id, ranks=ranks, steps=steps, ranks_per_node=8, slow_ranks={ranks // 3: 1.6},
                                 nan_step=steps - steps // 10, logs_per_step=1))
        (directory / ".complete").write_text("ok")
    return sorted(directory.glob("*.jsonl"))


def lines_of(paths: list[Path]) -> list[bytes]:
    out: list[bytes] = []
    for p in paths:
        out += p.read_bytes().splitlines(keepends=True)
    return out


def ours(url: str, lines: list[bytes], namespace: str, spool: Path) -> dict[str, float]:
    from jobtrace.http import HttpConfig
    from shippers._elasticsearch import ElasticsearchShipper

    shipper = ElasticsearchShipper(HttpConfig(url, timeout_s=60), spool, namespace=namespace, setup="off")
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(0, len(lines), 4096):  # as the export thread hands batches over
        shipper.write(lines[i:i + 4096])
    assert shipper.wait_idle(3600)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    shipper.close()
    assert shipper.stats.rejected == 0 and shipper.stats.sent == len(lines), shipper.stats
    return {"wall_s": wall, "cpu_s": cpu, "events_per_s": len(lines) / wall, "requests": shipper.stats.requests}


def documents(lines: list[bytes], namespace: str) -> list[dict[str, Any]]:
    import orjson

    from kibana._document import data_stream_name, doc_id, to_document

    actions = []
    for line in lines:
        id_ = doc_id(line)
        type_, doc = to_document(orjson.loads(line), namespace, doc_id_=id_)
        actions.append({"_op_type": "create", "_index": data_stream_name(type_, namespace), "_id": id_, "_source": doc})
    return actions


def helper(url: str, actions: list[dict[str, Any]], chunk_size: int) -> dict[str, float]:
    from opensearchpy import OpenSearch, helpers

    client = OpenSearch(hosts=[url], timeout=60)
    c0, t0 = time.process_time(), time.perf_counter()
    ok, errors = helpers.bulk(client, actions, chunk_size=chunk_size, max_chunk_bytes=100 << 20, stats_only=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    client.close()
    assert ok == len(actions) and not errors
    return {"wall_s": wall, "cpu_s": cpu, "events_per_s": len(actions) / wall}


def bench_ship(url: str, work: Path, events: int, repeat: int) -> dict[str, Any]:
    import requests

    from jobtrace.http import HttpConfig
    from kibana._setup import run_setup

    run_setup(HttpConfig(url), replicas=0)
    ranks = 32
    steps = max(2, events // (ranks * 9))
    lines = lines_of(synth(work / "ship", f"ship-{ranks}x{steps}", ranks, steps))[:events]
    print(f"ship: {len(lines):,} events ({sum(map(len, lines)) / len(lines):.0f} B canonical), {repeat} rounds")
    warm = f"bw{os.getpid()}"
    t0 = time.perf_counter()
    helper(url, documents(lines, warm), 2000)  # warm the node's JIT and caches; not reported
    requests.delete(f"{url}/_data_stream/*-jobtrace-{warm}", timeout=120)
    print(f"  warm-up round {time.perf_counter() - t0:.1f}s")
    results: dict[str, list[dict[str, float]]] = {"ours": [], "helper_500": [], "helper_2000": []}
    for r in range(repeat):
        run = f"{os.getpid()}r{r}"
        order = ["ours", 500, 2000] if r % 2 == 0 else [2000, 500, "ours"]
        for what in order:
            if what == "ours":
                results["ours"].append(ours(url, lines, f"bo{run}", work / f"spool-{run}"))
            else:
                actions = documents(lines, f"bh{what}{run}")
                results[f"helper_{what}"].append(helper(url, actions, int(what)))
        for name, rows in results.items():
            row = rows[-1]
            print(f"  round {r + 1}: {name:12s} {row['events_per_s']:>9,.0f} events/s  wall {row['wall_s']:6.2f}s  "
                  f"cpu {row['cpu_s']:6.2f}s")
        requests.delete(f"{url}/_data_stream/*-jobtrace-b*{run}", timeout=120)
    best = {name: max(r["events_per_s"] for r in rows) for name, rows in results.items()}
    print("ship, best of rounds (events/s): " + ", ".join(f"{k} {v:,.0f}" for k, v in best.items()))
    return {"events": len(lines), "rounds": results, "best_events_per_s": best}


def child(url: str, data: Path, job: str) -> dict[str, Any]:
    code = TRACE_CHILD.format(root=str(ROOT), url=url, data=str(data), job=job)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_trace(url: str, work: Path, ranks: int, steps: int) -> dict[str, Any]:
    from jobtrace.http import HttpConfig
    from kibana._setup import run_setup
    from shippers._elasticsearch import ElasticsearchShipper

    run_setup(HttpConfig(url), replicas=0)
    job = f"trace-{ranks}x{steps}"
    t0 = time.perf_counter()
    paths = synth(work / "trace", job, ranks, steps)
    size = sum(p.stat().st_size for p in paths)
    print(f"trace: {job}: {size / 2**20:,.0f} MiB canonical in {len(paths)} files ({time.perf_counter() - t0:.0f}s)")
    marker = work / "trace" / f"{job}.shipped"
    ship_s = None
    if not marker.exists():
        shipper = ElasticsearchShipper(HttpConfig(url, timeout_s=120), work / "trace" / "spool", namespace="bench",
                                       setup="off")
        t0 = time.perf_counter()
        n = 0
        for p in paths:
            with open(p, "rb") as fh:
                while chunk := fh.readlines(4 << 20):
                    shipper.write(chunk)
                    n += len(chunk)
                    while shipper.spool.pending_bytes() > 256 << 20:  # keep the spool on disk bounded
                        time.sleep(0.5)
        assert shipper.wait_idle(24 * 3600)
        ship_s = time.perf_counter() - t0
        shipper.close()
        marker.write_text(str(n))
        print(f"  shipped {n:,} events in {ship_s:.0f}s ({n / ship_s:,.0f} events/s)")
    local = child("", work / "trace", job)
    print(f"  trace-job local:          load {local['load_s']:.1f}s analyze {local['analyze_s']:.1f}s "
          f"peak {local['peak_mb']:.0f} MiB, {local['events']:,} events, {local['findings']}")
    remote = child(url, work / "trace", job)
    print(f"  trace-job --backend elasticsearch: load {remote['load_s']:.1f}s analyze {remote['analyze_s']:.1f}s "
          f"peak {remote['peak_mb']:.0f} MiB, {remote['events']:,} events, {remote['findings']}")
    return {"job": job, "ship_s": ship_s, "local": local, "elasticsearch": remote}


def bench_node_class() -> Any:
    """The test harness's embedded node with a steady-state JVM: the tests' flags (C1 only, serial GC)
    start fast but index several times slower, which would measure the JIT, not the shippers."""
    from tests.servers.opensearch_server import OpenSearchServer

    class BenchNode(OpenSearchServer):
        def _command(self, artifact: Path, data_dir: Path) -> list[str]:
            cmd = [c for c in super()._command(artifact, data_dir)
                   if c not in ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")]
            return [cmd[0], "-XX:+UseG1GC", *cmd[1:]]

    return BenchNode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an existing OpenSearch (default: start the embedded test node)")
    ap.add_argument("--part", choices=["ship", "trace", "all"], default="all")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "jobtrace-bench-es")
    ap.add_argument("--heap", default="2g", help="heap of the embedded node (JOBTRACE_OPENSEARCH_HEAP)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.url
    if not url:
        os.environ.setdefault("JOBTRACE_OPENSEARCH_HEAP", args.heap)
        server = bench_node_class()().start(data_dir=args.dir / "node")
        url = server.url
        print(f"embedded OpenSearch at {url} (heap {os.environ['JOBTRACE_OPENSEARCH_HEAP']}), data {args.dir / 'node'}")
    out: dict[str, Any] = {"cpus": os.cpu_count()}
    try:
        if args.part in ("ship", "all"):
            out["ship"] = bench_ship(url, args.dir, args.events, args.repeat)
        if args.part in ("trace", "all"):
            out["trace"] = bench_trace(url, args.dir, args.ranks, args.steps)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
