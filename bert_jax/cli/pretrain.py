"""`bert-jax pretrain --config bert:SIZE --workdir DIR [--config.key=value ...]` (or a config file,
`--config configs/bert.py:SIZE`)."""

from __future__ import annotations

import sys

from bert_jax.cli.config_flags import ConfigCommand
from bert_jax.runtime import errors
from bert_jax.runtime.errors import UserError


def _run(flag_values) -> int:
    from bert_jax.runtime import distributed
    from bert_jax.training import config_checks, inputs, pretrain

    config = flag_values.config
    # Which --config.KEY overrides were given: init_from's model refuses those that conflict.
    given = [
        name for name in flag_values if name.startswith("config.") and flag_values[name].present
    ]
    for change in inputs.adopt_init_from(config, given):
        print(f"bert-jax pretrain: {change}")
    if flag_values.dry_run:
        # Checks the values first; a workdir's kept tokenizer is the one a restart would use.
        described = config_checks.dry_run_outline(config, flag_values.workdir or "")
        _check_mesh(config)
        print(described)
        return 0
    if flag_values.topology or flag_values.compile_only:
        _vocab_of_the_run(config, flag_values.workdir or "")
    if flag_values.topology:
        from bert_jax.planning import compile_check
        from bert_jax.runtime import topology

        if not flag_values.compile_only:
            raise UserError("--topology compiles for a TPU slice: it needs --compile-only")
        # One process compiles for every host of the slice: no jax.distributed here.
        target = topology.parse(flag_values.topology)
        return compile_check.main(config, flag_values.device_memory_gib, target)
    # Multi-process jobs join up before anything touches a device.
    distributed.initialize_from_flags(flag_values)
    if flag_values.compile_only:
        from bert_jax.planning import compile_check

        return compile_check.main(config, flag_values.device_memory_gib)
    if not flag_values.workdir:
        raise UserError("--workdir is required")
    try:
        result = pretrain.pretrain(config, flag_values.workdir)
    except pretrain.NonFiniteError as err:
        print(f"bert-jax pretrain: stopped: {err}", file=sys.stderr)
        return errors.EXIT_DIVERGED
    # 128 + SIGTERM: a preempted run has not finished, and schedulers should see that.
    return errors.EXIT_STOPPED if result.preempted else errors.EXIT_OK


def _vocab_of_the_run(config, workdir: str) -> None:
    """A compile check compiles the vocabulary the run will have: the tokenizer's where the
    model follows it and a tokenizer is named or found (else the size's)."""
    from bert_jax.training import config_lib, inputs

    config.model.vocab_size = inputs.vocab_choice(
        config, config_lib.split_phases(config), workdir
    ).size


def _check_mesh(config) -> None:
    """The run's checks of config.mesh against this machine's devices (the mesh it builds, each
    phase's batch over its data axes), so a dry run refuses what the run would."""
    from bert_jax.core import partitioning
    from bert_jax.training import config_lib

    mesh = partitioning.make_mesh(config.mesh.shape)
    for phase in config_lib.split_phases(config):
        partitioning.check_batch_divisible(
            phase.batch_size, mesh, f"config.{phase.name}.batch_size"
        )


def _settings_help(config) -> str:
    """`--config-help`: every declared setting (training/config_schema.py)."""
    from bert_jax.training import config_schema

    return config_schema.listing(config)


def _define_distributed(flags, flag_values) -> None:
    from bert_jax.runtime import distributed

    distributed.define_flags(flags, flag_values)


COMMAND = ConfigCommand(
    name="pretrain",
    summary="pretrain BERT: --config bert:SIZE --workdir DIR [--config.key=value ...]",
    own_flags=(
        (
            "string",
            "workdir",
            None,
            "run directory (created; resumed); required unless --dry-run or --compile-only",
        ),
        ("bool", "dry_run", False, "print the resolved config and phase split, then exit"),
        (
            "bool",
            "compile_only",
            False,
            "compile the train step of every phase for the mesh from shapes alone (no state, no "
            "data), print its memory per device and exit (status 4: does not fit)",
        ),
        (
            "float",
            "device_memory_gib",
            None,
            "with --compile-only: device memory to check against (default: reported by the "
            "device, or the --topology chip's HBM)",
        ),
        (
            "string",
            "topology",
            None,
            "with --compile-only: compile for this Cloud TPU slice from any machine (v4-8, "
            "v5p-128, v5litepod-16, v6e-64, or a topology such as v5p:4x4x4; needs "
            "bert-jax[tpu]) and print XLA's cost-model estimates (default: none, the local "
            "devices)",
        ),
    ),
    run=_run,
    define_more=_define_distributed,
    settings_help=_settings_help,
)
add_to = COMMAND.add_to
