"""The pretraining run: phases, resume, checkpoints, evaluation, metrics, preemption, export.

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
`tensorboard/`, `tokenizer/` (when one was trained for the run), `data/` (records prepared on the
fly), `model/` (the exported model directory).

Failure behaviour: a non-finite loss or gradient skips the update (train_step) and is counted;
more than `max_consecutive_nonfinite` in a row stop the run with `NonFiniteError`, leaving the
last checkpoint untouched. Config errors fail before anything is compiled, naming the setting.
SIGTERM (or a TPU preemption notice) saves a checkpoint at the next step boundary and exits.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import (
    checkpointing,
    config_lib,
    distributed,
    inputs,
    losses,
    metrics,
    model_dir,
    optim,
    partitioning,
)
from bert_jax.convert import mapping
from bert_jax.data import shards as input_shards
from bert_jax.train import ShardedTrainer, TrainState, init_and_dropout_keys

log = logging.getLogger("bert_jax")


class NonFiniteError(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient."""


@dataclasses.dataclass
class PretrainResult:
    final_step: int
    preempted: bool
    skipped_steps: int
    last_train: dict[str, float]
    last_eval: dict[str, float]
    workdir: str
    model_dir: str | None


class _Preemption:
    """Turns SIGTERM into a flag checked at step boundaries (single-process runs).

    Multi-process runs rely on JAX's distributed preemption notice instead (through Orbax's
    `reached_preemption`), so that all hosts stop at the same step.
    """

    def __init__(self):
        self.requested = False
        self._previous = None
        if jax.process_count() == 1:
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        del signum, frame
        self.requested = True

    def restore(self):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class _Window:
    """Host-side sums of the steps since the last log line."""

    def __init__(self):
        self.sums = collections.Counter()
        self.grad_norms: list[float] = []
        self.steps = 0

    def add(self, values: dict[str, Any]) -> None:
        for key in (
            "mlm_loss_sum",
            "mlm_correct_sum",
            "mlm_weight",
            "nsp_loss_sum",
            "nsp_correct_sum",
            "nsp_weight",
        ):
            self.sums[key] += float(values[key])
        self.grad_norms.append(float(values["grad_norm"]))
        self.steps += 1


def evaluate(
    trainer: ShardedTrainer, params, batches: list[dict[str, np.ndarray]], vocab_size: int
) -> dict[str, float]:
    """Held-out MLM and NSP accuracy, with the always-the-most-frequent-token baseline."""
    sums = collections.Counter()
    counts = np.zeros((vocab_size,), np.float64)
    for local in batches:
        out = jax.device_get(trainer.eval_step(params, trainer.global_batch(local)))
        sums.update({k: float(v) for k, v in out.items()})
        np.add.at(counts, local["masked_lm_ids"].ravel(), local["masked_lm_weights"].ravel())
    summary = losses.summarize(sums)
    summary["mlm_baseline_accuracy"] = float(counts.max() / max(counts.sum(), 1e-9))
    summary["examples"] = sum(len(b["input_ids"]) for b in batches)
    return summary


def _state_from_model_dir(trainer: ShardedTrainer, state: TrainState, path: str) -> TrainState:
    """Params from a model directory on top of a fresh state (optimizer and step fresh)."""
    loaded = model_dir.load_model_dir(path)
    shape_fields = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    )
    mismatched = [
        f"{f}: {getattr(loaded.config, f)} there, {getattr(trainer.config, f)} here"
        for f in shape_fields
        if getattr(loaded.config, f) != getattr(trainer.config, f)
    ]
    if mismatched:
        raise ValueError(
            f"config.init_from={path} does not match config.model ({'; '.join(mismatched)})"
        )
    params = jax.tree.map(np.asarray, jax.device_get(state.params))
    # The vocabulary padding may differ (e.g. a converted Google checkpoint has none).
    incoming = mapping.repad_vocab(loaded.params, trainer.config)
    params["bert"] = incoming["bert"]
    if "predictions" in incoming:
        params["predictions"] = incoming["predictions"]
        params["seq_relationship"] = incoming["seq_relationship"]
    else:
        log.warning("%s has no pretraining heads; MLM/NSP heads start from scratch", path)
    params = jax.device_put(params, trainer.state_shardings.params)
    return state.replace(params=params)


