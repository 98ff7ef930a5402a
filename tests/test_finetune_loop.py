"""Heads and the fine-tuning loop on the 8-device CPU mesh: logical axes, batching, learning,
determinism, padding, and loading a pretrained encoder."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.core import partitioning
from bert_jax.data.tokenizers.pair_encoding import encode_pairs
from bert_jax.finetune.heads import pooled as heads
from bert_jax.finetune.tasks.glue import get_task
from bert_jax.finetune.tuning import sentence_tuning as loop
from bert_jax.finetune.tuning.batches import EncodedSplit, TaskData
from tests.glue_fixtures.tiny import fixture_tokenizer, tiny_encoder, tiny_pretrained

POSITIVE = ("great", "good", "delight", "best", "warm", "funny")
NEGATIVE = ("dull", "boring", "bad", "worst", "mess", "tedious")
FILLER = ("the", "film", "movie", "a", "is", "story", "cast", "and", "it", "of")


def sentiment_split(tokenizer, split: str, size: int, seed: int) -> EncodedSplit:
    """Sentences of filler words with one sentiment word; the label says which kind it is."""
    rng = np.random.default_rng(seed)
    sentences, labels = [], []
    for row in range(size):
        label = row % 2
        words = list(rng.choice(FILLER, size=5))
        words.insert(int(rng.integers(0, 6)), rng.choice(POSITIVE if label else NEGATIVE))
        sentences.append(" ".join(words))
        labels.append(label)
    features = encode_pairs(tokenizer, sentences, max_seq_length=16)
    guids = tuple(f"{split}-{i}" for i in range(size))
    return EncodedSplit(split, guids, features, np.asarray(labels, np.int32))


def sentiment_data(tokenizer) -> TaskData:
    task = dataclasses.replace(get_task("SST-2"), dev_splits={"dev": "SST-2"})
    return TaskData(
        task,
        train=sentiment_split(tokenizer, "train", 64, seed=0),
        dev={"dev": sentiment_split(tokenizer, "dev", 36, seed=1)},
        test={"test": sentiment_split(tokenizer, "test", 10, seed=2)},
    )


# A random (not pretrained) tiny encoder needs a few dozen steps to find the sentiment word.
SETTINGS = loop.FinetuneSettings(
    learning_rate=2e-3, epochs=16, batch_size=16, eval_batch_size=16, max_seq_length=16
)


def test_head_params_have_logical_axes_and_the_pretraining_encoder_tree():
    config, pretraining_params = tiny_encoder()
    model = heads.BertForSequenceClassification(config, num_labels=3)
    tokens = jnp.zeros((2, 8), jnp.int32)
    abstract = jax.eval_shape(model.init, jax.random.key(0), tokens, tokens, tokens)["params"]
    specs = nn.get_partition_spec(abstract)
    assert specs["classifier"]["output"]["kernel"] == jax.sharding.PartitionSpec("embed", None)
    assert abstract["classifier"]["output"]["kernel"].value.shape == (config.hidden_size, 3)
    # The encoder subtree is the pretraining model's, so a model directory's `bert` loads as is.
    encoder = nn.meta.unbox(abstract["bert"])
    assert jax.tree.structure(encoder) == jax.tree.structure(pretraining_params["bert"])


def test_losses_ignore_rows_of_weight_zero():
    logits = jnp.array([[2.0, 0.0], [0.0, 2.0], [9.0, -9.0]])
    labels = jnp.array([0, 1, 1])
    sums = heads.classification_loss(logits, labels, jnp.array([1.0, 1.0, 0.0]))
    expected = -2 * jax.nn.log_softmax(jnp.array([2.0, 0.0]))[0]
    assert float(sums["loss_sum"]) == pytest.approx(float(expected), rel=1e-6)
    assert float(sums["correct_sum"]) == 2.0 and float(sums["weight"]) == 2.0
    sums = heads.regression_loss(jnp.array([[1.0], [3.0]]), jnp.array([2.0, 0.0]), jnp.ones(2))
    assert float(sums["loss_sum"]) == pytest.approx(1.0 + 9.0)


@pytest.mark.slow
def test_finetuning_learns_is_deterministic_and_pads_evaluation():
    encoder = tiny_pretrained()
    data = sentiment_data(encoder.tokenizer)
    settings = dataclasses.replace(SETTINGS, eval_every_epoch=True)
    result = loop.finetune(encoder, data, settings)
    assert partitioning.make_mesh((-1, 1, 1)).shape["data"] == 8  # ran data-parallel on 8
    assert result.num_train_steps == 64 and result.skipped_steps == 0
    assert [h["step"] for h in result.history] == list(range(4, 65, 4))  # after every epoch
    accuracy = result.dev_metrics["SST-2"]["accuracy"]
    assert accuracy >= 90.0, result.history  # chance is 50%
    assert result.train_loss < 0.5
    # The test split (10 rows, eval batch 16) is predicted in full, as GLUE label strings.
    guids, predictions = result.test_predictions["test"]
    assert guids == [f"test-{i}" for i in range(10)] and set(predictions) <= {"0", "1"}

    again = loop.finetune(encoder, data, settings)
    assert again.train_loss == result.train_loss
    assert again.dev_metrics == result.dev_metrics
    assert again.test_predictions == result.test_predictions
    other_seed = loop.finetune(encoder, data, dataclasses.replace(settings, seed=1))
    assert other_seed.train_loss != result.train_loss


def test_padded_evaluation_batches_do_not_change_predictions():
    encoder = tiny_pretrained()
    data = sentiment_data(encoder.tokenizer)
    mesh = partitioning.make_mesh((-1, 1, 1))
    tuner = loop.fine_tuner(encoder.config, 2, mesh)
    state = tuner.init(jax.random.key(0), encoder.bert_params)
    dev = data.dev["dev"]
    padded = loop.predict_split(tuner, state.params, dev, eval_batch_size=16)  # 36 = 16+16+4
    whole = loop.predict_split(tuner, state.params, dev, eval_batch_size=40)
    assert padded.shape == (36, 2)
    np.testing.assert_allclose(padded, whole, atol=1e-5)


def test_pretrained_params_are_loaded_and_checked():
    encoder = tiny_pretrained()
    mesh = partitioning.make_mesh((-1, 1, 1))
    tuner = loop.fine_tuner(encoder.config, 2, mesh)
    state = tuner.init(jax.random.key(0), encoder.bert_params)
    loaded = state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    np.testing.assert_array_equal(
        np.asarray(loaded), encoder.bert_params["embeddings"]["word_embeddings"]["embedding"]
    )
    broken = jax.tree.map(lambda x: x, encoder.bert_params)
    broken["pooler"]["kernel"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match=r"\['pooler'\]\['kernel'\] has shape \(3, 3\)"):
        tuner.init(jax.random.key(0), broken)
    del broken["pooler"]
    with pytest.raises(ValueError, match=r"missing \['pooler'\]"):
        tuner.init(jax.random.key(0), broken)


def test_a_single_run_encoder_hands_its_params_to_the_state():
    """`bert-jax finetune`'s encoder (`single_run`) lets go of its params once the state holds
    them: the run keeps one copy of the weights, not two."""
    shared = tiny_pretrained()
    tuner = loop.fine_tuner(shared.config, 2, partitioning.make_mesh((-1, 1, 1)))
    own = jax.tree.map(np.array, shared.bert_params)  # this run's copy, nobody else's
    kernel = weakref.ref(own["pooler"]["kernel"])
    encoder = dataclasses.replace(shared, params=own, single_run=True)
    del own
    state = tuner.init(jax.random.key(0), encoder.bert_params)
    gc.collect()
    assert kernel() is None  # no host copy left
    np.testing.assert_array_equal(
        np.asarray(state.params["bert"]["pooler"]["kernel"]), shared.bert_params["pooler"]["kernel"]
    )
    with pytest.raises(RuntimeError, match="read once"):
        encoder.bert_params  # noqa: B018
    assert shared.bert_params is shared.bert_params  # a sweep's encoder keeps them


def test_settings_are_checked_before_compiling():
    encoder = tiny_pretrained()
    data = sentiment_data(fixture_tokenizer())
    with pytest.raises(ValueError, match="batch_size=12 is not divisible by the data-parallel"):
        loop.finetune(encoder, data, dataclasses.replace(SETTINGS, batch_size=12))
    with pytest.raises(ValueError, match="max_seq_length=128 exceeds"):
        loop.finetune(encoder, data, dataclasses.replace(SETTINGS, max_seq_length=128))
