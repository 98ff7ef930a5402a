"""The fine-tuning step loop every task shares (GLUE in `loop.py`, SQuAD and CoNLL-2003 in
`token_loop.py`): the checks before anything compiles, the paper's learning-rate schedule, the
steps over shuffled rows with the loss logged every `log_every` steps, and evaluation after every
epoch (`eval_every_epoch`) and at the end.

The optimizer has a unit schedule (`unit_schedule`): each step's learning rate is passed into
`train.update`, so one compiled step serves every rate of the schedule and of a sweep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core import optim, partitioning
from bert_jax.core.model import BertConfig
from bert_jax.core.train import TrainState
from bert_jax.finetune.features import epoch_end_steps, host_rows, train_order
from bert_jax.runtime.errors import UserError


def unit_schedule(count: jax.Array) -> jax.Array:
    del count
    return jnp.ones((), jnp.float32)


def run_config(encoder: Any, settings: Any, mesh: jax.sharding.Mesh) -> BertConfig:
    """The checks every fine-tuning run makes before compiling (batches that divide the mesh, a
    sequence the model holds, a vocabulary the embeddings hold); the encoder's config with the
    run's dropout."""
    partitioning.check_batch_divisible(settings.batch_size, mesh, "batch_size")
    partitioning.check_batch_divisible(settings.eval_batch_size, mesh, "eval_batch_size")
    if settings.max_seq_length > encoder.config.max_position_embeddings:
        raise UserError(
            f"max_seq_length={settings.max_seq_length} exceeds the model's "
            f"max_position_embeddings={encoder.config.max_position_embeddings}"
        )
    encoder.tokenizer.check_vocab_size(encoder.config.vocab_size)
    return encoder.config.replace(
        hidden_dropout_prob=settings.dropout, attention_probs_dropout_prob=settings.dropout
    )


class Tuner(Protocol):
    def global_batch(self, local_batch: Mapping[str, Any]) -> dict[str, jax.Array]: ...

    def train_step(self, state: TrainState, batch: Any, rng: jax.Array, learning_rate: float): ...


@dataclasses.dataclass
class Trained:
    state: TrainState
    train_loss: float  # over every step
    num_steps: int
    history: list[dict[str, Any]]  # {"step", "epoch", "dev"} per evaluation
    dev: Any  # the last evaluation's result


def run_steps(
    tuner: Tuner,
    state: TrainState,
    dropout_rng: jax.Array,
    settings: Any,
    count: int,
    rows_batch: Callable[[np.ndarray], Mapping[str, np.ndarray]],
    evaluate: Callable[[Any], Any],
    log: Callable[[str], None],
    name: str = "",
) -> Trained:
    """Trains on `count` rows (`rows_batch(row indices)` gives this host's batch) for
    `settings.epochs`; `evaluate(params)` after every epoch (with `eval_every_epoch`) and at the
    end. Log lines start with `name`."""
    prefix = f"{name} " if name else ""
    order = train_order(count, settings.epochs, settings.batch_size, settings.seed)
    num_steps = len(order)
    schedule = optim.warmup_linear_decay(
        settings.learning_rate, int(settings.warmup_proportion * num_steps), num_steps
    )
    learning_rates = np.asarray(schedule(jnp.arange(num_steps)), np.float32)
    eval_after = (
        set(epoch_end_steps(count, settings.epochs, settings.batch_size))
        if settings.eval_every_epoch
        else set()
    )
    history: list[dict[str, Any]] = []
    totals = window = dev = None
    for step in range(num_steps):
        batch = tuner.global_batch(rows_batch(host_rows(order[step])))
        state, step_metrics = tuner.train_step(
            state, batch, dropout_rng, float(learning_rates[step])
        )
        sums = {k: step_metrics[k] for k in ("loss_sum", "weight")}
        # Summed on device: nothing waits for a step until a log line needs the numbers.
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        window = sums if window is None else jax.tree.map(jnp.add, window, sums)
        done = step + 1
        if done % settings.log_every == 0 or done == num_steps:
            log(
                f"{prefix}step {done}/{num_steps} loss {_mean_loss(window):.4f} "
                f"lr {learning_rates[step]:.3g}"
            )
            window = None
        if done in eval_after or done == num_steps:
            dev = evaluate(state.params)
            epoch = min(done * settings.batch_size / count, settings.epochs)
            history.append({"step": done, "epoch": round(epoch, 3), "dev": dev})
            log(f"{prefix}step {done} dev {dev}")
    assert totals is not None
    return Trained(state, _mean_loss(totals), num_steps, history, dev)


def _mean_loss(sums: Mapping[str, jax.Array]) -> float:
    host = jax.device_get(sums)
    return float(host["loss_sum"]) / max(float(host["weight"]), 1.0)
