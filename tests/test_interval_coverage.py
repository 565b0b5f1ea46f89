"""The multikey intervals and paired tests by prompt (``eval.paired``) and the simulation of their coverage
(``eval.coverage``, ``experiments/interval_coverage.py``): Wilson by prompt covers at its nominal level where the
percentile bootstrap over 8 prompts does not, the simulated prompts have the correlation asked, and the sign-flip test
is the exhaustive count of sign patterns."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from conftest import load_script

from hf_rope_ext.eval import coverage, intervals, paired


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("rho", [0, 0.8])
def test_wilson_by_prompt_covers_at_least_93_percent_at_8_prompts(rate, rho):
    assert coverage.coverage("by prompt", rate, rho, 8, draws=2000) >= 0.93


def test_the_percentile_bootstrap_over_8_prompts_covers_too_little():
    """What the pages used before: at 8 prompts of 3 correlated keys it covers far less than 95%."""
    assert coverage.coverage("bootstrap", 0.2, 0.6, 8, draws=500) < 0.9
    assert coverage.coverage("by key", 0.2, 0.6, 8, draws=2000) < 0.9  # every key a draw: too narrow as well
    assert coverage.coverage("by prompt", 0.2, 0.6, 8, draws=2000) >= 0.93


@pytest.mark.parametrize("rho", [0, 0.3, 0.8])
def test_simulated_prompts_have_the_correlation_asked(rho):
    """The variance of a prompt's hits is k p (1 - p) (1 + (k - 1) rho) for k keys of mean rate p."""
    hits = coverage.draw(0.4, rho, 1, 3, 200_000, np.random.default_rng(0))
    assert hits.mean() / 3 == pytest.approx(0.4, abs=0.005)
    assert hits.var() == pytest.approx(3 * 0.4 * 0.6 * (1 + 2 * rho), rel=0.03)


def test_the_coverage_page_shows_what_the_simulation_gives():
    """Every Wilson-by-prompt cell of docs/results/real-model/coverage.md, recomputed (the seeds are fixed)."""
    script = load_script("interval_coverage")
    text = script.PAGE.read_text()
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith(("| 8 |", "| 24 |"))]
    assert len(rows) == len(script.PROMPTS) * len(script.RHOS)
    for row in rows:
        prompts, rho = int(row[0].strip("| ")), float(row[1])
        shown = [float(x) for x in row[2 : 2 + len(script.RATES)]]
        found = [coverage.coverage("by prompt", r, rho, prompts, 3, script.DRAWS["by prompt"]) for r in script.RATES]
        assert shown == [round(c, 3) for c in found]
    assert min(float(x) for row in rows for x in row[2 : 2 + len(script.RATES)]) >= script.FLOOR
    assert "(met)" in text


def test_by_prompt_is_wilson_on_the_share_with_n_the_prompts():
    per_prompt = [(3, 3), (0, 3), (2, 3), (1, 3)]
    lo, hi = intervals.wilson(6 / 12 * 4, 4)
    assert paired.by_prompt(per_prompt) == [round(lo, 4), round(hi, 4)]
    wider, narrower = paired.by_prompt([(3, 3)] * 4 + [(0, 3)] * 4), intervals.wilson(12, 24)
    assert wider[0] < narrower[0] - 0.05 and wider[1] > narrower[1] + 0.05
    with pytest.raises(ValueError, match="expected \\(hits, keys\\) pairs"):
        paired.by_prompt([(4, 3)])


def exhaustive(first: list[list[bool]], second: list[list[bool]]) -> float:
    """The two-sided p of the sign-flip test by enumerating every way of swapping whole prompts between the runs."""
    prompts, count, extreme = len(first), 0, 0
    observed = abs(sum(sum(b) - sum(a) for a, b in zip(first, second, strict=True)))
    for swaps in itertools.product([False, True], repeat=prompts):
        pairs = [(b, a) if s else (a, b) for s, a, b in zip(swaps, first, second, strict=True)]
        count += 1
        extreme += abs(sum(sum(b) - sum(a) for a, b in pairs)) >= observed
    return extreme / count


def test_the_sign_flip_test_counts_every_swap_of_whole_prompts():
    rng = random.Random(7)
    for _ in range(40):
        prompts = rng.randint(1, 9)
        first = [[rng.random() < 0.5 for _ in range(3)] for _ in range(prompts)]
        second = [[rng.random() < 0.6 for _ in range(3)] for _ in range(prompts)]
        assert paired.sign_flip(first, second)["p"] == pytest.approx(exhaustive(first, second), abs=1e-12)


def test_with_one_key_a_prompt_the_sign_flip_test_is_mcnemars():
    first, second = [True] * 2 + [False] * 9 + [True] * 3, [False] * 2 + [True] * 9 + [True] * 3
    result = paired.sign_flip([[x] for x in first], [[x] for x in second])
    assert result == paired.mcnemar(first, second) | {"prompts_first": 2, "prompts_second": 9}


def test_keys_of_one_prompt_count_as_one_draw_in_the_paired_test():
    """10 keys gained in 6 prompts: the sign test over prompts (p = 2/64), not McNemar over keys (p = 2/1024)."""
    first = [[False] * 3] * 8
    second = [[True, True, False]] * 4 + [[True, False, False]] * 2 + [[False] * 3] * 2
    result = paired.sign_flip(first, second)
    assert (result["only_second"], result["prompts_second"]) == (10, 6)
    assert result["p"] == pytest.approx(2 / 64)
    assert paired.mcnemar(sum(first, []), sum(second, []))["p"] == pytest.approx(2 / 1024)