def pretrain(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    step_hook: Callable[[int, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
) -> PretrainResult:
    """Runs (or resumes) pretraining in `workdir`. `step_hook(step, batch)` may alter batches
    (tests use it to inject NaNs)."""
    workdir = os.path.abspath(workdir)
    is_main = jax.process_index() == 0
    # Hosts that run different configs would hang or diverge later: fail now, naming the keys.
    distributed.check_hosts_agree({"config": distributed.config_fingerprint_text(config)})
    if is_main:
        os.makedirs(workdir, exist_ok=True)
    distributed.sync_hosts("workdir")
    phases = config_lib.plan_phases(config)
    total = phases[-1].end
    mesh = partitioning.make_mesh(config.mesh.shape)
    rules = partitioning.rules_from_config(config.mesh.rules)
    model_config = config_lib.bert_config(config)
    config_lib.validate(config, phases, mesh, None)
    tokenizer = inputs.resolve_tokenizer(config, phases, workdir)
    config_lib.validate(config, phases, mesh, tokenizer)
    own_tokenizer = os.path.join(workdir, "tokenizer")
    if is_main and not os.path.isdir(own_tokenizer):
        tokenizer.save(own_tokenizer)  # the workdir alone then describes the model
    if is_main:
        with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            f.write(config.to_json_best_effort(indent=2))

    tx, schedule = optim.from_config(
        config.optimizer, [p.steps for p in phases], [config[p.name] for p in phases]
    )
    trainer = ShardedTrainer(
        model_config, tx, mesh, rules, schedule=schedule, accum_steps=int(config.grad_accum_steps)
    )
    init_rng, dropout_rng = init_and_dropout_keys(
        int(config.seed), str(config.get("dropout_rng_impl", "threefry2x32"))
    )
    checkpointer = checkpointing.Checkpointer(
        os.path.join(workdir, "checkpoints"),
        keep=int(config.checkpoint.keep),
        async_save=bool(config.checkpoint.async_save),
    )

    # A host that sees another latest checkpoint (e.g. a workdir not shared by all hosts) would
    # restore something else than the others: fail now instead.
    distributed.check_hosts_agree({"latest checkpoint step": str(checkpointer.latest_step())})
    _, shards_per_host, num_shards = input_shards.layout(
        config_lib.data_shards(config), jax.process_index(), jax.process_count()
    )

    # Resume order: latest in workdir > explicit checkpoint > model directory > scratch.
    restored_phase, restored_position = None, None
    if checkpointer.latest_step() is not None:
        state, restored_phase, restored_position = checkpointer.restore(
            trainer.abstract_state(), mesh, num_shards=num_shards
        )
        origin = f"checkpoint {checkpointer.directory} step {checkpointer.latest_step()}"
    elif config.resume_from:
        other = checkpointing.Checkpointer(
            checkpointing.find_checkpoint_dir(config.resume_from), async_save=False
        )
        state, restored_phase, restored_position = other.restore(
            trainer.abstract_state(), mesh, num_shards=num_shards
        )
        origin = f"config.resume_from={config.resume_from} step {int(state.step)}"
        other.close()
    else:
        state = trainer.init(init_rng)
        origin = "scratch"
        if config.init_from:
            state = _state_from_model_dir(trainer, state, config.init_from)
            origin = f"config.init_from={config.init_from} (params only)"
    step = int(state.step)
    writer = metrics.MetricWriter(workdir, enabled=is_main)
    console = print if is_main else (lambda *a, **k: None)
    console(
        f"bert-jax pretrain: {model_config.num_hidden_layers} layers, hidden "
        f"{model_config.hidden_size}, {total} steps in {len(phases)} phase(s) on "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s) mesh {dict(mesh.shape)}; "
        f"starting at step {step} from {origin}"
    )

    throughput = metrics.Throughput(model_config, jax.device_count(), jax.devices()[0].device_kind)
    preemption = _Preemption()
    window = _Window()
    iterator, iterator_phase, eval_batches = None, None, []
    pending = None
    consecutive_bad = 0
    last_train: dict[str, float] = {}
    last_eval: dict[str, float] = {}
    run_start = time.perf_counter()
    steps_this_run = 0

    def flush(item) -> None:
        """Reads one step's metrics (a step behind the device) and logs windows."""
        nonlocal consecutive_bad, last_train
        done_step, device_metrics, phase = item
        values = jax.device_get(device_metrics)
        throughput.add(
            int(values["real_tokens"]),
            phase.batch_size,
            phase.max_seq_length,
            phase.max_predictions_per_seq,
        )
        if not bool(values["finite"]):
            consecutive_bad += 1
            writer.write(done_step, {"event": "non_finite_step_skipped"}, kind="event")
            console(f"step {done_step}: non-finite loss or gradient; update skipped")
            if consecutive_bad > int(config.max_consecutive_nonfinite):
                raise NonFiniteError(
                    f"{consecutive_bad} consecutive steps up to step {done_step} had a "
                    "non-finite loss or gradient (config.max_consecutive_nonfinite="
                    f"{config.max_consecutive_nonfinite}); stopping. The last good checkpoint "
                    f"is step {checkpointer.latest_step()} in {checkpointer.directory}"
                )
            return
        consecutive_bad = 0
        window.add(values)
        if done_step % int(config.log_every_steps) and done_step != total:
            return
        summary = losses.summarize(window.sums)
        summary["grad_norm"] = float(np.mean(window.grad_norms))
        summary["learning_rate"] = float(values["learning_rate"])
        summary["phase"] = phase.index + 1
        summary["seq_len"] = phase.max_seq_length
        summary.update(throughput.summary())
        summary["skipped_steps_total"] = int(values["skipped_steps"])
        elapsed = time.perf_counter() - run_start
        eta = elapsed / max(steps_this_run, 1) * (total - done_step)
        writer.write(done_step, summary)
        mfu = f" MFU {summary['mfu']:.1%}" if "mfu" in summary else ""
        console(
            f"step {done_step}/{total} [phase {phase.index + 1}, seq {phase.max_seq_length}] "
            f"loss {summary['loss']:.4f} mlm {summary['mlm_loss']:.3f}/"
            f"{summary['mlm_accuracy']:.3f} nsp {summary['nsp_loss']:.3f}/"
            f"{summary['nsp_accuracy']:.3f} lr {summary['learning_rate']:.2e} "
            f"gnorm {summary['grad_norm']:.2f} {summary['tokens_per_sec']:.0f} tok/s "
            f"{summary['sequences_per_sec']:.1f} seq/s "
            f"{summary['model_tflops_per_sec']:.3f} TFLOP/s{mfu} ETA "
            f"{metrics.format_duration(eta)}"
        )
        last_train = summary
        window.__init__()
        throughput.reset()

    def save(at_step: int) -> None:
        position = checkpointing.encode_position(
            iterator_phase.index if iterator_phase else config_lib.phase_at(phases, at_step).index,
            iterator.get_state() if iterator is not None else [None] * shards_per_host,
            mesh,
        )
        checkpointer.save(at_step, state, position)

    preempted = False
    try:
        while step < total:
            phase = config_lib.phase_at(phases, step)
            if iterator_phase is None or iterator_phase.index != phase.index:
                iterator = inputs._iterator(
                    config,
                    phase,
                    phase.source,
                    tokenizer,
                    workdir,
                    batch_size=phase.batch_size,
                    seed=int(config.seed) + phase.index,
                    dynamic=bool(config.data.dynamic_masking),
                    shuffle_buffer=int(config.data.shuffle_buffer_size),
                    packing_factor=float(config[phase.name].get("packing_factor", 0.0)),
                )
                if restored_position is not None and restored_phase == phase.index:
                    iterator.set_state(restored_position)
                restored_position = None
                iterator_phase = phase
                eval_batches = []
                source = inputs.eval_source(config, phase)
                if config.eval.every_steps > 0 and source:
                    eval_iterator = inputs._iterator(
                        config,
                        phase,
                        source,
                        tokenizer,
                        workdir,
                        batch_size=int(config.eval.batch_size),
                        seed=12345,
                        dynamic=False,
                        shuffle_buffer=1,
                    )
                    eval_batches = [next(eval_iterator) for _ in range(int(config.eval.batches))]
                console(
                    f"phase {phase.index + 1}: steps {phase.start}-{phase.end - 1}, seq "
                    f"{phase.max_seq_length}, {phase.max_predictions_per_seq} predictions, "
                    f"global batch {phase.batch_size}, data {phase.source}"
                )
            local = next(iterator)
            if step_hook is not None:
                local = step_hook(step, local)
            state, step_metrics = trainer.train_step(
                state, trainer.global_batch(local), dropout_rng
            )
            step += 1
            steps_this_run += 1
            if pending is not None:
                flush(pending)
            pending = (step, step_metrics, phase)

            preempted = preemption.requested or (
                jax.process_count() > 1 and checkpointer.reached_preemption(step)
            )
            at_checkpoint = step % int(config.checkpoint.every_steps) == 0 or step == total
            if at_checkpoint or preempted:
                flush(pending)
                pending = None
                save(step)
            if eval_batches and (step % int(config.eval.every_steps) == 0 or step == total):
                last_eval = evaluate(trainer, state.params, eval_batches, model_config.vocab_size)
                writer.write(step, last_eval, kind="eval")
                throughput.reset()  # evaluation time is not training throughput
                console(
                    f"eval step {step}: mlm accuracy {last_eval['mlm_accuracy']:.4f} (most "
                    f"frequent token {last_eval['mlm_baseline_accuracy']:.4f}), nsp accuracy "
                    f"{last_eval['nsp_accuracy']:.4f}, loss {last_eval['loss']:.4f}"
                )
            if preempted:
                console(f"preemption requested: saved checkpoint at step {step}; exiting")
                break
        if pending is not None:
            flush(pending)
    finally:
        checkpointer.wait()
        preemption.restore()
        writer.close()

    model_path = None
    if not preempted and config.export_model:
        model_path = export_model(trainer, state, tokenizer, os.path.join(workdir, "model"))
        console(f"exported model directory {model_path}")
    checkpointer.close()
    if last_eval:
        console(
            f"final eval: MLM accuracy {last_eval['mlm_accuracy']:.4f} vs "
            f"{last_eval['mlm_baseline_accuracy']:.4f} for always predicting the most frequent "
            f"token; NSP accuracy {last_eval['nsp_accuracy']:.4f} (chance 0.5)"
        )
    if is_main:
        console(
            f"checkpoints: {checkpointer.directory}\nmetrics: {writer.jsonl_path}\n"
            f"tensorboard: tensorboard --logdir {writer.tensorboard_dir}"
        )
    return PretrainResult(
        final_step=step,
        preempted=preempted,
        skipped_steps=int(jax.device_get(state.skipped)),
        last_train=last_train,
        last_eval=last_eval,
        workdir=workdir,
        model_dir=model_path,
    )


def export_model(trainer: ShardedTrainer, state: TrainState, tokenizer, path: str) -> str:
    """Writes the model directory (DESIGN.md) that `convert`, `encode` and `glue` read."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(state.params, tiled=True)
    else:
        params = jax.device_get(state.params)
    if jax.process_index() == 0:
        model_dir.save_model_dir(path, trainer.config, params, tokenizer=tokenizer, overwrite=True)
    distributed.sync_hosts("export")
    return path
