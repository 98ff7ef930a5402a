"""The sentence-task fine-tuning loop: a classifier (or regressor) on the pooled [CLS], one task,
one setting (learning rate, seed), on the device mesh. A ModernBERT encoder gets its own head
(`heads/modernbert_pooled.py`: CLS or mean pooling, dense, activation, norm, classifier).

The paper's recipe: BERT AdamW (weight decay 0.01, not on LayerNorm and biases; clipping at global
norm 1.0), linear warmup over the first 10% of steps then linear decay to 0, dropout 0.1, batch 32,
3 epochs; evaluation on dev at the end (and after every epoch with `eval_every_epoch`).
`optimizer="adamw-hf"` runs Hugging Face's Trainer recipe instead (see `settings.OPTIMIZERS`).

The state and step are pretraining's (`trainer.TrainState`, `trainer.update`,
`trainer.ShardedSteps`: shardings from the logical axis names, global batches, a donated state),
with the classifier's loss. The learning rate enters the step as an argument (the optimizer runs
with a unit schedule and the update is scaled by it), so every trial of a sweep with the same model
and head reuses one compiled step. Batches come from `batches`; a run is deterministic given its
seed (head initialisation, shuffling and dropout).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core import partitioning
from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.finetune.heads import modernbert_pooled
from bert_jax.finetune.heads.pooled import BertForSequenceClassification, ClassifierHead, head_loss
from bert_jax.finetune.tasks import glue_metrics
from bert_jax.finetune.tasks.glue import SentenceTask
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.batches import (
    Buckets,
    EncodedSplit,
    TaskData,
    bucket_lengths,
    row_lengths,
)
from bert_jax.finetune.tuning.head_tuner import HeadTuner, SumsFn
from bert_jax.finetune.tuning.packing import (
    Packing,
    batches_for,
    first_predict_batch,
    packing_inputs,
)
from bert_jax.finetune.tuning.result import FinetuneResult
from bert_jax.finetune.tuning.settings import FinetuneSettings, PretrainedEncoder

Array = jax.Array
logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------
# Compiled steps
# ------------------------------------------------------------------------------------------------


def classifier_loss(model: BertForSequenceClassification, regression: bool) -> SumsFn:
    """The head's loss sums on a (micro-)batch (`HeadTuner`'s `sums_fn`: its loss is their
    "loss_sum" over the whole batch's weight)."""

    def loss_fn(params, batch, dropout_rng):
        logits = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["input_mask"],
            batch["segment_ids"],
            deterministic=False,
            rngs={"dropout": dropout_rng},
            **packing_inputs(batch),
        )
        return head_loss(logits, batch["labels"], batch["weights"], regression)

    return loss_fn


def predict_step(
    params: Any, batch: Mapping[str, Array], *, model: BertForSequenceClassification
) -> Array:
    return model.apply(
        {"params": params},
        batch["input_ids"],
        batch["input_mask"],
        batch["segment_ids"],
        deterministic=True,
        **packing_inputs(batch),
    )


class FineTuner(HeadTuner):
    """The classification model, optimizer, mesh and rules bound together, compiled once.

    Use `fine_tuner(...)` to get a cached instance: trials that differ only in learning rate, seed
    or data reuse the compiled init, train and predict steps.
    """

    def __init__(
        self,
        config: BertConfig | ModernBertConfig,
        num_labels: int,
        mesh: jax.sharding.Mesh,
        settings: FinetuneSettings,
        rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
    ):
        self.config = config
        self.num_labels = num_labels
        self.regression = num_labels == 1
        if isinstance(config, ModernBertConfig):  # its own head (its rates set by run_config)
            model = modernbert_pooled.ModernBertForSequenceClassification(config, num_labels)
            head = modernbert_pooled.ModernBertClassifierHead(config, num_labels)
        else:
            model = BertForSequenceClassification(config, num_labels, settings.dropout)
            head = ClassifierHead(config, num_labels, settings.dropout)
        super().__init__(
            model,
            head,
            jnp.zeros((1, config.hidden_size), jnp.float32),  # the pooled [CLS]
            classifier_loss(model, self.regression),
            predict_step,
            mesh,
            settings,
            rules,
        )


def fine_tuner(
    config: BertConfig | ModernBertConfig,
    num_labels: int,
    mesh: jax.sharding.Mesh,
    settings: FinetuneSettings | None = None,
    rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
) -> FineTuner:
    """A FineTuner shared by every caller with the same model, mesh and settings of the step
    (`settings.step_settings()`: the learning rate and seed do not count; default: the
    declared defaults)."""
    settings = (settings or FinetuneSettings()).step_settings()
    return _fine_tuner(config, num_labels, mesh, settings, rules)


@functools.lru_cache(maxsize=8)
def _fine_tuner(config, num_labels, mesh, settings, rules) -> FineTuner:
    return FineTuner(config, num_labels, mesh, settings, rules)


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------


