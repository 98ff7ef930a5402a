"""Pretraining runs: phases, exact resume after SIGTERM / SIGKILL, resume_from and init_from,
NaN handling, config errors.

The runs share one uninterrupted reference (module fixture) and compare their losses with it step
by step; every run uses the same tiny model, so compiled steps come from the persistent cache.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bert_jax.convert import mapping
from bert_jax.core import optim
from bert_jax.training import config_lib, metric_writers, pretrain
from tests.helpers import SMALL_RUN, pretraining_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_config(shared_dirs, total_steps=12, **overrides):
    """BERT-Tiny-shaped but smaller (one layer), two short phases, every step logged. The
    vocabulary is the tokenizer's 1000 tokens, padded to 1024 rows."""
    return pretraining_config(
        total_steps,
        **{
            **SMALL_RUN,
            "data.tokenizer": shared_dirs["tokenizer"],
            "data.cache_dir": shared_dirs["cache"],
            "checkpoint.every_steps": 4,
            "log_every_steps": 1,
            "export_model": False,
            **overrides,
        },
    )


# Single-phase runs compile one train step instead of two (the other modules' runs); this
# module's runs use the reference run's config, whose two steps are compiled once.
ONE_PHASE = {"phase1.fraction": 1.0, "phase2.fraction": 0.0}


def losses_by_step(workdir) -> dict[int, float]:
    """The last logged loss for each step (a resumed run logs its replayed steps again)."""
    rows = metric_writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"), kind="train")
    return {row["step"]: row["loss"] for row in rows}


def sigterm_at(at_step):
    def hook(step, batch):
        if step == at_step:
            os.kill(os.getpid(), signal.SIGTERM)
        return batch

    return hook


@pytest.fixture(scope="module")
def uninterrupted(shared_dirs, tmp_path_factory):
    """The reference run: 12 steps, 11 at length 32 then 1 at 64; its losses and final params."""
    workdir = str(tmp_path_factory.mktemp("uninterrupted"))
    result = pretrain.pretrain(small_config(shared_dirs), workdir)
    step, params = _params_of(workdir, shared_dirs)
    assert step == 12
    return workdir, result, losses_by_step(workdir), params


def _params_of(result_workdir, shared_dirs):
    """Restores the final checkpoint's params as NumPy (the whole train state, as a resume does)."""
    import jax

    from bert_jax.core import partitioning
    from bert_jax.core.trainer import ShardedTrainer
    from bert_jax.training import checkpointing

    config = small_config(shared_dirs)
    tx, _ = optim.from_config(config.optimizer, [11, 1], [config.phase1, config.phase2])
    mesh = partitioning.make_mesh(config.mesh.shape)
    trainer = ShardedTrainer(config_lib.bert_config(config), tx, mesh)
    ckpt = checkpointing.Checkpointer(os.path.join(result_workdir, "checkpoints"), async_save=False)
    state, _, _ = ckpt.restore(trainer.abstract_state(), mesh)
    ckpt.close()
    return int(state.step), jax.tree.map(np.asarray, jax.device_get(state.params))


def assert_same_run(uninterrupted, workdir, steps, shared_dirs=None):
    """Equal losses at `steps` (exactly: same data, dropout and arithmetic), and with
    `shared_dirs` equal final params."""
    import jax

    _, _, expected, ref_params = uninterrupted
    got = losses_by_step(workdir)
    assert [got[step] for step in steps] == [expected[step] for step in steps]
    if shared_dirs is not None:
        step, params = _params_of(workdir, shared_dirs)
        assert step == 12
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
            np.testing.assert_array_equal(a, b)


