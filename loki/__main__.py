"""``python -m loki build|check|list|render NAME [param=value …]``: the query library from the shell."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from . import library
    from ._build import check, write

    args = list(sys.argv[1:] if argv is None else argv)
    cmd = args.pop(0) if args else "list"
    if cmd == "build":
        for path in write():
            print(f"wrote {path}")
        return 0
    if cmd == "check":
        stale = check()
        for path in stale:
            print(f"out of date: {path} (run: python -m loki build)", file=sys.stderr)
        return 1 if stale else 0
    lib = library()
    if cmd == "list":
        for name, q in lib.queries.items():
            print(f"{name} ({q.type}): {q.answers}")
        return 0
    if cmd == "render" and args:
        name, pairs = args[0], args[1:]
        values = dict(p.split("=", 1) for p in pairs)
        print(lib.render(name, **values))
        return 0
    if cmd == "grafana" and args:
        print(lib.grafana(args[0]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
