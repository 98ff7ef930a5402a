"""The shared fine-tuning loop (`tuning_loop.run_steps`) without a model: the steps it takes, the
learning rate it passes to each, when it evaluates, and its progress lines."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.finetune.tuning import batches as features
from bert_jax.finetune.tuning import packing, token_tuning, tuning_loop
from bert_jax.finetune.tuning import sentence_tuning as loop


class CountingTuner:
    """Takes the batches and rates `run_steps` hands it; the loss of a step is its row count."""

    def __init__(self):
        self.rows: list[int] = []
        self.rates: list[float] = []

    def global_batch(self, local_batch):
        return local_batch

    def train_step(self, state, batch, rng, learning_rate):
        self.rows.append(int(np.sum(batch["weights"])))
        self.rates.append(learning_rate)
        weight = jnp.asarray(np.sum(batch["weights"]), jnp.float32)
        state = types.SimpleNamespace(params=state.params + 1)
        return state, {"loss_sum": weight * 2.0, "weight": weight}


def test_run_steps_takes_every_batch_of_every_epoch_with_the_recipe_rates_and_reports_progress():
    settings = loop.FinetuneSettings(
        learning_rate=1e-4, epochs=2.0, batch_size=4, log_every=3, eval_every_epoch=True
    )
    tuner, lines, evaluated = CountingTuner(), [], []

    def evaluate(params):
        evaluated.append(int(params))
        time.sleep(0.1)  # left out of the steps' time
        return {"accuracy": 1.0}

    started = time.perf_counter()
    trained = tuning_loop.run_steps(
        tuner,
        types.SimpleNamespace(params=0),  # the state: the steps taken
        jax.random.key(0),
        settings,
        10,  # 3 batches an epoch: 4, 4 and 2 examples
        lambda rows: {"weights": (rows >= 0).astype(np.float32)},
        evaluate,
        lines.append,
        name="TASK",
    )
    wall = time.perf_counter() - started
    assert 0.0 < trained.train_seconds <= wall - 0.2  # two evaluations of 0.1 s left out
    assert trained.num_steps == 6 == 2 * features.steps_per_epoch(10, 4)
    assert tuner.rows == [4, 4, 2, 4, 4, 2]
    np.testing.assert_allclose(tuner.rates, tuning_loop.learning_rates(settings, 6))
    assert trained.train_loss == 2.0  # the mean over real examples, not over padded rows
    assert evaluated == [3, 6]  # after each epoch; the end is the second epoch's
    assert [h["epoch"] for h in trained.history] == [1.0, 2.0]
    progress = [line for line in lines if " loss " in line]
    assert len(progress) == 3  # every ceil(6 / 4) = 2 steps: a short run logs at least 4 times
    pattern = (
        r"TASK step (2|4|6)/6 loss 2\.0000 lr \S+ [\d.]+ steps/s [\d.]+ examples/s ETA \d+m\d\ds"
    )
    assert all(re.fullmatch(pattern, line) for line in progress), progress


def test_the_recipes_differ_in_warmup_rounding_and_where_the_decay_starts():
    settings = loop.FinetuneSettings(learning_rate=1.0, warmup_proportion=0.1)
    ours = tuning_loop.learning_rates(settings, 25)
    original = tuning_loop.learning_rates(dataclasses.replace(settings, decay_from="step-0"), 25)
    hf = tuning_loop.learning_rates(dataclasses.replace(settings, optimizer="adamw-hf"), 25)
    assert tuning_loop.warmup_steps("bert", 0.1, 25) == 2
    assert tuning_loop.warmup_steps("adamw-hf", 0.1, 25) == 3
    np.testing.assert_allclose(ours[:4], [0.0, 0.5, 1.0, 22 / 23])  # the peak, then the decay
    np.testing.assert_allclose(original[:3], [0.0, 0.5, 1 - 2 / 25])  # google-research/bert's
    np.testing.assert_allclose(hf[:5], [0.0, 1 / 3, 2 / 3, 1.0, 21 / 22])  # from the warmup's end


def test_a_short_run_logs_progress_at_least_four_times():
    """39 steps at --log-every 100 (a short GLUE run) log at steps 10, 20, 30 and 39; a long run
    keeps --log-every."""
    settings = loop.FinetuneSettings(epochs=1.0, batch_size=4, log_every=100)
    lines = []
    tuning_loop.run_steps(
        CountingTuner(),
        types.SimpleNamespace(params=0),
        jax.random.key(0),
        settings,
        39 * 4,
        lambda rows: {"weights": (rows >= 0).astype(np.float32)},
        lambda params: {},
        lines.append,
    )
    logged = [int(re.match(r"step (\d+)/39 ", line)[1]) for line in lines if " loss " in line]
    assert logged == [10, 20, 30, 39]
    assert tuning_loop.log_interval(100, 1000) == 100 and tuning_loop.log_interval(100, 2) == 1


class AheadTuner(CountingTuner):
    """A CountingTuner that checks the order `run_steps` keeps: the predict step is lowered
    before anything else starts and compiles while the train step is lowered (it returns only
    once that has happened), the state's init compiles and the encoder's params are read while
    the train step compiles, and the state is made once the train step is compiled."""

    def __init__(self):
        super().__init__()
        self.state_made = threading.Event()
        self.predict_lowered = threading.Event()
        self.train_lowered = threading.Event()
        self.init_compiled = threading.Event()
        self.params_read = threading.Event()
        self.compiled_for = None

    def compile_train_step(self, batch, rng, lowered):
        assert self.predict_lowered.is_set(), "the train step was lowered before the predict step"
        self.train_lowered.set()
        lowered.set()
        assert self.init_compiled.wait(timeout=60), "the state's init did not compile beside"
        assert self.params_read.wait(timeout=60), "the params were not read while this compiled"
        assert not self.state_made.is_set(), "the state was made while this compiled"
        self.compiled_for = batch

    def compile_predict_step(self, batch, lowered):
        assert not self.train_lowered.is_set(), "the train step started before the predict step"
        self.predict_lowered.set()
        lowered.set()
        assert self.train_lowered.wait(timeout=60), "the predict step did not compile beside"
        self.predict_compiled_for = batch

    def compile_init(self, rng):
        assert self.train_lowered.is_set(), "the init compiled before the train step was lowered"
        self.init_compiled.set()


def _run_six_rows(tuner, state, **more):
    """`run_steps` over 6 rows in batches of 4 (two steps) for one epoch, evaluating nothing."""
    return tuning_loop.run_steps(
        tuner,
        state,
        jax.random.key(0),
        loop.FinetuneSettings(epochs=1.0, batch_size=4),
        6,
        lambda rows: {"weights": (rows >= 0).astype(np.float32)},
        lambda params: {},
        lambda line: None,
        **more,
    )


def test_the_first_step_compiles_on_another_thread_then_the_state_is_made():
    tuner = AheadTuner()

    def make_state():
        assert tuner.compiled_for is not None, "the state was made before the step compiled"
        tuner.state_made.set()
        return types.SimpleNamespace(params=0)

    def while_compiling():  # what reads the encoder's params
        assert tuner.init_compiled.is_set() and not tuner.params_read.is_set()
        tuner.params_read.set()

    ahead = {"input_ids": np.ones((3, 5), np.int32)}
    trained = _run_six_rows(tuner, make_state, predict_ahead=ahead, while_compiling=while_compiling)
    assert tuner.params_read.is_set()
    assert trained.num_steps == 2 and tuner.rows == [4, 2]
    assert tuner.compiled_for is not None and int(np.sum(tuner.compiled_for["weights"])) == 4
    assert tuner.predict_compiled_for["input_ids"].shape == (3, 5)


@pytest.mark.parametrize("packed", [False, True])
def test_the_first_predict_batch_is_the_one_prediction_runs_first(packed):
    """What the predict step is compiled ahead for is the batch prediction then takes first."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 30, 40)
    mask = (np.arange(32)[None, :] < lengths[:, None]).astype(np.int32)
    arrays = {"input_ids": mask * 7, "input_mask": mask, "segment_ids": 0 * mask}
    settings = loop.FinetuneSettings(max_seq_length=32, eval_batch_size=8, packing=packed)
    mesh = types.SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 1})
    batches = packing.batches_for(settings, [arrays], mesh)
    ahead = packing.first_predict_batch(arrays, settings.eval_batch_size, batches)
    seen = []

    class Recorder:
        def global_batch(self, batch):
            return batch

        def predict(self, params, batch):
            seen.append(batch)
            rows = len(batch["input_ids"])
            return np.zeros((rows, 40, 2) if packed else (rows, 2), np.float32)

    token_tuning.predict_logits(Recorder(), None, arrays, settings.eval_batch_size, buckets=batches)
    first = seen[0]
    assert sorted(ahead) == sorted(first)
    for key in first:
        np.testing.assert_array_equal(ahead[key], first[key])


