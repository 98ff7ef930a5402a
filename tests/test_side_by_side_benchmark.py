"""benchmarks/finetune_side_by_side.py: a run as docs/finetuning.md shows it (bert-jax's stack on
the tiny fixture encoder, one seed, no optional flag) writes its summary, and the paired tests it
prints read made-up scores as they should."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from bert_jax.convert.model_dir import save_model_dir
from tests.glue_fixtures.tiny import GLUE_DIR, fixture_tokenizer, tiny_encoder

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import finetune_side_by_side as side_by_side  # noqa: E402 (a benchmark, not a package)


def test_a_run_without_optional_flags_writes_its_summary_with_the_defaults(tmp_path, capsys):
    config, params = tiny_encoder()
    model = save_model_dir(tmp_path / "tiny", config, params, fixture_tokenizer())
    workdir = tmp_path / "side_by_side"
    argv = ["--model", model, "--task", "glue/SST-2", "--data", GLUE_DIR, "--stacks", "bert-jax"]
    argv += ["--seeds", "0", "--epochs", "1", "--batch-size", "8", "--max-seq-length", "16"]
    assert side_by_side.main([*argv, "--workdir", str(workdir)]) == 0

    with open(workdir / "side_by_side.json", encoding="utf-8") as f:
        summary = json.load(f)
    # Unset, bert-jax's recipe flags report fine-tuning's own defaults.
    assert summary["optimizer (bert-jax)"] == "adamw-hf"
    assert summary["dropout_impl (bert-jax)"] == "hash"
    assert summary["adam_epsilon (bert-jax)"] == 1e-8
    assert summary["head"] == "own" and summary["paired"] is None
    (run,) = summary["runs"]["bert-jax"]
    assert run["seed"] == 0 and 0.0 <= run["score"] <= 100.0 and run["steps"] >= 1
    assert f"bert-jax      mean {run['score']:.2f}" in capsys.readouterr().out


def _runs(ours: np.ndarray, theirs: np.ndarray) -> dict[str, list[dict[str, float]]]:
    return {
        stack: [{"seed": seed, "score": float(score)} for seed, score in enumerate(scores)]
        for stack, scores in zip(side_by_side.STACKS, (ours, theirs))
    }


def test_the_paired_spread_test_sees_what_levenes_misses_when_scores_move_together():
    # Twelve heads, each stack's score following the head; one stack's twice as spread out.
    rng = np.random.default_rng(0)
    head = rng.normal(95.0, 2.0, size=12)
    wide = 95.0 + 2.0 * (head - 95.0) + rng.normal(0.0, 0.1, size=12)
    test = side_by_side.paired(_runs(wide, head))
    assert test["seeds"] == 12 and abs(test["mean_difference"] - np.mean(wide - head)) < 1e-9
    assert test["swap_spread_p"] < 0.01  # paired: the doubling is plain
    assert test["levene_p"] > 0.01  # as independent draws, 12 of each hardly show it

    # Two stacks as spread out, each with its own noise around the head: over 200 such
    # comparisons the test says "different" about as often as its 5% level allows.
    rejected = 0
    for _ in range(200):
        head = rng.normal(95.0, 2.0, size=12)
        ours, theirs = (head + rng.normal(0.0, 0.5, size=12) for _ in side_by_side.STACKS)
        rejected += side_by_side.swap_spread_p(ours, theirs, resamples=2000) < 0.05
    assert 2 <= rejected <= 20, rejected


def test_the_paired_spread_test_holds_its_level_on_scores_piled_at_the_ceiling():
    # Two stacks as spread out around each head, heavy-tailed and capped at 100 as dev accuracies
    # on a set most seeds learn: over 200 such comparisons of 40 seeds the test says "different"
    # about as often as its 5% level allows: 11 times (Pitman-Morgan's test: 38).
    rng = np.random.default_rng(1)
    rejected = 0
    for _ in range(200):
        head = rng.normal(0.0, 1.0, size=40)
        ours, theirs = (
            np.minimum(100.0, 99.0 + 2.0 * head + rng.standard_t(3, size=40))
            for _ in side_by_side.STACKS
        )
        rejected += side_by_side.swap_spread_p(ours, theirs, resamples=2000) < 0.05
    assert 2 <= rejected <= 20, rejected
    same = np.full(5, 100.0)
    assert side_by_side.swap_spread_p(same, same) == 1.0
