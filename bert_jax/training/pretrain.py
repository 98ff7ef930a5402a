"""The pretraining loop: phases, resume, checkpoints, evaluation, metrics, preemption, export.

`pretrain(config, workdir)` runs the paper's schedule: phase 1 takes `phase1.fraction` of
`total_steps` at `phase1.max_seq_length` (128, 20 predictions), phase 2 the rest at 512 / 80; the
model, optimizer state and step carry across the switch, and each phase has its own data source
and global batch size.

Resume order (first that applies):
  1. the latest checkpoint in `<workdir>/checkpoints` (train state + data position: exact resume);
  2. `config.resume_from`: a checkpoint directory or workdir of another run (state + position);
  3. `config.init_from`: a model directory (params only: optimizer and step start fresh);
  4. scratch (random init from `config.seed`).

Workdir layout: `config.json` (the resolved config), `checkpoints/` (Orbax), `metrics.jsonl`,
`tensorboard/`, `plots/pretraining.png` (loss, accuracies and learning rate; at the end and at an
eval a minute after the last drawing, not redrawn by a resume that trains no step when it
exists), `tokenizer/` (when one was trained for the run), `data/` (records prepared on the fly),
`model/` (the exported model directory).

Failure behaviour: a non-finite loss or gradient skips the update (train_step) and is counted;
more than `max_consecutive_nonfinite` in a row stop the run with `NonFiniteError`, leaving the
last checkpoint untouched. Config errors fail before anything is compiled, naming the setting.
SIGTERM (or a TPU preemption notice) saves a checkpoint at the next step boundary and exits.
One run per workdir: process 0 holds `<workdir>/bert-jax.lock` while it runs (`workdir.py`).
A latest checkpoint that cannot be restored is set aside (renamed, never deleted) and the newest
intact one is used; what a killed run left half-written is removed; metrics rows of the steps
that are redone after a resume are dropped first; a full disk during a save is one error line.

Why this file is long: set-up, resume, the step loop and export are one run's story, read top to
bottom; the pieces with a job of their own live beside it (inputs, checkpointing, step_log,
heldout_eval, load_model).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from bert_jax.convert import mapping
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.core import optim, partitioning
from bert_jax.core.trainer import ShardedTrainer, TrainState, init_and_dropout_keys
from bert_jax.data import objectives
from bert_jax.data.pipeline import input_shards
from bert_jax.data.tokenizers.load_or_train import check_prepared_with
from bert_jax.runtime import distributed, fs
from bert_jax.runtime import heartbeat as heartbeat_lib
from bert_jax.runtime.errors import UserError, user_path
from bert_jax.training import (
    checkpointing,
    config_checks,
    config_lib,
    data_position,
    eval_choice,
    heldout_eval,
    inputs,
    load_model,
    metric_writers,
    plots,
)
from bert_jax.training import workdir as workdir_lib
from bert_jax.training.config_lib import Phase

# NonFiniteError: raised by the loop (StepLog), under this module's name too (cli/pretrain.py).
from bert_jax.training.step_log import NonFiniteError, StepLog  # noqa: F401

log = logging.getLogger("bert_jax")


@dataclasses.dataclass
class PretrainResult:
    final_step: int
    preempted: bool
    skipped_steps: int
    last_train: dict[str, float]
    last_eval: dict[str, float]
    workdir: str
    model_dir: str | None


def pretrain(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    step_hook: Callable[[int, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
) -> PretrainResult:
    """Runs (or resumes) pretraining in `workdir`. `step_hook(step, batch)` may alter batches
    (tests use it to inject NaNs)."""
    workdir = fs.abspath(workdir)
    is_main = jax.process_index() == 0
    inputs.adopt_init_from(config)  # init_from's hidden_act, vocabulary, ...: the model's own
    phases = config_lib.split_phases(config)
    config_checks.check_values(config, phases)  # before the workdir exists
    config_lib.bert_config(config)  # a bad model setting fails first
    if config.resume_from:  # another run of another objective: refused before any work
        _check_run_objective(config.resume_from, config_lib.objective(config))
    inputs.check_records_objective(  # records made for another objective: before any work
        config, [(f"data for {p.name}", p.source) for p in phases] + _eval_sources(config, phases)
    )
    # Hosts that run different configs would hang or diverge later: fail now, naming the keys.
    distributed.check_hosts_agree({"config": distributed.config_fingerprint_text(config)})
    if is_main:
        with user_path(workdir, "--workdir", writing=True):
            fs.makedirs(workdir, exist_ok=True)
    distributed.sync_hosts("workdir")
    lock = workdir_lib.lock(workdir, is_main)
    try:
        return _pretrain_locked(config, workdir, is_main, step_hook)
    finally:
        lock.release()


def _pretrain_locked(config, workdir: str, is_main: bool, step_hook) -> PretrainResult:
    """`pretrain` while this run holds the workdir's lock."""
    # --- Set-up: config checked, tokenizer resolved (nothing compiled yet). ---
    console = _console if is_main else (lambda *a, **k: None)
    rules = partitioning.rules_from_config(config.mesh.rules)
    console(opening_line(config, workdir))
    warning = config_lib.warmup_warning(config, config_lib.split_phases(config))
    if warning:
        console(f"bert-jax pretrain: {warning}")
    phases, mesh, tokenizer = _prepare_workdir(config, workdir, is_main, console)
    # The vocabulary is the tokenizer's by now (a ModernBERT model takes its special ids too).
    model_config = config_lib.bert_config(config, tokenizer)
    evals = eval_choice.eval_choices(config, phases)
    total = phases[-1].end
    optimizer, phase_specs = config_lib.resolved_optimizer(config, phases)
    tx, schedule = optim.from_config(optimizer, [p.steps for p in phases], phase_specs)
    accum_steps = int(config.grad_accum_steps)
    trainer = ShardedTrainer(
        model_config, tx, mesh, rules, schedule, accum_steps=accum_steps,
        **partitioning.mesh_options(config.mesh),
    )  # fmt: skip
    init_rng, dropout_rng = init_and_dropout_keys(
        int(config.seed), str(config.get("dropout_rng_impl", "threefry2x32"))
    )
    checkpointer = checkpointing.Checkpointer(
        os.path.join(workdir, "checkpoints"),
        keep=int(config.checkpoint.keep),
        async_save=bool(config.checkpoint.async_save),
    )
    if is_main:
        workdir_lib.remove_leftovers(workdir, checkpointer, console)
    distributed.sync_hosts("leftovers")
    checkpointer.reload()

    # --- Resume: latest in workdir > explicit checkpoint > model directory > scratch. ---
    state, restored_phase, restored_position, origin = _restore_or_init(
        config, trainer, checkpointer, init_rng
    )
    step = int(state.step)
    if is_main:  # the rows of steps after this one are redone: drop the old ones
        metric_writers.drop_rows_after(os.path.join(workdir, "metrics.jsonl"), step)
    console(
        f"bert-jax pretrain: starting at step {step} from {origin} on {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s), mesh {dict(mesh.shape)}"
    )

    # --- The loop: dispatch step N, then read step N-1's metrics (never block the device). ---
    writer = metric_writers.MetricWriter(workdir, enabled=is_main)
    step_log = StepLog(config, total, model_config, writer, console, checkpointer)
    preemption = checkpointing.Preemption(checkpointer)
    heartbeat = heartbeat_lib.Heartbeat(  # for a supervisor (launch tpu watch)
        workdir, jax.process_index(), step, total, process_count=jax.process_count()
    )
    plot_path = os.path.join(workdir, plots.PLOT_NAME)
    started_at = step
    iterator, phase, eval_batches, last_eval, preempted = None, None, None, {}, False
    compiling = False
    plotted_at = time.monotonic()  # the plot of a run shorter than plots.REDRAW_SECONDS: at its end
    try:
        while step < total:
            if phase is None or step >= phase.end:  # a new phase: its own inputs
                step_log.flush()  # the last phase's last row first
                phase = config_lib.phase_at(phases, step)
                console(
                    f"phase {phase.index + 1}: steps {phase.start}-{phase.end - 1}, seq "
                    f"{phase.max_seq_length}, {phase.max_predictions_per_seq} predictions, "
                    f"global batch {phase.batch_size}, data {phase.source}"
                )
                iterator = inputs.train_iterator(config, phase, tokenizer, workdir, console)
                if restored_position is not None and restored_phase == phase.index:
                    iterator.set_state(restored_position)
                restored_position = None
                eval_batches = None  # prepared at the phase's first evaluation, if it has one
                compiling = True
            local = next(iterator)
            step_log.note_corrupt_files(step, iterator.corrupt_files)
            if step_hook is not None:
                local = step_hook(step, local)
            started = time.perf_counter()
            state, step_metrics = trainer.train_step(
                state, trainer.global_batch(local), dropout_rng
            )
            step += 1
            if compiling:  # the phase's first step compiles (synchronously) before it runs
                step_log.compiled(step, phase, time.perf_counter() - started)
                compiling = False
            step_log.push(step, step_metrics, phase)
            heartbeat.beat(step)

            preempted = preemption.requested(step)
            if _every(step, config.checkpoint.every_steps, total) or preempted:
                step_log.flush()
                _save_checkpoint(checkpointer, step, state, phase, iterator, mesh)
            evaluation = evals[phase.index]
            if evaluation.source and eval_choice.evaluates_at(config, step, total):
                if eval_batches is None:
                    eval_batches = inputs.eval_batches(
                        config, phase, evaluation, tokenizer, workdir, console
                    )
                if eval_batches:  # [] only where a corpus's preparation set nothing aside
                    step_log.flush()  # the curves include this step's row
                    last_eval = _evaluate_and_log(
                        trainer, state, eval_batches, step, writer, console
                    )
                    if is_main and plots.due(plotted_at):
                        plots.write_plot(writer.jsonl_path, plot_path)
                        plotted_at = time.monotonic()
                # Evaluation time is not training throughput.
                step_log.window.throughput.reset()
                step_log.paused()
            if preempted:
                console(f"preemption requested: saved checkpoint at step {step}; exiting")
                break
        step_log.flush()
        # A resumed run that trained no step left metrics.jsonl as it was: its plot stands.
        if is_main and (step > started_at or not fs.exists(plot_path)):
            plots.write_plot(writer.jsonl_path, plot_path)
    finally:
        try:
            checkpointer.wait()  # raises CheckpointSaveError if the last save failed
        finally:
            heartbeat.close("done" if step >= total else "stopped" if preempted else "exited")
            preemption.restore()
            writer.close()

    # --- Export and summary. ---
    model_path = None
    if not preempted and config.export_model:
        model_path = export_model(trainer, state, tokenizer, os.path.join(workdir, "model"))
        console(f"exported model directory {model_path}")
    checkpointer.close()
    if last_eval:
        nsp = heldout_eval.nsp_words(last_eval)
        nsp = f"; {nsp}" if nsp else ""
        console(
            f"final eval: MLM accuracy {last_eval['mlm_accuracy']:.4f} vs "
            f"{last_eval['mlm_baseline_accuracy']:.4f} for always predicting the most frequent "
            f"token; MLM perplexity {last_eval['mlm_perplexity']:.2f}{nsp}"
        )
    console(
        f"checkpoints: {checkpointer.directory}\nmetrics: {writer.jsonl_path}\n"
        f"plots: {plot_path}\n{tensorboard_line(writer.tensorboard_dir)}"
    )
    return PretrainResult(
        final_step=step,
        preempted=preempted,
        skipped_steps=int(jax.device_get(state.skipped)),
        last_train=step_log.last_train,
        last_eval=last_eval,
        workdir=workdir,
        model_dir=model_path,
    )


