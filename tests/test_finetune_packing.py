"""Packed fine-tuning batches (finetune/tuning/packing.py): how rows are laid out and how few
shapes a run takes, and, for every head that packs (sentence single and pair, regression,
multiple choice, tags) of both families (BERT; ModernBERT with its sliding window, CLS and mean
pooling), dropout off: two packed steps give the losses, updated parameters and logits of the
same steps unpacked (each row padded to max_seq_length, as tests/test_finetune_buckets.py checks
the buckets against)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from bert_jax.finetune.tuning import batches, packing, tuning_loop
from bert_jax.finetune.tuning import settings as settings_module
from bert_jax.finetune.tuning import token_tuning as token_loop
from tests.test_finetune_buckets import (
    BATCH,
    LEARNING_RATE,
    MAX_LEN,
    SETTINGS,
    SHIFTS,
    TOLERANCE,
    _case,
    _centred,
    _encoder_params,
    _mesh,
    assert_same_update,
)

PACKED = dataclasses.replace(SETTINGS, packing=True)
# The two training batches every comparison takes (the second with a padding row).
ORDER = np.array([[0, 1, 2, 3], [4, 5, 6, -1]])


# ------------------------------------------------------------------------------------------------
# The layout and the shapes
# ------------------------------------------------------------------------------------------------


def test_first_fit_decreasing_fills_each_sequence_within_its_length_and_slots():
    lengths = np.array([20, 5, 30, 12, 9, 3])
    bins = packing.first_fit_decreasing(lengths, 32, slots=3)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum(lengths[b]) <= 32 and len(b) <= 3 for b in bins)
    assert bins == [[2], [0, 3], [4, 1, 5]]
    with pytest.raises(ValueError, match="longer than the packed length"):
        packing.first_fit_decreasing(np.array([33]), 32, 4)


def test_a_run_compiles_the_counts_that_pay_for_their_compile():
    needed = [6] * 20 + [8] * 2
    assert packing.chosen_counts(needed, compile_cost=4 * 8) == (6, 8)  # saves 40 > 32
    assert packing.chosen_counts(needed, compile_cost=48) == (8,)  # saves 40 < 48
    assert packing.chosen_counts([3, 3, 3], 12) == (3,)
    # More than one micro-batch: a multiple of the micro-batch, which divides over the devices.
    assert packing.rounded_count(5, per_micro_batch=8, divisor=1) == 5
    assert packing.rounded_count(7, per_micro_batch=5, divisor=1) == 8  # two of 4
    assert packing.rounded_count(11, per_micro_batch=5, divisor=1) == 12  # three of 4
    assert packing.rounded_count(9, per_micro_batch=8, divisor=4) == 16  # two of 8
    assert packing.rounded_count(3, per_micro_batch=8, divisor=2) == 4
    for needed in range(1, 40):
        count = packing.rounded_count(needed, 5, 1)
        micro = batches.micro_batch_count(count, 384, 5 * 384)
        assert needed <= count < needed + count / 4 + 1 and count // micro <= 5


def test_packing_is_a_declared_setting_that_changes_neither_trial_nor_step():
    declared = settings_module.declaration("packing")
    assert not declared.trial and not declared.step
    assert "packing" not in settings_module.TRIAL_SETTINGS
    fixed = dataclasses.replace(PACKED, pad_to_max_length=True)
    _, arrays = _case("tags", "bert")
    assert isinstance(packing.batches_for(fixed, [arrays], _mesh()), batches.Buckets)
    assert isinstance(packing.batches_for(PACKED, [arrays], _mesh(), packs=False), batches.Buckets)


def test_a_packed_batch_restarts_positions_and_keeps_each_row_apart():
    _, arrays = _case("choice", "bert")
    run = packing.batches_for(PACKED, [arrays], _mesh())
    run.plan(ORDER)
    batch = run.gather(arrays, ORDER[0])
    spans = packing.row_spans(arrays["input_mask"][:4])  # [4 examples, 4 choices]
    assert batch["input_mask"].sum() == spans.sum()  # every real token once, no padding between
    assert batch["cls_positions"].shape[1:] == (run.slots, 4)
    for s, slot in zip(*np.nonzero(batch["weights"])):
        for choice, start in enumerate(batch["cls_positions"][s, slot]):
            row_id = batch["packed_segment_ids"][s, start]
            assert row_id == slot * 4 + choice + 1
            size = int(np.sum(batch["packed_segment_ids"][s] == row_id))
            np.testing.assert_array_equal(
                batch["position_ids"][s, start : start + size], range(size)
            )
            assert batch["input_ids"][s, start] == 1  # the row's [CLS]
    assert batch["weights"].sum() == 4


# ------------------------------------------------------------------------------------------------
# Every head that packs, both families: packed equals unpacked
# ------------------------------------------------------------------------------------------------


def _two_steps(tuner, arrays, run, family):
    """Two training steps over `ORDER`'s batches and the logits of every row after them, batched
    by `run` (a `Buckets` or a planned `Packing`): (losses, params before, params after,
    logits)."""
    state = tuner.init(jax.random.key(0), _encoder_params(family))
    before = jax.tree.map(np.array, jax.device_get(state.params))
    losses = []
    for rows in ORDER:
        batch = tuner.global_batch(run.gather(arrays, rows))
        state, metrics = tuner.train_step(state, batch, jax.random.key(1), LEARNING_RATE)
        losses.append(float(metrics["loss"]))
    keys = token_loop.MODEL_KEYS
    logits = token_loop.predict_logits(tuner, state.params, arrays, BATCH, keys, run)
    params = jax.tree.map(np.asarray, jax.device_get(state.params))
    return losses, before, params, logits


HEADS = ("sentence", "regression", "choice", "tags")


@pytest.mark.parametrize("family", ["bert", "modernbert"])
@pytest.mark.parametrize("head", HEADS)
def test_packed_steps_equal_the_unpacked_steps(head, family):
    tuner, arrays = _case(head, family)
    run = packing.batches_for(PACKED, [arrays], _mesh())
    assert isinstance(run, packing.Packing)
    run.plan(ORDER)
    losses, before, params, logits = _two_steps(tuner, arrays, run, family)
    fixed_losses, _, fixed_params, fixed_logits = _two_steps(
        tuner, arrays, batches.Buckets((MAX_LEN,)), family
    )
    # One training shape and one prediction shape, each fewer positions than padded rows take.
    assert len(run.used["train"]) == 1 and len(run.used["predict"]) == 1
    ((count, length),) = run.used["train"]
    assert count * length < BATCH * arrays["input_ids"][0].size
    np.testing.assert_allclose(losses, fixed_losses, rtol=TOLERANCE, atol=TOLERANCE)
    assert_same_update(head, before, params, fixed_params)
    if head in SHIFTS:
        logits, fixed_logits = (_centred(x, np.ones_like(x)) for x in (logits, fixed_logits))
    np.testing.assert_allclose(logits, fixed_logits, rtol=TOLERANCE, atol=TOLERANCE)


def test_a_packed_run_prints_its_compiled_shapes_once():
    """`run_steps` plans the counts from its own order and logs the shapes in one line."""
    tuner, arrays = _case("sentence", "bert")
    run = packing.batches_for(PACKED, [arrays], _mesh())
    state = tuner.init(jax.random.key(0), _encoder_params("bert"))
    lines = []
    tuning_loop.run_steps(
        tuner,
        state,
        jax.random.key(1),
        dataclasses.replace(PACKED, epochs=1.0),
        len(arrays["input_ids"]),
        lambda rows: run.gather(arrays, rows),
        lambda params: {
            "rows": len(token_loop.predict_logits(tuner, params, arrays, BATCH, buckets=run))
        },
        lines.append,
        buckets=run,
    )
    shapes = [line for line in lines if "compiled shapes" in line]
    assert len(shapes) == 1, lines
    assert run.train_counts and len(run.used["train"]) <= len(run.train_counts)
    assert shapes[0].startswith("compiled shapes: train ") and f"x{run.length}" in shapes[0]
