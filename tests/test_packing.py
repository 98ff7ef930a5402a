"""Sequence packing: layout of packed rows, and losses/gradients equal to the unpacked batch."""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
import pytest
from helpers import random_params, tiny_config

from bert_jax.core import losses, trainer
from bert_jax.core.model import BertForPreTraining
from bert_jax.data.pipeline import packing

CLS, SEP = 2, 3


def unpacked_instances(
    rng: np.random.Generator, lengths: list[int], seq_len: int, slots: int, vocab_size: int
) -> dict[str, np.ndarray]:
    """One `[CLS] A [SEP] B [SEP]` instance per row, padded to `seq_len`, with predictions."""
    n = len(lengths)
    batch = {
        "input_ids": np.zeros((n, seq_len), np.int32),
        "input_mask": np.zeros((n, seq_len), np.int32),
        "segment_ids": np.zeros((n, seq_len), np.int32),
        "masked_lm_positions": np.zeros((n, slots), np.int32),
        "masked_lm_ids": np.zeros((n, slots), np.int32),
        "masked_lm_weights": np.zeros((n, slots), np.float32),
        "next_sentence_labels": rng.integers(0, 2, size=n).astype(np.int32),
    }
    for row, length in enumerate(lengths):
        ids = rng.integers(5, vocab_size, size=length).astype(np.int32)
        a_end = int(rng.integers(1, length - 2))
        ids[0], ids[a_end + 1], ids[length - 1] = CLS, SEP, SEP
        batch["input_ids"][row, :length] = ids
        batch["input_mask"][row, :length] = 1
        batch["segment_ids"][row, a_end + 2 : length] = 1
        ordinary = [i for i in range(length) if ids[i] not in (CLS, SEP)]
        count = min(slots, max(1, round(0.15 * len(ordinary))))
        chosen = np.sort(rng.choice(ordinary, size=count, replace=False))
        batch["masked_lm_positions"][row, :count] = chosen
        batch["masked_lm_ids"][row, :count] = rng.integers(5, vocab_size, size=count)
        batch["masked_lm_weights"][row, :count] = 1.0
    return batch


def test_packed_rows_restart_positions_and_keep_each_instance():
    rng = np.random.default_rng(0)
    lengths = [10, 7, 20, 5, 12, 9]
    unpacked = unpacked_instances(rng, lengths, 32, 4, 100)
    config = packing.PackingConfig(max_seq_length=32, max_predictions_per_row=8, factor=3.0)
    packed, stats = packing.pack_batch(unpacked, 2, config)

    assert set(packed) == set(packing.PACKED_KEYS)
    assert stats.dropped == 0 and stats.real_tokens == sum(lengths) == packed["input_mask"].sum()
    for name, value in packed.items():
        assert value.shape[0] == 2, name
    seen = 0
    for row in range(2):
        ids = packed["packed_segment_ids"][row]
        for j in range(1, ids.max() + 1):
            span = np.flatnonzero(ids == j)
            start, n = span[0], len(span)
            assert np.array_equal(span, np.arange(start, start + n))  # contiguous
            np.testing.assert_array_equal(packed["position_ids"][row, span], np.arange(n))
            assert packed["cls_positions"][row, j - 1] == start
            assert packed["input_ids"][row, start] == CLS
            # The instance is one of the inputs, token types and NSP label included.
            source = [i for i, length in enumerate(lengths) if length == n]
            assert len(source) == 1
            src = source[0]
            np.testing.assert_array_equal(
                packed["input_ids"][row, span], unpacked["input_ids"][src, :n]
            )
            np.testing.assert_array_equal(
                packed["segment_ids"][row, span], unpacked["segment_ids"][src, :n]
            )
            assert (
                packed["next_sentence_labels"][row, j - 1] == unpacked["next_sentence_labels"][src]
            )
            assert packed["next_sentence_weights"][row, j - 1] == 1.0
            seen += 1
        # Every prediction points into its instance at the token it predicts.
        valid = packed["masked_lm_weights"][row] > 0
        picked = packed["masked_lm_positions"][row, valid]
        assert (ids[picked] > 0).all()
        assert (packed["input_mask"][row, picked] == 1).all()
        assert (packed["next_sentence_weights"][row, ids.max() :] == 0).all()
    assert seen == len(lengths)
    assert packed["masked_lm_weights"].sum() == unpacked["masked_lm_weights"].sum()

    # No room: what does not fit is dropped and counted, never truncated.
    _, tight = packing.pack_batch(unpacked, 1, config)
    assert tight.dropped > 0 and tight.real_tokens <= 32


