"""The fine-tuning step loop every task shares (GLUE in `sentence_tuning.py`, SQuAD and CoNLL-2003
in `token_tuning.py`): the checks before anything compiles, the optimizer and learning-rate
schedule of the chosen recipe (`settings.OPTIMIZERS`), the steps over shuffled rows (grouped by
length with `group_by_length`) with a progress line (loss, learning rate, rate, ETA) every
`log_every` steps (at least four times a run), evaluation after every epoch
(`eval_every_epoch`) and at the end, and one line on the shapes the run compiled.

Every recipe takes an epoch as `batches.steps_per_epoch` batches, the last one partial and
weighted by its real rows (the loss is a mean over them). The optimizer has a unit schedule
(`unit_schedule`): each step's learning rate is passed into `trainer.update`, so one compiled step
serves every rate of the schedule and of a sweep.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.core import attention, hf_adamw, optim, partitioning
from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.core.trainer import TrainState
from bert_jax.finetune.heads import modernbert_pooled
from bert_jax.finetune.tuning.batches import (
    Buckets,
    epoch_end_steps,
    steps_per_epoch,
    train_order,
)
from bert_jax.finetune.tuning.packing import Packing
from bert_jax.finetune.tuning.settings import OPTIMIZERS, FinetuneSettings
from bert_jax.runtime import step_buffers
from bert_jax.runtime.errors import UserError
from bert_jax.training.step_log import format_duration


def unit_schedule(count: jax.Array) -> jax.Array:
    del count
    return jnp.ones((), jnp.float32)


def make_optimizer(settings: FinetuneSettings) -> optax.GradientTransformation:
    """The recipe's optimizer (`settings.optimizer`, one of `OPTIMIZERS`) with its weight decay,
    clipping and bias correction, and a unit schedule (the step scales it by the learning rate).
    The loss reads the params through `loss_params`."""
    check_optimizer(settings)
    if settings.optimizer == "adamw-hf":
        return hf_adamw.torch_adamw(
            unit_schedule,
            eps=settings.adam_epsilon,
            weight_decay=settings.weight_decay,
            clip_norm=settings.clip_norm or None,
        )
    return optim.bert_adamw(
        unit_schedule,
        eps=settings.adam_epsilon,
        weight_decay=settings.weight_decay,
        clip_norm=settings.clip_norm or None,
        bias_correction=settings.adam_bias_correction,
    )


def loss_params(settings: FinetuneSettings, pad_token_id: int | None) -> Callable[[Any], Any]:
    """What a fine-tuning loss reads the params through: under "adamw-hf" the word embeddings'
    `pad_token_id` row gets no gradient, as `transformers`' BERT gives it none (it matters where
    the loss reads padding positions: SQuAD's softmax over the window), so the gradients and
    their clipped norm are transformers'; the params as they are otherwise."""
    if settings.optimizer != "adamw-hf" or pad_token_id is None:
        return lambda params: params
    return functools.partial(hf_adamw.no_gradient_to_padding_row, row=pad_token_id)


def check_optimizer(settings: FinetuneSettings) -> None:
    """The checks across settings (each alone is checked by its declaration): "adamw-hf" is
    transformers' recipe whole, so the original code's variants go with "bert" only."""
    name = settings.optimizer
    if name not in OPTIMIZERS:
        raise UserError(f"optimizer={name!r} is not one of {', '.join(OPTIMIZERS)}")
    if name == "adamw-hf" and not settings.adam_bias_correction:
        raise UserError(
            "optimizer='adamw-hf' is torch's AdamW, which always corrects the bias; "
            "adam_bias_correction=False goes with optimizer='bert'"
        )
    if name == "adamw-hf" and settings.decay_from != "warmup-end":
        raise UserError(
            "optimizer='adamw-hf' is transformers' schedule, which decays from the warmup's end; "
            f"decay_from={settings.decay_from!r} goes with optimizer='bert'"
        )


def warmup_steps(name: str, warmup_proportion: float, num_steps: int) -> int:
    """google-research/bert truncates the warmup's share of the steps; Hugging Face's Trainer
    rounds it up (TrainingArguments.get_warmup_steps)."""
    if name == "adamw-hf":
        return math.ceil(num_steps * warmup_proportion)
    return int(warmup_proportion * num_steps)


def learning_rates(settings: FinetuneSettings, num_steps: int) -> np.ndarray:
    """The learning rate of every step of a run, [num_steps] float32: a linear warmup over the
    recipe's warmup steps, then a linear decay to 0 measured as `settings.decay_from` says."""
    warmup = warmup_steps(settings.optimizer, settings.warmup_proportion, num_steps)
    schedule = optim.warmup_decay(
        settings.learning_rate,
        warmup,
        num_steps,
        from_warmup_end=settings.decay_from == "warmup-end",
    )
    # Compiled as one program: run op by op, its eight operations compile one by one.
    return np.asarray(jax.jit(schedule)(np.arange(num_steps)), np.float32)