def test_phase_switch_at_ninety_percent_with_the_schedule(uninterrupted):
    workdir, result, _, _ = uninterrupted
    assert result.final_step == 12 and not result.preempted
    rows = metric_writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"), kind="train")
    by_step = {row["step"]: row for row in rows}
    # round(0.9 * 12) = 11 steps at length 32, then 1 at 64 (steps are counted after the update).
    assert [by_step[s]["seq_len"] for s in range(1, 13)] == [32] * 11 + [64]
    assert [by_step[s]["phase"] for s in (11, 12)] == [1, 2]
    schedule = optim.warmup_decay(1e-3, 3, 12)
    for step in range(1, 13):
        # The logged rate is the one applied in that update (schedule at step - 1).
        np.testing.assert_allclose(
            by_step[step]["learning_rate"], float(schedule(step - 1)), rtol=1e-6
        )
    assert all(np.isfinite(row["loss"]) for row in rows)


def test_sigterm_then_resume_is_exact(uninterrupted, shared_dirs, tmp_path):
    workdir = str(tmp_path / "run")
    first = pretrain.pretrain(small_config(shared_dirs), workdir, step_hook=sigterm_at(6))
    assert first.preempted and first.final_step == 7
    saved = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
    assert max(saved) == 7
    plot = os.path.join(workdir, "plots", "pretraining.png")
    os.utime(plot, ns=(0, 0))  # a redraw gives it a new time
    second = pretrain.pretrain(small_config(shared_dirs), workdir)
    assert second.final_step == 12 and not second.preempted
    assert os.stat(plot).st_mtime_ns > 0, "a resume that trains redraws the plot"

    assert sorted(losses_by_step(workdir)) == list(range(1, 13))
    assert_same_run(uninterrupted, workdir, range(1, 13), shared_dirs)


def test_sigkill_after_checkpoint_then_resume_from_is_exact(uninterrupted, shared_dirs, tmp_path):
    """A process killed after its step-8 checkpoint; `config.resume_from` then continues it in
    another workdir (state and data position of the killed run) exactly as if never stopped."""
    workdir = str(tmp_path / "killed")
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        sys.path.insert(0, {REPO!r})
        import tests.conftest  # 8 CPU devices, as in the parent
        from tests.test_pretrain import small_config
        from bert_jax.training import pretrain

        def hook(step, batch):
            if step == 10:
                # Killed after its last checkpoint: wait until Orbax has committed step 8.
                committed = os.path.join({workdir!r}, "checkpoints", "8")
                for _ in range(600):
                    if os.path.isdir(committed):
                        break
                    time.sleep(0.1)
                os.kill(os.getpid(), signal.SIGKILL)
            return batch

        pretrain.pretrain(small_config({shared_dirs!r}), {workdir!r}, step_hook=hook)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert steps and steps[-1] == 8, steps

    continued = str(tmp_path / "continued")
    result = pretrain.pretrain(small_config(shared_dirs, resume_from=workdir), continued)
    assert result.final_step == 12
    assert sorted(losses_by_step(continued)) == [9, 10, 11, 12]  # its own steps only
    assert_same_run(uninterrupted, continued, range(9, 13), shared_dirs)


def test_injected_nan_is_skipped_and_counted(shared_dirs, tmp_path):
    def poison(step, batch):
        if step == 2:
            batch = dict(batch, masked_lm_weights=np.full_like(batch["masked_lm_weights"], np.nan))
        return batch

    # The reference run's config: its two compiled steps come from the persistent cache.
    config = small_config(shared_dirs)
    result = pretrain.pretrain(config, str(tmp_path / "nan"), step_hook=poison)
    assert result.final_step == 12 and result.skipped_steps == 1
    events = metric_writers.read_jsonl(str(tmp_path / "nan" / "metrics.jsonl"), kind="event")
    assert [e["step"] for e in events] == [3]
    assert np.isfinite(result.last_train["loss"])


