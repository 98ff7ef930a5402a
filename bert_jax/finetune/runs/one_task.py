"""One fine-tuning run of any task, by name: what `bert-jax finetune` and the checkpoint curve
(`curve.py`) call. GLUE goes to `sweep.run_single`, SQuAD and CoNLL-2003 to
`token_tasks.run_token_task` (CoNLL-2003 with `features` to `feature_ner.run_feature_ner`), SWAG
to `swag_task.run_swag`; each takes the task's own defaults, then the overrides that are not None.

A workdir that holds a finished run of the same task, settings and model is reused (its
result.json returned with `reused` set), as `bert-jax glue` reuses its trials; `overwrite` trains
again. One run writes into a workdir at a time (`workdir.one_writer`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from bert_jax.finetune.runs import squad_and_conll as token_tasks
from bert_jax.finetune.runs import workdir as finetune_workdir
from bert_jax.finetune.tasks import conll as ner
from bert_jax.finetune.tasks import swag
from bert_jax.finetune.tuning.sentence_tuning import PretrainedEncoder
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

RESULT_NAME = "result.json"  # the done marker of every task's run


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What a run needs beside `FinetuneSettings`."""

    span: token_tasks.SpanOptions = token_tasks.SpanOptions()
    features: str | None = None  # CoNLL-2003 only: a feature_tagger.VARIANTS name
    lstm_size: int = 768
    predict_test: bool = True


def kind(task: str) -> str:
    """ "glue", "squad", "conll2003" or "swag"."""
    if swag.is_swag_task(task):
        return "swag"
    if ner.is_ner_task(task):
        return "conll2003"
    return "squad" if token_tasks.is_token_task(task) else "glue"


def task_settings(task: str, overrides: Mapping[str, Any], options: TaskOptions = TaskOptions()):
    """The `FinetuneSettings` a run of `task` uses: the task's defaults, then the overrides."""
    task_kind = kind(task)
    if task_kind == "swag":
        from bert_jax.finetune.runs import swag as swag_task

        return swag_task.task_settings(overrides)
    if task_kind == "conll2003" and options.features is not None:
        from bert_jax.finetune.runs import conll_features as feature_ner

        return feature_ner.task_settings(overrides)
    if task_kind != "glue":
        return token_tasks.task_settings(task, overrides)
    from bert_jax.finetune.runs import sweep

    return sweep.sweep_options(overrides=dict(overrides))["settings"]


def run_task(
    model: str | PretrainedEncoder,
    task: str,
    data: str,
    workdir: str,
    overrides: Mapping[str, Any],
    options: TaskOptions = TaskOptions(),
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Fine-tune `model` on `task` into `workdir`; returns the run's result.json content (with
    `reused: True` when a finished run of the same task, settings and model was found there and
    `overwrite` is False)."""
    import jax

    if options.features is not None and kind(task) != "conll2003":
        raise UserError(f"--features is the feature-based CoNLL-2003 tagger; not for {task}")
    settings = task_settings(task, overrides, options)
    writer = jax.process_index() == 0
    with finetune_workdir.one_writer(workdir, writer=writer):
        path = os.path.join(fs.abspath(workdir), RESULT_NAME)
        if not overwrite:
            finished = finished_run(workdir, task, settings, model, options)
            if finished is not None:
                return {**finished, "reused": True}
        elif writer and fs.exists(path):
            fs.remove(path)  # the done marker: the run below writes it anew
        return _run(model, task, data, workdir, settings, options, log)


def finished_run(
    workdir: str, task: str, settings, model, options: TaskOptions = TaskOptions()
) -> dict[str, Any] | None:
    """The result.json of a finished run of `task` in `workdir` with these settings, options and
    model; None when there is none; a UserError naming what differs when it was another run."""
    from bert_jax.finetune.runs import sweep

    path = os.path.join(fs.abspath(workdir), RESULT_NAME)
    if not fs.exists(path):
        return None
    with fs.open(path, encoding="utf-8") as f:
        saved = json.load(f)
    differ = []
    if _task_key(str(saved.get("task"))) != _task_key(task):
        differ.append(f"task: saved {saved.get('task')!r}, now {task!r}")
    if saved.get("features") != options.features:
        differ.append(f"--features: saved {saved.get('features')!r}, now {options.features!r}")
    saved_settings = saved.get("settings") or {}
    for key in ("learning_rate", "seed"):  # `glue` keys its trials by these; load_matching not
        now = getattr(settings, key)
        if key in saved_settings and saved_settings[key] != now:
            differ.append(f"{key}: saved {saved_settings[key]!r}, now {now!r}")
    span = dataclasses.asdict(options.span)
    for key, value in (saved.get("options") or {}).items():
        if key in span and span[key] != value:
            differ.append(f"{key}: saved {value!r}, now {span[key]!r}")
    if differ:
        raise UserError(
            f"{path} is a finished run with different settings ({'; '.join(differ)}): use "
            "another --workdir, or --overwrite to replace it"
        )
    source = fs.abspath(model) if isinstance(model, str) else model.source
    try:
        return sweep.load_matching(path, settings, source)
    except UserError as err:
        raise UserError(f"{err} (or --overwrite to replace it)") from None


def _task_key(task: str) -> str:
    """A task's name as runs record it and users spell it alike: `glue/MRPC` = `MRPC` = `mrpc`."""
    name = task.split("/", 1)[1] if task.lower().startswith("glue/") else task
    return name.lower().replace("-", "").replace("_", "")


def _run(model, task, data, workdir, settings, options: TaskOptions, log) -> dict[str, Any]:
    task_kind = kind(task)
    if task_kind == "swag":
        from bert_jax.finetune.runs import swag as swag_task

        return swag_task.run_swag(
            model, data, workdir, settings, log=log, predict_test=options.predict_test
        )
    if options.features is not None:
        from bert_jax.finetune.runs import conll_features as feature_ner

        return feature_ner.run_feature_ner(
            model,
            data,
            workdir,
            options.features,
            settings,
            document_context=options.span.document_context,
            lstm_size=options.lstm_size,
            log=log,
        )
    if task_kind != "glue":
        return token_tasks.run_token_task(model, task, data, workdir, settings, options.span, log)
    from bert_jax.finetune.runs import sweep

    return sweep.run_single(
        model, task, data, workdir, settings=settings, predict_test=options.predict_test, log=log
    )


def dev_score(result: Mapping[str, Any]) -> tuple[str, float]:
    """The figure a curve plots for a run: the paper's metric on dev, in percent (GLUE: its
    selection score; SQuAD and CoNLL-2003: F1; SWAG: accuracy)."""
    if "selection_score" in result:  # GLUE
        return "dev " + _glue_metric(result["task"]), float(result["selection_score"])
    metrics = result["dev_metrics"]
    name = "accuracy" if result["task"] == swag.TASK_NAME else "f1"
    return f"dev {name}", float(metrics[name])


def _glue_metric(task: str) -> str:
    from bert_jax.finetune.tasks import glue_metrics as metrics

    return metrics.paper_metric(task)
