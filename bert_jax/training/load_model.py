"""A pretraining workdir read as a model, and `load_model_dir`: what every command's MODEL is.

MODEL is a model directory (the format: `bert_jax.convert.model_dir`) or a pretraining workdir:
its exported `<workdir>/model/` once the run has finished, else its latest checkpoint (the params
only, with the run's model config and the tokenizer kept in `<workdir>/tokenizer/`). Reading a
checkpoint needs the run's config and the checkpoint layout, so this stands in training/, above
the format.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax.convert import model_dir as model_format
from bert_jax.convert.model_dir import (
    CONFIG_NAME,
    FORMAT_NAME,
    TOKENIZER_DIR,
    ModelDir,
    ModelDirError,
    expected_tree,
    is_unexported_workdir,
    read_json,
)
from bert_jax.runtime import checkpoint_health, fs, topology


def load_model_dir(
    path: str | os.PathLike,
    *,
    sharding: Any = None,
    load_params: bool = True,
    load_tokenizer: bool = False,
    defer_params: bool = False,
) -> ModelDir:
    """Loads MODEL: a model directory (`bert_jax.convert.model_dir.load_model_dir`, whose
    docstring says what `sharding` and `defer_params` take), or a pretraining workdir, through
    its exported model or, while it has none, its latest checkpoint (`load_workdir_checkpoint`,
    which reads the params now)."""
    topology.quiet_library_runtime()  # before the params meet a device: no libtpu noise
    if is_unexported_workdir(path):
        return load_workdir_checkpoint(
            path, sharding=sharding, load_params=load_params, load_tokenizer=load_tokenizer
        )
    return model_format.load_model_dir(
        path,
        sharding=sharding,
        load_params=load_params,
        load_tokenizer=load_tokenizer,
        defer_params=defer_params,
    )


def load_workdir_checkpoint(
    workdir: str | os.PathLike,
    *,
    sharding: Any = None,
    load_params: bool = True,
    load_tokenizer: bool = False,
    step: int | None = None,
) -> ModelDir:
    """A `ModelDir` from a pretraining workdir's latest checkpoint (or its retained checkpoint
    `step`: the checkpoint curve reads each in turn; a step not retained is a ModelDirError).

    The run's `config.json` gives the model; only the params are read from the checkpoint (an
    Orbax partial restore, see `checkpointing.Checkpointer.restore_params`). They come back on
    the CPU, or with `sharding` (one Sharding, or a tree for the params) when given.
    """
    from bert_jax.training import checkpointing, config_lib

    workdir = fs.abspath(os.fspath(workdir))
    run_config = ml_collections.ConfigDict(read_json(os.path.join(workdir, CONFIG_NAME)))
    tokenizer = None
    own_tokenizer = os.path.join(workdir, TOKENIZER_DIR)
    if config_lib.family_of(run_config) == "modernbert" and fs.isdir(own_tokenizer):
        # The special-token ids are the run's tokenizer's, as the run gave its model.
        from bert_jax.data.tokenizers.load_or_train import load_tokenizer

        tokenizer = load_tokenizer(own_tokenizer)
    config = config_lib.bert_config(run_config, tokenizer)
    checkpoints = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
    retained, params = checkpoints.all_steps(), None
    if step is not None and step not in retained:
        checkpoints.close()
        raise ModelDirError(f"{workdir} keeps no checkpoint of step {step} (it has {retained})")
    step = step if step is not None else checkpoints.latest_step()
    if step is not None and load_params:
        # The params as the run holds them (padded vocabulary, `param_dtype`), onto the CPU.
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        target = jax.tree.map(
            lambda shape: jax.ShapeDtypeStruct(shape, np.dtype(config.param_dtype), sharding=cpu),
            expected_tree(config, has_heads=True),
            is_leaf=lambda x: isinstance(x, tuple),
        )
        restored, problem = checkpoint_health.read_or_problem(
            lambda: checkpoints.restore_params(target, step)
        )
        if problem is not None:  # a damaged checkpoint: say which, in one line
            checkpoints.close()
            raise ModelDirError(
                f"cannot read the params of checkpoint step {step} in {checkpoints.directory}: "
                f"{problem}"
            )
        params = jax.tree.map(np.asarray, restored[0])
        if sharding is not None:
            params = jax.device_put(params, sharding)
    checkpoints.close()
    if step is None:
        raise ModelDirError(f"{workdir} has no checkpoint yet and no exported model/")
    info = {"format": FORMAT_NAME, "source": "checkpoint", "step": step}
    loaded = ModelDir(workdir, config, params, True, info)
    if tokenizer is not None:
        loaded._tokenizer = tokenizer  # noqa: SLF001 (already loaded: kept, not read again)
    if load_tokenizer and loaded.has_tokenizer:
        loaded.tokenizer  # noqa: B018 (loads and caches)
    return loaded
