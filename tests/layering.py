"""The layer rules of docs/architecture.md, and the import graph they are checked against.

    python -m tests.layering            # the package graph, private imports and cycles
    python -m tests.layering --modules  # every module-level edge

Layers, lowest first (a module may import its own package, or the public names of a
package in a LOWER layer; packages of one layer never import each other):

    0 core    jobtrace.errors, .events, .identity, .config, .redact, .http, .protowire
    1 store   jobtrace.store        wire  loki, kibana
    2 shippers, queries
    3 otel_instrumentation, ingest, metrics, jobtrace.synth
    4 jobtrace.demo
    5 jobtrace.cli, jobtrace (the package's facade)

The graph is read from the source with :mod:`ast` (imports inside functions count: a
lazy import is still a dependency), so it needs nothing installed.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("jobtrace", "otel_instrumentation", "shippers", "queries", "ingest", "loki", "kibana", "metrics")
"""The product's top-level packages (the distribution's)."""

LAYERS: dict[str, int] = {
    "jobtrace.errors": 0,
    "jobtrace.events": 0,
    "jobtrace.identity": 0,
    "jobtrace.config": 0,
    "jobtrace.redact": 0,
    "jobtrace.http": 0,
    "jobtrace.protowire": 0,
    "jobtrace.store": 1,
    "loki": 1,
    "kibana": 1,
    "shippers": 2,
    "queries": 2,
    "otel_instrumentation": 3,
    "ingest": 3,
    "metrics": 3,
    "jobtrace.synth": 3,
    "jobtrace.demo": 4,
    "jobtrace.cli": 5,
    "jobtrace": 5,
}
"""Each unit's layer. A unit is the longest entry that prefixes a module's name."""

CORE_PEERS = frozenset(k for k, v in LAYERS.items() if v == 0)
"""Core modules may import each other (one package, one layer)."""


def unit_of(module: str) -> str:
    """The layer unit a module belongs to (``jobtrace.store._files`` → ``jobtrace.store``)."""
    best = ""
    for name in LAYERS:
        if (module == name or module.startswith(name + ".")) and len(name) > len(best):
            best = name
    if not best:
        raise KeyError(f"{module} is in no layer: add it to tests/layering.py and docs/architecture.md")
    return best


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=dict)
    """module → modules it imports (at module level or inside functions)."""
    imported_names: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """(importer, imported module) → the names taken (``from m import a, b``)."""


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def build_graph() -> Graph:
    """Every import between the product's modules."""
    g = Graph()
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            g.modules[_module_name(path)] = path
    for module, path in g.modules.items():
        is_pkg = path.name == "__init__.py"
        here = module.split(".") if is_pkg else module.split(".")[:-1]
        out = g.edges.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _longest_module(g, alias.name)
                    if target:
                        out.add(target)
            elif isinstance(node, ast.ImportFrom):
                base = (".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                        if node.level else node.module or "")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in g.modules else _longest_module(g, base)
                    if target:
                        out.add(target)
                        g.imported_names.setdefault((module, target), set()).add(alias.name)
    return g


def _longest_module(g: Graph, name: str) -> str | None:
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in g.modules:
            return candidate
        parts.pop()
    return None


def violations(g: Graph) -> list[str]:
    """Every import that breaks a layer rule, as a sentence."""
    out = []
    for a, targets in sorted(g.edges.items()):
        ua = unit_of(a)
        for b in sorted(targets):
            ub = unit_of(b)
            if ua == ub or (ua in CORE_PEERS and ub in CORE_PEERS):
                continue
            la, lb = LAYERS[ua], LAYERS[ub]
            if lb >= la:
                what = "a peer" if lb == la else "a higher layer"
                out.append(f"{a} (layer {la}, {ua}) imports {b} (layer {lb}, {ub}): {what}")
            if _private_part(b, ub):
                out.append(f"{a} imports {b}, a private module of {ub}: use its public names")
    return out


def _private_part(module: str, unit: str) -> bool:
    """Whether ``module`` is a private module inside ``unit`` (``jobtrace.store._files`` in ``jobtrace.store``)."""
    rest = module[len(unit):].lstrip(".")
    return any(part.startswith("_") for part in rest.split(".") if part)


def cycles(g: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g.modules):
        if v not in index:
            visit(v)
    return found


def package_graph(g: Graph) -> dict[str, set[str]]:
    """Unit → the units it imports."""
    out: dict[str, set[str]] = {}
    for a, targets in g.edges.items():
        ua = unit_of(a)
        for b in targets:
            ub = unit_of(b)
            if ub != ua:
                out.setdefault(ua, set()).add(ub)
    return out


def main(argv: list[str]) -> int:
    g = build_graph()
    if "--modules" in argv:
        for a in sorted(g.edges):
            for b in sorted(g.edges[a]):
                print(f"{a} -> {b}")
        return 0
    pg = package_graph(g)
    for unit in sorted(LAYERS, key=lambda u: (LAYERS[u], u)):
        print(f"[{LAYERS[unit]}] {unit} -> {', '.join(sorted(pg.get(unit, ()))) or '(nothing)'}")
    bad = violations(g)
    loops = cycles(g)
    print(f"layer violations: {len(bad)}")
    for line in bad:
        print(f"  {line}")
    print(f"import cycles: {len(loops)}")
    for loop in loops:
        print(f"  {' <-> '.join(loop)}")
    return 1 if bad or loops else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
