"""heldout_eval: held-out sums over batches and the most-frequent-token baseline."""

from __future__ import annotations

import numpy as np
import pytest

from bert_jax.training import heldout_eval


def test_evaluate_reports_the_most_frequent_token_baseline():
    def eval_step(local):
        return {
            "mlm_loss_sum": 3.0,
            "mlm_correct_sum": 2.0,
            "mlm_weight": 4.0,
            "nsp_loss_sum": 0.5,
            "nsp_correct_sum": 1.0,
            "nsp_weight": 2.0,
        }

    batches = [
        {
            "input_ids": np.zeros((2, 8), np.int32),
            "masked_lm_ids": np.array([[5, 5], [5, 7]]),
            "masked_lm_weights": np.array([[1.0, 1.0], [1.0, 0.0]]),
        }
    ] * 2
    result = heldout_eval.evaluate(eval_step, batches, vocab_size=10)
    assert result["mlm_baseline_accuracy"] == pytest.approx(1.0)  # padding (weight 0) not counted
    assert result["examples"] == 4
    assert result["mlm_loss"] == pytest.approx(6.0 / 8.0)
