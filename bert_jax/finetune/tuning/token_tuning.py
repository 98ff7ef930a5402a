"""The fine-tuning loop for heads on every token (SQuAD spans, CoNLL-2003 tags), on the mesh.

The recipe and the machinery are GLUE's: `FinetuneSettings`, the shared step loop
(`tuning_loop.run_steps`: BERT AdamW with a unit schedule, the learning rate passed in per step,
warmup over the first 10% then linear decay) and `head_tuner.HeadTuner` (shardings, global batches,
a donated state, the encoder placed from the model directory and a fresh head initialised on its
own). What differs is the model (`per_token.BertForTokenOutputs`, or for a ModernBERT encoder
`per_token.ModernBertForTokenOutputs`, transformers' ModernBertForQuestionAnswering and
ModernBertForTokenClassification), the loss (`span_loss` or `token_loss`) and what prediction
returns (logits at every position, handed to the task's own post-processing).

Padding positions are masked out of the per-token outputs (`masked_padding`: their logits are
`PADDING_LOGIT`), so the span softmax runs over the window's real tokens only. google-research/bert
and transformers' BertForQuestionAnswering run it over the padding as well, which makes their loss
depend on how far a batch is padded (to max_seq_length, or to its longest row with transformers'
data collator); masked, a batch's loss, gradients and logits are the same at every bucket.
Packed (`tuning/packing.py`: several windows or sentences in one sequence, each attending to its
own), the span softmax of each slot runs over that slot's own tokens (`slot_rows`), so a packed
step computes what the bucketed one does.

A run is deterministic given its seed (head initialisation, shuffling, dropout).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core import partitioning
from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.finetune.heads.modernbert_pooled import ModernBertClassifierHead
from bert_jax.finetune.heads.per_token import (
    BertForTokenOutputs,
    ModernBertForTokenOutputs,
    span_loss,
    token_loss,
)
from bert_jax.finetune.heads.pooled import ClassifierHead
from bert_jax.finetune.tuning import packing, tuning_loop
from bert_jax.finetune.tuning.batches import (
    Buckets,
    bucket_lengths,
    gather_rows,
    row_lengths,
)
from bert_jax.finetune.tuning.head_tuner import HeadTuner, SumsFn
from bert_jax.finetune.tuning.packing import TOKEN_PACKING_KEYS, Packing, packing_inputs
from bert_jax.finetune.tuning.settings import FinetuneSettings, PretrainedEncoder

Array = jax.Array
SPAN = "span"
TAGS = "tags"
MODEL_KEYS = ("input_ids", "input_mask", "segment_ids")
# The per-row training targets each kind of head reads (a span's: positions in its row).
TARGET_KEYS = {SPAN: packing.ROW_POSITION_KEYS, TAGS: ("labels", "label_weights")}


TokenModel = BertForTokenOutputs | ModernBertForTokenOutputs
# The logit of every output at a padding position: no softmax over positions (the span's) or
# classes gives it weight, and no top-n of positions picks it. Finite, so that a loss that
# multiplies a padding position by weight 0 stays 0.
PADDING_LOGIT = -1e4

__all__ = ["gather_rows"]  # the gather every task's batches use (`batches.gather_rows`)


def masked_padding(logits_BxLxC: Array, input_mask_BxL: Array) -> Array:
    """Per-token outputs with every padding position's set to `PADDING_LOGIT`."""
    real = input_mask_BxL[..., None] != 0
    return jnp.where(real, logits_BxLxC, jnp.asarray(PADDING_LOGIT, logits_BxLxC.dtype))


def slot_rows(logits_SxLxC: Array, packed_segment_ids_SxL: Array, slots: int) -> Array:
    """A packed batch's per-token outputs as one row per slot, [sequences x slots, L, C]: its
    sequence's outputs at the slot's own tokens (`packed_segment_ids` slot + 1), `PADDING_LOGIT`
    at every other position (padding and the other slots' rows), as `masked_padding` leaves an
    unpacked row's. A slot's targets are positions in its sequence (`packing.ROW_POSITION_KEYS`)."""
    ids = jnp.arange(1, slots + 1, dtype=packed_segment_ids_SxL.dtype)
    own_SxKxL = packed_segment_ids_SxL[:, None, :] == ids[None, :, None]
    fill = jnp.asarray(PADDING_LOGIT, logits_SxLxC.dtype)
    rows = jnp.where(own_SxKxL[..., None], logits_SxLxC[:, None], fill)
    return rows.reshape(-1, *rows.shape[2:])