def test_too_many_non_finite_steps_stop_with_the_checkpoint_intact(shared_dirs, tmp_path):
    def poison_from_5(step, batch):
        if step >= 5:
            batch = dict(batch, masked_lm_weights=np.full_like(batch["masked_lm_weights"], np.nan))
        return batch

    config = small_config(shared_dirs, max_consecutive_nonfinite=2)  # the reference's steps
    with pytest.raises(pretrain.NonFiniteError, match="3 consecutive steps.*checkpoint is step 4"):
        pretrain.pretrain(config, str(tmp_path / "bad"), step_hook=poison_from_5)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.vocab_size": 512}, "tokenizer has 1000 tokens but config.model.vocab_size=512"),
        ({"phase1.batch_size": 12}, "config.phase1.batch_size=12 is not divisible"),
        ({"phase2.max_seq_length": 128}, "config.phase2.max_seq_length=128 exceeds"),
        ({"data.source": "", "phase1.data": ""}, "config.phase1.data and config.data.source"),
        ({"phase1.fraction": 0.8}, "fraction must be 1"),
    ],
)
def test_config_errors_fail_before_compiling(shared_dirs, tmp_path, overrides, message):
    config = small_config(shared_dirs, **overrides)
    with pytest.raises(ValueError, match=message):
        pretrain.pretrain(config, str(tmp_path / "err"))
    assert not os.path.exists(tmp_path / "err" / "checkpoints")


def test_workdir_is_a_model_for_later_commands(uninterrupted, shared_dirs, tmp_path):
    """MODEL may be a workdir: its latest checkpoint while unexported, else its model/ export."""
    import jax

    from bert_jax.training import load_model

    reference_dir, _, _, ref_params = uninterrupted
    loaded = load_model.load_model_dir(reference_dir, load_tokenizer=True)
    assert loaded.info["source"] == "checkpoint" and loaded.info["step"] == 12
    assert loaded.tokenizer.vocab_size == 1000
    for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(ref_params)):
        np.testing.assert_array_equal(a, b)

    workdir = str(tmp_path / "exported")
    config = small_config(shared_dirs, export_model=True)  # the reference's compiled steps
    result = pretrain.pretrain(config, workdir)
    assert result.model_dir == os.path.join(workdir, "model")
    exported = load_model.load_model_dir(workdir)
    assert exported.has_heads and exported.config.hidden_size == 64
    assert exported.tokenizer.vocab_size == 1000


def test_init_from_a_model_directory(uninterrupted, shared_dirs, tmp_path):
    """`config.init_from`: params only. A model directory holding the scratch run's initial params
    (saved with an unpadded vocabulary, as a converted Google checkpoint; the run pads it back to
    1024 rows) must give the reference run's losses."""
    import jax

    from bert_jax.convert.model_dir import save_model_dir
    from bert_jax.core import partitioning
    from bert_jax.core.trainer import ShardedTrainer, init_and_dropout_keys
    from bert_jax.training import load_model

    config = small_config(shared_dirs)
    model_config = config_lib.bert_config(config)
    mesh = partitioning.make_mesh(config.mesh.shape)
    tx, _ = optim.from_config(config.optimizer, [11, 1], [config.phase1, config.phase2])
    trainer = ShardedTrainer(model_config, tx, mesh)
    init_rng, _ = init_and_dropout_keys(int(config.seed), config.dropout_rng_impl)
    state = trainer.init(init_rng)
    unpadded = model_config.replace(vocab_pad_multiple=1)
    initial = jax.tree.map(np.asarray, jax.device_get(state.params))
    exported = str(tmp_path / "exported")
    save_model_dir(exported, unpadded, mapping.repad_vocab(initial, unpadded))
    source = load_model.load_model_dir(exported)
    assert source.config.padded_vocab_size == 1000

    # The params as loaded into a fresh state: the source's, repadded with zero rows.
    loaded = pretrain._state_from_model_dir(trainer, state, exported)  # noqa: SLF001
    table = np.asarray(loaded.params["bert"]["embeddings"]["word_embeddings"]["embedding"])
    assert table.shape == (1024, 64) and not np.any(table[1000:])
    want = mapping.repad_vocab(source.params, model_config)
    for a, b in zip(jax.tree.leaves(jax.device_get(loaded.params)), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)

    # The run from them: the reference's losses (stopped after three steps).
    fresh = str(tmp_path / "fresh")
    config = small_config(shared_dirs, init_from=exported)
    result = pretrain.pretrain(config, fresh, step_hook=sigterm_at(2))
    assert result.final_step == 3
    assert_same_run(uninterrupted, fresh, [1, 2, 3])
    assert load_model.load_model_dir(fresh).config.padded_vocab_size == 1024
    assert os.listdir(os.path.join(fresh, "tensorboard")), "TensorBoard events were written"


