"""`bert-jax plan`: for a TPU slice, the settings that compile to the fastest train step of each
phase (mesh, compute dtype, windowed einsums, ZeRO 1, rematerialization, gradient accumulation),
their exact `--config.` flags, and the time and cost of the configured schedule.

The fastest fitting candidate of each phase makes the schedule (its steps times the estimated
step time; chip-hours times the on-demand price per chip-hour of the hardware table,
`runtime/hardware.py`, which states its source and date, or of a `--prices` file). A run has one
mesh, dtype and accumulation factor for all its phases, so the plan also names the one setting
with the least estimated time over the whole schedule: `flags_from_plan_json` reads those flags
(or a phase's) back from `plan --json`.

The search itself, by stages, is in `search.py`; the records and their printed form in
`candidates.py`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from bert_jax.core.bert_config import REMAT_POLICIES
from bert_jax.planning import search
from bert_jax.planning.candidates import (
    GIB,
    Candidate,
    PhaseSchedule,
    Plan,
    Space,
    fastest,
    format_plan,
    ms,
)
from bert_jax.runtime import caches, hardware
from bert_jax.runtime.errors import UserError, user_path
from bert_jax.runtime.topology import TpuTarget
from bert_jax.training import config_checks, config_lib
from bert_jax.training.step_log import format_duration

__all__ = [
    "SearchProgress",
    "flags_from_plan_json",
    "format_plan",
    "load_prices",
    "plan",
    "search_size",
    "with_planned_flags",
]

# A compile's wall time where this host has none in its compile cache: the mean of the 49
# compiles behind docs/performance.md's plan table (BERT-Base and Large for v4 to v6e slices,
# 136 minutes of search on a 2-core host). A one-layer model compiles in seconds; Large at 512
# with remat in minutes more.
TYPICAL_COMPILE_SECONDS = 170.0


def load_prices(path: str | None) -> dict[str, Any]:
    """The prices per chip-hour `plan` uses: a `--prices` JSON file (`usd_per_chip_hour` by
    generation, and the `source` and `date` printed beside a cost), or with no path the hardware
    table's."""
    if not path:
        return hardware.price_table()
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


def _checked_space(config: ml_collections.ConfigDict, target: TpuTarget, **space):
    """The phases and the search space (`Space`'s settings; its declared defaults for the
    others), every setting and flag value checked before anything compiles (each refusal one
    line naming its flag or setting)."""
    phases = config_lib.split_phases(config)
    config_checks.check_values(config, phases)
    space = Space(**space)
    unknown = sorted(set(space.remats) - set(REMAT_POLICIES))
    if unknown:
        raise UserError(
            f"--remat: unknown policy {unknown[0]!r}; known: {', '.join(REMAT_POLICIES)}"
        )
    search.meshes(target, config, space.kinds)  # an unknown kind fails before anything compiles
    return phases, space


def plan(
    config: ml_collections.ConfigDict,
    target: TpuTarget,
    *,
    prices: dict[str, Any] | None = None,
    progress: Callable[[Candidate], None] | None = None,
    **space,
) -> Plan:
    """Searches each phase (see the module docstring) over `space` (`Space`'s settings by name;
    its declared defaults for the others); `progress` sees each candidate as it comes."""
    start = time.perf_counter()
    phases, space = _checked_space(config, target, **space)
    candidates, schedule, seen, earlier = [], [], {}, []
    for phase in phases:
        tried = search.search_phase(config, phase, target, space, earlier, seen, progress)
        candidates += tried
        earlier = tried
        best = fastest(tried)
        runner_up = fastest([c for c in tried if best is not None and c.setting != best.setting])
        seconds = best.step_seconds * phase.steps if best else None
        undecided = 0 if best else sum(c.undecided for c in tried)
        schedule.append(
            PhaseSchedule(
                phase.name, phase.steps, best, seconds, runner_up,
                search.why(best, runner_up) if best else "", best.flags if best else (), undecided,
            )
        )  # fmt: skip
    total = (
        sum(s.seconds for s in schedule) if all(s.seconds is not None for s in schedule) else None
    )
    price = (prices or {}).get("usd_per_chip_hour", {}).get(target.generation.name)
    chip_hours = total / 3600 * target.chips if total is not None else None
    model = config_lib.bert_config(config)
    overall, accum, note = search.overall(phases, schedule, candidates)
    return Plan(
        target=target.topology,
        accelerator_type=target.accelerator_type,
        chips=target.chips,
        hbm_bytes=target.hbm_bytes,
        model=config_lib.model_label(model),
        candidates=candidates,
        schedule=schedule,
        total_seconds=total,
        chip_hours=chip_hours,
        price_per_chip_hour=price,
        cost=chip_hours * price if chip_hours is not None and price is not None else None,
        prices_source=" ".join(str((prices or {}).get(k, "")) for k in ("source", "date")).strip(),
        flags=tuple(overall.flags(accum)) if overall else (),
        setting=overall.label() if overall else "",
        overall_note=note,
        search_seconds=time.perf_counter() - start,
        compiles=sum(c.compiles for c in candidates),
    )


