"""NSP figures beside their majority baseline (issue 73): a model whose NSP head predicts one
class scores the share of that label, which must not read as learning. The baseline (the
majority label's share in the evaluated instances, counted here from the records themselves) and
the one-class flag are in `bert-jax eval`'s lines and JSON, the pretraining run's eval line,
metrics.jsonl, the plot and the run's final line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.convert import model_dir
from bert_jax.data import layout
from bert_jax.data.records import tfrecord as records_lib
from bert_jax.training import heldout_eval, metric_writers, model_eval, plots, pretrain
from tests.convert_fixtures import random_params
from tests.data_fixtures import SPM_VOCAB_SIZE, embedded_spm, embedded_spm_dir
from tests.helpers import ONE_LAYER_MODEL, pretraining_config, tiny_config


def _prepare(output: str) -> None:
    argv = ["data", "prepare", "--input", "embedded:eval", "--tokenizer", embedded_spm_dir()]
    argv += ["--output", output, "--max-seq-length", "32", "--max-predictions-per-seq", "5"]
    assert cli.main([*argv, "--dupe-factor", "1"]) == 0


def _majority_share(records: str) -> float:
    """The share of the majority next-sentence label in `records`, read with TensorFlow."""
    tf = records_lib.import_tensorflow()
    labels = []
    for serialized in tf.data.TFRecordDataset(records_lib.list_record_files([records])):
        feature = tf.train.Example.FromString(serialized.numpy()).features.feature
        labels.append(feature["next_sentence_labels"].int64_list.value[0])
    counts = np.bincount(np.asarray(labels), minlength=2)
    return float(counts.max() / counts.sum())


@pytest.fixture(scope="module")
def one_class(tmp_path_factory):
    """Records at length 32 (with held-out records) and a model whose NSP head says "random
    next" whatever it reads (kernel 0, bias [-30, 30])."""
    root = tmp_path_factory.mktemp("nsp_baseline")
    records = str(root / "records")
    _prepare(records)
    if not os.path.isdir(layout.heldout_dir(records)):  # too few documents to hold some out
        _prepare(layout.heldout_dir(records))
    config = tiny_config(
        vocab_size=SPM_VOCAB_SIZE,
        **{key.split(".")[1]: value for key, value in ONE_LAYER_MODEL.items()},
    )
    params = random_params(config)
    params["seq_relationship"]["kernel"][:] = 0.0
    params["seq_relationship"]["bias"][:] = [-30.0, 30.0]
    model = model_dir.save_model_dir(root / "model", config, params, embedded_spm())
    return {"root": root, "records": records, "model": str(model)}


def test_the_figures_are_the_label_and_prediction_shares():
    labels = np.array([1, 1, 0, 1, 0, 1, 1, 1])
    weights = np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float64)  # the last row counts nothing
    predicted = np.array([1, 1, 1, 1, 1, 1, 1, 0])
    sums = {
        "nsp_weight": weights.sum(),
        "nsp_random_next_label_sum": (weights * (labels == 1)).sum(),
        "nsp_random_next_predicted_sum": (weights * (predicted == 1)).sum(),
    }
    figures = heldout_eval.nsp_figures(sums)
    assert figures["nsp_baseline_accuracy"] == pytest.approx(5 / 7)
    assert figures["nsp_baseline_class"] == "random next"
    assert figures["nsp_one_class"]  # 7 of the 7 weighted rows
    predicted[0] = 0
    sums["nsp_random_next_predicted_sum"] = (weights * (predicted == 1)).sum()
    assert not heldout_eval.nsp_figures(sums)["nsp_one_class"]  # 6 of 7: not one class


def test_eval_says_the_baseline_and_the_flag(one_class, capsys):
    expected = f"{_majority_share(one_class['records']):.4f}"
    argv = ["eval", "--model", one_class["model"], "--data", one_class["records"], "--json"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert f"{result['nsp_baseline_accuracy']:.4f}" == expected
    assert result["nsp_one_class"] is True and result["nsp_predicted_random_next"] == 1.0
    # What `bert-jax eval` prints without --json (one compile in this test, not two).
    nsp = [line for line in model_eval.summary_lines(result) if line.startswith("nsp_")]
    assert nsp[0] == f"nsp_accuracy: {expected}"  # the label's share: no learning
    assert nsp[1].startswith(f"nsp_baseline_accuracy: {expected} (always ")
    assert nsp[2].startswith('nsp_one_class: yes (ONE CLASS: the model predicts "random next" ')


def test_pretraining_says_them_in_its_eval_line_metrics_plot_and_final_line(one_class, capsys):
    config = pretraining_config(
        2,
        **{
            "data.source": one_class["records"],
            "init_from": one_class["model"],
            "optimizer.learning_rate": 0.0,  # the head stays one class
            "phase1.fraction": 1.0,
            "phase2.fraction": 0.0,
            **ONE_LAYER_MODEL,
            "eval.every_steps": 2,
            "eval.batches": 2,
            "eval.batch_size": 8,
            "checkpoint.every_steps": 2,
            "export_model": False,
        },
    )
    workdir = str(one_class["root"] / "run")
    result = pretrain.pretrain(config, workdir)
    out = capsys.readouterr().out
    (row,) = metric_writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"), "eval")
    share = row["nsp_baseline_accuracy"]
    assert row["nsp_one_class"] is True and row["nsp_accuracy"] == pytest.approx(share)
    # The share of the majority label in the 16 evaluated instances (2 batches of 8).
    assert share >= 0.5 and share * 16 == pytest.approx(round(share * 16))
    words = f'NSP accuracy {share:.4f} (majority baseline {share:.4f}: always "'
    (eval_line,) = [line for line in out.splitlines() if line.startswith("eval step 2:")]
    (final_line,) = [line for line in out.splitlines() if line.startswith("final eval:")]
    for line in (eval_line, final_line):
        assert words in line and '; ONE CLASS: the model predicts "random next" for 100%' in line
    assert result.last_eval["nsp_one_class"]
    train = metric_writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"), "train")
    figure = plots.draw(train, [row], "run")
    labels = figure.axes[2].get_legend_handles_labels()[1]
    assert {"majority label (held-out)", "predicts one class"} <= set(labels)
    assert "chance" not in labels
    assert os.path.isfile(os.path.join(workdir, plots.PLOT_NAME))
