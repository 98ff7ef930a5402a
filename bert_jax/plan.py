"""`bert-jax plan`: for a TPU slice, the mesh, batch per chip and gradient accumulation that fit
each phase and reach its global batch, and the time and cost of the configured schedule.

Every candidate is a real compile of the phase's train step for the slice (`compile_check`), so
each fit verdict is XLA's; each time is its cost model's estimate. For each mesh (pure data
parallel, FSDP, FSDP with a tensor-parallel axis) the search starts with the whole global batch
in one step and doubles the accumulation factor until the step fits. Rematerialization
policies to try (`remats`, model.BertConfig.remat) are searched only below the accumulation
factor the configured policy needed: at the same factor they only add recomputation. The fastest
fitting candidate of each phase makes the schedule: its steps times the estimated step time, and the
chip-hours times the slice's price per chip-hour from a price file (configs/tpu_prices.json,
which states its source and date).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from bert_jax import compile_check, config_lib
from bert_jax.errors import UserError
from bert_jax.model import REMAT_POLICIES
from bert_jax.topology import TpuTarget

GIB = 1024**3
MESH_KINDS = ("dp", "fsdp", "fsdp_tp")
_MESH_NAMES = {"dp": "data parallel", "fsdp": "fsdp", "fsdp_tp": "fsdp + tensor"}
_DEFAULT_PRICES = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "configs", "tpu_prices.json"
)


@dataclasses.dataclass(frozen=True)
class Candidate:
    phase: str
    mesh_kind: str
    mesh: tuple[int, int, int]
    accum_steps: int
    batch_per_replica: int  # sequences per data-parallel rank per micro-batch
    fits: bool
    peak_bytes: int | None = None
    step_seconds: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    link_seconds: float | None = None  # least time of its collectives on the inter-chip links
    compile_seconds: float = 0.0
    note: str = ""
    remat: str = "none"  # config.model.remat of this candidate


@dataclasses.dataclass(frozen=True)
class PhaseSchedule:
    phase: str
    steps: int
    candidate: Candidate | None  # the fastest that fits; None: nothing fits
    seconds: float | None


@dataclasses.dataclass(frozen=True)
class Plan:
    target: str
    accelerator_type: str
    chips: int
    hbm_bytes: int
    model: str
    candidates: list[Candidate]
    schedule: list[PhaseSchedule]
    total_seconds: float | None
    chip_hours: float | None
    price_per_chip_hour: float | None
    cost: float | None
    prices_source: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


def meshes(target: TpuTarget, config: ml_collections.ConfigDict, kinds: Sequence[str]) -> list:
    """(kind, mesh shape) per requested kind that this model and slice allow."""
    chips, found = target.chips, []
    for kind in kinds:
        if kind == "dp":
            found.append((kind, (chips, 1, 1)))
        elif kind == "fsdp":
            found.append((kind, (1, chips, 1)))
        elif kind == "fsdp_tp":
            heads = int(config.model.num_attention_heads)
            tensor = next((t for t in (4, 2) if chips % t == 0 and heads % t == 0), None)
            if tensor and chips > tensor:
                found.append((kind, (1, chips // tensor, tensor)))
        else:
            raise UserError(f"--meshes: unknown mesh kind {kind!r}; known: {', '.join(MESH_KINDS)}")
    return found


def _phase_config(config, phase: config_lib.Phase, mesh, accum: int, remat: str | None = None):
    """The config compiling `phase` alone, on `mesh`, with `accum` micro-batches (and the
    rematerialization policy `remat`, None: the configured one)."""
    single = copy.deepcopy(config)
    with single.unlocked():
        for key in config_lib.PHASE_KEYS:
            if key in single:
                single[key].fraction = 1.0 if key == phase.name else 0.0
        single.mesh.shape = tuple(mesh)
        single.grad_accum_steps = accum
        if remat is not None:
            single.model.remat = remat
    return single


def search(
    config,
    phase,
    target: TpuTarget,
    kind: str,
    mesh,
    max_accum: int,
    remat: str | None = None,
) -> Candidate:
    """The largest micro-batch (fewest accumulation steps, up to `max_accum`) with which `phase`
    fits on `mesh` (with rematerialization policy `remat`; None: the configured one)."""
    replicas = mesh[0] * mesh[1]
    remat = remat or str(config.model.get("remat", "none"))
    accum, spent, last = 1, 0.0, "no accumulation factor divides the batch"
    while accum <= max_accum and phase.batch_size % (replicas * accum) == 0:
        per_replica = phase.batch_size // (replicas * accum)
        try:
            report = compile_check.check(_phase_config(config, phase, mesh, accum, remat), target)
        except compile_check.DoesNotFitError as err:
            last, fitted = str(err), None
        except UserError as err:  # e.g. a mesh the torus cannot hold
            return Candidate(
                phase.name, kind, mesh, accum, per_replica, False, note=str(err), remat=remat
            )
        else:
            fitted = report.phases[0]
            spent += fitted.compile_seconds
            if report.fits:
                estimate = report.estimates(fitted) or {}
                return Candidate(
                    phase.name, kind, mesh, accum, per_replica, True,
                    peak_bytes=fitted.peak_bytes,
                    step_seconds=estimate.get("step_seconds"),
                    tokens_per_second=estimate.get("tokens_per_second"),
                    mfu=estimate.get("mfu"),
                    link_seconds=estimate.get("link_seconds"),
                    compile_seconds=spent,
                    remat=remat,
                )  # fmt: skip
            last = f"peak {fitted.peak_bytes / GIB:.2f} GiB"
        accum *= 2
    note = f"does not fit up to {accum // 2} micro-batches ({last})"
    if phase.batch_size % replicas:
        note = f"global batch {phase.batch_size} does not divide over {replicas} replicas"
    return Candidate(
        phase.name, kind, mesh, accum // 2 or 1, 0, False, compile_seconds=spent, note=note,
        remat=remat,
    )  # fmt: skip


def load_prices(path: str | None) -> dict[str, Any]:
    path = path or _DEFAULT_PRICES
    try:
        with open(path, encoding="utf-8") as f:
            prices = json.load(f)
    except FileNotFoundError:
        raise UserError(f"--prices {path}: no such file") from None
    except json.JSONDecodeError as err:
        raise UserError(f"--prices {path}: not JSON ({err})") from None
    if not isinstance(prices.get("usd_per_chip_hour"), dict):
        raise UserError(f"--prices {path}: needs a 'usd_per_chip_hour' object by generation")
    return prices


def plan(
    config: ml_collections.ConfigDict,
    target: TpuTarget,
    *,
    kinds: Sequence[str] = MESH_KINDS,
    max_accum: int = 64,
    prices: dict[str, Any] | None = None,
    remats: Sequence[str] = (),
) -> Plan:
    """`remats`: rematerialization policies to try besides the configured one (see `search`)."""
    phases = config_lib.plan_phases(config)
    config_lib.check_values(config, phases)
    configured = str(config.model.get("remat", "none"))
    unknown = sorted(set(remats) - set(REMAT_POLICIES))
    if unknown:
        raise UserError(
            f"--remat: unknown policy {unknown[0]!r}; known: {', '.join(REMAT_POLICIES)}"
        )
    candidates, schedule = [], []
    for phase in phases:
        tried = []
        for kind, mesh in meshes(target, config, kinds):
            first = search(config, phase, target, kind, mesh, max_accum)
            tried.append(first)
            if first.note and not first.note.startswith("does not fit"):
                continue  # the mesh itself is the problem, not memory
            for remat in dict.fromkeys(r for r in remats if r != configured):
                # Only fewer micro-batches than `first` needed can make recomputation pay.
                below = first.accum_steps // 2 if first.fits else max_accum
                if below >= 1:
                    tried.append(search(config, phase, target, kind, mesh, below, remat))
        candidates += tried
        timed = [c for c in tried if c.fits and c.step_seconds]
        best = min(timed, key=lambda c: c.step_seconds) if timed else None
        seconds = best.step_seconds * phase.steps if best else None
        schedule.append(PhaseSchedule(phase.name, phase.steps, best, seconds))
    total = (
        sum(s.seconds for s in schedule) if all(s.seconds is not None for s in schedule) else None
    )
    price = (prices or {}).get("usd_per_chip_hour", {}).get(target.generation.name)
    chip_hours = total / 3600 * target.chips if total is not None else None
    model = config_lib.bert_config(config)
    return Plan(
        target=target.topology,
        accelerator_type=target.accelerator_type,
        chips=target.chips,
        hbm_bytes=target.hbm_bytes,
        model=f"{model.num_hidden_layers}/{model.hidden_size}/{model.num_attention_heads} "
        f"{model.dtype}",
        candidates=candidates,
        schedule=schedule,
        total_seconds=total,
        chip_hours=chip_hours,
        price_per_chip_hour=price,
        cost=chip_hours * price if chip_hours is not None and price is not None else None,
        prices_source=" ".join(str((prices or {}).get(k, "")) for k in ("source", "date")).strip(),
    )


def _duration(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:.1f} days" if days >= 1 else f"{seconds / 3600:.1f} hours"


def _mesh_name(c: Candidate) -> str:
    remat = "" if c.remat == "none" else f", remat {c.remat}"
    return f"{_MESH_NAMES[c.mesh_kind]} {c.mesh}{remat}"


def format_plan(result: Plan) -> str:
    lines = [
        f"plan: BERT {result.model} on {result.accelerator_type} ({result.target}, "
        f"{result.chips} chips, {result.hbm_bytes / GIB:g} GiB HBM each); times are estimates of "
        "XLA's TPU cost model, not measurements",
        "| phase | mesh | batch/replica | accum | peak GiB/chip | fits | est. step ms | "
        "est. tokens/s | est. MFU | ICI ms, at least | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.candidates:
        mesh = _mesh_name(c)
        if not c.fits:
            lines.append(
                f"| {c.phase} | {mesh} | - | - | - | no: {c.note} | - | - | - | - | "
                f"{c.compile_seconds:.0f} |"
            )
            continue
        step = f"{c.step_seconds * 1e3:.1f}" if c.step_seconds else "-"
        rate = f"{c.tokens_per_second:,.0f}" if c.tokens_per_second else "-"
        mfu = f"{c.mfu:.1%}" if c.mfu is not None and math.isfinite(c.mfu) else "-"
        links = f"{c.link_seconds * 1e3:.1f}" if c.link_seconds is not None else "-"
        lines.append(
            f"| {c.phase} | {mesh} | {c.batch_per_replica} | {c.accum_steps} | "
            f"{c.peak_bytes / GIB:.2f} | yes | {step} | {rate} | {mfu} | {links} | "
            f"{c.compile_seconds:.0f} |"
        )
    lines.append(
        "ICI: the least time the step's collectives need on the inter-chip links; XLA's cost "
        "model leaves it out of the step estimate (it prices a collective as memory traffic)"
    )
    lines.append("schedule:")
    for s in result.schedule:
        if s.candidate is None:
            lines.append(f"  {s.phase}: {s.steps:,} steps: nothing fits this slice")
            continue
        c = s.candidate
        lines.append(
            f"  {s.phase}: {s.steps:,} steps x {c.step_seconds * 1e3:.1f} ms with "
            f"{_mesh_name(c)}, {c.accum_steps} micro-batch(es) = "
            f"{_duration(s.seconds)}"
        )
    if result.total_seconds is not None:
        total = f"  total: {_duration(result.total_seconds)} on {result.chips} chips = "
        total += f"{result.chip_hours:,.0f} chip-hours"
        if result.cost is not None:
            total += (
                f" x ${result.price_per_chip_hour:.2f} = ${result.cost:,.0f} "
                f"(prices: {result.prices_source})"
            )
        lines.append(total)
    return "\n".join(lines)