def test_the_run_draws_its_curves(uninterrupted):
    """plots/pretraining.png is drawn at the end from the run's own metrics.jsonl."""
    workdir = uninterrupted[0]
    with open(os.path.join(workdir, "plots", "pretraining.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_finished_run_is_not_resumed_on_another_schedule(uninterrupted, shared_dirs, tmp_path):
    """A copy of the finished 12-step run (11 steps at 32, 1 at 64) rerun with total_steps=18
    would be back in phase 1 (round(0.9 x 18) = 16) with the learning rate jumping from the end
    of its decay: refused in one line naming the change and both ways on, before anything is
    compiled or written, in its workdir as through config.resume_from. Rerun with its own
    schedule, the copy resumes (at its end: nothing to do; its plot is kept)."""
    import shutil

    from bert_jax.runtime.errors import UserError

    copy = str(tmp_path / "copy")
    shutil.copytree(uninterrupted[0], copy, ignore=shutil.ignore_patterns("tensorboard"))
    with open(os.path.join(copy, "config.json"), encoding="utf-8") as f:
        recorded = f.read()
    checkpoints = sorted(os.listdir(os.path.join(copy, "checkpoints")))
    schedule = optim.warmup_decay(1e-3, 3, 12)
    extended = optim.warmup_decay(1e-3, 3, 18)
    with pytest.raises(UserError) as refused:
        pretrain.pretrain(small_config(shared_dirs, total_steps=18), copy)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"--workdir {copy} was trained to step 12 on another schedule")
    assert "config.total_steps=18 here, 12 there" in message
    assert "phases 0-10 at seq 32, 11-11 at seq 64 would become 0-15 at seq 32, 16-17" in message
    assert "step 13 would run in phase 1 (seq 32), not phase 2 (seq 64)" in message
    old, new = float(schedule(11)), float(extended(12))
    assert f"the learning rate would go from {old:.2e} (step 12) to {new:.2e} (step 13)" in message
    assert "resume with its own schedule (--config.total_steps=12)" in message
    assert f"start another --workdir with --config.init_from={copy} (its params only" in message
    with open(os.path.join(copy, "config.json"), encoding="utf-8") as f:
        assert f.read() == recorded  # nothing written
    assert sorted(os.listdir(os.path.join(copy, "checkpoints"))) == checkpoints

    # The same through config.resume_from, into a new workdir.
    with pytest.raises(
        UserError, match=r"^config.resume_from=.* was trained to step 12 on another"
    ):
        config = small_config(shared_dirs, total_steps=18, resume_from=copy)
        pretrain.pretrain(config, str(tmp_path / "other"))

    # With its own schedule the copy resumes where it ended, and keeps its plot: no step ran.
    plot = os.path.join(copy, "plots", "pretraining.png")
    os.utime(plot, ns=(0, 0))  # a redraw gives it a new time
    with open(plot, "rb") as f:
        drawn = f.read()
    assert pretrain.pretrain(small_config(shared_dirs), copy).final_step == 12
    assert os.stat(plot).st_mtime_ns == 0
    with open(plot, "rb") as f:
        assert f.read() == drawn


def test_the_first_line_says_how_many_steps_a_size_preset_trains():
    """`--config bert:tiny` without --config.total_steps: a CPU trial of 1,000 steps (not the
    paper's 1,000,000), said first; base keeps the paper's."""
    from bert_jax.configs import bert  # what --config bert:SIZE loads

    line = pretrain.opening_line(bert.get_config("tiny"), "W")
    assert "; 1,000 steps (config.total_steps) in 2 phase(s)," in line
    base = pretrain.opening_line(bert.get_config("base"), "W")
    assert "; 1,000,000 steps (config.total_steps) in 2 phase(s)," in base