def _eval_sources(config, phases: list[Phase]) -> list[tuple[str, str]]:
    """(what, source) of every phase's eval data, for the checks the training data gets."""
    choices = eval_choice.eval_choices(config, phases)
    return [(f"eval data for {p.name}", c.source) for p, c in zip(phases, choices) if c.source]


def _every(step: int, every_steps: int, total: int) -> bool:
    return step % int(every_steps) == 0 or step == total


def _console(*args, **kwargs) -> None:
    print(*args, **kwargs, flush=True)  # a line as soon as it is said, also into a pipe


def opening_line(config, workdir: str) -> str:
    """The run's first line: model, steps, warmup and the intervals of logs, checkpoints, evals."""
    phases = config_lib.split_phases(config)
    total = phases[-1].end
    optimizer, _ = config_lib.resolved_optimizer(config, phases)
    warmup = (
        f"warmup {optimizer.warmup_steps} steps"
        if optimizer.schedule == "whole_run"
        else "warmup per phase"
    )
    evaluation, _ = eval_choice.eval_outline(config, phases)
    vocab = inputs.vocab_choice(config, phases, workdir)
    return (
        f"bert-jax pretrain: {config.model.num_hidden_layers} layers, hidden "
        f"{config.model.hidden_size}, {vocab}; {total:,} steps (config.total_steps) in "
        f"{len(phases)} phase(s), lr {config.optimizer.learning_rate:g} after {warmup}; a line "
        f"every {config.log_every_steps} steps, checkpoint every {config.checkpoint.every_steps} "
        f"and at the end, {evaluation}; workdir {workdir}"
    )