def test_an_error_making_the_state_is_raised_without_waiting_for_the_predict_compile():
    """A user error while the state is made (an encoder that does not fit, say) is raised while
    the predict step's compile ahead is still running."""
    from bert_jax.runtime.errors import UserError

    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    class SlowTuner(CountingTuner):
        def compile_train_step(self, batch, rng, lowered):
            lowered.set()

        def compile_predict_step(self, batch, lowered):
            lowered.set()
            started.set()
            release.wait(timeout=60)
            finished.set()

        def compile_init(self, rng):
            pass

    def make_state():
        assert started.wait(timeout=60)  # the predict step is compiling
        raise UserError("pretrained encoder params do not fit the model")

    ahead = {"input_ids": np.ones((3, 5), np.int32)}
    with pytest.raises(UserError, match="do not fit"):
        _run_six_rows(SlowTuner(), make_state, predict_ahead=ahead)
    assert not finished.is_set()
    release.set()
    assert finished.wait(timeout=60)


def test_a_step_compiled_ahead_is_the_step_that_runs():
    """`HeadTuner.compile_train_step`, `compile_predict_step` and `compile_init` compile the
    programs the first step, prediction and the state's init then run: no second compile (the
    mesh, rules and argument types match `train_step`'s, `predict`'s and `init`'s)."""
    from bert_jax.core import partitioning
    from tests.helpers import random_params, tiny_config

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: (
            compiles.append(event)
            if event == "/jax/core/compile/backend_compile_duration"
            else None
        )
    )
    config = tiny_config(num_hidden_layers=1)
    settings = loop.FinetuneSettings(batch_size=2, max_seq_length=8)
    tuner = loop.FineTuner(
        config, 2, partitioning.make_mesh((1, 1, 1), jax.devices()[:1]), settings
    )
    ids = np.full((2, 8), 7, np.int32)
    batch = tuner.global_batch(
        {
            "input_ids": ids,
            "input_mask": np.ones_like(ids),
            "segment_ids": np.zeros_like(ids),
            "labels": np.array([0, 1], np.int32),
            "weights": np.ones(2, np.float32),
        }
    )
    init_rng, dropout_rng = jax.random.split(jax.random.key(0))
    encoder = random_params(loop.BertForSequenceClassification(config, 2), ids, ids, ids)
    predict_batch = {key: value for key, value in batch.items() if key != "weights"}
    lowered = threading.Event()
    tuner.compile_train_step(batch, dropout_rng, lowered)
    assert lowered.is_set()
    # A batch that does not lower (no labels) still sets the event `run_steps` waits on.
    lowered = threading.Event()
    with pytest.raises(KeyError):
        tuner.compile_train_step(predict_batch, dropout_rng, lowered)
    assert lowered.is_set()
    lowered = threading.Event()
    tuner.compile_predict_step(predict_batch, lowered)
    assert lowered.is_set()
    tuner.compile_init(dropout_rng)  # a key of init_rng's type: the programs init runs
    before = compiles.count("/jax/core/compile/backend_compile_duration")
    state = tuner.init(init_rng, encoder["params"]["bert"])
    state, metrics = tuner.train_step(state, batch, dropout_rng, 1e-3)
    jax.block_until_ready((metrics, tuner.predict(state.params, predict_batch)))
    assert compiles.count("/jax/core/compile/backend_compile_duration") == before