def test_packing_respects_prediction_and_instance_budgets():
    rng = np.random.default_rng(1)
    unpacked = unpacked_instances(rng, [6] * 8, 64, 2, 100)
    few_slots = packing.PackingConfig(64, max_predictions_per_row=2, max_instances_per_row=16)
    packed, stats = packing.pack_batch(unpacked, 8, few_slots)
    assert stats.dropped == 0
    assert (packed["masked_lm_weights"].sum(axis=1) <= 2).all()
    few_instances = packing.PackingConfig(64, max_predictions_per_row=16, max_instances_per_row=3)
    packed, stats = packing.pack_batch(unpacked, 2, few_instances)
    assert stats.dropped == 2 and packed["packed_segment_ids"].max() == 3


def _objective(model, params, batch):
    """The pretraining loss, its sums and its gradients, compiled."""

    def loss(p):
        sums = trainer.compute_sums(p, batch, model, deterministic=True)
        return losses.pretraining_loss(sums), sums

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


@pytest.fixture(scope="module")
def packed_reference():
    """Ten instances, unpacked one per row and packed four rows; the model's parameters and the
    unpacked batch's loss, sums and gradients (what each attention path's packed batch must
    give), computed once for the module."""
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(2)
    lengths = [int(n) for n in rng.integers(5, 30, size=10)]
    seq_len, slots = 64, 5
    unpacked = unpacked_instances(rng, lengths, seq_len, slots, config.vocab_size)
    pack_config = packing.PackingConfig(seq_len, max_predictions_per_row=4 * slots, factor=2.5)
    packed, stats = packing.pack_batch(unpacked, 4, pack_config)
    assert stats.dropped == 0 and stats.instances_per_row > 2

    # The reference runs every position through every layer; the packed model only the
    # positions its heads read in the last layer (config.sparse_last_layer, the default).
    reference = BertForPreTraining(config.replace(attention_impl="xla", sparse_last_layer=False))
    params = random_params(reference, **trainer.model_inputs(unpacked))["params"]
    return config, lengths, packed, params, _objective(reference, params, unpacked)


@pytest.mark.parametrize("impl", ["xla", "dot_product"])
def test_packed_losses_and_gradients_equal_unpacked(impl, packed_reference):
    config, lengths, packed, params, unpacked_result = packed_reference
    model = BertForPreTraining(config.replace(attention_impl=impl))

    (loss_u, sums_u), grads_u = unpacked_result
    (loss_p, sums_p), grads_p = _objective(model, params, packed)
    for key in sums_u:
        np.testing.assert_allclose(sums_p[key], sums_u[key], rtol=1e-5, err_msg=key)
    assert float(sums_p["nsp_weight"]) == len(lengths)
    np.testing.assert_allclose(loss_p, loss_u, rtol=1e-6)
    flat_u, flat_p = jax.tree.leaves(grads_u), jax.tree.leaves(grads_p)
    for g_u, g_p in zip(flat_u, flat_p):
        np.testing.assert_allclose(g_p, g_u, rtol=1e-4, atol=1e-7)

    # No attention across instances: changing every other instance of a row leaves the first
    # instance's outputs exactly as they were.
    dense = BertForPreTraining(config.replace(attention_impl=impl, sparse_last_layer=False))
    outputs = jax.jit(lambda b: dense.apply({"params": params}, **trainer.model_inputs(b)))
    before = outputs(packed)
    changed = {k: v.copy() for k, v in packed.items()}
    others = changed["packed_segment_ids"][0] > 1
    changed["input_ids"][0, others] = np.random.default_rng(3).integers(
        5, config.vocab_size, size=int(others.sum())
    )
    after = outputs(changed)
    first = packed["packed_segment_ids"][0] == 1
    np.testing.assert_array_equal(
        np.asarray(after["sequence_output"])[0, first],
        np.asarray(before["sequence_output"])[0, first],
    )
    np.testing.assert_array_equal(after["nsp_logits"][0, 0], before["nsp_logits"][0, 0])