def tensorboard_line(directory: str) -> str:
    """How to look at the TensorBoard events: the command, or how to install it first."""
    if shutil.which("tensorboard"):
        return f"tensorboard: tensorboard --logdir {directory}"
    return (
        f"tensorboard: events in {directory} (`pip install tensorboard`, then "
        f"`tensorboard --logdir {directory}`)"
    )


def _prepare_workdir(config, workdir: str, is_main: bool, console=lambda *a: None):
    """(phases, mesh, tokenizer) after every check that must fail before compiling; writes the
    workdir's config.json and tokenizer/."""
    phases = config_lib.split_phases(config)
    mesh = partitioning.make_mesh(config.mesh.shape)
    config_checks.validate(config, phases, mesh, None)
    tokenizer = inputs.resolve_tokenizer(config, phases, workdir, console)
    inputs.follow_tokenizer(config, tokenizer)  # config.model.vocab_size=0: the tokenizer's
    workdir_lib.check_same_model(workdir, config)  # before config.json is written anew
    workdir_lib.check_workdir_schedule(workdir, config)  # likewise
    config_checks.validate(config, phases, mesh, tokenizer)
    named = [(f"config.{p.name} data", p.source) for p in phases]
    check_prepared_with(tokenizer, named + _eval_sources(config, phases), "the run's tokenizer")
    own_tokenizer = os.path.join(workdir, "tokenizer")
    if is_main and not fs.isdir(own_tokenizer):
        tokenizer.save(own_tokenizer)  # the workdir alone then describes the model
    if is_main:
        with fs.open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            f.write(config.to_json_best_effort(indent=2))
    return phases, mesh, tokenizer


