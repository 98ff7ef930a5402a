"""TrainState, the pure pretraining step and its sharded, jitted form.

`train_step(state, batch, rng) -> (state, metrics)` is a pure function; `model`, `tx` and `schedule`
are bound with functools.partial. Metrics are sums and weights (see losses.py) plus the gradient
norm and learning rate; a step whose loss or gradient is not finite leaves the state untouched
except for the step counter and is counted in `skipped`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax import losses, partitioning
from bert_jax.model import BertConfig, BertForPreTraining

Array = jax.Array
Batch = Mapping[str, Array]


@flax.struct.dataclass
class TrainState:
    step: Array
    params: Any
    opt_state: Any
    # Updates skipped because the loss or a gradient was not finite (total over the run).
    skipped: Array


def model_inputs(batch: Batch) -> dict[str, Array]:
    """The model's keyword inputs from a pretraining batch (packed-row keys when present)."""
    names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
    optional = ("position_ids", "packed_segment_ids", "cls_positions")
    out = {name: batch[name] for name in names}
    out.update({name: batch[name] for name in optional if name in batch})
    return out


def dummy_batch(batch_size: int, seq_len: int, max_predictions: int) -> dict[str, Array]:
    """A shape-only batch for initialization and compilation."""
    return {
        "input_ids": jnp.zeros((batch_size, seq_len), jnp.int32),
        "input_mask": jnp.ones((batch_size, seq_len), jnp.int32),
        "segment_ids": jnp.zeros((batch_size, seq_len), jnp.int32),
        "masked_lm_positions": jnp.zeros((batch_size, max_predictions), jnp.int32),
        "masked_lm_ids": jnp.zeros((batch_size, max_predictions), jnp.int32),
        "masked_lm_weights": jnp.zeros((batch_size, max_predictions), jnp.float32),
        "next_sentence_labels": jnp.zeros((batch_size,), jnp.int32),
    }


def init_state(
    rng: Array, model: BertForPreTraining, tx: optax.GradientTransformation
) -> TrainState:
    """A TrainState whose params (and optimizer slots) keep their logical-partitioning boxes."""
    batch = dummy_batch(1, 8, 2)
    variables = model.init({"params": rng}, **model_inputs(batch), deterministic=True)
    params = variables["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        skipped=jnp.zeros((), jnp.int32),
    )


def compute_sums(
    params: Any,
    batch: Batch,
    model: BertForPreTraining,
    deterministic: bool,
    dropout_rng: Array | None = None,
) -> dict[str, Array]:
    rngs = None if deterministic else {"dropout": dropout_rng}
    outputs = model.apply(
        {"params": params}, **model_inputs(batch), deterministic=deterministic, rngs=rngs
    )
    nsp_weights = batch.get("next_sentence_weights")
    return {
        **losses.masked_lm(
            outputs.get("mlm_logits_padded", outputs["mlm_logits"]),
            batch["masked_lm_ids"],
            batch["masked_lm_weights"],
        ),
        **losses.next_sentence(outputs["nsp_logits"], batch["next_sentence_labels"], nsp_weights),
    }


def _micro_batches(batch: Batch, accum_steps: int) -> Batch:
    """[B, ...] -> [A, B/A, ...], micro-batch j holding rows j, j + A, j + 2A, ...

    Interleaving (rather than contiguous blocks) keeps every micro-batch spread over all devices
    of the batch axes, because each device holds a contiguous block of rows.
    """

    def split(x):
        if x.shape[0] % accum_steps:
            raise ValueError(
                f"batch size {x.shape[0]} is not divisible by grad_accum_steps={accum_steps}"
            )
        x = x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return {key: split(value) for key, value in batch.items()}


