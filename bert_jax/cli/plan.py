"""`bert-jax plan --config configs/bert.py:SIZE --topology T`: the fastest settings per phase for a
TPU slice (mesh, dtype, windowed einsums, ZeRO 1, remat, accumulation), their flags, the cost."""

from __future__ import annotations

import sys

from bert_jax.cli.config_flags import ConfigCommand, declared_flags, declared_values
from bert_jax.planning.candidates import Space
from bert_jax.runtime.errors import UserError


def _run(flag_values) -> int:
    from bert_jax.planning import plan
    from bert_jax.runtime import errors, host_memory, topology

    if not flag_values.topology:
        raise UserError("--topology is required (e.g. v5p-16, v5litepod-16, v5p:2x2x2)")
    target = topology.parse(flag_values.topology)
    prices = plan.load_prices(flag_values.prices)
    space = {**declared_values(Space, flag_values), "prices": prices}
    if flag_values.dry_run:
        print(plan.describe_search(flag_values.config, target, **space))
        return 0

    def say(line: str) -> None:  # a search takes minutes: say what each compile gave
        if flag_values.verbose:
            print(line, file=sys.stderr, flush=True)

    progress = plan.SearchProgress(plan.search_size(flag_values.config, target, **space), say)
    try:
        result = plan.plan(flag_values.config, target, **space, progress=progress)
    except KeyboardInterrupt:  # Ctrl-C: what was done and how to go on, not a stack
        print(progress.stopped_line(), file=sys.stderr, flush=True)
        return errors.EXIT_INTERRUPTED
    print(result.to_json() if flag_values.json else plan.format_plan(result))
    undecided = [s for s in result.schedule if s.candidate is None and s.undecided]
    if undecided:
        # Not 4: the slice may well hold the step; this host could not compile it to a verdict.
        limit = host_memory.limit_bytes()
        raise UserError(
            f"{undecided[0].phase}: no verdict on this host: {undecided[0].undecided} "
            "candidate(s) could not be compiled here (stopped at the host's memory limit"
            + (f" of {limit / host_memory.GIB:.1f} GiB" if limit else "")
            + f", or XLA crashed): plan on a host with more memory or raise {host_memory.LIMIT_ENV}"
        )
    # 4, as `pretrain --compile-only`: some phase fits no setting on this slice.
    return 4 if any(s.candidate is None for s in result.schedule) else 0


COMMAND = ConfigCommand(
    name="plan",
    summary="for a TPU slice: the fastest settings that fit each phase (mesh, dtype, windowed "
    "einsums, ZeRO 1, remat, accumulation), their --config. flags, and the schedule's time and "
    "cost (estimates of XLA's TPU cost model)",
    own_flags=(
        (
            "string",
            "topology",
            None,
            "Cloud TPU slice (required): v4-8, v5p-128, v5litepod-16, v6e-64, or a topology such "
            "as v5p:2x2x2",
        ),
        *declared_flags(Space),
        (
            "string",
            "prices",
            None,
            'a JSON file of prices per chip-hour: {"usd_per_chip_hour": {"v5p": 4.2, ...}, '
            '"source": ..., "date": ...} (default: the on-demand prices of bert-jax\'s '
            "hardware table, bert_jax/runtime/hardware.py)",
        ),
        ("bool", "json", False, "print the plan as JSON (the winners' flags included)"),
        (
            "bool",
            "dry_run",
            False,
            "check the config and flags, print the slice, the phases and the search's stages "
            "and meshes, then exit (nothing compiles)",
        ),
        ("bool", "verbose", True, "say each candidate's outcome on stderr as the search goes"),
    ),
    run=_run,
)
add_to = COMMAND.add_to
