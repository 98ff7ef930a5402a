"""A pretraining config's checks, each failing before anything compiles and naming its setting.

`check_values` needs no devices (`pretrain --dry-run`, `plan`, `--compile-only` run it); `validate`
adds what depends on the mesh, the input shards and the tokenizer; `dry_run_outline` is what
`--dry-run` prints once the checks pass.
"""

from __future__ import annotations

import math

import jax
import ml_collections

from bert_jax.core import optim, partitioning
from bert_jax.data.pipeline import input_shards
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_lib, config_schema, eval_choice, flops, inputs
from bert_jax.training.config_lib import (
    PRESET_MAX_POSITIONS,
    Phase,
    bert_config,
    count_parameters,
    data_shards,
    flat_settings,
    split_phases,
)
from bert_jax.training.config_schema import MIN_SEQ_LENGTH, setting_value


def validate(config, phases: list[Phase], mesh, tokenizer) -> None:
    """Config errors that must fail before compilation, each naming its setting."""
    check_values(config, phases)
    model = config.model
    # A vocabulary that follows the tokenizer (0) is the tokenizer's: only a set one can differ.
    followed = int(model.vocab_size) == config_lib.FOLLOW_TOKENIZER
    if tokenizer is not None and not followed and tokenizer.vocab_size > model.vocab_size:
        raise UserError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but config.model.vocab_size="
            f"{model.vocab_size}; ids beyond the embedding table give NaN losses. Raise "
            "config.model.vocab_size, set it to 0 (the tokenizer's), or use a smaller vocabulary"
        )
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    _, _, num_shards = input_shards.layout(data_shards(config), 0, jax.process_count())
    for phase in phases:
        setting = f"config.{phase.name}"
        if not phase.source:
            raise UserError(
                f"{setting}.data and config.data.source are empty: name prepared records "
                "(`bert-jax data prepare`), a corpus (text files, .jsonl, tfds:NAME) or 'embedded'"
            )
        partitioning.check_batch_divisible(phase.batch_size, mesh, f"{setting}.batch_size")
        if phase.batch_size % num_shards:
            raise UserError(
                f"{setting}.batch_size={phase.batch_size} is not divisible by the {num_shards} "
                f"input shards (config.data.shards; 0 = one per host, {jax.process_count()} here)"
            )
        accum = int(config.grad_accum_steps)
        if accum < 1 or phase.batch_size % (accum * dp):
            raise UserError(
                f"{setting}.batch_size={phase.batch_size} must be divisible by "
                f"config.grad_accum_steps={accum} x data-parallel size {dp}"
            )
    if any(choice.source for choice in eval_choice.eval_choices(config, phases)):
        partitioning.check_batch_divisible(config.eval.batch_size, mesh, "config.eval.batch_size")
        if config.eval.batch_size % num_shards:
            raise UserError(
                f"config.eval.batch_size={config.eval.batch_size} is not divisible by the "
                f"{num_shards} input shards (config.data.shards)"
            )


def check_sequence_length(
    length: int,
    setting: str,
    max_positions: int = PRESET_MAX_POSITIONS,
    limit: str = "config.model.max_position_embeddings of every size preset",
) -> None:
    """Refuses a sequence length the model cannot hold: positions past its position embeddings
    (`limit` names them; by default every size preset's 512, the bound for `data prepare
    --max-seq-length`, which knows no model), or too short for a sentence pair."""
    if length < MIN_SEQ_LENGTH:
        raise UserError(
            f"{setting}={length} must be at least {MIN_SEQ_LENGTH} ([CLS] A [SEP] B [SEP])"
        )
    if length > max_positions:
        raise UserError(
            f"{setting}={length} exceeds the model's {max_positions} position embeddings ({limit})"
        )


# Settings with a closed set of values, from their declarations (config_schema.py): checked here,
# where `--dry-run`, `plan` and the run all look before the workdir is written (the model,
# optimizer and keys would refuse them later).
CHOICES: dict[str, tuple] = config_schema.choices()
# Attention implementations that cannot drop attention probabilities (pretraining always does,
# unless model.attention_probs_dropout_prob is 0): the model refuses them at the first step.
_NO_ATTENTION_DROPOUT = ("dot_product", "cudnn")


def check_choices(config) -> None:
    """Settings with a closed set of values (their declarations), the mesh shape's form and
    attention implementations that cannot apply the config's dropout, each naming its setting.
    The objective and instance format first, in data/objectives.py's words (data prepare's)."""
    config_lib.objective(config)
    config_lib.instance_format(config)
    closed = config_schema.choice_problems(config)
    if closed:
        raise UserError(closed[0])
    model = config.model
    family = config_lib.family_of(config)
    others = sorted(set(model.keys()) - set(config_schema.family_fields(family)))
    if others:
        raise UserError(
            f"config.model.{others[0]} is not a setting of config.model.family={family!r} "
            "(start from that family's config: --config bert:SIZE or modernbert:SIZE)"
        )
    if family == "modernbert" and config_lib.objective(config) != "mlm":
        raise UserError(
            f"config.objective={config_lib.objective(config)!r}: a ModernBERT model (config."
            "model.family='modernbert') pretrains with masked LM alone; set config.objective=mlm"
        )
    dropout = model.get("attention_probs_dropout_prob", 0.0)
    if model.get("attention_impl") in _NO_ATTENTION_DROPOUT and dropout > 0:
        raise UserError(
            f"config.model.attention_impl={model.attention_impl!r} cannot apply attention-"
            f"probability dropout (config.model.attention_probs_dropout_prob={dropout}); use "
            "'auto' or 'xla', or set the dropout to 0"
        )
    shape = tuple(setting_value(config, "mesh.shape") or (-1, 1, 1))
    sizes_ok = all(isinstance(s, int) and (s >= 1 or s == -1) for s in shape)
    if len(shape) != len(partitioning.MESH_AXES) or shape.count(-1) > 1 or not sizes_ok:
        raise UserError(
            f"config.mesh.shape={shape} must be 3 sizes {partitioning.MESH_AXES}, each at "
            "least 1; one may be -1 (the devices left)"
        )


