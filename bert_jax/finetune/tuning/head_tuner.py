"""A pretrained BERT encoder with a fresh head on a mesh, compiled once: the sharded state born
from the loaded encoder and the head's own init, the train step (`trainer.update` with the
learning rate as an argument) and the predict step. GLUE's `sentence_tuning.FineTuner` and the token
tasks' `token_tuning.TokenTuner` are this with their model, head and loss sums.

A training batch of more padded positions than `micro_batch_tokens` runs as micro-batches
(`batches.micro_batch_count`, `trainer.update`'s accumulation), each loss divided by the whole
batch's weight, so the update is the whole batch's while the step holds one micro-batch's
activations (SWAG's 16 x 4 x 128 positions: 3.3 GB of working memory whole).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core import partitioning, trainer
from bert_jax.core.trainer import TrainState
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.batches import micro_batch_count
from bert_jax.finetune.tuning.settings import FinetuneSettings
from bert_jax.runtime.errors import UserError

Array = jax.Array
# `sums_fn(params, batch, dropout_rng)`: the head's sums over the batch's rows, at least
# "loss_sum" and "weight" (the sum of the batch's "label_weights" where it has them, else of its
# "weights").
SumsFn = Callable[[Any, Mapping[str, Array], Array], dict[str, Array]]


class HeadTuner(trainer.ShardedSteps):
    """`model` (an encoder under `bert/` and `head` under `classifier/`), the recipe's optimizer
    (`tuning_loop.make_optimizer(settings)`: the settings that shape the step) with a unit schedule,
    the mesh and rules, bound together and compiled once. The loss is `sums_fn`'s "loss_sum" over
    the whole batch's weight."""

    def __init__(
        self,
        model: nn.Module,
        head: nn.Module,
        head_input: Array,
        sums_fn: SumsFn,
        predict_fn: Callable[..., Array],
        mesh: jax.sharding.Mesh,
        settings: FinetuneSettings,
        rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
    ):
        self.model = model
        self.tx = tuning_loop.make_optimizer(settings)
        self._loss_params = tuning_loop.loss_params(settings, model.config.pad_token_id)
        tokens = np.zeros((1, 8), np.int32)
        inputs = {"input_ids": tokens, "input_mask": np.ones_like(tokens), "segment_ids": tokens}
        init_fn = functools.partial(trainer.init_state, model=model, tx=self.tx, inputs=inputs)
        super().__init__(init_fn, mesh, rules)
        self.abstract_bert = nn.meta.unbox(self.state_shapes.params["bert"])
        # Born sharded, as `ShardedSteps.init` does, but only the parts that are not
        # loaded: the head from its own init (the same module as the model's `classifier`
        # subtree) and the optimizer slots from the placed params (the encoder is never
        # initialised at random only to be overwritten). Jitted once per tuner, so a sweep's
        # trials share the compiled functions.
        self._init_head = jax.jit(
            lambda rng: nn.meta.unbox(head.init(rng, head_input)["params"]),
            out_shardings=self.state_shardings.params["classifier"],
        )
        self._init_opt_state = jax.jit(
            self.tx.init,
            in_shardings=(self.state_shardings.params,),
            out_shardings=self.state_shardings.opt_state,
        )
        self.micro_batch_tokens = settings.micro_batch_tokens
        step = functools.partial(self._update, sums_fn=sums_fn)
        self._train_step = self.jit_train_step(step, num_scalars=2)  # rng, learning rate
        self._predict_step = self.jit_params_fn(functools.partial(predict_fn, model=model))

    def init(self, rng: Array, pretrained_bert: Any) -> TrainState:
        """Sharded state: the encoder from `pretrained_bert`, a fresh head from `rng`."""
        params = {
            "bert": place_pretrained(pretrained_bert, self.abstract_bert, self.state_shardings),
            "classifier": self._init_head(rng),
        }
        # Two counters, two buffers: the train step donates each of them.
        # From host zeros: `jnp.zeros` would compile a program of its own.
        step, skipped = (jax.device_put(np.zeros((), np.int32), self.replicated) for _ in "ab")
        return TrainState(step, params, self._init_opt_state(params), skipped)

    def _update(
        self,
        state: TrainState,
        batch: Mapping[str, Array],
        rng: Array,
        learning_rate: Array,
        *,
        sums_fn: SumsFn,
    ) -> tuple[TrainState, dict[str, Array]]:
        """`trainer.update` with the head's mean loss, in as many micro-batches as the batch's
        shape needs (`micro_batch_count`); each micro-batch's loss sum is divided by the whole
        batch's weight (known before the forward pass), so the gradients add up to the whole
        batch's."""
        weights = batch["label_weights"] if "label_weights" in batch else batch["weights"]
        total = jnp.maximum(jnp.sum(weights.astype(jnp.float32)), 1.0)

        def loss_fn(params, micro_batch, dropout_rng):
            sums = sums_fn(self._loss_params(params), micro_batch, dropout_rng)
            return sums["loss_sum"] / total, sums

        rows, *positions = batch["input_ids"].shape
        data_parallel = math.prod(self.mesh.shape[a] for a in partitioning.BATCH_AXES)
        count = micro_batch_count(
            rows, math.prod(positions), self.micro_batch_tokens, data_parallel
        )
        return trainer.update(
            state, batch, rng, learning_rate, loss_fn=loss_fn, tx=self.tx, accum_steps=count
        )

    def train_step(
        self, state: TrainState, batch: Mapping[str, Array], rng: Array, learning_rate: float
    ) -> tuple[TrainState, dict[str, Array]]:
        return self.call(self._train_step, state, batch, rng, jnp.float32(learning_rate))

    def compile_train_step(
        self, batch: Mapping[str, Array], rng: Array, lowered: threading.Event | None = None
    ) -> None:
        """Compiles the train step for `batch`'s shapes, running nothing (`run_steps` calls it on
        another thread, before the state is made): the step that follows finds it compiled,
        as the same mesh and rules are active here as in `call`. Sets `lowered` once the step is
        traced and lowered (Python, holding the GIL), before XLA compiles it (outside it), or
        where that fails."""
        try:
            rate = jnp.float32(0.0)  # made outside the mesh, as `train_step` makes its rate
            state = self._abstract_state()
            step = self.call(lambda: self._train_step.lower(state, batch, rng, rate))
        finally:
            if lowered is not None:
                lowered.set()
        self.call(step.compile)

    def compile_init(self, rng: Array) -> None:
        """Compiles what `init` runs, the head's init and the optimizer slots' init, running
        nothing (`run_steps` calls it while the train step compiles, before the state is made);
        `rng` is a key like `init`'s (only its type counts)."""
        self._init_head.lower(rng).compile()
        self._init_opt_state.lower(self._abstract_state().params).compile()

    def compile_predict_step(
        self, batch: Mapping[str, Array], lowered: threading.Event | None = None
    ) -> None:
        """Compiles the predict step for `batch`'s shapes, as `compile_train_step` does (and
        sets `lowered` as it does)."""
        try:
            params = self._abstract_state().params
            step = self.call(lambda: self._predict_step.lower(params, batch))
        finally:
            if lowered is not None:
                lowered.set()
        self.call(step.compile)

    def _abstract_state(self) -> TrainState:
        return jax.tree.map(
            lambda shape, sharding: jax.ShapeDtypeStruct(
                shape.shape, shape.dtype, sharding=sharding
            ),
            nn.meta.unbox(self.state_shapes),
            self.state_shardings,
        )

    def predict(self, params: Any, batch: Mapping[str, Array]) -> Array:
        return self.call(self._predict_step, params, batch)


