"""A run's trained model kept as a fine-tuned model directory (the format:
`bert_jax.convert.model_dir`, its heads `convert/task_heads.py`), as `--keep-models` says.

`bert-jax finetune` writes `<workdir>/model/` (unless `--keep-models none`). `bert-jax glue` keeps
the selected trial's model of each task in that trial's directory
(`trials/<TASK>/lr=<LR>_seed=<SEED>/model/`; `--keep-models all`: every trial's): a trial that
becomes its task's selected one writes its model before its result.json, and the model of the
trial it displaced is removed (`prune`). `bert-jax predict` reads these directories, and
`bert-jax convert --to hf` exports them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from bert_jax.convert import model_dir as model_format
from bert_jax.finetune.tuning.settings import FinetuneSettings, PretrainedEncoder
from bert_jax.runtime import fs

MODEL_SUBDIR = model_format.WORKDIR_MODEL_SUBDIR  # "model", beside result.json


def task_entry(
    name: str,
    head: str,
    labels: Sequence[str],
    settings: FinetuneSettings,
    options: Mapping[str, Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The "bert_jax" block's `task` entry of a model fine-tuned on `name` (see model_dir's
    docstring): its head kind, label names, sequence length, settings and the task's options."""
    entry = {
        "name": name,
        "head": head,
        "labels": [str(label) for label in labels],
        "max_seq_length": int(settings.max_seq_length),
        "settings": settings.to_dict(),
        "options": dict(options or {}),
        **more,
    }
    return entry


def host_params(params: Any) -> Any:
    """The (possibly sharded) trained params as host NumPy arrays, on every process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(params, tiled=True)
    return jax.tree.map(np.asarray, params)


def save(directory: str, encoder: PretrainedEncoder, params: Any, task: Mapping[str, Any]) -> str:
    """Writes the model fine-tuned from `encoder` (the state's params {"bert", "classifier"})
    into `directory/model/`, replacing one written before; its path. Every process gathers the
    params; the first writes."""
    params = host_params(params)
    path = os.path.join(directory, MODEL_SUBDIR)
    if jax.process_index() != 0:
        return path
    return model_format.save_model_dir(
        path,
        encoder.config,
        params,
        encoder.tokenizer,
        overwrite=True,
        what="--workdir",
        task=task,
        extra={"fine_tuned_from": encoder.source},
    )


def keeps(settings: FinetuneSettings, selected: bool) -> bool:
    """Whether a run's model is written: `selected` (the run of `finetune`, or a trial that is
    its task's selected one so far) under "selected", every one under "all", none under "none"."""
    return settings.keep_models == "all" or (settings.keep_models == "selected" and selected)


def keep(
    directory: str,
    settings: FinetuneSettings,
    selected: bool,
    encoder: PretrainedEncoder,
    params: Any,
    task: Mapping[str, Any],
) -> str | None:
    """The run's model written into `directory/model/` when `keeps(settings, selected)`; else a
    model an earlier run left there removed (a directory never holds another run's model). The
    model's path, or None. Called by every process, before the run's result.json."""
    if keeps(settings, selected):
        return save(directory, encoder, params, task)
    prune([directory], None)
    return None


def prune(directories: Sequence[str], keep: str | None) -> list[str]:
    """Removes the model directory bert-jax wrote in each of `directories` but `keep`; the
    removed paths."""
    removed = []
    for directory in directories:
        path = os.path.join(directory, MODEL_SUBDIR)
        if directory == keep or not model_format.is_model_dir(path):
            continue
        if jax.process_index() == 0:
            fs.rmtree(path)
        removed.append(path)
    return removed