def flags_from_plan_json(path: str, phase: str | None = None, what: str = "--plan") -> list[str]:
    """The `--config.` flags a `bert-jax plan --json` file chose: the one setting for the whole
    run, or with `phase` ("phase1", ...) that phase's own winner. Raises UserError naming the
    file (as given by the flag `what`) when it is not such a plan or chose nothing."""
    with user_path(path, what):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    try:
        found = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{what} {path}: not JSON ({err})") from None
    if not isinstance(found, dict) or "schedule" not in found:
        raise UserError(f"{what} {path}: not the output of `bert-jax plan --json`")
    if "flags" not in found:
        raise UserError(f"{what} {path}: made by a `bert-jax plan` without flags; plan again")
    undecided = sum(int(s.get("undecided") or 0) for s in found["schedule"])
    why = (
        f" ({undecided} candidate(s) could not be compiled on the host that planned: plan again "
        "on a larger host)"
        if undecided
        else ""
    )
    if phase is None:
        flags = found.get("flags") or []
        if not flags:
            raise UserError(f"{what} {path}: the plan found no setting that fits every phase{why}")
        return [str(f) for f in flags]
    phases = {s.get("phase"): s for s in found["schedule"]}
    if phase not in phases:
        raise UserError(f"{what} {path}: no phase {phase!r}; it has {', '.join(map(str, phases))}")
    flags = phases[phase].get("flags") or []
    if not flags:
        raise UserError(
            f"{what} {path}: nothing fits {phase} on {found.get('accelerator_type')}{why}"
        )
    return [str(f) for f in flags]


def with_planned_flags(
    path: str, accelerator_type: str, pretrain_args: Sequence[str], what: str = "--settings"
) -> tuple[list[str], list[str]]:
    """(`pretrain_args` with the plan's flags for the whole run added, the flags added): a key
    `pretrain_args` sets itself keeps the user's value. A plan for another slice than
    `accelerator_type` is a UserError naming both."""
    flags = flags_from_plan_json(path, what=what)
    with open(path, encoding="utf-8") as f:
        planned_for = json.load(f).get("accelerator_type")
    if planned_for and planned_for != accelerator_type:
        raise UserError(
            f"{what} {path} was planned for {planned_for}, not --accelerator-type "
            f"{accelerator_type}: plan again with --topology {accelerator_type}"
        )
    mine = {a.split("=", 1)[0] for a in pretrain_args if a.startswith("--config.")}
    added = [f for f in flags if f.split("=", 1)[0] not in mine]
    return [*pretrain_args, *added], added


def search_size(
    config: ml_collections.ConfigDict,
    target: TpuTarget,
    *,
    prices: dict[str, Any] | None = None,
    **space,
) -> int:
    """About how many candidates `plan` compiles over `space` (`search.expected_compiles`),
    checked as `plan` checks them (`prices`, which `plan` also takes, plays no part)."""
    phases, space = _checked_space(config, target, **space)
    return search.expected_compiles(target, config, phases, space)


def compile_seconds_estimate() -> tuple[float, str]:
    """(seconds, where the figure comes from) of one compile: the mean of the compiles in this
    host's compile cache, else TYPICAL_COMPILE_SECONDS."""
    root = caches.cache_root()
    seconds = []
    folder = os.path.join(root, "tpu_compiles") if root else ""
    if folder and os.path.isdir(folder):
        for name in os.listdir(folder):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    value = json.load(f).get("compile_seconds")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(value, (int, float)) and value > 0:
                seconds.append(float(value))
    if seconds:
        return sum(seconds) / len(seconds), f"the mean of the {len(seconds)} compiles in {folder}"
    return TYPICAL_COMPILE_SECONDS, "a typical BERT-Base or Large compile on a 2-core host"


