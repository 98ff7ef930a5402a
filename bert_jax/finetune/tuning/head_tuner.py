"""A pretrained BERT encoder with a fresh head on a mesh, compiled once: the sharded state born
from the loaded encoder and the head's own init, the train step (`trainer.update` with the
learning rate as an argument) and the predict step. GLUE's `sentence_tuning.FineTuner` and the token
tasks' `token_tuning.TokenTuner` are this with their model, head and loss.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.core import partitioning, trainer
from bert_jax.core.trainer import TrainState
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.settings import FinetuneSettings
from bert_jax.runtime.errors import UserError

Array = jax.Array


class HeadTuner(trainer.ShardedSteps):
    """`model` (an encoder under `bert/` and `head` under `classifier/`), the recipe's optimizer
    (`tuning_loop.make_optimizer(settings)`: the settings that shape the step) with a unit schedule,
    the mesh and rules, bound together and compiled once."""

    def __init__(
        self,
        model: nn.Module,
        head: nn.Module,
        head_input: Array,
        loss_fn: trainer.LossFn,
        predict_fn: Callable[..., Array],
        mesh: jax.sharding.Mesh,
        settings: FinetuneSettings,
        rules: partitioning.LogicalRules = partitioning.DEFAULT_RULES,
    ):
        self.model = model
        self.tx = tuning_loop.make_optimizer(settings, pad_token_id=model.config.pad_token_id)
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
        step = functools.partial(trainer.update, loss_fn=loss_fn, tx=self.tx)
        self._train_step = self.jit_train_step(step, num_scalars=2)  # rng, learning rate
        self._predict_step = self.jit_params_fn(functools.partial(predict_fn, model=model))

    def init(self, rng: Array, pretrained_bert: Any) -> TrainState:
        """Sharded state: the encoder from `pretrained_bert`, a fresh head from `rng`."""
        params = {
            "bert": place_pretrained(pretrained_bert, self.abstract_bert, self.state_shardings),
            "classifier": self._init_head(rng),
        }
        # Two counters, two buffers: the train step donates each of them.
        step, skipped = (jax.device_put(jnp.zeros((), jnp.int32), self.replicated) for _ in "ab")
        return TrainState(step, params, self._init_opt_state(params), skipped)

    def train_step(
        self, state: TrainState, batch: Mapping[str, Array], rng: Array, learning_rate: float
    ) -> tuple[TrainState, dict[str, Array]]:
        return self.call(self._train_step, state, batch, rng, jnp.float32(learning_rate))

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
