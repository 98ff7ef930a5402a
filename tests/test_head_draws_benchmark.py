"""benchmarks/finetune_head_draws.py's estimate of a stack's dev score over all the heads it draws:
the mixture of its runs from heads that start against the labels and from the others, in the
proportion its generator draws them, checked against the plain moments and against made-up
populations whose spreads are known."""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import finetune_head_draws as head_draws  # noqa: E402 (a benchmark, not a package)


def test_the_mixture_of_the_two_strata_is_the_whole_samples_moments():
    rng = np.random.default_rng(0)
    against, along = rng.normal(90.0, 6.0, 7), rng.normal(99.0, 1.0, 50)
    whole = np.concatenate([against, along])
    mean, sd = head_draws.over_draws(len(against) / len(whole), against, along, ddof=0)
    assert mean == pytest.approx(whole.mean(), abs=1e-12)
    assert sd == pytest.approx(whole.std(), abs=1e-12)


def _population(rng, n_draws: int, rate: float, against_sd: float):
    """(heads drawn, of them against the labels, scores from 40 of those, from 120 others)."""
    n_against = rng.binomial(n_draws, rate)
    return n_draws, n_against, rng.normal(90.0, against_sd, 40), rng.normal(99.0, 1.0, 120)


def test_a_generator_that_draws_fewer_heads_against_the_labels_spreads_less_over_its_draws():
    rng = np.random.default_rng(1)
    # Same scores from each kind of head; bert-jax draws 4% against the labels, transformers 16%:
    # sd sqrt(p 36 + (1 - p) 1 + p (1 - p) 81), 2.34 against 4.37.
    strata = {"bert-jax": _population(rng, 2000, 0.04, 6.0)}
    strata["transformers"] = _population(rng, 2000, 0.16, 6.0)
    test = head_draws.compare_over_draws(strata, samples=2000)
    truth = [np.sqrt(p * 36 + (1 - p) + p * (1 - p) * 81) for p in (0.04, 0.16)]
    assert test["spread_ratio"] == pytest.approx(truth[0] / truth[1], rel=0.1)
    assert test["spread_ratio_95"][1] < 1.0 and test["p_wider"] < 0.01
    assert test["mean_difference_95"][0] > 0.5  # fewer low runs: a higher mean (+1.08)


def test_one_population_on_both_sides_gives_intervals_around_no_difference():
    rng = np.random.default_rng(2)
    strata = {stack: _population(rng, 600, 0.08, 6.0) for stack in ("bert-jax", "transformers")}
    test = head_draws.compare_over_draws(strata, samples=2000)
    low, high = test["spread_ratio_95"]
    assert low < 1.0 < high and 0.05 < test["p_wider"] < 0.95
    low, high = test["mean_difference_95"]
    assert low < 0.0 < high


def test_the_estimate_uses_each_stacks_own_heads_and_says_when_a_stratum_is_missing(capsys):
    # Seeds 0-9; each stack's heads 0 and 1 start against the labels.
    aligned = {
        stack: {s: 0.3 if s < 2 else 0.6 for s in range(10)}
        for stack in ("bert-jax", "transformers")
    }
    runs = [
        (stack, stack, s, 80.0 + s if s < 2 else 99.0 + s / 10)
        for stack in aligned
        for s in range(10)
    ]
    # A run from the other stack's head is not one of this stack's draws, nor is a seed past
    # the draws: both left out.
    runs.append(("bert-jax", "transformers", 0, 10.0))
    aligned["bert-jax"][12] = 0.6
    runs.append(("bert-jax", "bert-jax", 12, 10.0))
    head_draws.print_over_draws(runs, aligned, 10)
    out = capsys.readouterr().out
    mean, sd = head_draws.over_draws(0.2, np.array([80.0, 81.0]), 99.0 + np.arange(2, 10) / 10)
    assert "bert-jax over its draws (seeds 0-9): 20.0% against the labels, 2 runs" in out
    assert f"mean {mean:.2f}, std {sd:.2f}" in out
    assert "bert-jax - transformers over their draws: mean +0.00" in out

    head_draws.print_over_draws([r for r in runs if r[2] != 1], aligned, 10)
    assert (
        "no estimate (runs from its own heads: 1 against the labels, 8 others"
        in capsys.readouterr().out
    )


def test_a_stack_whose_scores_do_not_vary_gets_a_difference_of_spreads_not_a_ratio(capsys):
    # The 512-row negation set: every transformers run at 100, bert-jax's one sentence short once.
    aligned = {
        stack: {s: 0.3 if s < 3 else 0.6 for s in range(12)}
        for stack in ("bert-jax", "transformers")
    }
    runs = [(stack, stack, s, 100.0) for stack in aligned for s in range(12)]
    runs[1] = ("bert-jax", "bert-jax", 1, 99.61)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by a spread of 0
        head_draws.print_over_draws(runs, aligned, 12)
        test = head_draws.compare_over_draws(
            {"bert-jax": (12, 3, np.array([100.0, 99.61, 100.0]), np.full(9, 100.0)),
             "transformers": (12, 3, np.full(3, 100.0), np.full(9, 100.0))},
            samples=500,
        )  # fmt: skip
    out = capsys.readouterr().out
    assert "no ratio: transformers' scores do not vary" in out
    assert test["spread_ratio"] is None and test["spread_ratio_95"] is None
    mean, sd = head_draws.over_draws(0.25, np.array([100.0, 99.61, 100.0]), np.full(9, 100.0))
    assert test["spread_difference"] == pytest.approx(sd)
    assert f"std {sd:+.2f}" in out
    # A resample without the short run has no spread on either side; one with it, some.
    low, high = test["spread_difference_95"]
    assert low == 0.0 and high > sd / 2
    assert 0.0 < test["p_wider"] < 1.0
