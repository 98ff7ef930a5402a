"""`bert-jax finetune --task conll2003 --features VARIANT`: the feature-based approach (Table 7).

The CoNLL-2003 task of `squad_and_conll` (same reader, windows, first-sub-token labels, conlleval
scores and output files: dev/test_predictions.txt, result.json, results.md, plots/conll2003.png),
with BERT frozen: `lstm_tagger.BiLstmTagger` trains on `lstm_tagger.word_features` of the
chosen variant. Only the tagger's parameters are in the train state (no gradient, no optimizer
slot and no weight decay ever touch BERT); the encoder's params enter every step as a replicated
argument, and the features are computed there, so no per-layer copy of the data is kept.

The paper gives no recipe for the tagger; the registered one (`conll.TASKS`): Adam (BERT AdamW,
decay 0.01) at lr 1e-3 with warmup and linear decay, batch 32, 3 epochs, dropout 0.1,
max_seq_length 128.
"""

from __future__ import annotations

import dataclasses
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

from bert_jax.core import partitioning, trainer
from bert_jax.core.model import BertConfig
from bert_jax.core.trainer import TrainState
from bert_jax.finetune.heads import lstm_tagger as feature_tagger
from bert_jax.finetune.heads.lstm_tagger import BiLstmTagger
from bert_jax.finetune.heads.per_token import token_loss
from bert_jax.finetune.reports import run_report
from bert_jax.finetune.runs import workdir as finetune_workdir
from bert_jax.finetune.tasks import conll as ner
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.batches import Buckets, row_lengths
from bert_jax.finetune.tuning.result import FinetuneResult
from bert_jax.finetune.tuning.settings import FinetuneSettings, PretrainedEncoder, load_pretrained
from bert_jax.finetune.tuning.settings import task_settings as settings_for
from bert_jax.finetune.tuning.token_tuning import predict_logits
from bert_jax.runtime import fs
from bert_jax.runtime import outputs as files

logger = logging.getLogger(__name__)
Array = jax.Array
_KEYS = ("input_ids", "input_mask", "segment_ids", "word_positions", "word_counts")
# The registered feature-based CoNLL-2003 task and its recipe.
TASK = next(task for task in ner.TASKS if task.feature_based)
DEFAULTS = dict(TASK.defaults)


def task_settings(overrides: Mapping[str, Any]) -> FinetuneSettings:
    return settings_for(TASK, overrides)


class FeatureTuner(trainer.ShardedSteps):
    """The tagger's state on a mesh (replicated: it is small), batches split over the batch
    axes, the frozen encoder's params passed into each step."""

    def __init__(
        self,
        config: BertConfig,
        variant: str,
        num_labels: int,
        lstm_size: int,
        mesh: jax.sharding.Mesh,
        settings: FinetuneSettings,
    ):
        self.config = config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        mode, self.layers = feature_tagger.variant_layers(variant, config.num_hidden_layers)
        self.tagger = BiLstmTagger(num_labels, mode, lstm_size, dropout_rate=settings.dropout)
        self.tx = tuning_loop.make_optimizer(settings)
        features = jnp.zeros((1, 2, len(self.layers), config.hidden_size), jnp.float32)

        def init_fn(rng):
            params = self.tagger.init(rng, features, jnp.full((1,), 2, jnp.int32))["params"]
            return TrainState.create(params, self.tx)

        super().__init__(init_fn, mesh)
        self._init = jax.jit(init_fn, out_shardings=self.state_shardings)
        self._train_step = self.jit_train_step(self._step, num_scalars=3)  # rng, lr, encoder
        self._predict_step = jax.jit(
            self._predict,
            in_shardings=(self.state_shardings.params, self.batch_sharding, self.replicated),
            out_shardings=self.replicated,
        )

    def _features(self, bert_params, batch):
        return feature_tagger.word_features(
            bert_params, batch, config=self.config, layers=self.layers
        )

    def _step(self, state, batch, rng, learning_rate, bert_params):
        features = self._features(bert_params, batch)

        def loss_fn(params, batch, dropout_rng):
            logits = self.tagger.apply(
                {"params": params},
                features,
                batch["word_counts"],
                deterministic=False,
                rngs={"dropout": dropout_rng},
            )
            sums = token_loss(logits, batch["labels"], batch["label_weights"])
            return sums["loss_sum"] / jnp.maximum(sums["weight"], 1.0), sums

        return trainer.update(state, batch, rng, learning_rate, loss_fn=loss_fn, tx=self.tx)

    def _predict(self, params, batch, bert_params):
        features = self._features(bert_params, batch)
        return self.tagger.apply({"params": params}, features, batch["word_counts"])

    def init(self, rng: Array) -> TrainState:
        return self._init(rng)

    def train_step(self, state, batch, rng, learning_rate, bert_params):
        return self.call(
            self._train_step, state, batch, rng, jnp.float32(learning_rate), bert_params
        )

    def predict(self, params, batch, bert_params) -> Array:
        return self.call(self._predict_step, params, batch, bert_params)


def feature_tuner(config, variant, num_labels, lstm_size, mesh, settings) -> FeatureTuner:
    """A FeatureTuner shared by every caller with the same tagger and settings of the step."""
    return _feature_tuner(config, variant, num_labels, lstm_size, mesh, settings.step_settings())


@functools.lru_cache(maxsize=2)
def _feature_tuner(config, variant, num_labels, lstm_size, mesh, settings) -> FeatureTuner:
    return FeatureTuner(config, variant, num_labels, lstm_size, mesh, settings)