def head_loss_fn(model: TokenModel, kind: str) -> SumsFn:
    """The head's loss sums on a (micro-)batch (`HeadTuner`'s `sums_fn`: its loss is their
    "loss_sum" over the whole batch's weight: its rows', or its labelled tokens' for tags)."""

    def loss_fn(params, batch, dropout_rng):
        logits = model.apply(
            {"params": params},
            *(batch[key] for key in MODEL_KEYS),
            deterministic=False,
            rngs={"dropout": dropout_rng},
            **packing_inputs(batch, TOKEN_PACKING_KEYS),
        )
        logits = masked_padding(logits, batch["input_mask"])
        if kind == SPAN:
            weights = batch["weights"]
            if "packed_segment_ids" in batch:  # [sequences, slots] targets: one row a slot
                logits = slot_rows(logits, batch["packed_segment_ids"], weights.shape[-1])
            return span_loss(
                logits,
                batch["start_positions"].reshape(-1),
                batch["end_positions"].reshape(-1),
                weights.reshape(-1),
            )
        return token_loss(logits, batch["labels"], batch["label_weights"])

    return loss_fn


def _predict(params: Any, batch: Mapping[str, Array], *, model: TokenModel) -> Array:
    logits = model.apply(
        {"params": params},
        *(batch[key] for key in MODEL_KEYS),
        deterministic=True,
        **packing_inputs(batch, TOKEN_PACKING_KEYS),
    )
    return masked_padding(logits, batch["input_mask"])


class TokenTuner(HeadTuner):
    """`BertForTokenOutputs` (or `ModernBertForTokenOutputs`, whose head dropout is its config's
    `classifier_dropout`, set here to `head_dropout`), its loss, optimizer, mesh and rules,
    compiled once (see `token_tuner` for a cached instance)."""

    def __init__(
        self,
        config: BertConfig | ModernBertConfig,
        num_outputs: int,
        kind: str,
        mesh: jax.sharding.Mesh,
        head_dropout: float,
        settings: FinetuneSettings,
    ):
        if kind not in TARGET_KEYS:
            raise ValueError(f"unknown head kind {kind!r}; one of {sorted(TARGET_KEYS)}")
        self.kind = kind
        if isinstance(config, ModernBertConfig):
            config = config.replace(classifier_dropout=head_dropout)
            model = ModernBertForTokenOutputs(config, num_outputs)
            head = ModernBertClassifierHead(config, num_outputs)
        else:
            model = BertForTokenOutputs(config, num_outputs, head_dropout)
            head = ClassifierHead(config, num_outputs, head_dropout)
        super().__init__(
            model,
            head,
            jnp.zeros((1, 1, config.hidden_size), jnp.float32),  # every token's output
            head_loss_fn(model, kind),
            _predict,
            mesh,
            settings,
        )


def token_tuner(
    config: BertConfig | ModernBertConfig,
    num_outputs: int,
    kind: str,
    mesh: jax.sharding.Mesh,
    head_dropout: float,
    settings: FinetuneSettings,
) -> TokenTuner:
    """A TokenTuner shared by every caller with the same model, head and settings of the step."""
    return _token_tuner(config, num_outputs, kind, mesh, head_dropout, settings.step_settings())


@functools.lru_cache(maxsize=8)
def _token_tuner(config, num_outputs, kind, mesh, head_dropout, settings) -> TokenTuner:
    return TokenTuner(config, num_outputs, kind, mesh, head_dropout, settings)


def predict_logits(
    tuner: Any,
    params: Any,
    arrays: Mapping[str, np.ndarray],
    batch_size: int,
    keys: Sequence[str] = MODEL_KEYS,
    buckets: Buckets | Packing | None = None,
) -> np.ndarray:
    """Logits [N, ...] for every row of `arrays`, in their order: `tuner` is anything with
    `global_batch` and `predict(params, batch)`; `keys` are the arrays its model reads. Rows are
    predicted in batches of similar length (`batches.predict_batches`), each padded to its bucket
    (`buckets`: the run's; default `batches.bucket_lengths` of the stored length), or packed
    (the run's `packing.Packing`); per-token outputs ([N, L, ...]) come back at the stored
    length L, `PADDING_LOGIT` past each row's."""
    inputs = {key: arrays[key] for key in keys}
    if isinstance(buckets, Packing):
        return buckets.predict(
            inputs, lambda batch: tuner.predict(params, tuner.global_batch(batch)), PADDING_LOGIT
        )
    stored = inputs["input_ids"].shape[-1]
    buckets = buckets or Buckets(bucket_lengths(stored))
    outputs = None
    for rows, batch in buckets.predicting(inputs, batch_size):
        length = batch["input_ids"].shape[-1]
        logits = np.asarray(tuner.predict(params, tuner.global_batch(batch)))
        if logits.ndim >= 3:  # per token: back to the stored length
            padding = [(0, 0), (0, stored - length)] + [(0, 0)] * (logits.ndim - 2)
            logits = np.pad(logits, padding, constant_values=PADDING_LOGIT)
        if outputs is None:
            outputs = np.zeros((len(inputs["input_ids"]), *logits.shape[1:]), logits.dtype)
        outputs[rows[rows >= 0]] = logits[rows >= 0]
    assert outputs is not None, "no rows to predict"
    return outputs