def train_step(
    state: TrainState,
    batch: Batch,
    rng: Array,
    *,
    model: BertForPreTraining,
    tx: optax.GradientTransformation,
    schedule: Callable[[Array], Array] | None = None,
    accum_steps: int = 1,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer update on `batch`. Dropout RNG is `fold_in(rng, state.step)`.

    With `accum_steps > 1` the batch is processed in that many micro-batches whose gradients add
    up to exactly the full batch's: each micro-batch's sums are divided by the full batch's
    weights (known before the forward pass), so the objective is unchanged.
    """
    dropout_rng = jax.random.fold_in(rng, state.step)
    mlm_total = jnp.maximum(jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), 1e-5)
    nsp_weights = batch.get("next_sentence_weights")
    nsp_total = jnp.maximum(
        jnp.float32(batch["next_sentence_labels"].size)
        if nsp_weights is None
        else jnp.sum(nsp_weights.astype(jnp.float32)),
        1e-5,
    )

    def loss_fn(params, micro_batch, micro_rng):
        sums = compute_sums(params, micro_batch, model, deterministic=False, dropout_rng=micro_rng)
        loss = sums["mlm_loss_sum"] / mlm_total + sums["nsp_loss_sum"] / nsp_total
        return loss, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accum_steps == 1:
        (loss, sums), grads = grad_fn(state.params, batch, dropout_rng)
    else:

        def accumulate(carry, xs):
            index, micro_batch = xs
            (loss, sums), grads = grad_fn(
                state.params, micro_batch, jax.random.fold_in(dropout_rng, index)
            )
            return jax.tree.map(jnp.add, carry, (loss, sums, grads)), None

        micro = _micro_batches(batch, accum_steps)
        first = jax.tree.map(lambda x: x[0], micro)
        (loss_shape, sums_shape), grads_shape = jax.eval_shape(
            grad_fn, state.params, first, dropout_rng
        )
        zeros = jax.tree.map(
            lambda s: jnp.zeros(s.shape, s.dtype), (loss_shape, sums_shape, grads_shape)
        )
        (loss, sums, grads), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), micro))

    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def apply_update(operands):
        params, opt_state, grads = operands
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def skip_update(operands):
        params, opt_state, _ = operands
        return params, opt_state

    # A branch rather than a select over the state: a select keeps the old parameters and Adam
    # slots alive beside the new ones, which costs XLA a copy of all of them every step.
    new_params, new_opt_state = jax.lax.cond(
        finite, apply_update, skip_update, (state.params, state.opt_state, grads)
    )
    new_state = TrainState(
        step=state.step + 1,
        params=new_params,
        opt_state=new_opt_state,
        skipped=state.skipped + jnp.where(finite, 0, 1).astype(jnp.int32),
    )
    metrics = {
        **sums,
        "loss": loss,
        "grad_norm": grad_norm,
        "finite": finite,
        "real_tokens": jnp.sum(batch["input_mask"].astype(jnp.int32)),
        "skipped_steps": new_state.skipped,
    }
    if schedule is not None:
        metrics["learning_rate"] = schedule(state.step)
    return new_state, metrics


DROPOUT_RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")


def init_and_dropout_keys(seed: int, dropout_rng_impl: str = "threefry2x32") -> tuple[Array, Array]:
    """The parameter-init key (threefry2x32) and the dropout key (`dropout_rng_impl`) of a run.

    With threefry2x32 both come from splitting `key(seed)`; another implementation seeds its own
    key from the second half of that split, so init is the same whatever draws the masks.
    """
    if dropout_rng_impl not in DROPOUT_RNG_IMPLS:
        raise ValueError(
            f"config.dropout_rng_impl={dropout_rng_impl!r} is not one of {DROPOUT_RNG_IMPLS}"
        )
    init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
    if dropout_rng_impl != "threefry2x32":
        seed_bits = jax.random.bits(dropout_rng, (), jnp.uint32)
        dropout_rng = jax.random.key(seed_bits, impl=dropout_rng_impl)
    return init_rng, dropout_rng


def eval_step(params: Any, batch: Batch, *, model: BertForPreTraining) -> dict[str, Array]:
    """Loss and accuracy sums without dropout."""
    return compute_sums(params, batch, model, deterministic=True)


class ShardedTrainer:
    """The model, optimizer, mesh and rules bound together, with jitted sharded step functions.

    >>> trainer = ShardedTrainer(config, tx, mesh)
    >>> state = trainer.init(jax.random.key(0))
    >>> state, metrics = trainer.train_step(state, trainer.global_batch(batch), rng)
    """

    def __init__(
        self,
        config: BertConfig,
        tx: optax.GradientTransformation,
        mesh: jax.sharding.Mesh,
        rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
        schedule: Callable[[Array], Array] | None = None,
        accum_steps: int = 1,
    ):
        self.config = config
        self.model = BertForPreTraining(config)
        self.tx = tx
        self.mesh = mesh
        self.rules = rules
        self.schedule = schedule
        self._init_fn = functools.partial(init_state, model=self.model, tx=tx)
        abstract = jax.eval_shape(self._init_fn, jax.random.key(0))
        # Checked here, on shapes only: an uneven shard fails before anything compiles.
        self.state_shardings = partitioning.mesh_shardings(abstract, mesh, rules)
        self.batch_sharding = partitioning.batch_sharding(mesh)
        replicated = partitioning.replicated(mesh)
        step = functools.partial(
            train_step, model=self.model, tx=tx, schedule=schedule, accum_steps=accum_steps
        )
        self._train_step = jax.jit(
            step,
            in_shardings=(self.state_shardings, self.batch_sharding, replicated),
            out_shardings=(self.state_shardings, replicated),
            donate_argnums=0,
        )
        self._eval_step = jax.jit(
            functools.partial(eval_step, model=self.model),
            in_shardings=(self.state_shardings.params, self.batch_sharding),
            out_shardings=replicated,
        )

    def abstract_state(self) -> TrainState:
        """Shape/dtype/sharding structs of the state (e.g. an Orbax restore target)."""
        # Unboxed inside the trace: unboxing applies the logical constraints, which need
        # traced values when a mesh and rules are active (as in `train_step`).
        abstract = jax.eval_shape(lambda key: nn.meta.unbox(self._init_fn(key)), jax.random.key(0))
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract,
            self.state_shardings,
        )

    def init(self, rng: Array) -> TrainState:
        state, _ = partitioning.create_sharded(self._init_fn, self.mesh, self.rules, rng)
        return state

    def global_batch(self, local_batch: Mapping[str, Any]) -> dict[str, Array]:
        partitioning.check_batch_divisible(
            len(local_batch["input_ids"]) * jax.process_count(), self.mesh
        )
        return partitioning.global_batch(local_batch, self.mesh)

    def train_step(self, state: TrainState, batch: Batch, rng: Array):
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return self._train_step(state, batch, rng)

    def eval_step(self, params: Any, batch: Batch) -> dict[str, Array]:
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return self._eval_step(params, batch)
