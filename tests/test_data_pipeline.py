"""Per-host tf.data pipeline: batch format, exact resume in a new process, host disjointness,
dynamic masking."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.pipeline.tf_data import (
    PipelineSettings,
    PretrainIterator,
    make_pretrain_iterator,
)
from bert_jax.data.preparation.local_runner import prepare_records
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.records import tfrecord as records
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from tests.data_fixtures import embedded_spm, minilm_vocab_path

LENGTH, SLOTS, BATCH = 128, 20, 8

BATCH_FORMAT = {
    "input_ids": ((BATCH, LENGTH), "int32"),
    "input_mask": ((BATCH, LENGTH), "int32"),
    "segment_ids": ((BATCH, LENGTH), "int32"),
    "masked_lm_positions": ((BATCH, SLOTS), "int32"),
    "masked_lm_ids": ((BATCH, SLOTS), "int32"),
    "masked_lm_weights": ((BATCH, SLOTS), "float32"),
    "next_sentence_labels": ((BATCH,), "int32"),
}


@pytest.fixture(scope="module")
def records_dir(tmp_path_factory):
    output = tmp_path_factory.mktemp("records")
    settings = PrepareSettings(
        max_seq_length=LENGTH,
        max_predictions_per_seq=SLOTS,
        dupe_factor=2,
        seed=3,
        num_groups=4,
    )
    result = prepare_records(["embedded:eval"], embedded_spm(), output, settings)
    assert len(result.files) >= 3
    return output


def _all_records(records_dir) -> dict[str, np.ndarray]:
    batches = list(records.read_records(str(records_dir), LENGTH, SLOTS, batch_size=10_000))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _row_keys(batch: dict) -> list[bytes]:
    """One identity per example: its static features, byte for byte."""
    names = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids")
    return [b"".join(batch[n][row].tobytes() for n in names) for row in range(len(batch[names[0]]))]


def _restore(batch: dict) -> np.ndarray:
    restored = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_lm_weights"])
    restored[rows, batch["masked_lm_positions"][rows, slots]] = batch["masked_lm_ids"][rows, slots]
    return restored


def _iterator(records_dir, **overrides) -> PretrainIterator:
    options = dict(batch_size=BATCH, seed=9, shuffle_buffer_size=64)
    options.update(overrides)
    return make_pretrain_iterator(str(records_dir), PipelineSettings(**options))


def test_batches_have_the_fixed_format(records_dir):
    iterator = _iterator(records_dir)
    batch = next(iterator)
    assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == BATCH_FORMAT
    assert set(np.unique(batch["next_sentence_labels"])) <= {0, 1}
    dynamic = next(_iterator(records_dir, dynamic_masking=True))
    assert {k: (v.shape, v.dtype.name) for k, v in dynamic.items()} == BATCH_FORMAT
    assert iterator.get_state()["batches_total"] == 1
    json.dumps(iterator.get_state())


_RESUME_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    from bert_jax.data.pipeline.tf_data import PipelineSettings, make_pretrain_iterator

    tf.random.set_seed(1234)  # another seed than the first process: the order must not care

    records_dir, states_path, out_path, count = sys.argv[1:5]
    states = json.load(open(states_path))
    arrays = {}
    for name, state in states.items():
        settings = PipelineSettings(
            batch_size=8, seed=9, shuffle_buffer_size=64, dynamic_masking=(name == "dynamic"),
        )
        iterator = make_pretrain_iterator(records_dir, settings)
        iterator.set_state(state)
        for step in range(int(count)):
            for key, value in next(iterator).items():
                arrays[f"{name}/{step}/{key}"] = value
    np.savez(out_path, **arrays)
    """
)