class SearchProgress:
    """What `plan` says as it searches: each candidate it compiles as `candidate k of about N`
    with the time so far and an ETA (the mean time of the candidates so far times those left),
    each pruned one with why; `stopped_line` is what it says when interrupted."""

    def __init__(self, expected: int, say: Callable[[str], None], clock=time.perf_counter):
        self.expected, self.say, self.clock = expected, say, clock
        self.start = clock()
        self.done = self.compiles = 0

    def __call__(self, candidate: Candidate) -> None:
        what = candidate.note if not candidate.timed else ms(candidate.step_seconds)
        where = f"{candidate.phase} {candidate.stage}: {candidate.setting.label()}"
        if not search.searched(candidate):
            self.say(f"plan: {where}: {what}")
            return
        self.done += 1
        self.compiles += candidate.compiles
        elapsed = self.clock() - self.start
        left = max(self.expected - self.done, 0) * elapsed / self.done
        self.say(
            f"plan: candidate {self.done} of about {max(self.expected, self.done)}, {where}: "
            f"{what} ({format_duration(elapsed)} so far, ETA {format_duration(left)})"
        )

    def stopped_line(self, command: str = "the same command") -> str:
        """One line for an interrupted search: what was done, and how to go on."""
        root = caches.cache_root()
        kept = (
            f"kept in the compile cache {root}: run {command} again to go on; what was "
            "compiled is read back in seconds"
            if root
            else f"the compile cache is off ({caches.CACHE_ENV} is empty): running "
            f"{command} again compiles them again"
        )
        return (
            f"plan: stopped after {self.done} of about {max(self.expected, self.done)} "
            f"candidates ({self.compiles} compiled, {format_duration(self.clock() - self.start)}), "
            f"{kept}"
        )


def describe_search(
    config: ml_collections.ConfigDict,
    target: TpuTarget,
    *,
    prices: dict[str, Any] | None = None,
    **space,
) -> str:
    """What `plan --dry-run` prints: the slice, the phases and the search `plan` would run over
    `space` (its stages and the meshes it would compile), checked as `plan` checks them;
    nothing compiles."""
    phases, space = _checked_space(config, target, **space)
    model = config_lib.bert_config(config)
    price = (prices or {}).get("usd_per_chip_hour", {}).get(target.generation.name)
    kinds = search.meshes(target, config, space.kinds)
    meshes = ", ".join(f"{kind} {shape}" for kind, shape in kinds)
    first = space.dtypes[0]
    lines = [
        f"plan (dry run, nothing compiled): {config_lib.model_label(model)} on "
        f"{target.accelerator_type} ({target.topology}: "
        f"{target.chips} chips, {target.hbm_bytes / GIB:.0f} GiB HBM each)",
        "phases: "
        + "; ".join(
            f"{p.name} {p.steps} steps at length {p.max_seq_length}, global batch {p.batch_size}"
            for p in phases
        ),
        f"stage 1, meshes ({first}, windowed einsums {_on(space.windowed[0])}, ZeRO 1 "
        f"{_on(space.zero[0])}, remat {config.model.remat}; the fewest accumulation steps that "
        f"fit, up to "
        f"{space.max_accum}): {meshes or 'none fits this slice'}",
    ]
    if space.windowed[1:]:
        lines.append(
            f"stage 2, windowed einsums {_on(space.windowed[1])}: the fastest mesh that gathers "
            "weights"
        )
    if space.zero[1:]:
        lines.append(
            f"stage 3, ZeRO 1 {_on(space.zero[1])}: meshes with a data axis, where it could win"
        )
    if space.dtypes[1:]:
        lines.append(f"stage 4, dtypes {', '.join(space.dtypes[1:])}: the fastest setting")
    if space.remats:
        lines.append(
            f"stage 5, remat {', '.join(space.remats)}: where the fastest setting needs "
            "accumulation"
        )
    if len(phases) > 1:
        lines.append(
            f"later phases compile only meshes within {space.margin:g}x of the earlier best"
        )
    lines.append(f"price: ${price:.2f} per chip-hour" if price is not None else "price: none known")
    expected = search.expected_compiles(target, config, phases, space)
    each, source = compile_seconds_estimate()
    lines.append(
        f"search time, an estimate: about {expected} candidate compiles x "
        f"{format_duration(each)} each ({source}) = about {format_duration(expected * each)}; "
        "candidates in the compile cache are read back in seconds, a larger model or slice "
        "compiles for longer"
    )
    return "\n".join(lines)


def _on(value: bool) -> str:
    return "on" if value else "off"
