"""Batches padded to length buckets (finetune/tuning/batches.py): which bucket a batch takes, the
one gather every task uses, `group_by_length`'s order, and a batch split into micro-batches
(`micro_batch_tokens`) updating as the whole batch does. Also the cases the step comparisons
share: for every head (sentence single and pair, regression, multiple choice, span, tags) of both
families (BERT, ModernBERT with its sliding window and mean pooling), dropout off, its rows and
tuner, and its two steps padded to max_seq_length, run once per test process: the steps the
bucketed and packed steps must equal (tests/test_finetune_packing.py compares the three), and the
micro-batched ones here."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest

from bert_jax.finetune.heads.modernbert_pooled import with_dropout
from bert_jax.finetune.runs import multiple_choice as swag_task
from bert_jax.finetune.tasks import swag
from bert_jax.finetune.tuning import batches, tuning_loop
from bert_jax.finetune.tuning import sentence_tuning as loop
from bert_jax.finetune.tuning import settings as settings_module
from bert_jax.finetune.tuning import token_tuning as token_loop
from tests.glue_fixtures.tiny import tiny_encoder
from tests.modernbert_fixtures import CONFIG as MODERNBERT_CONFIG

# The runs compared: batches padded to 16 or 32 tokens, and all padded to 32. (The buckets of a
# run end at its max_seq_length, so the fixed-length run's one shape is one of the bucketed
# run's: each model compiles two train and two predict steps.)
MAX_LEN, BUCKETS = 32, (16, 32)
NUM_ROWS, BATCH = 12, 4
LEARNING_RATE = 2e-4  # the parity tests' (test_finetune_parity.py)
TOLERANCE = 1e-5
SETTINGS = loop.FinetuneSettings(
    learning_rate=1e-3,
    batch_size=BATCH,
    eval_batch_size=BATCH,
    max_seq_length=MAX_LEN,
    dropout=0.0,
    optimizer="adamw-hf",
    mesh_shape=(1, 1, 1),
)


# ------------------------------------------------------------------------------------------------
# The rule
# ------------------------------------------------------------------------------------------------


def test_bucket_lengths_grow_by_at_most_half_and_end_at_the_maximum():
    assert batches.bucket_lengths(128) == (16, 24, 32, 48, 64, 96, 128)
    assert batches.bucket_lengths(384) == (16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
    assert batches.bucket_lengths(200) == (16, 24, 32, 48, 64, 96, 128, 192, 200)
    assert batches.bucket_lengths(16) == (16,) and batches.bucket_lengths(10) == (10,)
    for length in (100, 512, 8192):
        buckets = batches.bucket_lengths(length)
        assert buckets[-1] == length and list(buckets) == sorted(set(buckets))
        assert all(b / a <= 1.5 for a, b in zip(buckets, buckets[1:]))
        assert len(buckets) <= 2 * np.log2(length / 16) + 2


def test_a_batch_takes_the_shortest_bucket_that_holds_its_longest_row():
    buckets = batches.bucket_lengths(128)
    assert batches.padded_length([3, 7, 16], buckets) == 16
    assert batches.padded_length([3, 17, 24], buckets) == 24
    assert batches.padded_length([33, 5], buckets) == 48
    assert batches.padded_length([97], buckets) == 128
    assert batches.padded_length([], buckets) == 128
    assert batches.padded_length([40], (128,)) == 128  # the fixed-length run's one bucket
    with pytest.raises(ValueError, match="longer than every bucket"):
        batches.padded_length([129], buckets)


def test_row_lengths_and_the_gather_cut_every_per_token_array_to_the_bucket():
    mask = np.zeros((3, 2, 64), np.int32)
    mask[0, 0, :10] = mask[0, 1, :40] = 1  # a multiple-choice row: its longest choice
    mask[1, :, :5] = mask[2, :, :20] = 1
    np.testing.assert_array_equal(batches.row_lengths(mask), [40, 5, 20])
    arrays = {
        "input_ids": np.arange(3 * 64).reshape(3, 64),
        "input_mask": mask[:, 0],
        "labels": np.ones((3, 64), np.int32),  # per token: cut
        "label_weights": np.ones((3, 64), np.float32),
        "start_positions": np.array([7, 8, 9]),  # per row: whole
    }
    arrays["input_mask"][0, :40] = 1
    batch = batches.gather_rows(arrays, np.array([2, 1, -1]))
    assert batch["input_ids"].shape == batch["labels"].shape == (3, 24)
    np.testing.assert_array_equal(batch["input_ids"][0], np.arange(128, 152))
    np.testing.assert_array_equal(batch["start_positions"], [9, 8, 7])
    np.testing.assert_array_equal(batch["weights"], [1, 1, 0])
    assert batch["label_weights"][2].sum() == 0  # the padding row weighs nothing
    assert batches.gather_rows(arrays, np.array([0, 1]))["input_ids"].shape == (2, 48)
    assert batches.gather_rows(arrays, np.array([0, 1]), (64,))["input_ids"].shape == (2, 64)


def test_prediction_batches_take_every_row_once_in_order_of_length():
    lengths = np.array([30, 5, 60, 5, 12])
    rows = np.concatenate(batches.predict_batches(lengths, 2))
    np.testing.assert_array_equal(rows, [1, 3, 4, 0, 2, -1])


def test_group_by_length_keeps_every_row_once_an_epoch_deterministically():
    rng = np.random.default_rng(0)
    count, batch_size = 203, 4
    lengths = rng.integers(3, 128, count)
    plain = batches.train_order(count, 2.5, batch_size, seed=3)
    grouped = batches.train_order(count, 2.5, batch_size, seed=3, lengths=lengths)
    np.testing.assert_array_equal(grouped, batches.train_order(count, 2.5, batch_size, 3, lengths))
    assert not np.array_equal(grouped, batches.train_order(count, 2.5, batch_size, 4, lengths))
    assert grouped.shape == plain.shape
    per_epoch = batches.steps_per_epoch(count, batch_size) * batch_size
    for epoch in grouped[: 2 * per_epoch // batch_size].reshape(2, per_epoch):
        np.testing.assert_array_equal(np.sort(epoch[epoch >= 0]), np.arange(count))
    # Each mega-batch of group_size rows (the permutation's) is sorted, longest first.
    size = batches.group_size(count, batch_size)
    first = grouped.reshape(-1)[:size]
    assert np.all(np.diff(lengths[first]) <= 0)
    assert set(first) == set(plain.reshape(-1)[:size])  # the same rows as without grouping
    buckets = batches.bucket_lengths(128)

    def padded(order):
        return sum(batches.padded_length(lengths[rows[rows >= 0]], buckets) for rows in order)

    assert padded(grouped) < 0.8 * padded(plain)


def test_group_by_length_is_a_declared_trial_setting_and_padding_is_not():
    from bert_jax.finetune.tuning import settings

    assert "group_by_length" in settings.TRIAL_SETTINGS
    assert "pad_to_max_length" not in settings.TRIAL_SETTINGS
    assert not settings.declaration("group_by_length").step
    assert not settings.declaration("pad_to_max_length").step
    longer = dataclasses.replace(SETTINGS, max_seq_length=64)
    assert batches.Buckets.for_settings(longer).lengths == (16, 24, 32, 48, 64)
    fixed = dataclasses.replace(longer, pad_to_max_length=True)
    assert batches.Buckets.for_settings(fixed).lengths == (64,)


# ------------------------------------------------------------------------------------------------
# Every head, both families: the cases, and their steps padded to max_seq_length
# ------------------------------------------------------------------------------------------------


def _rows(rng: np.random.Generator, shape: tuple[int, ...], vocab: int, pad: int) -> dict:
    """[CLS] a [SEP] (b [SEP]) rows, every other one a pair, `pad` after them: rows 0-3 of 6 to
    16 tokens (the first batch: bucket 16), row 4 of 17 to 30 (the second: bucket 32), the rest
    of 6 to 30."""
    ids = np.full((*shape, MAX_LEN), pad, np.int32)
    mask, segments = np.zeros_like(ids), np.zeros_like(ids)
    for index in np.ndindex(*shape):
        row, first = index[0], all(i == 0 for i in index[1:])
        low, high = (6, 17) if row < 4 else (17, 31) if row == 4 and first else (6, 31)
        length = int(rng.integers(low, high))
        ids[index][:length] = rng.integers(5, vocab, length)
        ids[index][[0, length - 1]] = 1, 2
        mask[index][:length] = 1
        if sum(index) % 2:
            segments[index][length // 2 : length] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


# The fewest layers that hold what is compared (each case compiles four steps per model, and its
# packed run two more): BERT's one, ModernBERT's global layer and sliding-window layer.
LAYERS = {"bert": 1, "modernbert": 2}
# The two training batches every comparison takes (the second with a padding row).
ORDER = np.array([[0, 1, 2, 3], [4, 5, 6, -1]])
# Span windows without the answer (rows 1 and 5): their target is their own [CLS].
ABSENT = [1, 5]


@functools.cache
def _config(family: str, pooling: str = "cls"):
    if family == "bert":
        config, _ = tiny_encoder(num_hidden_layers=LAYERS["bert"])
        return config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config = with_dropout(MODERNBERT_CONFIG, 0.0).replace(num_hidden_layers=LAYERS["modernbert"])
    assert config.global_attn_every_n_layers == 2  # layer 0 global, layer 1 in its window
    return config.replace(classifier_pooling=pooling)


@functools.cache
def _mesh():
    from bert_jax.core import partitioning

    return partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1])


def _case(head: str, family: str):
    """(tuner, the train arrays) of `head` for `family` (span: `ABSENT`'s targets at their
    [CLS], position 0)."""
    config = _config(family, "mean" if head == "regression" else "cls")
    rng = np.random.default_rng(len(head))
    vocab, pad = config.vocab_size, config.pad_token_id
    if head == "choice":
        arrays = _rows(rng, (NUM_ROWS, swag.NUM_CHOICES), vocab, pad)
        arrays["labels"] = rng.integers(0, swag.NUM_CHOICES, NUM_ROWS).astype(np.int32)
        return swag_task.choice_tuner(config, _mesh(), SETTINGS), arrays
    arrays = _rows(rng, (NUM_ROWS,), vocab, pad)
    if head in ("sentence", "regression"):
        num_labels = 3 if head == "sentence" else 1
        arrays["labels"] = (
            rng.integers(0, 3, NUM_ROWS).astype(np.int32)
            if head == "sentence"
            else rng.uniform(0, 5, NUM_ROWS).astype(np.float32)
        )
        return loop.fine_tuner(config, num_labels, _mesh(), SETTINGS), arrays
    lengths = arrays["input_mask"].sum(axis=1)
    if head == "span":
        starts = np.array([rng.integers(0, n - 1) for n in lengths], np.int32)
        arrays["start_positions"] = starts
        arrays["end_positions"] = np.minimum(starts + 2, lengths - 1).astype(np.int32)
        arrays["start_positions"][ABSENT] = arrays["end_positions"][ABSENT] = 0
        kind, outputs = token_loop.SPAN, 2
    else:
        arrays["labels"] = rng.integers(0, 5, (NUM_ROWS, MAX_LEN)).astype(np.int32)
        arrays["label_weights"] = arrays["input_mask"] * rng.integers(0, 2, (NUM_ROWS, MAX_LEN))
        arrays["label_weights"] = arrays["label_weights"].astype(np.float32)
        kind, outputs = token_loop.TAGS, 5
    return token_loop.token_tuner(config, outputs, kind, _mesh(), 0.0, SETTINGS), arrays


@functools.cache
def _encoder_params(family: str):
    """BERT's: the shared tiny encoder's. ModernBERT's: random (no compile): kernels and
    embeddings N(0, 0.05), LayerNorm scales near 1, biases near 0."""
    if family == "bert":
        return tiny_encoder(num_hidden_layers=LAYERS["bert"])[1]["bert"]
    tuner, _ = _case("tags", family)
    rng = np.random.default_rng(0)

    def draw(path, leaf):
        noise = rng.normal(0.0, 0.05, leaf.shape).astype(np.float32)
        return noise + 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else noise

    return jax.tree_util.tree_map_with_path(draw, tuner.abstract_bert)


def two_steps(tuner, arrays, run, family):
    """Two training steps over `ORDER`'s batches and the logits of every row after them, batched
    by `run` (a `Buckets`, or a planned `packing.Packing`): (losses, params before, params
    after, logits)."""
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


@functools.cache
def fixed_length_steps(head: str, family: str):
    """`two_steps` of `_case(head, family)` with every batch padded to max_seq_length: the
    reference the bucketed, packed and micro-batched steps are held to, run once per test
    process (read only); and its `Buckets`, the lengths its batches took."""
    tuner, arrays = _case(head, family)
    run = batches.Buckets((MAX_LEN,))
    return *two_steps(tuner, arrays, run, family), run


HEADS = ("sentence", "regression", "choice", "span", "tags")
# Biases that shift every choice's (position's) score alike: no gradient in a softmax over the
# choices (positions) but rounding noise, which Adam scales to steps of +-lr (as in
# test_finetune_parity.py). The losses and logits, which read them, are compared all the same.
SHIFTS = {
    "choice": ("['classifier']['output']['bias']", "['classifier']['head']['norm']['bias']"),
    "span": (
        "['classifier']['output']['bias']",
        "['classifier']['head']['norm']['bias']",
        "['bert']['encoder']['layer_0']['output_LayerNorm']['bias']",  # BERT's last
    ),
}


def assert_same_steps(head, arrays, steps, fixed):
    """`steps` (`two_steps`' losses, params before and after, logits) are the fixed-length
    steps': losses and logits to TOLERANCE, the update as `assert_same_update` has it. Per-token
    logits come back at max_seq_length, the padding at PADDING_LOGIT in both runs."""
    losses, before, params, logits = steps
    fixed_losses, _, fixed_params, fixed_logits = fixed[:4]
    np.testing.assert_allclose(losses, fixed_losses, rtol=TOLERANCE, atol=TOLERANCE)
    assert_same_update(head, before, params, fixed_params)
    if head in SHIFTS:  # the scores up to the shift those biases add to each row's (output's)
        real = arrays["input_mask"][..., None] > 0 if head == "span" else np.ones_like(logits)
        assert np.all(np.where(real, True, logits == token_loop.PADDING_LOGIT))
        logits, fixed_logits = (_centred(x, real) for x in (logits, fixed_logits))
    np.testing.assert_allclose(logits, fixed_logits, rtol=TOLERANCE, atol=TOLERANCE)


# Micro-batches: a batch over `micro_batch_tokens` runs split, its update the whole batch's.
MICRO_BUDGETS = {"choice": 128, "tags": 64}  # 4 rows x 4 choices x 32: 4 of 1 row; 4 x 32: 2 of 2


def test_micro_batch_count_is_the_fewest_equal_splits_within_the_budget():
    assert batches.micro_batch_count(16, 4 * 96, 2048) == 4  # SWAG: 4 rows of 384 positions
    assert batches.micro_batch_count(16, 128, 2048) == 1
    assert batches.micro_batch_count(16, 128, 0) == 1  # never split
    assert batches.micro_batch_count(12, 100, 250) == 6  # 2 rows; 5 do not divide 12
    assert batches.micro_batch_count(16, 4 * 128, 256) == 16  # over budget at one row: the most
    assert batches.micro_batch_count(16, 4 * 128, 256, divisor=4) == 4  # 4 rows per device set
    assert settings_module.declaration("micro_batch_tokens").step


@pytest.mark.parametrize("head", sorted(MICRO_BUDGETS))
def test_micro_batched_steps_equal_the_whole_batch_steps(head):
    """Dropout off, the second batch with a padding row (weight 0; tags: labelled tokens of
    uneven count per row): each micro-batch's loss over the whole batch's weight adds up to
    the whole batch's loss, gradients and updated parameters."""
    whole_tuner, arrays = _case(head, "bert")
    split = dataclasses.replace(SETTINGS, micro_batch_tokens=MICRO_BUDGETS[head])
    if head == "choice":
        split_tuner = swag_task.choice_tuner(_config("bert"), _mesh(), split)
    else:
        split_tuner = token_loop.token_tuner(
            _config("bert"), 5, token_loop.TAGS, _mesh(), 0.0, split
        )
    assert split_tuner is not whole_tuner
    losses, _, params, logits = two_steps(split_tuner, arrays, batches.Buckets((MAX_LEN,)), "bert")
    # The whole batch's steps: the fixed-length run of the case (whole_tuner's).
    whole_losses, _, whole_params, whole_logits, _ = fixed_length_steps(head, "bert")
    np.testing.assert_allclose(losses, whole_losses, rtol=TOLERANCE, atol=TOLERANCE)
    for (path, ours), whole in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(whole_params)
    ):
        name = jax.tree_util.keystr(path)
        if name not in SHIFTS.get(head, ()):
            np.testing.assert_allclose(ours, whole, atol=TOLERANCE, err_msg=name)
    if head == "choice":
        logits, whole_logits = (_centred(x, np.ones_like(x)) for x in (logits, whole_logits))
    np.testing.assert_allclose(logits, whole_logits, rtol=TOLERANCE, atol=TOLERANCE)