def test_restoring_the_position_in_a_new_process_continues_exactly(records_dir, tmp_path):
    epoch_batches = len(_all_records(records_dir)["input_ids"]) // BATCH
    resume_at, following = epoch_batches - 3, 6  # the continuation crosses into epoch 1
    states, expected = {}, {}
    for name, dynamic in (("static", False), ("dynamic", True)):
        iterator = _iterator(records_dir, dynamic_masking=dynamic)
        for _ in range(resume_at):
            next(iterator)
        states[name] = iterator.get_state()
        assert states[name]["epoch"] == 0
        expected[name] = [next(iterator) for _ in range(following)]
        assert iterator.epoch == 1
    states_path = tmp_path / "states.json"
    states_path.write_text(json.dumps(states))
    out_path = tmp_path / "resumed.npz"
    subprocess.run(
        [sys.executable, "-c", _RESUME_SCRIPT, str(records_dir), states_path, out_path, "6"],
        check=True,
        capture_output=True,
    )
    resumed = np.load(out_path)
    for name in states:
        for step, batch in enumerate(expected[name]):
            for key, value in batch.items():
                np.testing.assert_array_equal(resumed[f"{name}/{step}/{key}"], value)
    # Dynamic masking differs from the stored static masking but keeps the same examples.
    static, dynamic = expected["static"][0], expected["dynamic"][0]
    np.testing.assert_array_equal(_restore(static), _restore(dynamic))
    assert not np.array_equal(static["masked_lm_positions"], dynamic["masked_lm_positions"])


@pytest.mark.parametrize("shard_by", ["files", "records"])
def test_two_hosts_never_see_the_same_example(records_dir, shard_by):
    everything = set(_row_keys(_all_records(records_dir)))
    seen = []
    for process_index in (0, 1):
        iterator = _iterator(
            records_dir,
            process_index=process_index,
            process_count=2,
            num_epochs=1,
            shard_by=shard_by,
        )
        assert iterator.shard_by == shard_by
        keys = [key for batch in iterator for key in _row_keys(batch)]
        assert len(keys) == len(set(keys)) and len(keys) >= 10 * BATCH
        seen.append(set(keys))
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] <= everything
    # Only the partial last batch of each host is dropped.
    assert len(everything) - len(seen[0] | seen[1]) < 2 * BATCH


def test_dynamic_masking_statistics_and_fresh_masks_each_epoch(records_dir):
    tokenizer = embedded_spm()
    iterator = _iterator(records_dir, dynamic_masking=True, shuffle=False, num_epochs=3)
    epochs: list[list[dict]] = [[], [], []]
    for batch in iterator:
        epochs[iterator.epoch].append(batch)
    assert all(len(e) == len(epochs[0]) > 0 for e in epochs)
    batches = [b for e in epochs for b in e]
    merged = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    restored = _restore(merged)
    valid = merged["masked_lm_weights"] > 0
    special = np.isin(restored, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id])
    non_special = ((merged["input_mask"] == 1) & ~special).sum(axis=1)
    expected_counts = np.minimum(SLOTS, np.maximum(1, np.round(0.15 * non_special)))
    np.testing.assert_array_equal(valid.sum(axis=1), expected_counts)
    share = valid.sum() / non_special.sum()
    assert abs(share - 0.15) < 0.005, share
    labels = merged["masked_lm_ids"][valid]
    assert not np.isin(labels, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id]).any()
    at_positions = np.take_along_axis(merged["input_ids"], merged["masked_lm_positions"], 1)[valid]
    masked, kept = (at_positions == tokenizer.mask_id).mean(), (at_positions == labels).mean()
    assert (
        abs(masked - 0.8) < 0.015 and abs(kept - 0.1) < 0.015 and abs(0.9 - masked - kept) < 0.015
    )
    replaced = at_positions[(at_positions != tokenizer.mask_id) & (at_positions != labels)]
    assert np.isin(replaced, tokenizer.ordinary_ids).all()
    # Only the masked positions change; tokens elsewhere are the originals.
    untouched = np.ones_like(merged["input_ids"], dtype=bool)
    rows, slots = np.nonzero(valid)
    untouched[rows, merged["masked_lm_positions"][rows, slots]] = False
    np.testing.assert_array_equal(merged["input_ids"][untouched], restored[untouched])
    # Same examples in the same order each epoch (no shuffle), but a new masking.
    first, second = epochs[0][0], epochs[1][0]
    np.testing.assert_array_equal(_restore(first), _restore(second))
    assert not np.array_equal(first["masked_lm_positions"], second["masked_lm_positions"])


