"""Command line: ``python -m tests.servers build [victorialogs|opensearch|jaeger|all]``
and ``python -m tests.servers run victorialogs|opensearch|jaeger [--port N] [--data-dir D]``.

``build`` fills the cache (what CI does before pytest); ``run`` starts one server for
poking at by hand and stops it cleanly on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from types import FrameType

from . import SERVERS, ServerError, cache_dir


def _build(names: list[str]) -> int:
    for name in names:
        t0 = time.monotonic()
        try:
            path = SERVERS[name].build()
        except ServerError as exc:
            print(f"build {name}: FAILED\n{exc}", file=sys.stderr)
            return 1
        print(f"build {name}: ok in {time.monotonic() - t0:.1f}s -> {path}", flush=True)
    return 0


def _run(name: str, port: int | None, data_dir: str | None) -> int:
    server = SERVERS[name](port=port)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        server.start(data_dir=data_dir)
    except ServerError as exc:
        print(f"run {name}: FAILED\n{exc}", file=sys.stderr)
        server.close()
        return 1
    print(f"{name} ready in {server.started_in:.2f}s at {server.url}", flush=True)
    for attr in ("loki_push_url", "es_bulk_url", "query_url", "bulk_url"):
        if hasattr(server, attr):
            print(f"  {attr}: {getattr(server, attr)}")
    print(f"  data: {server.data_dir}\n  log:  {server.log_path}\nCtrl-C to stop.", flush=True)
    while not stop.wait(1.0):
        if not server.is_running():
            print(f"{name} exited unexpectedly; log: {server.log_path}", file=sys.stderr)
            return 1
    server.stop()
    print(f"{name} stopped", flush=True)
    if data_dir is None:
        server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.servers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build and cache servers")
    b.add_argument("which", nargs="?", default="all", choices=[*SERVERS, "all"])
    r = sub.add_parser("run", help="start one server until Ctrl-C")
    r.add_argument("which", choices=list(SERVERS))
    r.add_argument("--port", type=int, default=None)
    r.add_argument("--data-dir", default=None, help="keep data here (default: temp dir, removed)")
    sub.add_parser("cache-dir", help="print the cache directory")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        return _build(list(SERVERS) if args.which == "all" else [args.which])
    if args.cmd == "run":
        return _run(args.which, args.port, args.data_dir)
    print(cache_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
