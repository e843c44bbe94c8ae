"""Every parser, and the line-head and prefix readers, take time linear in a line's length (issue 20).

A pattern whose quantifiers can match the same text backtracks: ``step 1 loss`` and 10,000 word
characters took 8.3 s, an OOM line with a long run of digits minutes. Each adversarial line below is
read at two lengths eight times apart; a linear reader takes about 8x as long, a quadratic one 64x.
The ratio (of the best of several repetitions, each long enough to time) is compared, not a time, so
a loaded machine slows both sides alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from ingest import Line, StreamState, default_registry
from ingest._prefix import PrefixMode, split_prefix
from ingest._timestamps import HeadParser, parse_tz

SHORT = 2_000
WORST_RATIO = 24.0  # linear: ~8; quadratic: ~64

ADVERSARIAL: dict[str, Callable[[int], str]] = {
    "word run after a key": lambda n: "step 1 loss " + "a" * n,
    "digits then a letter": lambda n: "step 1 loss " + "1" * n + "x",
    "a decimal's digits": lambda n: "step 1 loss 1." + "1" * n + "x",
    "spaces after step": lambda n: "step" + " " * n + "x",
    "key= runs": lambda n: "step 1 " + "k=" * (n // 2),
    "-a runs": lambda n: "step 1 " + "-a" * (n // 2),
    ".a runs": lambda n: "step 1 " + ".a" * (n // 2),
    "colons": lambda n: "step 1 " + ": " * (n // 2),
    "thousands separators": lambda n: "step 1 loss " + "1," * (n // 2) + "x",
    "Megatron fields": lambda n: " iteration 1/ 10 |" + " a: |" * (n // 5),
    "NCCL head then words": lambda n: "host:1:2 [0] NCCL INFO " + "x " * (n // 2),
    "a word run before NCCL": lambda n: "a" * n + ":1:2 [0] NCCL INFO x",
    "a dict of digits": lambda n: "{'loss': " + "1" * n,
    "dict heads": lambda n: "{'loss': 1, " * (n // 12),
    "a bar of hashes": lambda n: "Training: 100%|" + "#" * n + "| 1/1",
    "bar descriptions": lambda n: "a: " * (n // 3) + "5%|#| 1/2 [00:01<00:02, 1.0it/s]",
    "OOM digits": lambda n: "CUDA out of memory. Tried to allocate " + "1" * n,
    "OOM reserved digits": lambda n: "1" * n + " is reserved by PyTorch but unallocated",
    "DeepSpeed timers": lambda n: "[Rank 0] time (ms) | " + "a" * n + ": x",
    "watchdog work": lambda n: "Watchdog caught collective operation timeout: WorkNCCL(" + "a" * n + ")",
    "mmengine": lambda n: "Epoch(train) [1][1/2] " + "lr: " * (n // 4),
    "an exception name": lambda n: "a" * n + "x:",
    "a timestamp of digits": lambda n: "2024-01-01 " + "1" * n,
}


def _seconds_per_call(fn: Callable[[], object]) -> float:
    """The best of five timings of ``fn``, each repeated until it has run for at least 20 ms."""
    best = float("inf")
    for _ in range(5):
        reps, start = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            took = time.perf_counter() - start
            if took >= 0.02:
                break
        best = min(best, took / reps)
    return best


def _read(text: str) -> None:
    stream = StreamState("adv", "node", 0, 0)
    HeadParser(parse_tz("UTC")).parse(text)
    for mode in (PrefixMode.SRUN, PrefixMode.PDSH):
        split_prefix(text, mode)
    line = Line(text, text, None, None, None, stream)
    for parser in default_registry().parsers():
        parser.parse(line)


@pytest.mark.parametrize("case", list(ADVERSARIAL))
def test_every_reader_is_linear_in_the_line(case):
    make = ADVERSARIAL[case]
    short, long = make(SHORT), make(8 * SHORT)
    ratio = _seconds_per_call(lambda: _read(long)) / _seconds_per_call(lambda: _read(short))
    assert ratio < WORST_RATIO, f"{case}: 8x the length took {ratio:.0f}x the time"