def run_config(
    encoder: Any, settings: FinetuneSettings, mesh: jax.sharding.Mesh
) -> BertConfig | ModernBertConfig:
    """The checks every fine-tuning run makes before compiling (a known optimizer, batches that
    divide the mesh, a sequence the model holds, a vocabulary the embeddings hold); the encoder's
    config, of either family, with every dropout rate at the run's `dropout` and its masks from
    the run's `dropout_impl`."""
    check_optimizer(settings)
    partitioning.check_batch_divisible(settings.batch_size, mesh, "batch_size")
    partitioning.check_batch_divisible(settings.eval_batch_size, mesh, "eval_batch_size")
    config = encoder.config  # both families name the two sizes as transformers does
    if settings.max_seq_length > config.max_position_embeddings:
        raise UserError(
            f"max_seq_length={settings.max_seq_length} exceeds the model's "
            f"max_position_embeddings={config.max_position_embeddings}"
        )
    encoder.tokenizer.check_vocab_size(config.vocab_size)
    if (
        config.attention_impl == "pallas"
        and settings.dropout_impl != "hash"
        and settings.dropout > 0.0
        and attention.pallas_mode() is not None
    ):
        raise UserError(
            f"dropout_impl={settings.dropout_impl!r} (--dropout-impl): the model's "
            "attention_impl='pallas' draws attention dropout with the hash; fine-tune with "
            "--dropout-impl hash"
        )
    if isinstance(config, ModernBertConfig):
        config = modernbert_pooled.with_dropout(config, settings.dropout)
    else:
        config = config.replace(
            hidden_dropout_prob=settings.dropout, attention_probs_dropout_prob=settings.dropout
        )
    return config.replace(dropout_impl=settings.dropout_impl)


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
    # The steps' wall time: from the first step (its program compiled, the state made) to the
    # last step's end, evaluation left out (what a peer's training loop alone takes).
    train_seconds: float | None = None


def run_steps(
    tuner: Tuner,
    state: TrainState | Callable[[], TrainState],
    dropout_rng: jax.Array,
    settings: Any,
    count: int,
    rows_batch: Callable[[np.ndarray], Mapping[str, np.ndarray]],
    evaluate: Callable[[Any], Any],
    log: Callable[[str], None],
    name: str = "",
    lengths: np.ndarray | None = None,
    buckets: Buckets | Packing | None = None,
    predict_ahead: Mapping[str, np.ndarray] | None = None,
    while_compiling: Callable[[], object] | None = None,
) -> Trained:
    """Trains on `count` rows (`rows_batch(global row indices)` gives this host's batch: see
    `batches.gather_rows`) for `settings.epochs`, from `state`, or from what `state()` makes
    once the first batch's step is compiled (`tuner.compile_train_step`, on another thread, with
    the predict step for `predict_ahead`, this host's first evaluation batch, lowered before it
    and compiling beside it, and `while_compiling()` on this thread: reading the encoder's
    params, say) and its compiler's freed memory is handed back;
    `evaluate(params)` after every epoch (with `eval_every_epoch`) and at the end. Log lines start
    with `name`. `lengths`: each row's real tokens (`batches.row_lengths`), which
    `group_by_length` orders by; `buckets`: the run's (length buckets, or its `packing.Packing`,
    which chooses its sequence counts from the whole order first), whose compiled shapes are
    logged once at the end."""
    prefix = f"{name} " if name else ""
    if settings.group_by_length and lengths is None:
        raise ValueError("group_by_length needs the rows' lengths")
    order = train_order(
        count,
        settings.epochs,
        settings.batch_size,
        settings.seed,
        lengths if settings.group_by_length else None,
    )
    num_steps = len(order)
    if isinstance(buckets, Packing):  # its sequence counts, from the whole run's batches
        buckets.plan(order)
    rates = learning_rates(settings, num_steps)
    per_epoch = steps_per_epoch(count, settings.batch_size)
    progress = Progress(num_steps, settings.batch_size)
    every = log_interval(settings.log_every, num_steps)
    eval_after = (
        set(epoch_end_steps(count, settings.epochs, settings.batch_size))
        if settings.eval_every_epoch
        else set()
    )
    history: list[dict[str, Any]] = []
    totals = window = dev = None
    first = tuner.global_batch(rows_batch(order[0]))
    if callable(state):
        pool = concurrent.futures.ThreadPoolExecutor(2, "compile-ahead")
        try:
            # Tracing is Python under the GIL, one thread at a time, and XLA compiles outside it:
            # the predict step is traced first (a forward pass, a fraction of the train step's
            # trace) and XLA compiles it on the other core while the train step is traced, which
            # otherwise ran on one core alone; traced side by side instead, the two made the
            # first step ~1 s later.
            compiling = []
            if predict_ahead is not None:
                predict_lowered = threading.Event()
                ahead = tuner.global_batch(predict_ahead)
                compiling.append(pool.submit(tuner.compile_predict_step, ahead, predict_lowered))
                predict_lowered.wait()
            lowered = threading.Event()
            compiling.insert(0, pool.submit(tuner.compile_train_step, first, dropout_rng, lowered))
            lowered.wait()
            # What makes the state compiles here, while this thread would wait anyway: made
            # after the compile, the state then costs its transfers, not two more compiles.
            tuner.compile_init(dropout_rng)
            if while_compiling is not None:
                while_compiling()
            # The state is made once the train step is compiled and malloc has handed back what
            # its compiler freed: XLA's working memory while compiling it was the run's peak, and
            # the state made beside it added its size (SST-2 on all-MiniLM-L6-v2: 1.09-1.24 GB
            # peak beside in 4 runs, 0.94 GB after in 2).
            compiling[0].result()
            step_buffers.release_freed_memory()
            state = state()
            for done in compiling:
                done.result()
        finally:  # an error is raised without waiting for the predict step's compile
            pool.shutdown(wait=False, cancel_futures=True)
    training = time.perf_counter()
    evaluating_seconds = 0.0
    with step_buffers.keep_step_buffers():  # each step reuses the last one's temporaries
        for step in range(num_steps):
            batch = first if step == 0 else tuner.global_batch(rows_batch(order[step]))
            state, step_metrics = tuner.train_step(state, batch, dropout_rng, float(rates[step]))
            sums = {k: step_metrics[k] for k in ("loss_sum", "weight")}
            # Summed on device: where programs run asynchronously, nothing waits for a step
            # until a log line needs the numbers.
            totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
            window = sums if window is None else jax.tree.map(jnp.add, window, sums)
            done = step + 1
            if done % every == 0 or done == num_steps or progress.due():
                loss = _mean_loss(window)  # waits for the step: the clock reads finished work
                log(f"{prefix}{progress.line(done, loss, float(rates[step]))}")
                window = None
            if done in eval_after or done == num_steps:
                jax.block_until_ready(state.params)  # the steps' time ends here
                evaluating = time.perf_counter()
                dev = evaluate(state.params)
                progress.pause(time.perf_counter() - evaluating)
                evaluating_seconds += time.perf_counter() - evaluating
                epoch = min(done / per_epoch, settings.epochs)
                history.append({"step": done, "epoch": round(epoch, 3), "dev": dev})
                log(f"{prefix}step {done} dev: {figures(dev, name)}")
    assert totals is not None
    if buckets is not None:
        log(f"{prefix}{buckets.summary()}")
    return Trained(
        state,
        _mean_loss(totals),
        num_steps,
        history,
        dev,
        train_seconds=time.perf_counter() - training - evaluating_seconds,
    )


