"""Fine-tuning a ModernBERT model through the task registry: `bert-jax finetune --task glue/RTE`
from a converted model directory; the classifier head (heads/modernbert_pooled.py) trained step
for step as transformers' ModernBertForSequenceClassification under the Trainer's recipe
(`optimizer="adamw-hf"`, dropout off), with CLS and with mean pooling; `bert-jax glue` on two
tasks; SWAG's head step for step as transformers' ModernBertForMultipleChoice, and a SWAG run; a
task without a ModernBERT head refused in one line."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import cli
from bert_jax.convert import hf_modernbert, modernbert_names
from bert_jax.finetune.heads.modernbert_pooled import with_dropout
from bert_jax.finetune.runs import multiple_choice as swag_task
from bert_jax.finetune.runs import one_task
from bert_jax.finetune.tasks import registry, swag
from bert_jax.finetune.tuning import batches as features
from bert_jax.finetune.tuning import sentence_tuning as loop
from bert_jax.finetune.tuning import token_tuning, tuning_loop
from bert_jax.finetune.tuning.settings import PretrainedEncoder
from bert_jax.training.load_model import load_model_dir
from tests.glue_fixtures.tiny import GLUE_DIR
from tests.modernbert_fixtures import CONFIG, TEXT, modernbert_dirs
from tests.test_finetune_parity import (
    NUM_EXAMPLES,
    PARAM_ATOL,
    SETTINGS,
    one_device_mesh,
    token_rows,
    train_ours,
    train_reference,
)
from tests.test_finetune_sweep import SMALL_FLAGS
from tests.test_predict import check_predictions
from tests.test_swag import _synthetic_swag

LOSS_RTOL = 1e-5


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return modernbert_dirs(tmp_path_factory.mktemp("modernbert_finetune"))


@pytest.fixture(scope="module")
def two_layer_dirs(tmp_path_factory):
    """A model of `dirs`'s shape with two layers (a global one and a sliding-window one) for the
    step-for-step tests and the run beside them: each compiles its steps, and a third layer adds
    compile time but no other kind of layer."""
    config = CONFIG.replace(num_hidden_layers=2)
    assert config.layer_types == ("full_attention", "sliding_attention")
    return modernbert_dirs(tmp_path_factory.mktemp("modernbert_finetune_2"), config)


def test_a_glue_task_fine_tunes_from_a_modernbert_model(dirs, tmp_path, capsys):
    _, ours, _ = dirs
    argv = ["finetune", "--model", str(ours), "--task", "glue/RTE", "--data", GLUE_DIR]
    argv += ["--workdir", str(tmp_path / "rte"), "--epochs", "2", "--batch-size", "8"]
    argv += ["--eval-batch-size", "8", "--max-seq-length", "32", "--learning-rate", "1e-3"]
    assert cli.main(argv) == 0
    result = json.loads((tmp_path / "rte" / "result.json").read_text())
    assert result["model"] == str(ours) and result["num_train_steps"] > 0
    assert np.isfinite(result["train_loss"]) and "RTE" in result["dev_metrics"]
    # Its model (rte/model/): predict gives the run's predictions again.
    assert check_predictions(tmp_path / "rte", GLUE_DIR, tmp_path / "predicted") == "classification"
    assert cli.main(argv) == 0  # the finished run is found again, with the same model
    assert "reused" in capsys.readouterr().out


def test_the_glue_sweep_runs_a_modernbert_model(dirs, tmp_path, capsys):
    _, ours, _ = dirs
    workdir = tmp_path / "glue"
    argv = ["glue", "--model", str(ours), "--data", GLUE_DIR, "--workdir", str(workdir)]
    argv += ["--tasks", "RTE", "MRPC", "--learning-rates", "1e-3", *SMALL_FLAGS]
    assert cli.main(argv) == 0
    assert "2 trials run, 0 finished earlier" in capsys.readouterr().out
    results = json.loads((workdir / "results.json").read_text())
    assert results["protocol"]["model"] == str(ours) and set(results["tasks"]) == {"RTE", "MRPC"}
    assert all(np.isfinite(t["selected"]["selection_score"]) for t in results["tasks"].values())
    table = (workdir / "results.md").read_text()
    assert (
        f"# GLUE results: {ours} (ModernBERT 3/32/2)" in table
        and "| Ours (dev, selected trial) |" in table
    )
    # The paper's BERT rows stand beside ours as a reference; no other line names BERT.
    assert all("(paper, test)" in line for line in table.splitlines() if "BERT-" in line)


def test_a_task_without_a_modernbert_head_refuses_the_model_in_one_line(
    two_layer_dirs, tmp_path, capsys
):
    _, ours, _ = two_layer_dirs
    argv = ["finetune", "--model", str(ours), "--task", "conll2003", "--features", "last"]
    argv += ["--data", str(tmp_path), "--workdir", str(tmp_path / "ner")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--model {ours} is a ModernBERT model: it fine-tunes on the GLUE tasks, " in err
    assert "swag" in err and "conll2003 --features fine-tunes BERT models only" in err


def _hf_named(params: dict, config) -> dict[str, np.ndarray]:
    """Our classification params under transformers' ModernBertForSequenceClassification names."""
    named = modernbert_names.state_dict_from({"model": params["bert"]}, config)
    named = {f"model.{key}": value for key, value in named.items()}
    head = params["classifier"]
    named["head.dense.weight"] = np.asarray(head["head"]["dense"]["kernel"]).T
    named["head.dense.bias"] = np.asarray(head["head"]["dense"]["bias"])
    named["head.norm.weight"] = np.asarray(head["head"]["norm"]["scale"])
    named["head.norm.bias"] = np.asarray(head["head"]["norm"]["bias"])
    named["classifier.weight"] = np.asarray(head["output"]["kernel"]).T
    named["classifier.bias"] = np.asarray(head["output"]["bias"])
    return named


