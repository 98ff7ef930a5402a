"""`bert-jax plan --config configs/bert.py:SIZE --topology T`: what fits a TPU slice, the cost."""

from __future__ import annotations

from bert_jax.cli.config_flags import ConfigCommand
from bert_jax.errors import UserError


def _run(flag_values) -> int:
    from bert_jax import plan, topology

    if not flag_values.topology:
        raise UserError("--topology is required (e.g. v5p-16, v5litepod-16, v5p:2x2x2)")
    target = topology.parse(flag_values.topology)
    kinds = [k.strip() for k in flag_values.meshes.split(",") if k.strip()]
    remats = [r.strip() for r in flag_values.remat.split(",") if r.strip()]
    prices = plan.load_prices(flag_values.prices)
    result = plan.plan(
        flag_values.config,
        target,
        kinds=kinds,
        max_accum=flag_values.max_accum,
        prices=prices,
        remats=remats,
    )
    print(result.to_json() if flag_values.json else plan.format_plan(result))
    # 4, as `pretrain --compile-only`: some phase fits no mesh of this slice.
    return 4 if any(s.candidate is None for s in result.schedule) else 0


COMMAND = ConfigCommand(
    name="plan",
    summary="for a TPU slice: the mesh, batch per chip and accumulation that fit each phase, and "
    "the schedule's time and cost (estimates of XLA's TPU cost model)",
    own_flags=(
        (
            "string",
            "topology",
            None,
            "Cloud TPU slice: v4-8, v5p-128, v5litepod-16, v6e-64, or a topology such as v5p:2x2x2",
        ),
        (
            "string",
            "meshes",
            "dp,fsdp,fsdp_tp",
            "mesh kinds to try: dp (data parallel), fsdp, "
            "fsdp_tp (fsdp with a tensor axis of 4 or 2)",
        ),
        ("integer", "max_accum", 64, "the largest gradient-accumulation factor to try"),
        (
            "string",
            "remat",
            "",
            "rematerialization policies to try besides config.model.remat (none, dots, full), "
            "each only where it could take fewer accumulation steps",
        ),
        ("string", "prices", None, "price file (default: configs/tpu_prices.json)"),
        ("bool", "json", False, "print the plan as JSON"),
    ),
    run=_run,
)
add_to = COMMAND.add_to