def place_pretrained(pretrained_bert: Any, abstract_bert: Any, state_shardings: TrainState) -> Any:
    """Put the loaded encoder params on the mesh with the state's shardings, checking the tree.

    Raises a ValueError naming missing, unexpected or mis-shaped parameters.
    """
    want = {
        jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(abstract_bert)
    }
    have = {
        jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(pretrained_bert)
    }
    problems = [f"missing {key}" for key in sorted(set(want) - set(have))]
    problems += [f"unexpected {key}" for key in sorted(set(have) - set(want))]
    problems += [
        f"{key} has shape {tuple(np.shape(have[key]))}, the model wants {want[key].shape}"
        for key in sorted(set(want) & set(have))
        if tuple(np.shape(have[key])) != tuple(want[key].shape)
    ]
    if problems:
        raise UserError(
            "pretrained encoder params do not fit the model: " + "; ".join(problems[:5])
        )

    # Always from a fresh host copy: the train step donates the state, and on some backends a
    # transfer may alias its source; the caller's encoder params must survive for the next trial.
    def place(value: Any, spec: jax.ShapeDtypeStruct, sharding: Any) -> Array:
        return jax.device_put(np.array(value, dtype=spec.dtype, copy=True), sharding)

    return jax.tree.map(place, pretrained_bert, abstract_bert, state_shardings.params["bert"])