def test_dynamic_whole_word_masking_takes_whole_words(records_dir):
    tokenizer = embedded_spm()
    iterator = _iterator(records_dir, dynamic_masking=True, whole_word_mask=True, num_epochs=1)
    words_by_category = {"mask": 0, "other": 0}
    selected = total = 0
    for batch in iterator:
        restored = _restore(batch)
        special = np.isin(restored, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id])
        starts = tokenizer.word_start_table[restored] | special | np.roll(special, 1, axis=1)
        word_ids = np.cumsum(starts, axis=1)
        for row in range(BATCH):
            valid = batch["masked_lm_weights"][row] > 0
            positions = batch["masked_lm_positions"][row][valid]
            words = np.unique(word_ids[row][positions])
            np.testing.assert_array_equal(positions, np.flatnonzero(np.isin(word_ids[row], words)))
            for word in words:
                seen = batch["input_ids"][row][word_ids[row] == word]
                is_mask = seen == tokenizer.mask_id
                assert is_mask.all() or not is_mask.any()  # one decision per word
                words_by_category["mask" if is_mask.all() else "other"] += 1
            selected += len(positions)
            total += int(((batch["input_mask"][row] == 1) & ~special[row]).sum())
    share = selected / total
    assert 0.12 < share <= 0.155  # the prefix rule may stop a little short of 15%
    mask_share = words_by_category["mask"] / sum(words_by_category.values())
    assert abs(mask_share - 0.8) < 0.03


def test_a_state_from_another_configuration_is_refused(records_dir):
    state = _iterator(records_dir).get_state()
    with pytest.raises(ValueError, match="different input configuration"):
        _iterator(records_dir, batch_size=4).set_state(state)
    with pytest.raises(ValueError, match="different input configuration"):
        _iterator(records_dir, process_count=2).set_state(state)
    restored = _iterator(records_dir)
    restored.set_state(json.dumps(state))
    assert restored.get_state() == state


def test_mismatched_lengths_and_too_little_data_are_clear_errors(records_dir):
    with pytest.raises(ValueError, match="max_seq_length=128 and max_predictions_per_seq=20"):
        make_pretrain_iterator(
            str(records_dir), PipelineSettings(batch_size=BATCH, max_seq_length=512)
        )
    with pytest.raises(ValueError, match="fewer than batch_size=100000 examples"):
        next(_iterator(records_dir, batch_size=100_000))
    with pytest.raises(ValueError, match="corpus, not prepared records"):
        make_pretrain_iterator("embedded:eval", PipelineSettings(batch_size=BATCH))
    with pytest.raises(
        ValueError,
        match="was prepared with another tokenizer .* than the tokenizer given for dynamic",
    ):
        make_pretrain_iterator(
            str(records_dir),
            PipelineSettings(batch_size=BATCH, dynamic_masking=True),
            load_tokenizer(minilm_vocab_path()),
        )
    masking = MaskingConfig.from_tokenizer(embedded_spm(), 0.15, 10)
    with pytest.raises(ValueError, match="must equal max_predictions_per_seq"):
        PretrainIterator(
            records.list_record_files(str(records_dir)),
            PipelineSettings(
                batch_size=BATCH, max_seq_length=LENGTH, max_predictions_per_seq=SLOTS
            ),
            masking,
        )


def test_the_pipeline_functions_are_traced_without_autograph(records_dir, monkeypatch):
    """AutoGraph's source rewrite (about a second of CPU per process) is skipped for every
    function the pipeline and the record readers give tf.data: a shuffled, dynamically masked
    epoch, a read and a count convert nothing."""
    from tensorflow.python.autograph.impl import api as autograph_api

    converted = []
    convert = autograph_api._convert_actual

    def spy(entity, program_ctx):
        converted.append(getattr(entity, "__qualname__", repr(entity)))
        return convert(entity, program_ctx)

    monkeypatch.setattr(autograph_api, "_convert_actual", spy)
    iterator = _iterator(records_dir, dynamic_masking=True, whole_word_mask=True)
    next(iterator)
    next(records.read_records(str(records_dir), LENGTH, SLOTS))
    records.count_records(records.list_record_files(str(records_dir))[0])
    assert converted == []
