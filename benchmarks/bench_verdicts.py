"""How often ``jobtrace ingest`` + ``trace-job`` give the right verdict on real logs (``tests/corpus``).

    python benchmarks/bench_verdicts.py                  # every excerpt, a table per family
    python benchmarks/bench_verdicts.py --family oom -v  # one family, one line per excerpt

Each excerpt of ``tests/corpus/<family>/<slug>.log`` was copied from a public source; its
``.json`` says what a careful reader concludes (written by reading the log, not by running
this). Each excerpt is ingested into its own job of a temporary embedded store and analysed
with the default thresholds, then scored:

* a **healthy** excerpt is right when the report is healthy; otherwise it is a false alarm;
* any other excerpt is right when the report names the expected root cause's kind and, where
  the expected verdict names ranks, a finding of that kind names the same ranks.

Beside each figure, the baseline of the same run: a verdict of "healthy" for every excerpt
(what a tool that reads nothing would score). Prints figures; asserts nothing (issue 19 sets
the goal: 95 % right, no false alarm).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CORPUS = ROOT / "tests" / "corpus"


def excerpts(family: str | None) -> list[tuple[str, Path, dict[str, Any]]]:
    out = []
    for meta in sorted(CORPUS.glob("*/*.json")):
        if family and meta.parent.name != family:
            continue
        out.append((meta.parent.name, meta.with_suffix(".log"), json.loads(meta.read_text())))
    return out


def verdict(log: Path, job: str, data_dir: Path) -> tuple[list[Any] | None, str]:
    """The report's findings for one excerpt, or ``None`` and why there is no report."""
    from ingest import IngestConfig, Ingestor, open_sink
    from queries import analyze, load_local

    try:
        Ingestor(IngestConfig(job=job), open_sink("local", job, data_dir=data_dir)).run([str(log)])
        report = analyze(load_local(data_dir, job))
    except Exception as exc:  # a benchmark reports every outcome, a crash included
        return None, f"{type(exc).__name__}: {str(exc)[:80]}"
    return report.findings, "healthy" if report.healthy else "findings"


def score(expected: dict[str, Any], findings: list[Any] | None, outcome: str) -> bool:
    if findings is None:
        return False
    if expected.get("healthy"):
        return outcome == "healthy"
    want = (expected.get("findings") or [{}])[0]
    kind, ranks = want.get("kind"), want.get("ranks")
    named = [f for f in findings if f.kind == kind]
    if not named:
        return False
    return not ranks or any(sorted(f.ranks) == sorted(r for r in ranks if r is not None) for f in named)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", help="only this folder of tests/corpus")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per excerpt")
    args = ap.parse_args()
    rows = excerpts(args.family)
    if not rows:
        print("no excerpts found", file=sys.stderr)
        return 2
    right: Counter[str] = Counter()
    base: Counter[str] = Counter()
    total: Counter[str] = Counter()
    alarms: Counter[str] = Counter()
    healthy_inputs: Counter[str] = Counter()
    crashes: dict[str, list[str]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="jobtrace-verdicts-") as tmp:
        for i, (family, log, expected) in enumerate(rows):
            findings, outcome = verdict(log, f"v{i}", Path(tmp))
            ok = score(expected, findings, outcome)
            total[family] += 1
            right[family] += ok
            base[family] += bool(expected.get("healthy"))
            if expected.get("healthy"):
                healthy_inputs[family] += 1
                alarms[family] += outcome == "findings"
            if findings is None:
                crashes[family].append(f"{log.name}: {outcome}")
            if args.verbose:
                got = outcome if findings is None else ",".join(sorted({f.kind for f in findings})) or "healthy"
                want = "healthy" if expected.get("healthy") else (expected.get("findings") or [{}])[0].get("kind")
                print(f"{'ok ' if ok else 'BAD'} {family}/{log.name}: expected {want}; got {got}")
    print(f"{'family':<20} {'right':>7} {'total':>6} {'share':>7} {'baseline':>9} {'false alarms':>13} {'no report':>10}")
    for family in sorted(total):
        n = total[family]
        print(f"{family:<20} {right[family]:>7} {n:>6} {right[family] / n:>7.0%} {base[family] / n:>9.0%} "
              f"{alarms[family]:>6} of {healthy_inputs[family]:<4} {len(crashes[family]):>10}")
    n = sum(total.values())
    print(f"{'all':<20} {sum(right.values()):>7} {n:>6} {sum(right.values()) / n:>7.0%} "
          f"{sum(base.values()) / n:>9.0%} {sum(alarms.values()):>6} of {sum(healthy_inputs.values()):<4} "
          f"{sum(len(v) for v in crashes.values()):>10}")
    for family, why in sorted(crashes.items()):
        for w in why[:5]:
            print(f"  no report: {family}/{w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