@dataclasses.dataclass
class _BoundTuner:
    """`tuning_loop.run_steps`' view of a FeatureTuner: the encoder's params bound to every step."""

    tuner: FeatureTuner
    bert_params: Any

    def global_batch(self, local_batch):
        return self.tuner.global_batch(local_batch)

    def train_step(self, state, batch, rng, learning_rate):
        return self.tuner.train_step(state, batch, rng, learning_rate, self.bert_params)

    def predict(self, params, batch):
        return self.tuner.predict(params, batch, self.bert_params)


def run_feature_ner(
    model: str | PretrainedEncoder,
    data: str,
    workdir: str,
    variant: str,
    settings: FinetuneSettings | None = None,
    document_context: bool = False,
    lstm_size: int = 768,
    log: Callable[[str], None] | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> dict[str, Any]:
    """Train the tagger on frozen `variant` features and write the workdir's files (those of the
    fine-tuned CoNLL-2003 task); returns result.json's content."""
    log = log or logger.info
    settings = settings or task_settings({})
    feature_tagger.check_variant(variant)
    ner.check_files(data)
    train_split, dev, test = (ner.read_split(data, split) for split in ("train", "dev", "test"))
    finetune_workdir.check_workdir(workdir)
    encoder = load_pretrained(model, single_run=True) if isinstance(model, str) else model
    started = time.time()
    labels = ner.label_list(train_split)
    iob1 = ner.uses_iob1(train_split)
    mesh = mesh if mesh is not None else partitioning.make_mesh(settings.mesh_shape)
    config = tuning_loop.run_config(encoder, settings, mesh)
    length = settings.max_seq_length

    def prepared(sentences):
        windows = ner.build_features(sentences, encoder.tokenizer, labels, length, document_context)
        return windows, feature_tagger.word_arrays(windows, length)

    (train_windows, train_arrays), (dev_windows, dev_arrays) = prepared(train_split), prepared(dev)
    log(f"CoNLL-2003 features={variant}: {len(train_split)} train sentences, {labels}")
    tuner = feature_tuner(config, variant, len(labels), lstm_size, mesh, settings)
    encoder_params = {k: v for k, v in encoder.bert_params.items() if k != "pooler"}
    bound = _BoundTuner(tuner, jax.device_put(encoder_params, tuner.replicated))
    init_rng, dropout_rng = jax.random.split(jax.random.key(settings.seed))
    kept: dict[str, Any] = {}
    # At the stored length: the tagger's LSTM reads every word position, padding included.
    buckets = Buckets((length,))

    def score(sentences, windows, arrays, params):
        words = predict_logits(bound, params, arrays, settings.eval_batch_size, _KEYS, buckets)
        logits = feature_tagger.token_logits(words, arrays, length)
        predicted = ner.predicted_tags(sentences, windows, logits, labels, iob1)
        return ner.conlleval([s.tags for s in sentences], predicted), predicted

    def evaluate(params):
        metrics, kept["dev"] = score(dev, dev_windows, dev_arrays, params)
        return metrics

    inputs = {key: train_arrays[key] for key in (*_KEYS, "labels", "label_weights")}
    trained = tuning_loop.run_steps(
        bound,
        tuner.init(init_rng),
        dropout_rng,
        settings,
        len(train_windows),
        lambda rows: buckets.gather(inputs, rows),
        evaluate,
        log,
        name=f"conll2003[{variant}]",
        lengths=row_lengths(inputs["input_mask"]),
        buckets=buckets,
    )
    outputs = {"dev_predictions.txt": ner.conll_text(dev, kept["dev"])}
    details: dict[str, Any] = {}
    if test is not None:
        test_windows, test_arrays = prepared(test)
        params = trained.state.params
        details["test_metrics"], predicted = score(test, test_windows, test_arrays, params)
        outputs["test_predictions.txt"] = ner.conll_text(test, predicted)
    details.update(
        features=variant,
        layers=list(tuner.layers),
        lstm_size=lstm_size,
        layer_weights=_layer_weights(trained.state.params),
        num_train_features=len(train_windows),
        labels=list(labels),
    )
    finished = FinetuneResult.of_run(
        TASK, settings, trained, len(train_split), time.time() - started, details=details
    )
    result = finished.to_json()
    result.update(
        model=fs.abspath(model) if isinstance(model, str) else encoder.source,
        data=data,
        options={"document_context": document_context},
        finished_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    if jax.process_index() == 0:
        workdir = finetune_workdir.open_workdir(workdir, "finetune")
        for name, text in outputs.items():
            files.write_bytes_atomic(os.path.join(workdir, name), text.encode("utf-8"))
        markdown = run_report.results_markdown(result) + run_report.feature_line(result)
        files.write_bytes_atomic(os.path.join(workdir, "results.md"), markdown.encode("utf-8"))
        fs.makedirs(os.path.join(workdir, "plots"), exist_ok=True)
        run_report.plot_history(os.path.join(workdir, "plots", "conll2003.png"), result)
        files.write_json_atomic(os.path.join(workdir, "result.json"), result)
    return result


def _layer_weights(params) -> list[float] | None:
    """The learned mix (softmax weights), for the record; None for pick and concat."""
    mix = nn.meta.unbox(params).get("mix", {})
    if "layer_weights" not in mix:
        return None
    return [float(w) for w in jax.nn.softmax(jnp.asarray(mix["layer_weights"]))]
