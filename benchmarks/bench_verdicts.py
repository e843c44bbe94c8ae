"""How often ``jobtrace ingest`` + ``trace-job`` give the right verdict on real logs (``tests/corpus``).

    python benchmarks/bench_verdicts.py                  # every excerpt, a table per family
    python benchmarks/bench_verdicts.py --family oom -v  # one family, one line per excerpt
    python benchmarks/bench_verdicts.py --write-known-wrong  # rewrite tests/corpus/known_wrong.txt

Each excerpt of ``tests/corpus/<family>/<slug>.log`` was copied from a public source; its
``.json`` says what a careful reader concludes (written by reading the log, not by running
this). Each excerpt is ingested into its own job of a temporary embedded store and analysed
with the default thresholds, then scored:

* a **healthy** excerpt is right when the report is healthy; otherwise it is a false alarm;
* any other excerpt is right when the report names the expected root cause's kind and, where
  the expected verdict names ranks, a finding of that kind names the same ranks.

The **facts** column counts the expected verdict's facts (an OOM's GPU and sizes, a timeout's op,
SeqNum and timeout, …) that the finding of that kind carries: a value is found when it equals one
of the finding's values (numbers within 0.5 %, sizes such as ``132.00 MiB`` as bytes) or appears
in its text.

Beside each figure, the baseline of the same run: a verdict of "healthy" for every excerpt
(what a tool that reads nothing would score). Prints figures; asserts nothing (issue 19 sets
the goal: 95 % right, no false alarm).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CORPUS = ROOT / "tests" / "corpus"
KNOWN_WRONG = CORPUS / "known_wrong.txt"


def excerpts(family: str | None) -> list[tuple[str, Path, dict[str, Any]]]:
    out = []
    for meta in sorted(CORPUS.glob("*/*.json")):
        if family and meta.parent.name != family:
            continue
        out.append((meta.parent.name, meta.with_suffix(".log"), json.loads(meta.read_text())))
    return out


def verdict(log: Path, job: str, data_dir: Path) -> tuple[list[Any] | None, str]:
    """The report's findings for one excerpt, or ``None`` and why there is no report.

    The excerpt is read under a neutral name: its slug says what it shows ("…-rank3-oom…"), and ingest
    takes a rank from a file name (torchrun's ``rank3.log``), which would be reading the answer.
    """
    import shutil

    from ingest import IngestConfig, Ingestor, open_sink
    from queries import analyze, load_local

    try:
        neutral = data_dir / f"{job}-input" / "console.log"
        neutral.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, neutral)
        Ingestor(IngestConfig(job=job), open_sink("local", job, data_dir=data_dir)).run([str(neutral)])
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


_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"^\s*([-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?)\s*([KMGT]i?B|B)?\s*$", re.I)


def _number(value: Any) -> float | None:
    """``value`` as a number: ints and floats, numeric text (``193,831``), sizes (``132.00 MiB``) in bytes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = _SIZE.match(str(value))
    if not m:
        return None
    return float(m.group(1).replace(",", "")) * _UNITS[(m.group(2) or "b").lower()]


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [value]


def facts_found(expected: dict[str, Any], findings: list[Any] | None) -> tuple[int, int]:
    """(found, expected): the expected root cause's facts that the report's finding of that kind carries."""
    want = (expected.get("findings") or [{}])[0]
    facts = {k: v for k, v in (want.get("facts") or {}).items() if v is not None}
    if not facts or not findings:
        return 0, len(facts)
    named = [f for f in findings if f.kind == want.get("kind")]
    if not named:
        return 0, len(facts)
    leaves = [x for f in named for x in _leaves(f.details) + f.evidence + [f.summary]]
    numbers = [n for n in map(_number, leaves) if n is not None]
    text = "\n".join(str(x) for x in leaves).lower()
    found = 0
    for value in facts.values():
        for v in _leaves(value):
            n = _number(v)
            if n is not None and any(abs(n - m) <= 0.005 * max(abs(n), 1e-9) for m in numbers) \
                    or str(v).lower() in text:
                found += 1
                break
    return found, len(facts)


def known_wrong_line(family: str, log: Path, expected: dict[str, Any], findings: list[Any] | None,
                     outcome: str) -> str:
    want = "healthy" if expected.get("healthy") else \
        "{kind} {ranks}".format(**{"kind": None, "ranks": None, **(expected.get("findings") or [{}])[0]})
    got = outcome if findings is None else ", ".join(
        f"{f.kind} {f.ranks}" for f in findings if f.severity in ("error", "warning")) or "healthy"
    return f"{family}/{log.stem} want {want}; got {got}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", help="only this folder of tests/corpus")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per excerpt")
    ap.add_argument("--write-known-wrong", action="store_true",
                    help="rewrite tests/corpus/known_wrong.txt (the strict xfails of tests/test_corpus.py)")
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
    facts: Counter[str] = Counter()
    facts_total: Counter[str] = Counter()
    wrong: list[str] = []
    with tempfile.TemporaryDirectory(prefix="jobtrace-verdicts-") as tmp:
        for i, (family, log, expected) in enumerate(rows):
            findings, outcome = verdict(log, f"v{i}", Path(tmp))
            ok = score(expected, findings, outcome)
            got_facts, want_facts = facts_found(expected, findings)
            facts[family] += got_facts
            facts_total[family] += want_facts
            if not ok:
                wrong.append(known_wrong_line(family, log, expected, findings, outcome))
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
    print(f"{'family':<20} {'right':>7} {'total':>6} {'share':>7} {'baseline':>9} {'false alarms':>13} "
          f"{'facts':>11} {'no report':>10}")
    for family in sorted(total):
        n = total[family]
        print(f"{family:<20} {right[family]:>7} {n:>6} {right[family] / n:>7.0%} {base[family] / n:>9.0%} "
              f"{alarms[family]:>6} of {healthy_inputs[family]:<4} {facts[family]:>4} of {facts_total[family]:<4} "
              f"{len(crashes[family]):>10}")
    n = sum(total.values())
    print(f"{'all':<20} {sum(right.values()):>7} {n:>6} {sum(right.values()) / n:>7.0%} "
          f"{sum(base.values()) / n:>9.0%} {sum(alarms.values()):>6} of {sum(healthy_inputs.values()):<4} "
          f"{sum(facts.values()):>4} of {sum(facts_total.values()):<4} {sum(len(v) for v in crashes.values()):>10}")
    if args.write_known_wrong:
        if args.family:
            print("--write-known-wrong needs every family (no --family)", file=sys.stderr)
            return 2
        head = [line for line in KNOWN_WRONG.read_text().splitlines() if line.startswith("#")]
        KNOWN_WRONG.write_text("\n".join(head + wrong) + "\n")
        print(f"wrote {len(wrong)} lines to {KNOWN_WRONG.relative_to(ROOT)}")
    for family, why in sorted(crashes.items()):
        for w in why[:5]:
            print(f"  no report: {family}/{w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