def assert_same_update(head, before, params, fixed_params):
    """The steps moved the params well beyond the tolerance, to the fixed-length run's (each
    leaf to TOLERANCE; the biases of SHIFTS[head] only up to the shift they add)."""
    moved = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(before))
    )
    assert moved > 10 * TOLERANCE
    for (path, ours), fixed in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(fixed_params)
    ):
        name = jax.tree_util.keystr(path)
        if name not in SHIFTS.get(head, ()):
            np.testing.assert_allclose(ours, fixed, atol=TOLERANCE, err_msg=name)


def _centred(logits, real):
    """Each row's scores less their mean over its choices (positions), at the real ones."""
    mean = np.sum(logits * real, axis=1, keepdims=True) / np.sum(real, axis=1, keepdims=True)
    return np.where(real, logits - mean, logits)


def test_a_glue_run_prints_its_compiled_shapes_once_bounded_by_the_buckets():
    """`finetune` on a sentence task: the one line on compiled shapes; predict_split's signature
    (the split and the eval batch size) still predicts every row, in the split's order."""
    tuner, arrays = _case("sentence", "bert")
    features = {key: arrays[key] for key in token_loop.MODEL_KEYS}
    split = batches.EncodedSplit("dev", tuple(map(str, range(NUM_ROWS))), features, None)
    state = tuner.init(jax.random.key(0), _encoder_params("bert"))
    ours = loop.predict_split(tuner, state.params, split, BATCH)
    whole = loop.predict_split(tuner, state.params, split, NUM_ROWS, batches.Buckets((MAX_LEN,)))
    np.testing.assert_allclose(ours, whole, rtol=TOLERANCE, atol=TOLERANCE)
    lines = []
    run = batches.Buckets(BUCKETS)
    tuning_loop.run_steps(
        tuner,
        state,
        jax.random.key(1),
        dataclasses.replace(SETTINGS, epochs=1.0, group_by_length=True),
        NUM_ROWS,
        lambda rows: run.gather(arrays, rows),
        lambda params: {"rows": len(loop.predict_split(tuner, params, split, BATCH, run))},
        lines.append,
        lengths=batches.row_lengths(arrays["input_mask"]),
        buckets=run,
    )
    shapes = [line for line in lines if "compiled shapes" in line]
    assert len(shapes) == 1, lines
    assert shapes[0].startswith("compiled shapes: train ") and "of buckets 16, 32" in shapes[0]
    assert len(run.used["train"]) + len(run.used["predict"]) <= 2 * len(run.lengths)
