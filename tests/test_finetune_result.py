"""One fine-tuning result type for every task (`tuning.result.FinetuneResult`) and the metric each
registered task is selected by: result.json files written before still read back (with their
selection score), every registered task names a metric its own evaluation returns, with a
direction, and the sweep's selection and the curve read it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from bert_jax.finetune.runs import multiple_choice, one_task, sweep
from bert_jax.finetune.tasks import conll, glue, glue_metrics, registry, squad_answers
from bert_jax.finetune.tasks.task import CHOICES, FAMILIES, FROZEN_TAGS, SENTENCE, SPANS, TAGS
from bert_jax.finetune.tuning.result import FinetuneResult, result_task
from bert_jax.finetune.tuning.settings import FinetuneSettings
from bert_jax.finetune.tuning.tuning_loop import Trained

# What `bert-jax finetune --task RTE` wrote to result.json before FinetuneResult.
GLUE_RTE = (
    '{"data":"/data/rte","dev_baseline":{"RTE":{"metrics":{"accuracy":66.66666666666666},"pre'
    'diction":"not_entailment"}},"dev_metrics":{"RTE":{"accuracy":33.33333333333333}},"finish'
    'ed_at":"2026-12-06T10:04:56+00:00","history":[{"dev":{"RTE":{"accuracy":33.3333333333333'
    '3}},"epoch":1.0,"step":1}],"learning_rate":2e-05,"model":"tiny-random","num_train_exampl'
    'es":6,"num_train_steps":1,"prediction_summary":{"dev":{"RTE":{"counts":{"entailment":3,"'
    'not_entailment":0},"single":"entailment"}},"test":{"test":{"counts":{"entailment":2,"not'
    '_entailment":0},"single":"entailment"}}},"run_id":"20261206-100431-23352f","seconds":25.'
    '05616331100464,"seed":0,"selection_score":33.33333333333333,"settings":{"adam_bias_corre'
    'ction":true,"adam_epsilon":1e-08,"batch_size":8,"clip_norm":1.0,"decay_from":"warmup-end'
    '","dropout":0.1,"dropout_impl":"hash","epochs":1,"eval_batch_size":8,"eval_every_epoch":'
    'false,"group_by_length":false,"keep_models":"none","learning_rate":2e-05,"log_every":100'
    ',"max_seq_length":32,"mesh_shape":[-1,1,1],"optimizer":"bert","pad_to_max_length":false,'
    '"seed":0,"warmup_proportion":0.1,"weight_decay":0.01},"skipped_steps":0,"task":"RTE","te'
    'st_files":["RTE.tsv"],"train_loss":0.6912233829498291,"trial":"RTE/lr=2e-05_seed=0"}'
)

# What `bert-jax finetune --task conll2003` wrote to result.json before FinetuneResult.
CONLL = (
    '{"data":"/data/conllrun","dev_metrics":{"accuracy":30.0,"f1":10.256410256410255,"per_typ'
    'e":{"LOC":{"f1":13.333333333333334,"precision":16.666666666666664,"recall":11.1111111111'
    '1111},"PER":{"f1":8.333333333333332,"precision":6.25,"recall":12.5}},"precision":9.09090'
    '9090909092,"recall":11.76470588235294},"finished_at":"2026-12-06T10:05:27+00:00","histor'
    'y":[{"dev":{"accuracy":30.0,"f1":10.256410256410255,"per_type":{"LOC":{"f1":13.333333333'
    '333334,"precision":16.666666666666664,"recall":11.11111111111111},"PER":{"f1":8.33333333'
    '3333332,"precision":6.25,"recall":12.5}},"precision":9.090909090909092,"recall":11.76470'
    '588235294},"epoch":1.0,"step":2}],"iob1":true,"labels":["O","B-LOC","B-PER","I-PER"],"mo'
    'del":"tiny-random","num_train_examples":16,"num_train_features":16,"num_train_steps":2,"'
    'options":{"dev_data":null,"doc_stride":128,"document_context":false,"max_answer_length":'
    '30,"max_query_length":64,"n_best_size":20,"null_score_diff_threshold":0.0},"seconds":30.'
    '785951852798462,"settings":{"adam_bias_correction":true,"adam_epsilon":1e-08,"batch_size'
    '":8,"clip_norm":1.0,"decay_from":"warmup-end","dropout":0.1,"dropout_impl":"hash","epoch'
    's":1,"eval_batch_size":8,"eval_every_epoch":false,"group_by_length":false,"keep_models":'
    '"none","learning_rate":5e-05,"log_every":100,"max_seq_length":16,"mesh_shape":[-1,1,1],"'
    'optimizer":"bert","pad_to_max_length":false,"seed":0,"warmup_proportion":0.1,"weight_dec'
    'ay":0.01},"skipped_steps":0,"task":"conll2003","test_metrics":{"accuracy":34.0,"f1":5.0,'
    '"per_type":{"LOC":{"f1":0.0,"precision":0.0,"recall":0.0},"PER":{"f1":6.896551724137931,'
    '"precision":4.761904761904762,"recall":12.5}},"precision":4.3478260869565215,"recall":5.'
    '88235294117647},"train_loss":1.3731530881395526}'
)

# What `bert-jax finetune --task swag` wrote to result.json before FinetuneResult.
SWAG = (
    '{"data":"/data/swagrun","dev_baseline":{"swag":{"metrics":{"accuracy":37.5},"prediction"'
    ':"ending0"}},"dev_metrics":{"accuracy":0.0,"num_examples":8},"finished_at":"2026-12-06T1'
    '0:05:59+00:00","history":[{"dev":{"accuracy":0.0,"num_examples":8},"epoch":1.0,"step":2}'
    '],"model":"tiny-random","num_train_examples":16,"num_train_steps":2,"prediction_summary"'
    ':{"dev":{"swag":{"counts":{"ending0":2,"ending1":1,"ending2":3,"ending3":2},"single":nul'
    'l}},"test":{"test":{"counts":{"ending0":1,"ending1":3,"ending2":3,"ending3":1},"single":'
    'null}}},"seconds":30.57357621192932,"settings":{"adam_bias_correction":true,"adam_epsilo'
    'n":1e-08,"batch_size":8,"clip_norm":1.0,"decay_from":"warmup-end","dropout":0.1,"dropout'
    '_impl":"hash","epochs":1,"eval_batch_size":8,"eval_every_epoch":false,"group_by_length":'
    'false,"keep_models":"none","learning_rate":2e-05,"log_every":100,"max_seq_length":16,"me'
    'sh_shape":[-1,1,1],"optimizer":"bert","pad_to_max_length":false,"seed":0,"warmup_proport'
    'ion":0.1,"weight_decay":0.01},"skipped_steps":0,"task":"swag","train_loss":1.38641977310'
    "18066}"
)


@pytest.mark.parametrize("text", [GLUE_RTE, CONLL, SWAG], ids=["glue", "conll2003", "swag"])
def test_a_result_json_written_before_reads_back_with_its_keys(text, tmp_path):
    saved = json.loads(text)
    result = FinetuneResult.from_json(saved)
    task = result_task(saved)
    score = task.selection_score(saved["dev_metrics"])
    assert result.task == saved["task"] and result.dev_metrics == saved["dev_metrics"]
    assert result.selection_score == pytest.approx(saved.get("selection_score", score))
    # Written again: the same keys and values, and a selection score where there was none.
    assert result.to_json() == {**saved, "selection_score": result.selection_score}
    assert one_task.dev_score(saved) == (f"dev {task.selected_by}", pytest.approx(score))
    # What a resumed run (sweep, SWAG, curve) reuses: the file as it was, with its score.
    path = tmp_path / "result.json"
    path.write_text(text, encoding="utf-8")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["settings"].items()}
    reused = sweep.load_matching(str(path), FinetuneSettings(**values), saved["model"])
    assert reused == {**saved, "selection_score": result.selection_score}


def test_glue_s_selection_score_is_the_paper_metric_over_its_dev_splits():
    mnli = registry.get("MNLI")
    dev = {"MNLI-m": {"accuracy": 80.0}, "MNLI-mm": {"accuracy": 84.0}}
    assert mnli.selected_by == glue_metrics.paper_metric(mnli) == "accuracy"
    assert mnli.selection_score(dev) == pytest.approx(82.0)
    squad = registry.get("squad/v1.1")
    assert squad.selection_score({"exact_match": 70.0, "f1": 80.0}) == 80.0


def test_a_run_s_result_is_built_from_the_loop_s_outcome():
    saved = json.loads(SWAG)
    state = dataclasses.make_dataclass("State", ["skipped"])(np.int32(0))
    trained = Trained(state, 1.5, 3, saved["history"], saved["dev_metrics"], train_seconds=1.25)
    settings = dataclasses.make_dataclass("S", [], namespace={"to_dict": lambda self: {"x": 1}})()
    result = FinetuneResult.of_run(registry.get("swag"), settings, trained, 16, 2.0)
    assert result.selection_score == saved["dev_metrics"]["accuracy"]
    written = result.to_json()
    assert "dev_baseline" not in written and "prediction_summary" not in written  # none recorded
    assert (written["num_train_steps"], written["train_loss"], written["settings"]) == (
        3,
        1.5,
        {"x": 1},
    )
    assert (written["seconds"], written["train_seconds"]) == (2.0, 1.25)
    with pytest.raises(ValueError, match="overwrite the result's own fields"):
        dataclasses.replace(result, details={"task": "other"}).to_json()


# Each family's own evaluation on a tiny dev set: the figures its runs record as dev_metrics.
_SQUAD = [{"paragraphs": [{"qas": [{"id": "q", "answers": [{"text": "a cat"}]}]}]}]
FAMILY_METRICS = {
    SENTENCE: lambda task: glue_metrics.task_metrics(
        task,
        np.array([0.0, 1.0, 2.0] if task.is_regression else [0, 1, 1]),
        np.array([0.5, 1.0, 2.5] if task.is_regression else [0, 1, 0]),
    ),
    SPANS: lambda task: squad_answers.evaluate(_SQUAD, {"q": "the cat"}, task.version),
    TAGS: lambda task: conll.conlleval([["B-PER", "O"]], [["B-PER", "O"]]),
    FROZEN_TAGS: lambda task: conll.conlleval([["B-PER", "O"]], [["O", "O"]]),
    CHOICES: lambda task: multiple_choice.accuracy(np.eye(4)[:2], np.array([0, 2])),
}


def test_every_registered_task_names_a_metric_its_results_carry_with_a_direction():
    assert set(FAMILY_METRICS) == set(FAMILIES)
    for task in registry.all_tasks():
        dev = FAMILY_METRICS[task.family](task)
        assert task.selected_by in task.metrics and task.selected_by in dev, task.name
        assert isinstance(task.higher_is_better, bool), task.name
        assert task.selection_score(dev) == pytest.approx(dev[task.selected_by]), task.name


def test_a_task_selected_by_a_lower_figure_selects_its_lowest_trial():
    with pytest.raises(ValueError, match="selected_by='loss' is not one of its metrics"):
        dataclasses.replace(registry.get("RTE"), selected_by="loss")
    lowest = glue.SentenceTask(
        name="tiny-error-rate", metrics=("accuracy",), higher_is_better=False, labels=("0", "1"),
        is_pair=False, dev_splits={"dev": "tiny-error-rate"},
    )  # fmt: skip
    registry.register(lowest)
    try:
        records = [
            {"task": "tiny-error-rate", "trial": name, "selection_score": score}
            for name, score in (("a", 30.0), ("b", 10.0), ("c", 10.0), ("d", 20.0))
        ]
        records.append({"task": "RTE", "trial": "RTE/a", "selection_score": 60.0})
        records.append({"task": "RTE", "trial": "RTE/b", "selection_score": 70.0})
        selected = sweep.select_trials(records)
        assert selected["tiny-error-rate"]["trial"] == "b"  # the lowest; the earlier on ties
        assert selected["RTE"]["trial"] == "RTE/b"
        assert lowest.is_better(10.0, 20.0) and not lowest.is_better(10.0, 10.0)
    finally:
        registry.unregister(lowest)
