"""The fixed-shape batches of a fine-tuning run: training order and epoch boundaries."""

from __future__ import annotations

import numpy as np

from bert_jax.finetune.tuning import batches as features


def test_train_order_sees_every_example_once_per_epoch():
    order = features.train_order(num_examples=10, epochs=3, batch_size=4, seed=0)
    assert order.shape == (9, 4)  # 3 batches an epoch, the last one holding 2 examples
    for epoch in order.reshape(3, 12):
        assert np.array_equal(np.sort(epoch[epoch >= 0]), np.arange(10))
        assert np.array_equal(epoch[10:], [-1, -1])  # filled up with weight-0 rows
    assert np.array_equal(order, features.train_order(10, 3, 4, seed=0))
    assert not np.array_equal(order, features.train_order(10, 3, 4, seed=1))
    half = features.train_order(num_examples=10, epochs=1.5, batch_size=4, seed=0)
    assert half.shape == (5, 4)  # ceil(1.5 * 3) steps: one epoch, then two batches of the next
    assert np.array_equal(half[:3], order[:3]) and np.sum(half[3:] >= 0) == 8
    assert features.epoch_end_steps(10, 3, 4) == [3, 6, 9]