def in_order(*calls: Callable[[], object] | None) -> Callable[[], None]:
    """One `while_compiling` for `run_steps` from several (None: nothing), called in order."""

    def call_each() -> None:
        for call in calls:
            if call is not None:
                call()

    return call_each


def log_interval(log_every: int, num_steps: int) -> int:
    """Steps between progress lines: `log_every`, or fewer where a run is short, so that every
    run shows at least four lines (39 steps at log_every 100: every 10)."""
    return max(1, min(log_every, math.ceil(num_steps / 4)))


class Progress:
    """A run's progress line, in the style of pretraining's: step, loss, learning rate, the rate
    since the last line (steps and examples a second) and the time left at the run's rate so far
    (evaluation time excluded; the first line's rate includes compilation). A line is due at
    least every `every_seconds`, so a slow run shows progress between `log_every` steps."""

    every_seconds = 60.0

    def __init__(self, num_steps: int, batch_size: int):
        self.num_steps = num_steps
        self.batch_size = batch_size
        self.start = self.last = time.perf_counter()
        self.last_step = 0
        self.paused = 0.0

    def due(self) -> bool:
        return time.perf_counter() - self.last >= self.every_seconds

    def pause(self, seconds: float) -> None:
        """Time spent outside the steps (evaluation), left out of the rates."""
        self.paused += seconds
        self.last += seconds

    def line(self, done: int, loss: float, learning_rate: float) -> str:
        now = time.perf_counter()
        rate = (done - self.last_step) / max(now - self.last, 1e-9)
        per_step = (now - self.start - self.paused) / max(done, 1)
        self.last, self.last_step = now, done
        return (
            f"step {done}/{self.num_steps} loss {loss:.4f} lr {learning_rate:.3g} "
            f"{rate:.2f} steps/s {rate * self.batch_size:.1f} examples/s "
            f"ETA {format_duration(per_step * (self.num_steps - done))}"
        )


def _mean_loss(sums: Mapping[str, jax.Array]) -> float:
    host = jax.device_get(sums)
    return float(host["loss_sum"]) / max(float(host["weight"]), 1.0)


def figures(metrics: Mapping[str, Any], task: str = "") -> str:
    """`accuracy 84.31, f1 88.10`: each figure labelled and rounded; a split's own table
    (GLUE's `{"MNLI-m": {...}}`) one level down, named unless it is the task's."""
    shown = []
    for name, value in metrics.items():
        if isinstance(value, Mapping):
            prefix = "" if name == task else f"{name} "
            shown += [f"{prefix}{text}" for text in _labelled(value)]
        else:
            shown += _labelled({name: value})
    return ", ".join(shown) or "(no figures)"


def _labelled(metrics: Mapping[str, Any]) -> list[str]:
    return [
        f"{name} {value:.2f}" if isinstance(value, float) else f"{name} {value}"
        for name, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