class _Counting:
    """A resumable iterator of unpacked batches (its position is the batch count)."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.taken = 0

    def __next__(self):
        rng = np.random.default_rng(self.taken)
        self.taken += 1
        lengths = [int(n) for n in rng.integers(5, 20, size=self.batch_size)]
        return unpacked_instances(rng, lengths, 32, 3, 100)

    def get_state(self):
        return {"taken": self.taken}

    def set_state(self, state):
        self.taken = state["taken"]


def test_packed_iterator_resumes_exactly_and_checks_the_input_batch_size():
    config = packing.PackingConfig(32, max_predictions_per_row=12, factor=2.0)
    it = packing.PackedIterator(_Counting(8), 4, config)
    next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(2)]
    resumed = packing.PackedIterator(_Counting(8), 4, config)
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        for key in packing.PACKED_KEYS:
            np.testing.assert_array_equal(got[key], want[key])
    assert it.stats.rows == 12 and it.stats.instances == 24

    with pytest.raises(ValueError, match="reads 8 unpacked rows"):
        next(packing.PackedIterator(_Counting(6), 4, config))


def test_suggest_factor_fills_rows():
    assert packing.suggest_factor([128] * 4, 128) == 1.0
    assert packing.suggest_factor([100, 200, 300], 512) == 2.4  # 0.95 * 512 / 200 = 2.43


def test_pipeline_packs_records_and_resumes_exactly(tmp_path):
    from bert_jax.data.pipeline.tf_data import PipelineSettings, make_pretrain_iterator
    from bert_jax.data.records import tfrecord as records

    rng = np.random.default_rng(5)
    lengths = [int(n) for n in rng.integers(5, 16, size=48)]
    unpacked = unpacked_instances(rng, lengths, 32, 3, 100)
    records.write_records(str(tmp_path / "part-00000.tfrecord"), records.serialize_arrays(unpacked))
    config = packing.PackingConfig(32, max_predictions_per_row=12, factor=2.0)
    settings = PipelineSettings(
        batch_size=4,
        max_seq_length=32,
        max_predictions_per_seq=3,
        seed=1,
        shuffle_buffer_size=16,
        packing=config,
    )
    make = lambda: make_pretrain_iterator(str(tmp_path), settings)  # noqa: E731
    it = make()
    first = next(it)
    assert first["input_ids"].shape == (4, 32) and first["cls_positions"].shape == (4, 16)
    assert first["next_sentence_weights"].sum() == 8  # 2 x 4 instances, all fit
    state = it.get_state()
    expected = [next(it) for _ in range(6)]  # 6 batches an epoch: crosses into the second
    resumed = make()
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        for key in packing.PACKED_KEYS:
            np.testing.assert_array_equal(got[key], want[key])


def test_choose_factor_keeps_drops_rare():
    rng = np.random.default_rng(6)
    lengths = [int(n) for n in rng.integers(5, 30, size=120)]
    rows = unpacked_instances(rng, lengths, 32, 3, 100)
    config = packing.PackingConfig(32, max_predictions_per_row=12)
    factor = packing.choose_factor(rows, 4, config, max_dropped=0.0)
    assert 1.0 <= factor <= packing.suggest_factor(lengths, 32)
    chosen = dataclasses.replace(config, factor=factor)
    size = chosen.instances_per_batch(4)
    for start in range(0, 120 - size + 1, size):
        group = {k: v[start : start + size] for k, v in rows.items()}
        assert packing.pack_batch(group, 4, chosen)[1].dropped == 0


def test_pretraining_phase_with_packing_runs(tmp_path):
    """`config.phaseN.packing_factor`: packed training batches, unpacked evaluation."""
    from bert_jax.training import config_lib, metric_writers, pretrain
    from tests.data_fixtures import SPM_VOCAB_SIZE, embedded_spm_dir

    config = config_lib.pretraining_config("tiny")
    config.model.update(hidden_size=32, num_attention_heads=2, intermediate_size=64)
    config.model.vocab_size = SPM_VOCAB_SIZE  # the data tests' tokenizer: 3,000 rows, not 30,522
    config.model.num_hidden_layers = 1  # the packed rows are what matters, not depth
    config.model.max_position_embeddings = 64
    config.update(total_steps=3, log_every_steps=1, export_model=False)
    config.phase1.update(fraction=1.0, max_seq_length=64, max_predictions_per_seq=10)
    config.phase1.update(batch_size=8, packing_factor=2.0)
    config.phase2.fraction = 0.0
    config.data.update(source="embedded:eval", tokenizer=embedded_spm_dir(), shuffle_buffer_size=50)
    config.data.cache_dir = str(tmp_path / "cache")
    config.eval.update(every_steps=3, batches=1, batch_size=8, source="embedded:eval")
    config.checkpoint.every_steps = 3
    result = pretrain.pretrain(config, str(tmp_path / "run"))
    assert result.final_step == 3 and result.skipped_steps == 0
    rows = metric_writers.read_jsonl(os.path.join(result.workdir, "metrics.jsonl"), kind="train")
    # (What the packed batches hold is checked on the pipeline above.)
    assert len(rows) == 3 and all(np.isfinite(row["loss"]) for row in rows)
    assert np.isfinite(result.last_eval["loss"])