def _modernbert_rows(rng: np.random.Generator, shape: tuple[int, ...], vocab: int) -> dict:
    """`token_rows` with ModernBERT's [CLS] 1, [SEP] 2 and [PAD] 3 where BERT's are 2, 3 and 0."""
    rows = token_rows(rng, shape, vocab)
    ids = rows["input_ids"]
    rows["input_ids"] = np.where(rows["input_mask"] == 1, np.where(ids <= 3, ids - 1, ids), 3)
    return rows


def _inputs(batch: dict, labels_dtype) -> dict:
    mask = batch["input_mask"].astype(np.int64)
    return {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": mask} | {
        "labels": batch["labels"].astype(labels_dtype)
    }


def _steps_equal(name, tuner, encoder, rows_batch, reference_class, to_inputs, ignore=(), **hf):
    """20 steps of ours (`run_steps`) and of `reference_class` (transformers, the same starting
    weights, the Trainer's recipe) on the same batches: the losses and final params agree."""
    config = tuner.model.config
    recorder, before, after = train_ours(tuner, rows_batch, encoder)

    values = hf_modernbert.hf_config_from(config, with_heads=True)
    hf_config = transformers.ModernBertConfig(**values, **hf, attn_implementation="eager")
    reference = reference_class(hf_config)
    state_dict = {k: torch.from_numpy(np.array(v)) for k, v in _hf_named(before, config).items()}
    reference.load_state_dict(state_dict, strict=True)
    ref_losses = train_reference(reference, recorder.batches, to_inputs)
    ours_losses = np.asarray(jax.device_get(recorder.losses), np.float64)
    relative = np.abs(ours_losses - ref_losses) / np.abs(ref_losses)
    absolute = np.abs(ours_losses - ref_losses)
    ref_state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    ours_after, start = _hf_named(after, config), _hf_named(before, config)
    compared = [k for k in ours_after if k not in ignore]
    param_diff = max(float(np.abs(ours_after[k] - ref_state[k]).max()) for k in compared)
    moved = max(float(np.abs(ours_after[k] - start[k]).max()) for k in compared)
    print(
        f"ModernBERT {name}: {len(relative)} steps, loss max relative diff "
        f"{relative.max():.2e} (abs {absolute.max():.2e}); params max abs diff "
        f"{param_diff:.2e} (moved {moved:.2e})"
    )
    assert moved > 100 * PARAM_ATOL
    # Relative, but absolute under a loss of 1: the last step's single row can score an MSE near
    # 0.01, where float32 rounding alone is 1e-5 of it.
    scale = np.maximum(np.abs(np.asarray(ref_losses)), 1.0)
    assert np.max(np.abs(ours_losses - ref_losses) / scale) < LOSS_RTOL
    assert param_diff < PARAM_ATOL