def _restore_or_init(config, trainer: ShardedTrainer, checkpointer, init_rng):
    """(state, phase, data position, origin) by the resume order in the module docstring."""
    # A host that sees another latest checkpoint (e.g. a workdir not shared by all hosts) would
    # restore something else than the others: fail now instead.
    distributed.check_hosts_agree({"latest checkpoint step": str(checkpointer.latest_step())})
    _, _, num_shards = input_shards.layout(
        config_lib.data_shards(config), jax.process_index(), jax.process_count()
    )
    if checkpointer.latest_step() is not None:
        # The newest checkpoint that can be restored; damaged newer ones are set aside.
        restored, step, failed = checkpointer.restore_intact(
            trainer.abstract_state(), trainer.mesh, num_shards=num_shards
        )
        if failed and jax.process_index() == 0:
            for (bad, problem), moved in zip(failed, checkpointer.set_aside(failed)):
                log.warning(
                    "checkpoint step %d cannot be restored (%s): set aside as %s; resuming "
                    "from step %d",
                    bad,
                    problem,
                    moved,
                    step,
                )
        distributed.sync_hosts("set aside")
        checkpointer.reload()
        origin = f"checkpoint {checkpointer.directory} step {step}"
        if failed:
            origin += " (" + ", ".join(f"step {s} set aside" for s, _ in failed) + ")"
        return (*restored, origin)
    if config.resume_from:
        _check_run_objective(config.resume_from, trainer.config.objective)
        other = checkpointing.Checkpointer(
            checkpointing.find_checkpoint_dir(config.resume_from), async_save=False
        )
        if other.latest_step() is None:
            raise UserError(f"config.resume_from: no checkpoint in {other.directory}")
        # The newest one that can be restored (another run's: nothing there is moved).
        (state, phase, position), step, failed = other.restore_intact(
            trainer.abstract_state(), trainer.mesh, num_shards=num_shards
        )
        other.close()
        for bad, problem in failed:
            log.warning(
                "config.resume_from: checkpoint step %d in %s cannot be restored (%s); using "
                "step %d",
                bad,
                other.directory,
                problem,
                step,
            )
        theirs = _run_config(config.resume_from)
        if theirs is not None:  # its phases and learning rate go on as they were
            hint = (
                f"start with --config.init_from={config.resume_from} instead (its params only: "
                "the optimizer, the step and the schedule start anew)"
            )
            where = f"config.resume_from={config.resume_from}"
            workdir_lib.check_same_schedule(theirs, where, int(step), config, hint)
        origin = f"config.resume_from={config.resume_from} step {int(state.step)}"
        return state, phase, position, origin
    state = trainer.init(init_rng)
    if not config.init_from:
        return state, None, None, "scratch"
    state = _state_from_model_dir(trainer, state, config.init_from)
    return state, None, None, f"config.init_from={config.init_from} (params only)"


def _run_config(path: str) -> dict | None:
    """The config.json of the run whose checkpoints `path` (config.resume_from) holds, if any."""
    directory = checkpointing.find_checkpoint_dir(path)
    for candidate in (path, os.path.dirname(os.path.normpath(directory))):
        run_config = os.path.join(candidate, load_model.CONFIG_NAME)
        if fs.exists(run_config):
            with fs.open(run_config, encoding="utf-8") as f:
                return json.load(f)
    return None


