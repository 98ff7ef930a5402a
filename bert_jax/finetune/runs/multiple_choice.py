"""`bert-jax finetune --task swag`: the paper's SWAG recipe on the official CSV files.

The model is `pooled.BertForMultipleChoice` (one score per choice from its pooled [CLS], softmax
over the four), or for a ModernBERT model `modernbert_pooled.ModernBertForMultipleChoice` (its
pooling and head, one score per choice), trained with GLUE's machinery (`head_tuner.HeadTuner`,
`tuning_loop.run_steps`: BERT AdamW, warmup over 10% then linear decay) and the paper's recipe:
3 epochs, lr 2e-5, batch 16, max_seq_length 128 (the paper gives no length; 128 holds nearly
every SWAG choice).

Writes into the workdir: `result.json` (dev accuracy in percent, settings, history),
`dev_predictions.csv` and `test_predictions.csv` (`id,prediction,score0..score3`: the row's
first column, the chosen ending and the four softmax probabilities), `results.md` (the run beside
Table 4's dev figures) and `plots/swag.png`. A workdir whose `result.json` was written with the
same settings and model is a finished run: running again rewrites the reports and trains nothing.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core import partitioning
from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.finetune.heads import modernbert_pooled
from bert_jax.finetune.heads.pooled import (
    BertForMultipleChoice,
    ClassifierHead,
    classification_loss,
)
from bert_jax.finetune.reports import run_report
from bert_jax.finetune.runs import finetuned_model
from bert_jax.finetune.runs import workdir as finetune_workdir
from bert_jax.finetune.runs.sweep import RESULT_NAME, load_matching
from bert_jax.finetune.tasks import glue_metrics, swag
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.batches import row_lengths
from bert_jax.finetune.tuning.head_tuner import HeadTuner, SumsFn
from bert_jax.finetune.tuning.packing import batches_for, first_predict_batch, packing_inputs
from bert_jax.finetune.tuning.result import FinetuneResult
from bert_jax.finetune.tuning.settings import FinetuneSettings, PretrainedEncoder, load_pretrained
from bert_jax.finetune.tuning.settings import task_settings as settings_for
from bert_jax.finetune.tuning.token_tuning import MODEL_KEYS, predict_logits
from bert_jax.runtime import fs
from bert_jax.runtime import outputs as files

logger = logging.getLogger(__name__)
Array = jax.Array

DEFAULTS = dict(swag.TASKS[0].defaults)  # Table 4's recipe, as registered
ENDINGS = tuple(f"ending{i}" for i in range(swag.NUM_CHOICES))  # the choices, as the CSV names them


def task_settings(overrides: Mapping[str, Any]) -> FinetuneSettings:
    """The paper's SWAG recipe, then the overrides that are not None."""
    return settings_for(swag.TASKS[0], overrides)


def choice_loss(model: nn.Module) -> SumsFn:
    """Cross-entropy over the choices, summed over a (micro-)batch's rows (`HeadTuner`'s
    `sums_fn`: its loss is the sum over the whole batch's weight)."""

    def loss_fn(params, batch, dropout_rng):
        scores = model.apply(
            {"params": params},
            *(batch[key] for key in MODEL_KEYS),
            deterministic=False,
            rngs={"dropout": dropout_rng},
            **packing_inputs(batch),
        )
        return classification_loss(scores, batch["labels"], batch["weights"])

    return loss_fn


def _predict(params: Any, batch: Mapping[str, Array], *, model: nn.Module) -> Array:
    return model.apply(
        {"params": params},
        *(batch[key] for key in MODEL_KEYS),
        deterministic=True,
        **packing_inputs(batch),
    )


