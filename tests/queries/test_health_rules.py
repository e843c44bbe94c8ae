"""The divergence rule on loss series, each one a real log's (tests/corpus/health) or a real job's shape."""

from __future__ import annotations

import pytest

from queries._health import _diverged


@pytest.mark.parametrize("losses, rule", [
    # mlx-lora-loss-jumps-and-stays-high: 1.41 -> 6.44, and still 4.6 at the end
    ([1.593, 1.406, 3.316, 6.437, 5.478, 4.857, 4.874, 4.604], "stays"),
    # bigscience-tr8-104B-exp2-loss-rise: rising at each record, 6.37 -> 10.24
    ([6.365808, 6.598378, 7.314456, 9.121927, 10.23865], "rising"),
    # bigscience-tr1-13B-lm-loss-spike: 2.77 -> 8.72, slowly back to 6.85
    ([2.775923, 2.772822, 2.768131, 7.343709, 8.715872, 7.654131, 7.19247, 6.849044], "stays"),
])
def test_a_loss_that_rose_and_stayed_up_diverged(losses, rule):
    found = _diverged(losses, 3, 1.5)
    assert found is not None and found[2] == rule


@pytest.mark.parametrize("losses", [
    # a small, jumpy loss on random data (a healthy 4-rank CPU job's shape): 3x swings are noise
    [0.41, 0.13, 0.52, 0.2, 0.35, 0.15, 0.44, 0.3, 0.4, 0.45],
    # rank 1 of `jobtrace demo --hang-rank 1` (2026-12-06), stopped at step 8: four rises in a row by chance,
    # back only a little above where it began
    [0.3756, 0.347, 0.278, 0.3783, 0.184, 0.2092, 0.2497, 0.4405],
    # a spike that recovered
    [2.77, 2.77, 8.7, 3.1, 2.8, 2.75, 2.74],
    # a loss falling as it should
    [10.9, 8.1, 6.5, 5.2, 4.4, 3.9],
    # too short to tell
    [1.0, 5.0],
])
def test_noise_recoveries_and_short_series_did_not_diverge(losses):
    assert _diverged(losses, 3, 1.5) is None
