"""The fixed-shape batches of a fine-tuning run: training order and epoch boundaries."""

from __future__ import annotations

import numpy as np

from bert_jax.finetune import features


def test_train_order_sees_every_example_once_per_epoch():
    order = features.train_order(num_examples=10, epochs=3, batch_size=4, seed=0)
    assert order.shape == (8, 4)  # ceil(30 / 4) fixed-shape batches
    flat = order.ravel()
    assert np.sum(flat == -1) == 2  # the last batch is filled up with weight-0 rows
    assert np.array_equal(np.bincount(flat[flat >= 0]), np.full(10, 3))
    assert np.array_equal(order, features.train_order(10, 3, 4, seed=0))
    assert not np.array_equal(order, features.train_order(10, 3, 4, seed=1))
    half = features.train_order(num_examples=10, epochs=1.5, batch_size=4, seed=0).ravel()
    assert np.sum(half >= 0) == 15
    assert features.epoch_end_steps(10, 3, 4) == [3, 5, 8]
