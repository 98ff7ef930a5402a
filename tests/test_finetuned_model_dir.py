"""The fine-tuned model directory (convert/model_dir.py with convert/task_heads.py): its head table
against the modules fine-tuning trains and the classes transformers has, its config.json as
transformers reads it, its checks, the encoder read back from it, and the GLUE sweep keeping the
selected trial's model. (Each head kind written by a real run and predicted from again:
tests/test_predict.py.)"""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import numpy as np
import pytest
import transformers

from bert_jax import cli
from bert_jax.convert import model_dir as model_format
from bert_jax.convert import task_heads
from bert_jax.convert.model_dir import ModelDirError, load_model_dir, save_model_dir
from bert_jax.finetune.runs import finetuned_model, sweep
from bert_jax.finetune.tuning.settings import FinetuneSettings, load_pretrained
from bert_jax.inference import encode, predict
from bert_jax.training import load_model
from tests.glue_fixtures.tiny import GLUE_DIR, fixture_tokenizer, tiny_encoder
from tests.modernbert_fixtures import modernbert_dirs

LABELS = {"classification": ["no", "yes", "maybe"], "tags": ["O", "B-PER", "I-PER"]}


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    """(config, encoder params, tokenizer) of a tiny BERT and a tiny ModernBERT model."""
    config, params = tiny_encoder()
    _, modern_dir, _ = modernbert_dirs(tmp_path_factory.mktemp("modernbert"))
    modern = load_model.load_model_dir(modern_dir, load_tokenizer=True)
    return {
        "bert": (config, params["bert"], fixture_tokenizer()),
        "modernbert": (modern.config, modern.params["model"], modern.tokenizer),
    }


def _trained_tree(config, head: str, labels) -> dict:
    """The params fine-tuning trains for a head kind: its module (the one predict runs)."""
    outputs = task_heads.get(head).num_outputs(labels)
    module = predict._module(config, head, outputs)
    tokens = np.zeros((1, 2, 8) if head == "multiple_choice" else (1, 8), np.int32)
    shapes = jax.eval_shape(
        lambda: module.init(jax.random.key(0), tokens, tokens + 1, tokens, deterministic=True)
    )
    return jax.tree.map(lambda x: x.shape, nn.meta.unbox(shapes["params"]))