@dataclasses.dataclass
class TokenRun:
    """What `train_and_evaluate` returns: the shared loop's outcome (what the task's run builds its
    `result.FinetuneResult` from) and the logits its output files are written from."""

    trained: tuning_loop.Trained
    seconds: float  # from the tuner's creation to the last prediction
    num_train_features: int  # the training rows (windows)
    logits: np.ndarray  # the last evaluation's, of `eval_arrays`
    final_logits: dict[str, np.ndarray]  # by name, of each of `final_arrays`


def train_and_evaluate(
    encoder: PretrainedEncoder,
    kind: str,
    num_outputs: int,
    train_arrays: Mapping[str, np.ndarray],
    evaluate: Callable[[np.ndarray], dict[str, float]],
    eval_arrays: Mapping[str, np.ndarray],
    settings: FinetuneSettings,
    head_dropout: float,
    log: Callable[[str], None],
    final_arrays: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    on_trained: Callable[[Mapping[str, Any]], None] | None = None,
    while_compiling: Callable[[], object] | None = None,
) -> TokenRun:
    """Fine-tune on `train_arrays`; `evaluate(logits of eval_arrays)` at the end (and after every
    epoch with `settings.eval_every_epoch`). Returns the loop's outcome (the last metrics,
    history, loss and steps), the final eval logits for the caller's output files and those of
    each of `final_arrays` (e.g. a test split), predicted once at the end. `mesh` defaults to
    one of `settings.mesh_shape` over every device. `on_trained`, when given, receives
    {"params": the trained params} (the model to keep); `while_compiling`, when given, runs
    after the encoder's params are read, while the first step compiles (what the caller needs
    later, imported ahead: `run_report.load_plotting`)."""
    started = time.time()
    mesh = mesh if mesh is not None else partitioning.make_mesh(settings.mesh_shape)
    config = tuning_loop.run_config(encoder, settings, mesh)
    tuner = token_tuner(config, num_outputs, kind, mesh, head_dropout, settings)
    init_rng, dropout_rng = jax.random.split(jax.random.key(settings.seed))
    count = len(train_arrays["input_ids"])
    inputs = {key: train_arrays[key] for key in (*MODEL_KEYS, *TARGET_KEYS[kind])}
    kept: dict[str, np.ndarray] = {}
    packed = [inputs, eval_arrays, *(final_arrays or {}).values()]
    buckets = packing.batches_for(settings, packed, mesh)

    def predicted(params, arrays):
        return predict_logits(tuner, params, arrays, settings.eval_batch_size, buckets=buckets)

    def evaluate_params(params):
        kept["logits"] = predicted(params, eval_arrays)
        return evaluate(kept["logits"])

    trained = tuning_loop.run_steps(
        tuner,
        lambda: tuner.init(init_rng, encoder.bert_params),
        dropout_rng,
        settings,
        count,
        lambda rows: buckets.gather(inputs, rows),
        evaluate_params,
        log,
        lengths=row_lengths(inputs["input_mask"]),
        buckets=buckets,
        predict_ahead=packing.first_predict_batch(
            {key: eval_arrays[key] for key in MODEL_KEYS}, settings.eval_batch_size, buckets
        ),
        while_compiling=tuning_loop.in_order(encoder.read_params, while_compiling),
    )
    if on_trained is not None:
        on_trained({"params": trained.state.params})
    final_logits = {
        name: predicted(trained.state.params, arrays)
        for name, arrays in (final_arrays or {}).items()
    }
    return TokenRun(trained, time.time() - started, count, kept["logits"], final_logits)
