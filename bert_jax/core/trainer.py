"""The train state and step, generic over the loss, and their sharded, jitted form.

Shared by pretraining and fine-tuning:
- `TrainState` (`TrainState.create(params, tx)`); `init_state` initialises a model into one.
- `update(state, batch, rng, learning_rate=None, *, loss_fn, tx, accum_steps=1)`: one optimizer
  update on the gradients of `loss_fn(params, batch, dropout_rng) -> (loss, aux)`, accumulated
  over micro-batches if asked; a step whose loss or gradient is not finite leaves the state
  untouched except for the step counter and is counted in `skipped`.
- `ShardedSteps`: a state's shardings on a mesh (from the shapes alone), global batches, and
  steps jitted with those shardings and a donated state.

Pretraining's pieces follow: `train_step(state, batch, rng)` (a pure function; `model`, `tx` and
`schedule` are bound with functools.partial) whose metrics are sums and weights (see losses.py)
plus the gradient norm and learning rate, and `ShardedTrainer`, which binds them to a mesh.

Why this file is long: the generic update and its sharded, jitted form are one contract (the
donated state, the skipped-step counter, the accumulation) that pretraining and fine-tuning both
call; pretraining's own pieces follow from `pretraining_loss` on.
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

from bert_jax.core import losses, optim, partitioning
from bert_jax.core.model import BertConfig, BertForPreTraining
from bert_jax.core.modernbert import ModernBertForMaskedLM
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.core.prng_impls import DROPOUT_RNG_IMPLS
from bert_jax.runtime.errors import UserError

Array = jax.Array
Batch = Mapping[str, Array]


@flax.struct.dataclass
class TrainState:
    step: Array
    params: Any
    opt_state: Any
    # Updates skipped because the loss or a gradient was not finite (total over the run).
    skipped: Array

    @classmethod
    def create(cls, params: Any, tx: optax.GradientTransformation) -> TrainState:
        """Step 0: `params`, fresh optimizer slots, nothing skipped."""
        zero = jnp.zeros((), jnp.int32)
        return cls(step=zero, params=params, opt_state=tx.init(params), skipped=zero)


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
    rng: Array,
    model: nn.Module,
    tx: optax.GradientTransformation,
    inputs: Mapping[str, Any] | None = None,
) -> TrainState:
    """A TrainState whose params (and optimizer slots) keep their logical-partitioning boxes.

    `inputs`: the model's keyword inputs to initialise with (default: a tiny pretraining batch).
    """
    if inputs is None:
        inputs = model_inputs(dummy_batch(1, 8, 2))
    variables = model.init({"params": rng}, **inputs, deterministic=True)
    return TrainState.create(variables["params"], tx)


def compute_sums(
    params: Any,
    batch: Batch,
    model: BertForPreTraining,
    deterministic: bool,
    dropout_rng: Array | None = None,
) -> dict[str, Array]:
    rngs = None if deterministic else {"dropout": dropout_rng}
    batch = objective_batch(batch, model.config.objective)
    outputs = model.apply(
        {"params": params}, **model_inputs(batch), deterministic=deterministic, rngs=rngs
    )
    nsp_weights = batch.get("next_sentence_weights")
    sums = losses.masked_lm(
        outputs.get("mlm_logits_padded", outputs["mlm_logits"]),
        batch["masked_lm_ids"],
        batch["masked_lm_weights"],
    )
    if model.config.objective == "mlm+nsp":
        sums.update(
            losses.next_sentence(outputs["nsp_logits"], batch["next_sentence_labels"], nsp_weights)
        )
    else:  # no NSP loss, no NSP metrics
        sums.update(losses.no_next_sentence())
    return sums


def objective_batch(batch: Batch, objective: str) -> Batch:
    """The batch the objective's heads read: for "ltr" every position's next token in the
    masked-LM slots (losses.next_token_targets; the records' own slots are unused; in a packed
    row the last token of an instance predicts nothing), else as is."""
    if objective != "ltr":
        return batch
    positions, ids, weights = losses.next_token_targets(batch["input_ids"], batch["input_mask"])
    if "packed_segment_ids" in batch:  # packed rows: no target across two instances
        segments = batch["packed_segment_ids"]
        same = (segments[:, 1:] == segments[:, :-1]).astype(weights.dtype)
        weights = weights * jnp.concatenate([same, jnp.zeros_like(same[:, :1])], axis=1)
    return {
        **batch,
        "masked_lm_positions": positions,
        "masked_lm_ids": ids,
        "masked_lm_weights": weights,
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


LossFn = Callable[[Any, Batch, Array], tuple[Array, dict[str, Array]]]


def update(
    state: TrainState,
    batch: Batch,
    rng: Array,
    learning_rate: Array | None = None,
    *,
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    accum_steps: int = 1,
    grad_shardings: Any = None,
) -> tuple[TrainState, dict[str, Array]]:
    """One optimizer update on the gradients of `loss_fn(params, batch, dropout_rng)`.

    `loss_fn` returns (loss, aux); the metrics are `aux` (summed over micro-batches), `loss`,
    `grad_norm`, `finite` and `skipped_steps`. Dropout RNG is `fold_in(rng, state.step)`.
    `learning_rate`, when given, scales the optimizer's update: an optimizer with a unit schedule
    then takes its rate per step as an argument, so one compiled step serves every rate.
    With `accum_steps > 1` the batch runs as that many micro-batches whose losses and gradients
    add up; `loss_fn` must weigh each by the full batch's totals (see `pretraining_loss`).
    `grad_shardings`, when given, is a pair of layouts for the gradients: the one they are
    computed and summed in, then the one they are clipped and applied in (ZeRO stage 1: the
    parameters' own, then the optimizer slots'; see `ShardedSteps`).
    """
    dropout_rng = jax.random.fold_in(rng, state.step)
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=True)
    computed, applied = grad_shardings or (None, None)

    def grad_fn(*args):
        (loss, aux), grads = value_and_grad(*args)
        if computed is not None:
            grads = jax.lax.with_sharding_constraint(grads, computed)
        return (loss, aux), grads

    if accum_steps == 1:
        (loss, aux), grads = grad_fn(state.params, batch, dropout_rng)
    else:

        def accumulate(carry, xs):
            index, micro_batch = xs
            (loss, aux), grads = grad_fn(
                state.params, micro_batch, jax.random.fold_in(dropout_rng, index)
            )
            return jax.tree.map(jnp.add, carry, (loss, aux, grads)), None

        micro = _micro_batches(batch, accum_steps)
        first = jax.tree.map(lambda x: x[0], micro)
        (loss_shape, aux_shape), grads_shape = jax.eval_shape(
            grad_fn, state.params, first, dropout_rng
        )
        zeros = jax.tree.map(
            lambda s: jnp.zeros(s.shape, s.dtype), (loss_shape, aux_shape, grads_shape)
        )
        (loss, aux, grads), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), micro))

    if applied is not None:
        grads = jax.lax.with_sharding_constraint(grads, applied)
    grad_norm = optim.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def apply_update(operands):
        params, opt_state, grads = operands
        # The norm computed once: the one-pass optimizers clip by it (an extra argument; optax's
        # chains pass it on to transforms that take it and ignore it elsewhere).
        extra = (
            {"grad_norm": grad_norm}
            if isinstance(tx, optax.GradientTransformationExtraArgs)
            else {}
        )
        updates, opt_state = tx.update(grads, opt_state, params, **extra)
        apply = functools.partial(_apply_update, learning_rate=learning_rate)
        return jax.tree.map(apply, params, updates), opt_state

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
        **aux,
        "loss": loss,
        "grad_norm": grad_norm,
        "finite": finite,
        "skipped_steps": new_state.skipped,
    }
    return new_state, metrics


@functools.partial(jax.jit, inline=True)
def _apply_update(param: Array, update: Array, learning_rate: Array | None) -> Array:
    """`optax.apply_updates` of one parameter, its update scaled by `learning_rate` when given.
    Jitted: the parameters of one shape share a trace."""
    if learning_rate is not None:
        update = (learning_rate * update).astype(update.dtype)
    return jnp.asarray(param + update).astype(jnp.asarray(param).dtype)


def pretraining_model(config: BertConfig | ModernBertConfig) -> nn.Module:
    """The model a config's family pretrains: BertForPreTraining, or ModernBertForMaskedLM
    (masked LM only: its config's `objective` is "mlm"). Both take `model_inputs(batch)`."""
    if isinstance(config, ModernBertConfig):
        return ModernBertForMaskedLM(config)
    return BertForPreTraining(config)


def pretraining_loss(batch: Batch, *, model: BertForPreTraining) -> LossFn:
    """MLM + NSP loss of a (micro-)batch of `batch`, each divided by `batch`'s total weight.

    The totals are the full batch's (known before the forward pass), so micro-batches' gradients
    add up to exactly the full batch's and the objective is unchanged by accumulation.
    """
    batch = objective_batch(batch, model.config.objective)
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

    return loss_fn


def train_step(
    state: TrainState,
    batch: Batch,
    rng: Array,
    *,
    model: BertForPreTraining,
    tx: optax.GradientTransformation,
    schedule: Callable[[Array], Array] | None = None,
    accum_steps: int = 1,
    grad_shardings: Any = None,
) -> tuple[TrainState, dict[str, Array]]:
    """One pretraining update on `batch` (`update` with `pretraining_loss`).

    Metrics: the loss and accuracy sums, `loss`, `grad_norm`, `finite`, `skipped_steps`,
    `real_tokens` and (with a schedule) this step's `learning_rate`.
    """
    loss_fn = pretraining_loss(batch, model=model)
    new_state, metrics = update(
        state, batch, rng, loss_fn=loss_fn, tx=tx, accum_steps=accum_steps,
        grad_shardings=grad_shardings,
    )  # fmt: skip
    metrics["real_tokens"] = jnp.sum(batch["input_mask"].astype(jnp.int32))
    if schedule is not None:
        metrics["learning_rate"] = schedule(state.step)
    return new_state, metrics


def init_and_dropout_keys(seed: int, dropout_rng_impl: str = "threefry2x32") -> tuple[Array, Array]:
    """The parameter-init key (threefry2x32) and the dropout key (`dropout_rng_impl`) of a run.

    With threefry2x32 both come from splitting `key(seed)`; another implementation seeds its own
    key from the second half of that split, so init is the same whatever draws the masks.
    """
    if dropout_rng_impl not in DROPOUT_RNG_IMPLS:
        raise UserError(
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


class ShardedSteps:
    """A train state laid out on a mesh: its shardings (from `init_fn`'s shapes; nothing runs),
    per-host batches made global, and steps jitted with those shardings."""

    def __init__(
        self,
        init_fn: Callable[[Array], TrainState],
        mesh: jax.sharding.Mesh,
        rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
        shard_optimizer_state: bool = False,
        windowed_einsum: bool = True,
    ):
        self.mesh = mesh
        self.rules = rules
        self.compiler_options = partitioning.compiler_options(mesh, windowed_einsum)
        self._init_fn = init_fn
        # The state's shapes, with their logical-partitioning boxes (nothing runs).
        self.state_shapes = jax.eval_shape(init_fn, jax.random.key(0))
        # Checked here, on shapes only: an uneven shard fails before anything compiles.
        self.state_shardings = partitioning.mesh_shardings(self.state_shapes, mesh, rules)
        # ZeRO stage 1 (partitioning.optimizer_state_rules): the Adam slots split over `data`;
        # gradients computed in the parameters' layout, then cut to the slots' for the update.
        # Left to itself, sharding propagation pulls the slots' layout back into the backward
        # matmuls, which XLA:TPU then splits into windowed loops (by its cost model a Base step
        # on 8 v5p chips took 26.5 ms that way; docs/performance.md has the figures).
        self.grad_shardings = None
        if shard_optimizer_state:
            zero = partitioning.optimizer_state_rules(rules)
            slots = partitioning.mesh_shardings(self.state_shapes.opt_state, mesh, zero)
            self.state_shardings = self.state_shardings.replace(opt_state=slots)
            self.grad_shardings = (
                self.state_shardings.params,
                partitioning.mesh_shardings(self.state_shapes.params, mesh, zero),
            )
        self.batch_sharding = partitioning.batch_sharding(mesh)
        self.replicated = partitioning.replicated(mesh)

    def jit_train_step(self, step: Callable[..., Any], num_scalars: int = 1) -> Callable[..., Any]:
        """`step(state, batch, *scalars) -> (state, metrics)` jitted with the state donated;
        the scalars (rng, learning rate, ...) and the metrics replicated."""
        return jax.jit(
            step,
            in_shardings=(self.state_shardings, self.batch_sharding)
            + (self.replicated,) * num_scalars,
            out_shardings=(self.state_shardings, self.replicated),
            donate_argnums=0,
            compiler_options=self.compiler_options,
        )

    def jit_params_fn(self, fn: Callable[[Any, Batch], Any]) -> Callable[..., Any]:
        """`fn(params, batch) -> outputs` (evaluation, prediction) jitted; outputs replicated."""
        return jax.jit(
            fn,
            in_shardings=(self.state_shardings.params, self.batch_sharding),
            out_shardings=self.replicated,
            compiler_options=self.compiler_options,
        )

    def global_batch(self, local_batch: Mapping[str, Any]) -> dict[str, Array]:
        partitioning.check_batch_divisible(
            len(local_batch["input_ids"]) * jax.process_count(), self.mesh
        )
        return partitioning.global_batch(local_batch, self.mesh)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` with this mesh and logical-axis rules active (for jitted steps)."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return fn(*args)


class ShardedTrainer(ShardedSteps):
    """The pretraining model, optimizer, mesh and rules bound together, with jitted sharded
    train and eval steps.

    >>> trainer = ShardedTrainer(config, tx, mesh)
    >>> state = trainer.init(jax.random.key(0))
    >>> state, metrics = trainer.train_step(state, trainer.global_batch(batch), rng)
    """

    def __init__(
        self,
        config: BertConfig | ModernBertConfig,
        tx: optax.GradientTransformation,
        mesh: jax.sharding.Mesh,
        rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
        schedule: Callable[[Array], Array] | None = None,
        accum_steps: int = 1,
        shard_optimizer_state: bool = False,
        windowed_einsum: bool = True,
    ):
        self.config = config
        self.model = pretraining_model(config)
        self.tx = tx
        self.schedule = schedule
        init = functools.partial(init_state, model=self.model, tx=tx)
        super().__init__(init, mesh, rules, shard_optimizer_state, windowed_einsum)
        step = functools.partial(
            train_step, model=self.model, tx=tx, schedule=schedule, accum_steps=accum_steps,
            grad_shardings=self.grad_shardings,
        )  # fmt: skip
        self._train_step = self.jit_train_step(step)
        self._eval_step = self.jit_params_fn(functools.partial(eval_step, model=self.model))

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
        """The initial state, born sharded: each device writes only its own shards."""
        # No logical rules in scope: activation constraints inside init (on a dummy batch) are
        # moot.
        init = jax.jit(
            lambda key: nn.meta.unbox(self._init_fn(key)), out_shardings=self.state_shardings
        )
        return init(rng)

    def train_step(self, state: TrainState, batch: Batch, rng: Array):
        return self.call(self._train_step, state, batch, rng)

    def eval_step(self, params: Any, batch: Batch) -> dict[str, Array]:
        return self.call(self._eval_step, params, batch)
