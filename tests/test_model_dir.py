"""Model directories: round trips, atomic writes, workdirs, mesh restores and clear refusals."""

from __future__ import annotations

import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.convert import mapping
from bert_jax.convert import model_dir as md
from bert_jax.convert.strict import ConversionError
from bert_jax.core import partitioning, trainer
from bert_jax.core.model import BertForPreTraining
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.runtime.errors import UserError
from tests.convert_fixtures import random_params, write_vocab
from tests.helpers import REAL_SENTENCES, tiny_config

CONFIG = tiny_config(num_hidden_layers=2)


@pytest.fixture(scope="module")
def params():
    return random_params(CONFIG)


@pytest.fixture
def vocab(tmp_path):
    return write_vocab(str(tmp_path / "vocab.txt"), CONFIG.vocab_size)


def _assert_same(loaded, saved):
    assert jax.tree.structure(loaded) == jax.tree.structure(saved)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(saved)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), b)


def test_round_trip_with_heads_and_tokenizer(tmp_path, params, vocab):
    path = md.save_model_dir(tmp_path / "model", CONFIG, params, vocab, extra={"note": "hi"})
    assert sorted(os.listdir(path)) == ["config.json", "params", "tokenizer"]
    with open(os.path.join(path, "config.json")) as f:
        stored = json.load(f)
    # Hugging Face field names at the top level, our own block beside them.
    assert stored["hidden_size"] == 64 and stored["num_hidden_layers"] == 2
    assert stored["hidden_act"] == "gelu" and stored["layer_norm_eps"] == 1e-12
    assert stored["bert_jax"]["format_version"] == md.FORMAT_VERSION
    assert stored["bert_jax"]["has_pretraining_heads"] is True
    assert stored["bert_jax"]["tokenizer"] == {
        "path": "tokenizer",
        "type": "wordpiece",
        "lowercase": True,
    }

    loaded = md.load_model_dir(path)
    assert loaded.config == CONFIG and loaded.has_heads and loaded.extra == {"note": "hi"}
    _assert_same(loaded.params, params)
    cpu = jax.devices("cpu")[0]
    assert all(leaf.devices() == {cpu} for leaf in jax.tree.leaves(loaded.params))
    assert loaded._tokenizer is None  # loaded lazily
    reference = load_tokenizer(vocab, lowercase=True)
    for sentence in REAL_SENTENCES:
        assert loaded.tokenizer.encode(sentence) == reference.encode(sentence)


def test_encoder_only_round_trip_without_tokenizer(tmp_path, params):
    encoder = {"bert": params["bert"]}
    path = md.save_model_dir(tmp_path / "enc", CONFIG, encoder)
    loaded = md.load_model_dir(path)
    assert not loaded.has_heads and not loaded.has_tokenizer
    _assert_same(loaded.params, encoder)
    with pytest.raises(md.ModelDirError, match="no tokenizer/"):
        loaded.tokenizer  # noqa: B018


def test_mapping_table_names_exactly_the_model_parameters():
    # The table drives every importer, exporter and the model-dir check: it must list each
    # parameter of the model once, with the model's shape.
    batch = trainer.dummy_batch(1, 8, 2)
    abstract = jax.eval_shape(
        lambda: BertForPreTraining(CONFIG).init(
            jax.random.key(0), **trainer.model_inputs(batch), deterministic=True
        )
    )
    model_tree = nn.meta.unbox(abstract["params"])
    table = {"/".join(e.path): mapping.expected_shape(e, CONFIG) for e in mapping.entries(CONFIG)}
    flat = {
        "/".join(k.key for k in path): leaf.shape
        for path, leaf in jax.tree_util.tree_flatten_with_path(model_tree)[0]
    }
    assert table == flat


def test_pretraining_workdir_with_exported_model_is_accepted(tmp_path, params):
    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    md.save_model_dir(workdir / "model", CONFIG, params)
    loaded = md.load_model_dir(workdir, load_params=False)
    assert loaded.path == str(workdir / "model") and loaded.params is None
    assert md.read_config(workdir)[0] == CONFIG


def test_restore_straight_onto_a_mesh(tmp_path, params):
    path = md.save_model_dir(tmp_path / "model", CONFIG, params)
    mesh = partitioning.make_mesh((2, 2, 2))
    loaded = md.load_params_for_mesh(path, mesh)
    expected = md.param_shardings(CONFIG, mesh)
    for leaf, sharding in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(expected)):
        assert leaf.sharding == sharding
    embedding = loaded.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert len(embedding.sharding.device_set) == 8  # really spread over the mesh
    _assert_same(jax.device_get(loaded.params), params)

    # An encoder-only directory takes the matching subtree of the full tree of shardings.
    enc = md.save_model_dir(tmp_path / "enc", CONFIG, {"bert": params["bert"]})
    loaded = md.load_model_dir(enc, sharding=expected)
    assert sorted(loaded.params) == ["bert"]
    # One sharding for everything also works (e.g. one accelerator).
    single = jax.sharding.SingleDeviceSharding(jax.devices()[3])
    loaded = md.load_model_dir(enc, sharding=single)
    assert all(leaf.sharding == single for leaf in jax.tree.leaves(loaded.params))