@pytest.mark.parametrize(
    ("num_labels", "pooling"),
    [(3, "cls"), (1, "mean")],
    ids=["classification-cls", "regression-mean"],
)
def test_steps_equal_transformers_sequence_classification(two_layer_dirs, num_labels, pooling):
    _, ours, _ = two_layer_dirs
    loaded = load_model_dir(ours)
    encoder = PretrainedEncoder(
        loaded.config.replace(classifier_pooling=pooling),
        loaded.params["model"],
        loaded.tokenizer,
    )
    config = tuning_loop.run_config(encoder, SETTINGS, one_device_mesh())
    assert config == with_dropout(encoder.config, 0.0).replace(dropout_impl=SETTINGS.dropout_impl)
    rng = np.random.default_rng(num_labels)
    rows = _modernbert_rows(rng, (NUM_EXAMPLES,), config.vocab_size)
    if num_labels == 1:
        labels = rng.uniform(-1, 1, NUM_EXAMPLES).astype(np.float32)
    else:
        labels = rng.integers(0, num_labels, NUM_EXAMPLES).astype(np.int32)
    split = features.EncodedSplit("train", tuple(map(str, range(NUM_EXAMPLES))), rows, labels)
    tuner = loop.fine_tuner(config, num_labels, one_device_mesh(), SETTINGS)
    _steps_equal(
        pooling,
        tuner,
        encoder,
        lambda r: features.gather_batch(split, r),
        transformers.ModernBertForSequenceClassification,
        lambda batch: _inputs(batch, np.float32 if num_labels == 1 else np.int64),
        num_labels=num_labels,
    )


def test_swag_steps_equal_transformers_multiple_choice(two_layer_dirs):
    _, ours, _ = two_layer_dirs
    encoder = PretrainedEncoder.from_model_dir(load_model_dir(ours))  # the one loader
    config = tuning_loop.run_config(encoder, SETTINGS, one_device_mesh())
    rng = np.random.default_rng(4)
    arrays = _modernbert_rows(rng, (NUM_EXAMPLES, swag.NUM_CHOICES), config.vocab_size)
    arrays["labels"] = rng.integers(0, swag.NUM_CHOICES, NUM_EXAMPLES).astype(np.int32)
    tuner = swag_task.choice_tuner(config, one_device_mesh(), SETTINGS)
    _steps_equal(
        "multiple choice",
        tuner,
        encoder,
        lambda r: token_tuning.gather_rows(arrays, r),
        transformers.ModernBertForMultipleChoice,
        lambda batch: _inputs(batch, np.int64),
        # The classifier's bias, and the head norm's bias through the classifier's one vector,
        # shift every choice alike: no gradient in a softmax over the choices, but for rounding
        # noise, which Adam scales to steps of +-lr on either side.
        ignore=("classifier.bias", "head.norm.bias"),
    )


def test_swag_fine_tunes_from_a_modernbert_model(two_layer_dirs, tmp_path):
    """`finetune --task swag` takes a ModernBERT model; the run, on one device with the parity
    test's step settings (its compiled step reused), reads the model directory as a user's."""
    _, ours, _ = two_layer_dirs
    one_task.check_family(str(ours), registry.get("swag"))  # not refused
    data = tmp_path / "swag"
    data.mkdir()
    words = sorted({w.strip(".,;") for line in TEXT for w in line.split() if len(w) > 3})
    _synthetic_swag(data / "train.csv", 8, 1, words)
    _synthetic_swag(data / "val.csv", 4, 2, words)
    settings = dataclasses.replace(SETTINGS, epochs=1.0, learning_rate=1e-3)
    workdir = tmp_path / "run"
    result = swag_task.run_swag(
        str(ours), str(data), str(workdir), settings, mesh=one_device_mesh()
    )
    assert result["model"] == str(ours) and result["num_train_steps"] == 2
    assert np.isfinite(result["train_loss"]) and 0 <= result["dev_metrics"]["accuracy"] <= 100
    assert json.loads((workdir / "result.json").read_text())["dev_metrics"] == result["dev_metrics"]
    report = (workdir / "results.md").read_text()
    assert all("(paper, dev)" in line for line in report.splitlines() if "BERT-" in line)
    assert check_predictions(workdir, data, tmp_path / "predicted") == "multiple_choice"
