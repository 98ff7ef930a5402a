"""Held-out evaluation's sums: MLM accuracy and perplexity (and NSP accuracy where the objective
has NSP) over batches, beside the always-the-most-frequent-token baseline (NSP: the majority
label's share, and whether the model predicts one class); the pretraining loop's evaluation and
`bert-jax eval` (model_eval.py) both add up batches here, and say NSP's figures in `nsp_words`."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.core import losses
from bert_jax.data import objectives

# NSP's labels (core/losses.next_sentence: label 1 = sentence B is a random one).
NSP_CLASSES = ("is next", "random next")
# A model whose NSP predictions are this share or more one class "predicts one class": its
# accuracy is then the share of that label, whatever it learned.
NSP_ONE_CLASS_SHARE = 0.98


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
        if "nsp_accuracy" in summary and "nsp_random_next_label_sum" in self.sums:
            summary.update(nsp_figures(self.sums))
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


def nsp_figures(sums: Mapping[str, float]) -> dict[str, Any]:
    """NSP's majority baseline (the share of the majority label in the evaluated instances), the
    share of instances predicted "random next" and whether the model predicts one class (at
    least `NSP_ONE_CLASS_SHARE` of the instances), from the eval step's sums."""
    weight = max(float(sums["nsp_weight"]), 1e-9)
    random_labels = float(sums["nsp_random_next_label_sum"]) / weight
    random_predicted = float(sums["nsp_random_next_predicted_sum"]) / weight
    return {
        "nsp_baseline_accuracy": max(random_labels, 1.0 - random_labels),
        "nsp_baseline_class": NSP_CLASSES[int(random_labels > 0.5)],
        "nsp_predicted_random_next": random_predicted,
        "nsp_one_class": max(random_predicted, 1.0 - random_predicted) >= NSP_ONE_CLASS_SHARE,
    }


def nsp_words(result: Mapping[str, Any]) -> str:
    """NSP accuracy beside its majority baseline, and the one-class flag where it is raised:
    `NSP accuracy 0.5625 (majority baseline 0.5625: always "random next"; ONE CLASS: ...)`.
    "" without NSP."""
    if "nsp_accuracy" not in result:
        return ""
    words = f"NSP accuracy {result['nsp_accuracy']:.4f}"
    if "nsp_baseline_accuracy" not in result:  # rows written before the baseline was kept
        return words
    words += (
        f" (majority baseline {result['nsp_baseline_accuracy']:.4f}: always "
        f'"{result["nsp_baseline_class"]}"'
    )
    flag = one_class_words(result)
    return words + (f"; {flag})" if flag else ")")


def one_class_words(result: Mapping[str, Any]) -> str:
    """The one-class flag in words (`ONE CLASS: the model predicts "random next" for 100% of the
    instances, ...`), or "" where the model's NSP predictions are not one class."""
    if not result.get("nsp_one_class"):
        return ""
    random_next = float(result["nsp_predicted_random_next"])
    share, which = max((random_next, NSP_CLASSES[1]), (1.0 - random_next, NSP_CLASSES[0]))
    return (
        f'ONE CLASS: the model predicts "{which}" for {share:.0%} of the instances, so its '
        "accuracy is that label's share, not learning"
    )