@pytest.mark.parametrize("family", ["bert", "modernbert"])
@pytest.mark.parametrize("head", list(task_heads.HEADS))
def test_each_head_kind_is_the_tree_fine_tuning_trains_and_a_transformers_class(
    encoders, family, head
):
    config, _, _ = encoders[family]
    labels = LABELS.get(head, [])
    task = {"name": "t", "head": head, "labels": labels, "max_seq_length": 8}
    expected = jax.tree.map(
        tuple,
        model_format.expected_tree(config, False, task),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    assert expected == _trained_tree(config, head, labels)
    kind = task_heads.get(head)
    assert hasattr(transformers, kind.architecture(family)), kind.architecture(family)
    assert head in predict.INPUTS and head in predict.HEAD_PREDICTIONS


def _random_head(config, task, seed=0) -> dict:
    """A head of the task's shapes with random values (no run needed to test the format)."""
    rng = np.random.default_rng(seed)
    shapes = model_format.expected_tree(config, False, task)[task_heads.HEAD_KEY]
    return jax.tree.map(
        lambda shape: rng.normal(size=shape).astype(np.float32) * 0.1,
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def _save(encoders, family, head, path, labels=None, **task):
    config, encoder, tokenizer = encoders[family]
    labels = LABELS.get(head, []) if labels is None else labels
    entry = {"name": "t", "head": head, "labels": labels, "max_seq_length": 16, **task}
    params = {"bert": encoder, "classifier": _random_head(config, entry)}
    return save_model_dir(path, config, params, tokenizer, task=entry)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_config_json_is_what_transformers_reads(encoders, family, tmp_path):
    _save(encoders, family, "classification", tmp_path / "cls")
    _save(encoders, family, "regression", tmp_path / "reg")
    for name, head, problem, labels in (
        ("cls", "classification", "single_label_classification", LABELS["classification"]),
        ("reg", "regression", "regression", ["LABEL_0"]),
    ):
        values = json.loads((tmp_path / name / "config.json").read_text())
        assert values["bert_jax"]["task"]["head"] == head
        assert values["bert_jax"]["has_pretraining_heads"] is False
        read = transformers.AutoConfig.from_pretrained(tmp_path / name)
        assert read.architectures == [task_heads.get(head).architecture(family)]
        assert read.problem_type == problem and read.num_labels == len(labels)
        assert read.id2label == dict(enumerate(labels))  # transformers' keys are ints again
        assert read.label2id == {label: i for i, label in enumerate(labels)}
    loaded = load_model_dir(tmp_path / "cls")
    assert loaded.task["labels"] == LABELS["classification"] and loaded.encoder_key == "bert"


def test_params_that_do_not_fit_the_head_are_refused_naming_them(encoders, tmp_path):
    config, encoder, tokenizer = encoders["bert"]
    task = {"name": "t", "head": "tags", "labels": LABELS["tags"], "max_seq_length": 16}
    head = _random_head(config, {**task, "labels": ["O", "B-PER"]})  # two tags, not three
    with pytest.raises(ModelDirError, match=r"classifier/output/kernel has shape \(64, 2\)"):
        save_model_dir(tmp_path / "m", config, {"bert": encoder, "classifier": head}, task=task)
    with pytest.raises(ModelDirError, match="head 'spans' is not one of classification"):
        save_model_dir(tmp_path / "m", config, {"bert": encoder}, task={**task, "head": "spans"})
    assert not (tmp_path / "m").exists()


def test_a_damaged_task_entry_is_one_line(encoders, tmp_path, capsys):
    path = _save(encoders, "bert", "classification", tmp_path / "m")
    values = json.loads((tmp_path / "m" / "config.json").read_text())
    values["bert_jax"]["task"]["labels"] = "yes,no"
    (tmp_path / "m" / "config.json").write_text(json.dumps(values))
    with pytest.raises(ModelDirError, match="labels 'yes,no' is not a list of names"):
        load_model_dir(path)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "hello"}\n')
    assert cli.main(["predict", "--model", path, "--input", str(rows)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the fine-tuned task entry is damaged" in err


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_fine_tuned_directory_still_reads_as_an_encoder(encoders, family, tmp_path, capsys):
    """finetune --model and encode take a fine-tuned model's encoder; fill-mask refuses it (it
    has no masked-LM head) in one line."""
    config, encoder, _ = encoders[family]
    path = _save(encoders, family, "span", tmp_path / "m")
    deferred = load_model_dir(path, defer_params=True)  # the tree checked, nothing read yet
    assert deferred.params is None and deferred.has_unread_params
    loaded = load_pretrained(path)  # reads its params when first used
    assert "unread params" in repr(loaded.params)
    loaded.read_params()
    assert "unread params" not in repr(loaded.params)
    assert jax.tree.map(np.shape, loaded.bert_params) == jax.tree.map(np.shape, encoder)
    assert jax.tree.map(np.shape, deferred.encoder_params) == jax.tree.map(np.shape, encoder)
    assert not deferred.has_unread_params
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(loaded.bert_params), jax.tree.leaves(encoder), strict=True)
    )
    features = encode.encode_texts(load_model_dir(path), ["the door is open"], pool="cls")
    assert features.features.shape == (1, config.hidden_size)
    texts = tmp_path / "texts.txt"
    texts.write_text("the door is [MASK].\n")
    assert cli.main(["fill-mask", "--model", path, "--input", str(texts)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_keep_models_and_prune(tmp_path, encoders):
    selected, every, none = (FinetuneSettings(keep_models=k) for k in ("selected", "all", "none"))
    assert finetuned_model.keeps(selected, True) and not finetuned_model.keeps(selected, False)
    assert finetuned_model.keeps(every, False) and not finetuned_model.keeps(none, True)
    kept = _save(encoders, "bert", "classification", tmp_path / "a" / "model")
    _save(encoders, "bert", "classification", tmp_path / "b" / "model")
    (tmp_path / "c" / "model").mkdir(parents=True)  # not bert-jax's: left alone
    directories = [str(tmp_path / name) for name in "abc"]
    assert finetuned_model.prune(directories, str(tmp_path / "a")) == [
        str(tmp_path / "b" / "model")
    ]
    assert load_model_dir(kept).task is not None and (tmp_path / "c" / "model").is_dir()
    # A run that keeps no model removes the one an earlier run left in its directory.
    assert finetuned_model.keep(str(tmp_path / "a"), none, True, None, None, {}) is None
    assert not (tmp_path / "a" / "model").exists()


@pytest.mark.slow
def test_the_sweep_keeps_the_selected_trials_model_only(tmp_path, capsys):
    config, params = tiny_encoder()
    model = save_model_dir(tmp_path / "tiny", config, params, fixture_tokenizer())
    workdir = tmp_path / "glue"
    argv = ["glue", "--model", model, "--data", GLUE_DIR, "--workdir", str(workdir)]
    argv += ["--tasks", "SST-2", "--learning-rates", "1e-3", "1e-5"]
    argv += ["--epochs", "1", "--batch-size", "8", "--eval-batch-size", "8"]
    assert cli.main([*argv, "--max-seq-length", "32", "--no-predict-test"]) == 0
    out = capsys.readouterr().out
    results = json.loads((workdir / "results.json").read_text())
    chosen = results["tasks"]["SST-2"]["selected"]["trial"]
    kept = sorted(p.parent.relative_to(workdir) for p in workdir.glob("trials/*/*/model"))
    assert [str(k) for k in kept] == [f"trials/{chosen}"]
    assert f"SST-2: the selected trial's model is {workdir}/trials/{chosen}/model" in out
    loaded = load_model_dir(workdir / "trials" / chosen / "model")
    assert loaded.task["name"] == "SST-2" and loaded.task["settings"]["learning_rate"] in (
        1e-3,
        1e-5,
    )
    assert loaded.task["pair"] is False
    # Run again: every trial is reused, the selected trial's model named.
    settings = FinetuneSettings(epochs=1, batch_size=8, eval_batch_size=8, max_seq_length=32)
    outcome = sweep.run_sweep(
        model, GLUE_DIR, str(workdir), ["SST-2"], (1e-3, 1e-5), (0,), settings, predict_test=False
    )
    assert outcome.ran == []
    assert outcome.models == {"SST-2": str(workdir / "trials" / chosen / "model")}
