"""inputs: which tokenizer a run uses, and its evaluation source and batches."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bert_jax.training import config_lib, eval_choice, inputs
from tests.convert_fixtures import write_vocab
from tests.helpers import pretraining_config


def run_config(source="embedded", **overrides):
    eval_settings = {"eval.every_steps": 5, "eval.batches": 2, "eval.batch_size": 8}
    return pretraining_config(
        10,
        **{"data.source": source, "data.tokenizer_vocab_size": 300, **eval_settings, **overrides},
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run on the embedded corpus with no tokenizer named: one is trained into its workdir."""
    workdir = str(tmp_path_factory.mktemp("run"))
    config = run_config()
    tokenizer = inputs.resolve_tokenizer(config, config_lib.split_phases(config), workdir)
    return config, workdir, tokenizer


def test_a_corpus_run_trains_its_tokenizer_once(trained, monkeypatch):
    config, workdir, tokenizer = trained
    assert tokenizer.kind == "sentencepiece" and tokenizer.vocab_size == 300
    assert sorted(os.listdir(workdir)) == ["tokenizer"]  # the training text is removed
    from bert_jax.data.tokenizers import load_or_train as tokenizer_lib

    def no_training(*args, **kwargs):
        raise AssertionError("a restart must reuse <workdir>/tokenizer")

    monkeypatch.setattr(tokenizer_lib, "train_sentencepiece", no_training)
    again = inputs.resolve_tokenizer(config, config_lib.split_phases(config), workdir)
    assert again.encode("the quick brown fox") == tokenizer.encode("the quick brown fox")


def test_a_named_tokenizer_wins_then_the_one_next_to_prepared_records(trained, tmp_path):
    _, workdir, tokenizer = trained
    vocab = write_vocab(str(tmp_path / "vocab.txt"), size=400)
    records = tmp_path / "records"
    tokenizer.save(str(records / "tokenizer"))

    named = run_config(str(records), **{"data.tokenizer": vocab})
    chosen = inputs.resolve_tokenizer(named, config_lib.split_phases(named), workdir)
    assert (chosen.kind, chosen.vocab_size) == ("wordpiece", 400)

    config = run_config(str(records))
    chosen = inputs.resolve_tokenizer(config, config_lib.split_phases(config), str(tmp_path / "w"))
    assert (chosen.kind, chosen.vocab_size) == ("sentencepiece", 300)


def test_prepared_records_without_a_tokenizer_are_an_error(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    (records / "train-00000-of-00001.tfrecord").write_bytes(b"")
    config = run_config(str(records))
    with pytest.raises(ValueError, match="no tokenizer: set config.data.tokenizer"):
        inputs.resolve_tokenizer(config, config_lib.split_phases(config), str(tmp_path / "w"))


def test_the_eval_source(tmp_path):
    def sources(config):
        return [c.source for c in eval_choice.eval_choices(config, config_lib.split_phases(config))]

    assert sources(run_config()) == ["embedded:eval", "embedded:eval"]
    assert sources(run_config(**{"eval.source": "/held/out"})) == ["/held/out", "/held/out"]
    (tmp_path / "part-00000.tfrecord").write_bytes(b"")  # records with no held-out records
    assert sources(run_config(str(tmp_path))) == ["", ""]
    assert sources(run_config("/corpus.txt")) == ["/corpus.txt", "/corpus.txt"]  # its held-out
    assert sources(run_config(**{"eval.every_steps": 0})) == ["", ""]


def test_eval_batches_per_phase(trained):
    config, workdir, tokenizer = trained
    phases = config_lib.split_phases(config)
    choice = eval_choice.eval_choices(config, phases)[1]
    assert choice.batches == 2
    batches = inputs.eval_batches(config, phases[1], choice, tokenizer, workdir)
    assert len(batches) == 2
    for batch in batches:
        assert batch["input_ids"].shape == (8, 64) and batch["masked_lm_ids"].shape == (8, 10)
        assert batch["input_ids"].max() < tokenizer.vocab_size
    # Fixed seed, static masks: the same held-out batches every time.
    again = inputs.eval_batches(config, phases[1], choice, tokenizer, workdir)
    np.testing.assert_array_equal(again[0]["input_ids"], batches[0]["input_ids"])


# For each pipeline setting config.data declares: a value unlike PipelineSettings' default.
_PIPELINE_VALUES = {
    "dynamic_masking": True,
    "whole_word_mask": True,
    "masked_lm_prob": 0.2,
    "mask_share": 0.5,
    "same_share": 0.2,
    "random_share": 0.3,
    "shuffle_buffer_size": 7,
    "skip_corrupt_records": True,
}


def test_every_pipeline_setting_config_data_declares_reaches_the_iterator(trained):
    """config.data -> PipelineSettings -> make_pretrain_iterator -> PretrainIterator hands one
    settings object down: every pipeline setting config.data declares, set unlike its default,
    is what each shard's iterator (and its dynamic masking) reads; one dropped on the way
    fails here."""
    import dataclasses

    from bert_jax.data.pipeline.tf_data import PipelineSettings, PretrainIterator
    from bert_jax.training.config_schema import DataSection

    declared = {f.name for f in dataclasses.fields(DataSection)}
    shared = {f.name for f in dataclasses.fields(PipelineSettings)} & declared
    assert set(_PIPELINE_VALUES) == shared  # a new one needs its value above
    defaults = PipelineSettings(batch_size=1)
    assert all(getattr(defaults, k) != v for k, v in _PIPELINE_VALUES.items())
    _, workdir, tokenizer = trained
    values = {f"data.{k}": v for k, v in _PIPELINE_VALUES.items()}
    config = run_config(**values, **{"data.shards": 2})
    phase = config_lib.split_phases(config)[0]
    sharded = inputs.train_iterator(config, phase, tokenizer, workdir)
    assert len(sharded.readers) == 2
    for shard, reader in enumerate(sharded.readers):
        assert isinstance(reader, PretrainIterator)
        settings = reader.settings
        assert {k: getattr(settings, k) for k in _PIPELINE_VALUES} == _PIPELINE_VALUES
        assert (settings.process_index, settings.process_count) == (shard, 2)
        assert (settings.max_seq_length, settings.batch_size) == (phase.max_seq_length, 4)
        masking = reader.masking
        assert masking.whole_word_mask and masking.masked_lm_prob == 0.2
        assert (masking.mask_share, masking.random_share) == (0.5, 0.3)
    assert next(sharded)["input_ids"].shape == (8, phase.max_seq_length)