class ChoiceTuner(HeadTuner):
    """The family's multiple-choice model, its loss and optimizer on a mesh, compiled once."""

    def __init__(
        self,
        config: BertConfig | ModernBertConfig,
        mesh: jax.sharding.Mesh,
        settings: FinetuneSettings,
    ):
        if isinstance(config, ModernBertConfig):  # its own head (its rates set by run_config)
            model = modernbert_pooled.ModernBertForMultipleChoice(config)
            head = modernbert_pooled.ModernBertClassifierHead(config, 1)
        else:
            model = BertForMultipleChoice(config, settings.dropout)
            head = ClassifierHead(config, 1, settings.dropout)
        super().__init__(
            model,
            head,
            jnp.zeros((1, config.hidden_size), jnp.float32),  # a choice's pooled state
            choice_loss(model),
            _predict,
            mesh,
            settings,
        )


def choice_tuner(config, mesh, settings: FinetuneSettings) -> ChoiceTuner:
    """A ChoiceTuner shared by every caller with the same model and settings of the step."""
    return _choice_tuner(config, mesh, settings.step_settings())


@functools.lru_cache(maxsize=8)
def _choice_tuner(config, mesh, settings) -> ChoiceTuner:
    return ChoiceTuner(config, mesh, settings)


def accuracy(scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Percent of examples whose highest-scoring choice is the gold one."""
    correct = np.argmax(scores, axis=-1) == labels
    return {"accuracy": 100.0 * float(np.mean(correct)), "num_examples": int(len(labels))}


def predictions_csv(examples: list[swag.SwagExample], scores: np.ndarray) -> str:
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=-1, keepdims=True)
    lines = ["id,prediction," + ",".join(f"score{i}" for i in range(swag.NUM_CHOICES))]
    for example, row, probs in zip(examples, scores, probabilities, strict=True):
        cells = ",".join(f"{p:.6f}" for p in probs)
        lines.append(f"{example.example_id},{int(np.argmax(row))},{cells}")
    return "\n".join(lines) + "\n"


def run_swag(
    model: str | PretrainedEncoder,
    data: str,
    workdir: str,
    settings: FinetuneSettings | None = None,
    log: Callable[[str], None] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    predict_test: bool = True,
) -> dict[str, Any]:
    """Fine-tune on SWAG (or reuse a finished run in `workdir`); write the workdir's files and
    return result.json's content. `model`: a model directory / pretraining workdir, or a loaded
    encoder; `mesh` defaults to one of `settings.mesh_shape` over every device."""
    log = log or logger.info
    settings = settings or task_settings({})
    # Inputs first, then the workdir, then the model: a bad input or model leaves nothing behind.
    swag.check_files(data)
    splits = {split: swag.read_split(data, split) for split in ("train", "dev")}
    splits["test"] = swag.read_split(data, "test") if predict_test else None
    finetune_workdir.check_workdir(workdir)
    model_name = fs.abspath(model) if isinstance(model, str) else model.source
    finished = load_matching(os.path.join(fs.abspath(workdir), RESULT_NAME), settings, model_name)
    if finished is not None:
        log(f"swag: finished earlier in {workdir}, reports rewritten")
        _write_reports(fs.abspath(workdir), finished)
        return finished
    encoder = load_pretrained(model, single_run=True) if isinstance(model, str) else model
    trained: dict[str, Any] = {}
    finished, outputs = train_and_predict(encoder, splits, settings, log, mesh, trained.update)
    result = finished.to_json()
    result.update(
        model=model_name,
        data=data,
        finished_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    workdir = finetune_workdir.open_workdir(workdir, "finetune", writer=jax.process_index() == 0)
    entry = finetuned_model.task_entry(swag.TASK_NAME, "multiple_choice", [], settings)
    finetuned_model.keep(workdir, settings, True, encoder, trained["params"], entry)
    if jax.process_index() == 0:
        workdir = finetune_workdir.open_workdir(workdir, "finetune")
        for name, text in outputs.items():
            files.write_bytes_atomic(os.path.join(workdir, name), text.encode("utf-8"))
        _write_reports(workdir, result)
        files.write_json_atomic(os.path.join(workdir, RESULT_NAME), result)  # the done marker
    return result


def _write_reports(workdir: str, result: Mapping[str, Any]) -> None:
    if jax.process_index() != 0:
        return
    text = run_report.results_markdown(result)
    files.write_bytes_atomic(os.path.join(workdir, "results.md"), text.encode("utf-8"))
    fs.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
    run_report.plot_history(os.path.join(workdir, "plots", "swag.png"), result)


def train_and_predict(
    encoder: PretrainedEncoder,
    splits: Mapping[str, list[swag.SwagExample] | None],
    settings: FinetuneSettings,
    log: Callable[[str], None],
    mesh: jax.sharding.Mesh | None = None,
    on_trained: Callable[[Mapping[str, Any]], None] | None = None,
) -> tuple[FinetuneResult, dict[str, str]]:
    """The run on read splits: its `FinetuneResult` and the prediction files' text;
    `on_trained`, when given, receives {"params": the trained params} (the model to keep)."""
    started = time.time()
    mesh = mesh if mesh is not None else partitioning.make_mesh(settings.mesh_shape)
    config = tuning_loop.run_config(encoder, settings, mesh)
    tuner = choice_tuner(config, mesh, settings)
    arrays = {
        name: swag.build_features(examples, encoder.tokenizer, settings.max_seq_length)
        for name, examples in splits.items()
        if examples is not None
    }
    log(f"SWAG: {len(splits['train'])} train, {len(splits['dev'])} dev examples")
    init_rng, dropout_rng = jax.random.split(jax.random.key(settings.seed))
    train_inputs = {key: arrays["train"][key] for key in (*MODEL_KEYS, "labels")}
    kept: dict[str, np.ndarray] = {}
    # Bucketed, a row's length is its longest choice's; packed, its choices' together.
    buckets = batches_for(
        settings, [train_inputs, *(arrays[s] for s in arrays if s != "train")], mesh
    )

    def predicted(params, split):
        return predict_logits(
            tuner, params, arrays[split], settings.eval_batch_size, buckets=buckets
        )

    def evaluate(params):
        kept["dev"] = predicted(params, "dev")
        return accuracy(kept["dev"], arrays["dev"]["labels"])

    trained = tuning_loop.run_steps(
        tuner,
        lambda: tuner.init(init_rng, encoder.bert_params),
        dropout_rng,
        settings,
        len(splits["train"]),
        lambda rows: buckets.gather(train_inputs, rows),
        evaluate,
        log,
        name=swag.TASK_NAME,
        lengths=row_lengths(train_inputs["input_mask"]),
        buckets=buckets,
        predict_ahead=first_predict_batch(
            {key: arrays["dev"][key] for key in MODEL_KEYS}, settings.eval_batch_size, buckets
        ),
        # The params read, and the plot at the end's imports, while the first step compiles.
        while_compiling=tuning_loop.in_order(encoder.read_params, run_report.load_plotting),
    )
    if on_trained is not None:
        on_trained({"params": trained.state.params})
    outputs = {"dev_predictions.csv": predictions_csv(splits["dev"], kept["dev"])}
    dev_labels = arrays["dev"]["labels"]
    majority = glue_metrics.class_summary(dev_labels, ENDINGS)
    choice = max(ENDINGS, key=majority["counts"].__getitem__)
    share = 100.0 * majority["counts"][choice] / max(len(dev_labels), 1)
    summary = {"dev": {swag.TASK_NAME: glue_metrics.class_summary(_choices(kept["dev"]), ENDINGS)}}
    if "test" in arrays:
        scores = predicted(trained.state.params, "test")
        outputs["test_predictions.csv"] = predictions_csv(splits["test"], scores)
        summary["test"] = {"test": glue_metrics.class_summary(_choices(scores), ENDINGS)}
    result = FinetuneResult.of_run(
        swag.TASKS[0],
        settings,
        trained,
        len(splits["train"]),
        time.time() - started,
        # The ending most often gold on dev, picked for every example (`references`).
        dev_baseline={swag.TASK_NAME: {"prediction": choice, "metrics": {"accuracy": share}}},
        prediction_summary=summary,
    )
    return result, outputs


def _choices(scores: np.ndarray) -> np.ndarray:
    return np.argmax(scores, axis=-1)
