"""Held-out evaluation's sums: MLM accuracy and perplexity (and NSP accuracy where the objective
has NSP) over batches, beside the always-the-most-frequent-token baseline; the pretraining loop's
evaluation and `bert-jax eval` (model_eval.py) both add up batches here."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.core import losses
from bert_jax.data import objectives


class EvalSums:
    """Held-out sums over batches: the losses and weights the eval step returns, and the target
    counts behind the always-the-most-frequent-token baseline (rows of weight 0 count nothing)."""

    def __init__(self, vocab_size: int, objective: str = objectives.DEFAULT_OBJECTIVE):
        self.objective = objective
        self.sums: collections.Counter = collections.Counter()
        self.counts = np.zeros((vocab_size,), np.float64)
        self.rows = 0

    def add(self, local: Mapping[str, Any], step_sums: Mapping[str, Any]) -> None:
        """`local`: the batch; `step_sums`: what the eval step returned for it."""
        out = jax.device_get(step_sums)
        self.sums.update({k: float(v) for k, v in out.items()})
        if self.objective == "ltr":  # the targets are every next token
            ids, weights = local["input_ids"][:, 1:], local["input_mask"][:, 1:]
        else:
            ids, weights = local["masked_lm_ids"], local["masked_lm_weights"]
        np.add.at(self.counts, np.asarray(ids).ravel(), np.asarray(weights, np.float64).ravel())
        self.rows += len(local["input_ids"])

    def result(self) -> dict[str, float]:
        summary = losses.summarize(self.sums)
        summary["mlm_baseline_accuracy"] = float(self.counts.max() / max(self.counts.sum(), 1e-9))
        summary["examples"] = self.rows
        return summary


def evaluate(
    eval_step: Callable[[dict[str, np.ndarray]], Mapping[str, Any]],
    batches: list[dict[str, np.ndarray]],
    vocab_size: int,
    objective: str = objectives.DEFAULT_OBJECTIVE,
) -> dict[str, float]:
    """Held-out MLM accuracy and perplexity (and NSP accuracy where the objective has NSP), with
    the always-the-most-frequent-token baseline.

    `eval_step(local_batch)` returns the batch's summed losses and weights (all hosts together).
    """
    sums = EvalSums(vocab_size, objective)
    for local in batches:
        sums.add(local, eval_step(local))
    return sums.result()
