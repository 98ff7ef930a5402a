"""One fine-tuning run of any registered task, by name: what `bert-jax finetune` and the
checkpoint curve (`curve.py`) call. The task comes from `tasks.registry`; its family says which
run trains it: a sentence task `sweep.run_single`, SQuAD and CoNLL-2003
`squad_and_conll.run_token_task`, CoNLL-2003 with `features` `conll_features.run_feature_ner`,
SWAG `multiple_choice.run_swag`; each with the task's registered recipe, then the overrides
that are not None.
Every run loads either family's model directory (`settings.load_pretrained`); a ModernBERT model
is refused in one line for a family it has no head for (`MODERNBERT_FAMILIES`).

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
from bert_jax.finetune.tasks import registry
from bert_jax.finetune.tasks.task import (
    CHOICES,
    FROZEN_TAGS,
    SENTENCE,
    SPANS,
    TAGS,
    Task,
    name_key,
)
from bert_jax.finetune.tuning import settings as run_settings
from bert_jax.finetune.tuning.result import FinetuneResult, result_task
from bert_jax.finetune.tuning.settings import PretrainedEncoder
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

RESULT_NAME = "result.json"  # the done marker of every task's run
# The task families a ModernBERT model fine-tunes on (with its own heads: heads/modernbert_*.py,
# per_token.ModernBertForTokenOutputs); it is refused in one line for the others.
MODERNBERT_FAMILIES = frozenset({SENTENCE, SPANS, TAGS, CHOICES})


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What a run needs beside `FinetuneSettings`."""

    span: token_tasks.SpanOptions = token_tasks.SpanOptions()
    features: str | None = None  # CoNLL-2003 only: a lstm_tagger.VARIANTS name
    lstm_size: int = 768
    predict_test: bool = True


def get_task(task: str | Task, options: TaskOptions = TaskOptions()) -> Task:
    """The registered task a run of `task` (a name, any spelling) with these options is."""
    if isinstance(task, Task):
        return task
    return registry.get(task, feature_based=options.features is not None)


def task_settings(
    task: str | Task, overrides: Mapping[str, Any], options: TaskOptions = TaskOptions()
):
    """The `FinetuneSettings` a run of `task` uses: the task's recipe, then the overrides."""
    return run_settings.task_settings(get_task(task, options), overrides)


def run_task(
    model: str | PretrainedEncoder,
    task: str | Task,
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

    given, task = task, get_task(task, options)
    check_family(model, task)
    settings = run_settings.task_settings(task, overrides)
    writer = jax.process_index() == 0
    with finetune_workdir.one_writer(workdir, writer=writer):
        path = os.path.join(fs.abspath(workdir), RESULT_NAME)
        if not overwrite:
            finished = finished_run(workdir, given, settings, model, options)
            if finished is not None:
                return {**finished, "reused": True}
        elif writer and fs.exists(path):
            fs.remove(path)  # the done marker: the run below writes it anew
        return _run(model, task, data, workdir, settings, options, log)


def finished_run(
    workdir: str, task: str | Task, settings, model, options: TaskOptions = TaskOptions()
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
    given = task if isinstance(task, str) else task.name  # as the user spelled it
    task = get_task(task, options)
    if name_key(str(saved.get("task"))) not in task.keys:
        differ.append(f"task: saved {saved.get('task')!r}, now {given!r}")
    if saved.get("features") != options.features:
        differ.append(f"--features: saved {saved.get('features')!r}, now {options.features!r}")
    saved_settings = saved.get("settings") or {}
    for key in run_settings.SWEPT:  # `glue` keys its trials by these; load_matching not
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


def check_family(model: str | PretrainedEncoder, task: Task) -> None:
    """A ModernBERT MODEL refused in one line for a task outside `MODERNBERT_FAMILIES` (read from
    its config alone); any other model passes (a bad one is named by the run, in its order)."""
    if task.family in MODERNBERT_FAMILIES:
        return
    from bert_jax.core.modernbert_config import ModernBertConfig
    from bert_jax.training import load_model

    if not isinstance(model, str):
        config = model.config
    else:
        try:
            config = load_model.load_model_dir(model, load_params=False).config
        except UserError:
            return
    if isinstance(config, ModernBertConfig):
        where = model if isinstance(model, str) else model.source
        tasks = registry.all_tasks()
        named = [t.name for t in tasks if t.family in MODERNBERT_FAMILIES - {SENTENCE}]
        kinds = ", ".join(["the GLUE tasks", *dict.fromkeys(named)])  # conll2003 is two tasks
        raise UserError(
            f"--model {where} is a ModernBERT model: it fine-tunes on {kinds}; "
            f"{task.name}{' --features' * task.feature_based} fine-tunes BERT models only"
        )


def _run(model, task: Task, data, workdir, settings, options: TaskOptions, log) -> dict[str, Any]:
    """The run of the task's family."""
    if task.family == SENTENCE:
        from bert_jax.finetune.runs import sweep

        return sweep.run_single(
            model,
            task,
            data,
            workdir,
            settings=settings,
            predict_test=options.predict_test,
            log=log,
        )
    if task.family == CHOICES:
        from bert_jax.finetune.runs import multiple_choice as swag_task

        return swag_task.run_swag(
            model, data, workdir, settings, log=log, predict_test=options.predict_test
        )
    if task.family == FROZEN_TAGS:
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
    return token_tasks.run_token_task(model, task, data, workdir, settings, options.span, log)


def dev_score(result: Mapping[str, Any]) -> tuple[str, float]:
    """The figure a curve plots for a run (its result.json): the run's selection score, the
    task's `selected_by` on dev in percent (a sentence task's: the mean over its dev splits)."""
    task = result_task(result)
    return f"dev {task.selected_by}", FinetuneResult.from_json(dict(result)).selection_score