def _check_run_objective(path: str, objective: str) -> None:
    """Refuses config.resume_from of a run (its workdir's config.json) with another objective."""
    theirs = _run_config(path)
    if theirs is not None:
        objective_there = theirs.get("objective", objectives.DEFAULT_OBJECTIVE)
        objectives.check_model(f"config.resume_from={path}", objective_there, objective)


def _save_checkpoint(checkpointer, step: int, state, phase: Phase, iterator, mesh) -> None:
    """Saves the train state with every input shard's position (a collective on all hosts)."""
    position = data_position.encode_position(phase.index, iterator.get_state(), mesh)
    checkpointer.save(step, state, position)


def _evaluate_and_log(trainer, state, batches, step: int, writer, console) -> dict[str, float]:
    result = heldout_eval.evaluate(
        lambda local: trainer.eval_step(state.params, trainer.global_batch(local)),
        batches,
        trainer.config.vocab_size,
        trainer.config.objective,
    )
    writer.write(step, result, kind="eval")
    nsp = heldout_eval.nsp_words(result)
    console(
        f"eval step {step}: mlm accuracy {result['mlm_accuracy']:.4f} (most "
        f"frequent token {result['mlm_baseline_accuracy']:.4f}), mlm perplexity "
        f"{result['mlm_perplexity']:.2f}, loss {result['loss']:.4f}" + (f"; {nsp}" if nsp else "")
    )
    return result


def _state_from_model_dir(trainer: ShardedTrainer, state: TrainState, path: str) -> TrainState:
    """Params from a model directory of the run's family on top of a fresh state (optimizer and
    step fresh)."""
    from bert_jax.convert import modernbert_names
    from bert_jax.core.modernbert_config import ModernBertConfig

    loaded = load_model.load_model_dir(path)

    def family(model_config) -> str:
        return "modernbert" if isinstance(model_config, ModernBertConfig) else "bert"

    theirs, ours = family(loaded.config), family(trainer.config)
    if theirs != ours:
        raise UserError(
            f"config.init_from={path} is a {theirs} model; this run pretrains {ours} "
            f"(config.model.family)"
        )
    objectives.check_model(
        f"config.init_from={path}", loaded.config.objective, trainer.config.objective
    )
    shape_fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    shape_fields += ("intermediate_size",)
    if ours == "modernbert":  # rotary positions: no table; the biases shape the tree
        shape_fields += ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias")
        shape_fields += ("classifier_bias",)
    else:
        shape_fields += ("max_position_embeddings", "type_vocab_size")
    mismatched = [
        f"{f}: {getattr(loaded.config, f)} there, {getattr(trainer.config, f)} here"
        for f in shape_fields
        if getattr(loaded.config, f) != getattr(trainer.config, f)
    ]
    if mismatched:
        raise UserError(
            f"config.init_from={path} does not match config.model ({'; '.join(mismatched)})"
        )
    params = jax.tree.map(np.asarray, jax.device_get(state.params))
    if ours == "modernbert":
        # The vocabulary rows as this run pads them (the directory's padding may differ).
        incoming = mapping._copy_dicts(loaded.params)  # noqa: SLF001
        for entry in modernbert_names.entries(trainer.config, with_heads="head" in incoming):
            if entry.path[-1] in ("embedding", "decoder_bias"):
                value = np.asarray(mapping.get_path(incoming, entry.path))
                value = mapping._with_rows(value, trainer.config)  # noqa: SLF001
                mapping.set_path(incoming, entry.path, value)
        params["model"] = incoming["model"]
        heads = ("head", "decoder_bias")
    else:
        # The vocabulary padding may differ (e.g. a converted Google checkpoint has none).
        incoming = mapping.repad_vocab(loaded.params, trainer.config)
        params["bert"] = incoming["bert"]
        heads = ("predictions", "seq_relationship")
    if heads[0] in incoming:
        params.update({name: incoming[name] for name in heads if name in incoming})
    else:
        log.warning("%s has no pretraining heads; they start from scratch", path)
    params = jax.device_put(params, trainer.state_shardings.params)
    return state.replace(params=params)


def export_model(trainer: ShardedTrainer, state: TrainState, tokenizer, path: str) -> str:
    """Writes the model directory (DESIGN.md) that `convert`, `encode` and `glue` read."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(state.params, tiled=True)
    else:
        params = jax.device_get(state.params)
    if jax.process_index() == 0:
        save_model_dir(path, trainer.config, params, tokenizer=tokenizer, overwrite=True)
    distributed.sync_hosts("export")
    return path
