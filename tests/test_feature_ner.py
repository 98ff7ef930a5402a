"""The feature-based NER tagger (Table 7): each variant's layers against `encode`'s features, no
gradient reaching BERT, and the BiLSTM learning a synthetic tagging task through the command."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import cli
from bert_jax.convert.model_dir import ModelDir, save_model_dir
from bert_jax.core import partitioning, trainer
from bert_jax.core.model import BertForPreTraining
from bert_jax.finetune.heads import lstm_tagger as feature_tagger
from bert_jax.finetune.runs import conll_features as feature_ner
from bert_jax.finetune.tasks import conll as ner
from bert_jax.finetune.tuning.settings import PretrainedEncoder
from bert_jax.inference import encode
from tests.glue_fixtures.tiny import VOCAB_SIZE, fixture_tokenizer
from tests.helpers import random_params, tiny_config
from tests.test_ner import _synthetic_conll

LENGTH = 16


@pytest.fixture(scope="module")
def four_layer():
    """A random 4-layer tiny encoder (BERT's init scale; no init program compiled: the init is
    not what these tests test)."""
    config = tiny_config(vocab_size=VOCAB_SIZE, num_hidden_layers=4)
    inputs = trainer.model_inputs(trainer.dummy_batch(1, 8, 2))
    params = random_params(BertForPreTraining(config), **inputs)["params"]
    return PretrainedEncoder(config, params["bert"], fixture_tokenizer(), "tiny-4-layers")


def _words(tokenizer):
    return [t for t in tokenizer.vocab[120:] if t.isalpha() and len(t) > 3][:40]


def test_each_variant_selects_the_layers_encode_gives(four_layer):
    words = _words(four_layer.tokenizer)
    sentences = [
        ner.Sentence(tuple(words[i : i + n]), ("O",) * n, 0) for i, n in ((0, 5), (7, 3), (12, 9))
    ]
    windows = ner.build_features(sentences, four_layer.tokenizer, ("O",), LENGTH)
    arrays = feature_tagger.word_arrays(windows, LENGTH)
    model = ModelDir(
        path="tiny",
        config=four_layer.config,
        params={"bert": four_layer.bert_params},
        has_heads=False,
        info={},
        _tokenizer=four_layer.tokenizer,
    )
    texts = [" ".join(s.words) for s in sentences]
    layers_all = ",".join(str(i) for i in range(5))
    encoded = encode.encode_texts(model, texts, pool="none", layers=layers_all, max_seq_length=16)
    hidden = four_layer.config.hidden_size
    by_layer = encoded.features.reshape(len(texts), -1, 5, hidden)  # [N, L, 5, D]
    counts = arrays["word_counts"]
    assert counts.tolist() == [5, 3, 9]
    want_layers = {
        "embeddings": (0,),
        "second_to_last": (3,),
        "last": (4,),
        "sum_last_four": (1, 2, 3, 4),
        "concat_last_four": (1, 2, 3, 4),
        "sum_all": (1, 2, 3, 4),
    }
    config = four_layer.config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    # Compiled, once per set of layers (eagerly, each 4-layer forward goes op by op).
    word_features = jax.jit(feature_tagger.word_features, static_argnames=("config", "layers"))
    for variant in feature_tagger.VARIANTS:
        mode, layers = feature_tagger.variant_layers(variant, 4)
        assert layers == want_layers[variant], variant
        picked = word_features(four_layer.bert_params, arrays, config=config, layers=layers)
        mix = feature_tagger.LayerMix(mode)
        weights = np.linspace(0.1, 0.4, len(layers)).astype(np.float32)
        params = (
            {"layer_weights": jnp.log(weights / weights.sum()), "scale": jnp.float32(2.0)}
            if mode == "sum"
            else {}
        )
        mixed = np.asarray(mix.apply({"params": params}, picked))
        for row, count in enumerate(counts):
            positions = arrays["word_positions"][row, :count]
            reference = by_layer[row, positions][:, list(layers)]  # [words, K, D]
            if mode == "pick":
                reference = reference[:, 0]
            elif mode == "concat":
                reference = reference.reshape(count, -1)
            else:
                reference = 2.0 * np.einsum("k,wkd->wd", weights / weights.sum(), reference)
            np.testing.assert_allclose(mixed[row, :count], reference, atol=2e-5, err_msg=variant)
    # Frozen: no gradient reaches the encoder's parameters.
    grads = jax.jit(
        jax.grad(
            lambda p: jnp.sum(feature_tagger.word_features(p, arrays, config=config, layers=(4,)))
        )
    )(four_layer.bert_params)
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(grads))
    with pytest.raises(ValueError, match="not one of"):
        feature_tagger.check_variant("middle")


@pytest.mark.slow
def test_bilstm_tagger_learns_synthetic_conll_through_the_command(four_layer, tmp_path, capsys):
    data = tmp_path / "conll"
    data.mkdir()
    words = _words(four_layer.tokenizer)
    for name, count, seed in (("train.txt", 128, 1), ("valid.txt", 32, 2), ("test.txt", 32, 3)):
        _synthetic_conll(data / name, count, seed, words)
    model = save_model_dir(
        tmp_path / "model",
        four_layer.config,
        {"bert": four_layer.bert_params},
        four_layer.tokenizer,
    )
    workdir = tmp_path / "run"
    argv = ["finetune", "--task", "conll2003", "--features", "sum_all", "--lstm-size", "32"]
    argv += ["--model", model, "--data", str(data), "--workdir", str(workdir)]
    argv += ["--max-seq-length", str(LENGTH), "--batch-size", "16", "--epochs", "5"]
    argv += ["--learning-rate", "2e-2", "--dropout", "0"]  # on every (8) device: batch 2 each
    assert cli.main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    result = json.loads((workdir / "result.json").read_text())
    print(
        f"feature-based (sum_all) synthetic CoNLL dev F1 {result['dev_metrics']['f1']:.1f} "
        f"test F1 {result['test_metrics']['f1']:.1f}, {result['num_train_steps']} steps"
    )
    assert result["dev_metrics"]["f1"] > 90 and result["test_metrics"]["f1"] > 90
    assert result["features"] == "sum_all" and result["settings"]["mesh_shape"] == [-1, 1, 1]
    assert result["layers"] == [1, 2, 3, 4] and len(result["layer_weights"]) == 4
    assert (workdir / "dev_predictions.txt").exists() and (
        workdir / "test_predictions.txt"
    ).exists()
    assert (
        "the paper's BERT-Base dev F1 for this variant 95.5" in (workdir / "results.md").read_text()
    )
    assert (workdir / "plots" / "conll2003.png").stat().st_size > 1000
    # Only the tagger is trained: its state (params and Adam slots) holds no encoder parameter.
    mesh = partitioning.make_mesh((-1, 1, 1))
    settings = feature_ner.task_settings({})
    tuner = feature_ner.FeatureTuner(four_layer.config, "sum_all", 4, 8, mesh, settings)
    lstms = {f"lstm_{i}_{way}" for i in (0, 1) for way in ("forward", "backward")}
    assert set(tuner.state_shapes.params) == {"mix", "output", *lstms}
    state_size = sum(x.size for x in jax.tree.leaves(tuner.state_shapes))
    bert_size = sum(np.size(x) for x in jax.tree.leaves(four_layer.bert_params))
    assert state_size < bert_size


def test_the_command_refuses_an_unknown_variant_or_a_task_without_features(tmp_path, capsys):
    argv = ["finetune", "--model", "unused", "--data", str(tmp_path), "--workdir", str(tmp_path)]
    assert cli.main([*argv, "--task", "conll2003", "--features", "middle"]) == 2
    assert "--features 'middle' is not one of embeddings" in capsys.readouterr().err
    assert cli.main([*argv, "--task", "glue/MRPC", "--features", "last"]) == 2
    assert "not for glue/MRPC" in capsys.readouterr().err