def predict_split(
    tuner: FineTuner,
    params: Any,
    split: EncodedSplit,
    eval_batch_size: int,
    buckets: Buckets | Packing | None = None,
) -> np.ndarray:
    """Raw outputs for every row of `split`, [N, num_labels], in the split's order; rows are
    predicted in batches of similar length (`batches.predict_batches`), each padded to its bucket
    (`buckets`: the run's; default `batches.bucket_lengths` of the split's stored length), or
    packed (the run's `packing.Packing`)."""
    if isinstance(buckets, Packing):
        return buckets.predict(
            dict(split.features),
            lambda batch: tuner.predict(params, tuner.global_batch(batch)),
            fill=0.0,
        )
    buckets = buckets or Buckets(bucket_lengths(split.features["input_ids"].shape[-1]))
    outputs = None
    for rows, batch in buckets.predicting(split.features, eval_batch_size):
        logits = np.asarray(tuner.predict(params, tuner.global_batch(batch)))
        if outputs is None:
            outputs = np.zeros((len(split), *logits.shape[1:]), logits.dtype)
        outputs[rows[rows >= 0]] = logits[rows >= 0]
    return outputs if outputs is not None else np.zeros((0, tuner.num_labels), np.float32)


def predictions_from_outputs(task: SentenceTask, outputs: np.ndarray) -> np.ndarray:
    """Label indices (argmax) for classification, scores for regression."""
    if task.is_regression:
        return outputs[:, 0].astype(np.float64)
    return np.argmax(outputs, axis=-1)


def submission_strings(task: SentenceTask, predictions: np.ndarray) -> list[str]:
    """Predictions as the GLUE server reads them: label strings; STS-B scores clipped to [0, 5]."""
    if task.is_regression:
        return [f"{min(max(float(p), 0.0), 5.0):.3f}" for p in predictions]
    assert task.labels is not None
    return [task.labels[int(p)] for p in predictions]


def evaluate(
    tuner: FineTuner,
    params: Any,
    task: SentenceTask,
    dev: Mapping[str, EncodedSplit],
    batch_size: int,
    kept: dict[str, np.ndarray] | None = None,
    buckets: Buckets | Packing | None = None,
) -> dict[str, dict[str, float]]:
    """GLUE metrics on every dev split, keyed by report name; `kept` (when given) receives the
    predictions, by split."""
    results = {}
    for split, encoded in dev.items():
        predictions = predictions_from_outputs(
            task, predict_split(tuner, params, encoded, batch_size, buckets)
        )
        if kept is not None:
            kept[split] = predictions
        assert encoded.labels is not None
        results[task.dev_splits[split]] = glue_metrics.task_metrics(
            task, encoded.labels, predictions
        )
    return results


def make_mesh(settings: FinetuneSettings) -> jax.sharding.Mesh:
    return partitioning.make_mesh(settings.mesh_shape)


def finetune(
    encoder: PretrainedEncoder,
    data: TaskData,
    settings: FinetuneSettings,
    mesh: jax.sharding.Mesh | None = None,
    rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
    log: Callable[[str], None] | None = None,
    on_trained: Callable[[Mapping[str, Any]], None] | None = None,
) -> FinetuneResult:
    """Fine-tune `encoder` + a fresh head on `data.train`; evaluate on dev; predict test splits.
    `on_trained`, when given, receives {"params": the trained params} (the model to keep)."""
    started = time.time()
    log = log or logger.info
    task = data.task
    mesh = mesh if mesh is not None else make_mesh(settings)
    config = tuning_loop.run_config(encoder, settings, mesh)
    tuner = fine_tuner(config, task.num_outputs, mesh, settings, rules)
    init_rng, dropout_rng = jax.random.split(jax.random.key(settings.seed))
    kept: dict[str, np.ndarray] = {}  # the last evaluation's dev predictions
    train = dict(data.train.features, labels=data.train.labels)
    splits = [train, *(split.features for split in (*data.dev.values(), *data.test.values()))]
    buckets = batches_for(settings, splits, mesh)
    trained = tuning_loop.run_steps(
        tuner,
        lambda: tuner.init(init_rng, encoder.bert_params),
        dropout_rng,
        settings,
        len(data.train),
        lambda rows: buckets.gather(train, rows),
        lambda params: evaluate(
            tuner, params, task, data.dev, settings.eval_batch_size, kept, buckets
        ),
        log,
        name=task.name,
        lengths=row_lengths(data.train.features["input_mask"]),
        buckets=buckets,
        predict_ahead=next(
            (
                first_predict_batch(dict(split.features), settings.eval_batch_size, buckets)
                for split in data.dev.values()
            ),
            None,
        ),
        while_compiling=encoder.read_params,
    )
    state = trained.state
    if on_trained is not None:
        on_trained({"params": state.params})
    train_labels = data.train.labels
    summaries: dict[str, dict[str, Any]] = {"dev": {}, "test": {}}
    baseline = {}
    for split, encoded in data.dev.items():
        assert encoded.labels is not None
        report_name = task.dev_splits[split]
        baseline[report_name] = glue_metrics.constant_baseline(task, encoded.labels, train_labels)
        summaries["dev"][report_name] = glue_metrics.prediction_summary(
            task, kept[split], train_labels
        )
    test_predictions = {}
    for split, encoded in data.test.items():
        outputs = predict_split(tuner, state.params, encoded, settings.eval_batch_size, buckets)
        predictions = predictions_from_outputs(task, outputs)
        summaries["test"][split] = glue_metrics.prediction_summary(task, predictions, train_labels)
        test_predictions[split] = (list(encoded.guids), submission_strings(task, predictions))
    return FinetuneResult.of_run(
        task,
        settings,
        trained,
        len(data.train),
        time.time() - started,
        dev_baseline=baseline,
        prediction_summary=summaries,
        test_predictions=test_predictions,
    )
