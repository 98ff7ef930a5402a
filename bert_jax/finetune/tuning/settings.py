"""What a fine-tuning run is given: its settings (`FinetuneSettings`, each task's recipe over
them) and the pretrained encoder it starts from (`PretrainedEncoder`, `load_pretrained`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bert_jax.core.model import BertConfig
from bert_jax.finetune.tasks.task import Task
from bert_jax.runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
    """One fine-tuning run's hyperparameters (the paper's defaults)."""

    learning_rate: float = 2e-5
    seed: int = 0
    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 32
    max_seq_length: int = 128
    warmup_proportion: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1
    clip_norm: float = 1.0
    # The paper says Adam; the original code's optimizer skips bias correction (set False to match
    # it; the missing correction is a known cause of failed runs on small tasks).
    adam_bias_correction: bool = True
    # "bert" (BERT AdamW, google-research/bert's schedule) or "adamw-hf" (Hugging Face Trainer's
    # torch AdamW and linear schedule); steps.OPTIMIZERS says what each is.
    optimizer: str = "bert"
    eval_every_epoch: bool = False
    mesh_shape: tuple[int, int, int] = (-1, 1, 1)
    log_every: int = 100

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["mesh_shape"] = list(self.mesh_shape)
        return values


@dataclasses.dataclass(frozen=True)
class PretrainedEncoder:
    """What fine-tuning needs from a model directory: config, the `bert` params and tokenizer."""

    config: BertConfig
    bert_params: Any
    tokenizer: Any
    source: str = ""

    @classmethod
    def from_model_dir(cls, model_dir: Any) -> PretrainedEncoder:
        """From `model_dir.load_model_dir(...)`'s ModelDir (params hold a `bert` subtree)."""
        params = model_dir.params
        if "bert" not in params:
            raise UserError(
                f"model directory {model_dir.path} has no 'bert' parameters "
                f"(top-level keys: {sorted(params)})"
            )
        return cls(model_dir.config, params["bert"], model_dir.tokenizer, str(model_dir.path))


def load_pretrained(path: str) -> PretrainedEncoder:
    """A model directory or pretraining workdir, through `model_dir.load_model_dir` (the loader
    every command uses); the params come to the host and are placed on the mesh per trial."""
    from bert_jax.training import model_dir

    return PretrainedEncoder.from_model_dir(model_dir.load_model_dir(path))


def task_settings(task: Task, overrides: Mapping[str, Any] | None = None) -> FinetuneSettings:
    """A run's settings: the task's recipe (`Task.defaults`) over the paper's GLUE defaults above,
    then the overrides that are not None."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    values = {**task.defaults, **given}
    if "mesh_shape" in values:
        values["mesh_shape"] = tuple(int(x) for x in values["mesh_shape"])
    return FinetuneSettings(**values)