def _leftovers(parent):
    return [name for name in os.listdir(parent) if name.startswith(".")]


def test_failed_writes_leave_nothing(tmp_path, params, vocab, monkeypatch):
    bad = jax.tree.map(lambda x: x, params)
    bad["bert"]["encoder"]["layer_1"]["intermediate"]["kernel"] = np.zeros((64, 100), np.float32)
    with pytest.raises(ConversionError, match=r"bert/encoder/layer_1/intermediate/kernel"):
        md.save_model_dir(tmp_path / "a", CONFIG, bad)
    missing = {"bert": dict(params["bert"]), "predictions": params["predictions"]}
    with pytest.raises(ConversionError, match="missing parameter seq_relationship/kernel"):
        md.save_model_dir(tmp_path / "a", CONFIG, missing)
    big_vocab = write_vocab(str(tmp_path / "big.txt"), CONFIG.vocab_size + 10)
    with pytest.raises(md.ModelDirError, match="522 entries but the model's vocab_size is 512"):
        md.save_model_dir(tmp_path / "a", CONFIG, params, big_vocab)

    # A failure after the params are written (here: while saving the tokenizer).
    tokenizer = load_tokenizer(vocab)

    def broken_save(directory):
        raise OSError("disk full")

    monkeypatch.setattr(tokenizer, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        md.save_model_dir(tmp_path / "a", CONFIG, params, tokenizer)
    assert not os.path.exists(tmp_path / "a")
    assert _leftovers(tmp_path) == []


def test_existing_destination_needs_overwrite(tmp_path, params):
    path = md.save_model_dir(tmp_path / "m", CONFIG, {"bert": params["bert"]})
    with pytest.raises(UserError, match="overwrite"):
        md.save_model_dir(path, CONFIG, params)
    md.save_model_dir(path, CONFIG, params, overwrite=True)
    assert md.load_model_dir(path).has_heads
    assert _leftovers(tmp_path) == []


def test_refusals_say_what_was_found(tmp_path, params):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(md.ModelDirError, match="convert --from hf"):
        md.load_model_dir(hf_dir)
    tf1_dir = tmp_path / "tf1"
    tf1_dir.mkdir()
    (tf1_dir / "bert_config.json").write_text("{}")
    with pytest.raises(md.ModelDirError, match="convert --from tf1"):
        md.load_model_dir(tf1_dir)
    with pytest.raises(md.ModelDirError, match="not a bert-jax model directory"):
        md.load_model_dir(tmp_path)
    with pytest.raises(md.ModelDirError, match="not found"):
        md.load_model_dir(tmp_path / "nowhere")

    path = md.save_model_dir(tmp_path / "m", CONFIG, params)
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        original = json.load(f)

    def rewrite(**changes):
        values = json.loads(json.dumps(original))
        for key, value in changes.items():
            if key == "format_version":
                values["bert_jax"]["format_version"] = value
            else:
                values[key] = value
        with open(config_path, "w") as f:
            json.dump(values, f)

    rewrite(format_version=md.FORMAT_VERSION + 1)
    with pytest.raises(md.ModelDirError, match="format version 2"):
        md.load_model_dir(path)
    rewrite(num_hidden_layers=1)  # the stored params hold two layers
    with pytest.raises(md.ModelDirError, match="unexpected parameter bert/encoder/layer_1"):
        md.load_model_dir(path)
    rewrite(intermediate_size=96)
    with pytest.raises(
        md.ModelDirError, match=r"bert/encoder/layer_0/intermediate/bias has shape \(128,\)"
    ):
        md.load_model_dir(path)


def test_a_workdir_without_a_checkpoint_or_export_is_an_error(tmp_path):
    """A pretraining workdir is read from its latest checkpoint until it exports model/ (by the
    commands' loader, in training/); one that has neither says so (the checkpoint read itself is
    tested in test_pretrain). The format's own loader refuses it in one line, saying which
    loader reads it."""
    from bert_jax.training import config_lib
    from bert_jax.training import load_model as commands_loader

    workdir = tmp_path / "run"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "config.json").write_text(
        config_lib.pretraining_config("tiny").to_json_best_effort(), encoding="utf-8"
    )
    assert md.is_unexported_workdir(workdir)
    with pytest.raises(md.ModelDirError, match="has no checkpoint yet and no exported model/"):
        commands_loader.load_model_dir(workdir)
    with pytest.raises(md.ModelDirError, match="pretraining workdir with no exported model/ yet"):
        md.load_model_dir(workdir)
    with pytest.raises(md.ModelDirError, match="training.load_model.load_model_dir"):
        md.read_config(workdir)