def check_values(config, phases: list[Phase]) -> None:
    """Values out of range or outside their closed set, each naming its setting (the ranges and
    choices are the settings' declarations, config_schema.py); then the checks across settings.
    Needs no devices (`pretrain --dry-run`, `plan` and the run call it before the workdir is
    written)."""
    check_choices(config)
    # NaN and inf would train to garbage or fail late: every float must be finite.
    for key, value in flat_settings(config):
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"config.{key}={value} must be a finite number")
    ranged = config_schema.range_problems(config)
    if ranged:
        raise UserError(ranged[0])
    config_lib.mask_shares(config)
    if config.eval.every_steps > 0 and min(config.eval.batches, config.eval.batch_size) < 1:
        raise UserError(
            "config.eval.batches and config.eval.batch_size must be at least 1 with evaluation on "
            "(config.eval.every_steps=0 turns it off)"
        )
    positions = int(config.model.max_position_embeddings)
    for phase in phases:
        setting = f"config.{phase.name}"
        check_sequence_length(
            phase.max_seq_length,
            f"{setting}.max_seq_length",
            positions,
            f"config.model.max_position_embeddings={positions}",
        )
        predictions = phase.max_predictions_per_seq
        if predictions > phase.max_seq_length:
            raise UserError(
                f"{setting}.max_predictions_per_seq={predictions} exceeds its "
                f"max_seq_length={phase.max_seq_length}"
            )


def dry_run_outline(config: ml_collections.ConfigDict, workdir: str = "") -> str:
    """The resolved config, phase split, parameter count and FLOPs per token (for --dry-run),
    with the vocabulary the run will have (inputs.vocab_choice; `workdir`: where a tokenizer
    an earlier run trained is kept)."""
    phases = split_phases(config)
    check_values(config, phases)
    vocab = inputs.vocab_choice(config, phases, workdir)
    model_config = bert_config(config).replace(vocab_size=vocab.size)
    lines = ["config (each line is a --config.KEY=VALUE override):"]
    lines += [f"  {key} = {value!r}" for key, value in flat_settings(config)]
    lines += ["phases:"]
    for phase in phases:
        share = flops.head_share(model_config, phase.max_seq_length, phase.max_predictions_per_seq)
        per_token = flops.flops_per_token(model_config, phase.max_seq_length, share)
        head = "LM head at every position" if share >= 1 else "MLM head at the gathered positions"
        lines.append(
            f"  {phase.name}: steps {phase.start}..{phase.end - 1} ({phase.steps}), seq "
            f"{phase.max_seq_length}, {phase.max_predictions_per_seq} predictions, global batch "
            f"{phase.batch_size}, data {phase.source or '(unset)'}, "
            f"{per_token / 1e9:.3f} GFLOP/token ({head})"
        )
    lines.append(f"parameters: {count_parameters(model_config):,}")
    lines += ["run:"] + [f"  {line}" for line in run_outline(config, phases, workdir)]
    return "\n".join(lines)


def run_outline(config, phases: list[Phase], workdir: str = "") -> list[str]:
    """What the run will do beyond the phases: schedule, intervals, evaluation, vocabulary and
    tokenizer, a warning. The evaluation, vocabulary and tokenizer are the run's own decisions
    (eval_choice.eval_choices, vocab_choice, tokenizer_choice), put in words."""
    optimizer, specs = config_lib.resolved_optimizer(config, phases)
    total = phases[-1].end
    decay = optimizer.get("decay", optim.DEFAULT_DECAY)
    if decay == "wsd":
        share = float(optimizer.get("decay_fraction", 0.0))
        decay = f"the peak held until the last {share:.1%} of the steps, then a 1-sqrt"
    if optimizer.schedule == "per_phase":
        warmup = ", ".join(f"{p.name} {s.warmup_steps}" for p, s in zip(phases, specs))
        schedule = f"each phase warms up ({warmup} steps) and decays ({decay}) to "
    else:
        schedule = f"warmup {optimizer.warmup_steps} steps, then {decay} decay to "
    lines = [
        f"learning rate {optimizer.learning_rate:g}: {schedule}"
        f"{optimizer.end_learning_rate:g} at step {total}",
        f"a metrics line every {config.log_every_steps} steps; a checkpoint every "
        f"{config.checkpoint.every_steps} steps and at the end (keeping "
        f"{config.checkpoint.keep})",
    ]
    evaluation, per_phase = eval_choice.eval_outline(config, phases)
    lines += [evaluation] + [f"  {line}" for line in per_phase]
    tokenizer = inputs.tokenizer_choice(config, phases, workdir)
    lines.append(
        f"{inputs.vocab_choice(config, phases, workdir)}; tokenizer: "
        + (f"{tokenizer.path} ({tokenizer.why})" if tokenizer.path else tokenizer.why)
    )
    warning = config_lib.warmup_warning(config, phases)
    if warning:
        lines.append(warning)
    return lines
