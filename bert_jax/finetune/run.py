"""One fine-tuning run of any task, by name: what `bert-jax finetune` and the checkpoint curve
(`curve.py`) call. GLUE goes to `sweep.run_single`, SQuAD and CoNLL-2003 to
`token_tasks.run_token_task` (CoNLL-2003 with `features` to `feature_ner.run_feature_ner`), SWAG
to `swag_task.run_swag`; each takes the task's own defaults, then the overrides that are not None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from bert_jax.finetune import ner, swag, token_tasks
from bert_jax.finetune.loop import PretrainedEncoder
from bert_jax.runtime.errors import UserError


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
        from bert_jax.finetune import swag_task

        return swag_task.task_settings(overrides)
    if task_kind == "conll2003" and options.features is not None:
        from bert_jax.finetune import feature_ner

        return feature_ner.task_settings(overrides)
    if task_kind != "glue":
        return token_tasks.task_settings(task, overrides)
    from bert_jax.finetune import sweep

    return sweep.sweep_options(overrides=dict(overrides))["settings"]


def run_task(
    model: str | PretrainedEncoder,
    task: str,
    data: str,
    workdir: str,
    overrides: Mapping[str, Any],
    options: TaskOptions = TaskOptions(),
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune `model` on `task` into `workdir`; returns the run's result.json content."""
    task_kind = kind(task)
    if options.features is not None and task_kind != "conll2003":
        raise UserError(f"--features is the feature-based CoNLL-2003 tagger; not for {task}")
    settings = task_settings(task, overrides, options)
    if task_kind == "swag":
        from bert_jax.finetune import swag_task

        return swag_task.run_swag(
            model, data, workdir, settings, log=log, predict_test=options.predict_test
        )
    if options.features is not None:
        from bert_jax.finetune import feature_ner

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
    from bert_jax.finetune import sweep

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
    from bert_jax.finetune import metrics

    return metrics.paper_metric(task)
