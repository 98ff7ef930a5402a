"""The dev score against pretraining step (the paper's Figure 5): one task fine-tuned from each
retained checkpoint of a pretraining workdir (`bert-jax finetune --each-checkpoint`).

Workdir layout:

    steps/step=<N>/...         one ordinary run of the task (its result.json, predictions, plot)
                               from the params of checkpoint N
                               (`load_model.load_workdir_checkpoint`)
    curve.json, curve.md       step -> the run's selection score: the task's `selected_by` on
                               dev (GLUE: the paper's metric; SQuAD, CoNLL-2003: F1; SWAG:
                               accuracy), in percent
    plots/curve.png            the score against the step

Resumable like the sweep: a step whose `result.json` exists (same settings, same checkpoint) is
read back, not run again; an interrupted curve, run again, runs only the missing steps. The
checkpoints are those the pretraining run keeps (`checkpoint.keep`, every `checkpoint.every_steps`):
to draw a long curve, raise `keep` before pretraining. `steps` picks some of them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from bert_jax.finetune.reports import curve_report
from bert_jax.finetune.runs import one_task as run
from bert_jax.finetune.runs import workdir as finetune_workdir
from bert_jax.finetune.runs.sweep import RESULT_NAME, load_matching
from bert_jax.finetune.tuning.settings import PretrainedEncoder
from bert_jax.runtime import fs, outputs
from bert_jax.runtime.errors import UserError

logger = logging.getLogger(__name__)
CURVE_NAME = "curve.json"


def retained_steps(pretrain_workdir: str) -> list[int]:
    """The steps of the checkpoints a pretraining workdir keeps, in order."""
    from bert_jax.convert.model_dir import is_unexported_workdir
    from bert_jax.training import checkpointing

    if not is_unexported_workdir(pretrain_workdir) and not fs.isdir(
        os.path.join(pretrain_workdir, "checkpoints")
    ):
        raise UserError(
            f"--each-checkpoint: {pretrain_workdir} is not a pretraining workdir (no "
            "checkpoints/ and config.json)"
        )
    checkpoints = checkpointing.Checkpointer(
        os.path.join(pretrain_workdir, "checkpoints"), async_save=False
    )
    try:
        return sorted(checkpoints.all_steps())
    finally:
        checkpoints.close()


def encoder_at(pretrain_workdir: str, step: int) -> PretrainedEncoder:
    """The encoder of checkpoint `step`, named `<workdir>@step=<step>` in its runs' records."""
    from bert_jax.training import load_model

    loaded = load_model.load_workdir_checkpoint(pretrain_workdir, step=step)
    encoder = PretrainedEncoder.from_model_dir(loaded, single_run=True)  # one run's
    return dataclasses.replace(encoder, source=f"{pretrain_workdir}@step={step}")


def run_curve(
    model: str,
    task: str,
    data: str,
    workdir: str,
    overrides: Mapping[str, Any],
    options: run.TaskOptions | None = None,
    steps: Sequence[int] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the curve in `workdir`; returns curve.json's content."""
    log = log or logger.info
    options = options or run.TaskOptions()
    pretrain = fs.abspath(model)
    retained = retained_steps(pretrain)
    chosen = sorted(set(steps)) if steps else retained
    missing = sorted(set(chosen) - set(retained))
    if missing or not chosen:
        raise UserError(
            f"{pretrain} keeps checkpoints of steps {retained}; "
            + (f"not of {missing}" if missing else "none to fine-tune from")
        )
    settings = run.task_settings(task, overrides, options)
    workdir = finetune_workdir.open_workdir(
        workdir, "finetune --each-checkpoint", writer=jax.process_index() == 0
    )
    _check_same_task(workdir, task, options)
    points = []
    for step in chosen:
        directory = os.path.join(workdir, "steps", f"step={step}")
        source = f"{pretrain}@step={step}"
        result = load_matching(os.path.join(directory, RESULT_NAME), settings, source)
        if result is None:
            log(f"{task} from checkpoint {step}: running")
            result = run.run_task(
                encoder_at(pretrain, step), task, data, directory, overrides, options, log
            )
        else:
            log(f"{task} from checkpoint {step}: finished earlier, skipped")
        metric, score = run.dev_score(result)
        points.append({"step": step, "score": score, "seconds": result.get("seconds")})
        log(f"{task} from checkpoint {step}: {metric} {score:.2f}")
    curve = {
        "task": task,
        "features": options.features,
        "metric": metric,
        "model": pretrain,
        "data": data,
        "settings": settings.to_dict(),
        "points": points,
    }
    if jax.process_index() == 0:  # every process computes the same curve; one writes it
        outputs.write_json_atomic(os.path.join(workdir, CURVE_NAME), curve)
        outputs.write_bytes_atomic(
            os.path.join(workdir, "curve.md"), curve_report.curve_markdown(curve).encode()
        )
        fs.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
        curve_report.plot_curve(os.path.join(workdir, "plots", "curve.png"), curve)
    return curve


def _check_same_task(workdir: str, task: str, options: run.TaskOptions) -> None:
    path = os.path.join(workdir, CURVE_NAME)
    if not fs.exists(path):
        return
    import json

    with fs.open(path, encoding="utf-8") as f:
        earlier = json.load(f)
    if (earlier.get("task"), earlier.get("features")) != (task, options.features):
        raise UserError(
            f"{path} is a curve of {earlier.get('task')} (features {earlier.get('features')}); "
            f"use another --workdir for {task}"
        )
