"""`bert-jax plan`: for a TPU slice, the settings that compile to the fastest train step of each
phase (mesh, compute dtype, windowed einsums, ZeRO 1, rematerialization, gradient accumulation),
their exact `--config.` flags, and the time and cost of the configured schedule.

Every candidate is a real compile of the phase's train step for the slice (`compile_check`), so
each fit verdict is XLA's; each time is its cost model's estimate. A full grid (4 meshes x 2
dtypes x 2 windowed x 2 ZeRO x accumulation, per phase) would take hours of compile on a small
host, so the search goes by stages, each holding the best setting of the stages before it, and
prunes what cannot win or cannot differ; every pruned candidate is kept in the plan with why:

1. mesh: each mesh kind (data parallel, FSDP, data x FSDP, FSDP x tensor) in the first dtype
   (bfloat16 by default), windowed einsums off where the mesh gathers weights (a data-parallel
   mesh gathers none: the setting cannot change its program), ZeRO 1 off, the configured remat.
   Per mesh the fewest accumulation steps that fit: with the whole global batch in one step,
   doubling the factor until the step fits (more micro-batches only add loop overhead). In a
   later phase, a mesh slower than `margin` x the earlier phase's best is not compiled again.
2. windowed einsums: the other value, on the fastest mesh only (by the cost model the windowed
   loops add bookkeeping and price none of the transfer they hide).
3. ZeRO 1 (`mesh.shard_optimizer_state`): only on meshes with a data axis, and only where the
   step minus the share of the optimizer update that ZeRO 1 could save ((1 - 1/data) of the
   update, priced alone) would beat the best step: otherwise it cannot win.
4. compute dtype: the others, on the fastest setting.
5. rematerialization: only where the fastest setting needs accumulation (or nothing fits), at
   fewer micro-batches than it needed: at the same factor it only adds recomputation.
6. in a later phase, the earlier phase's winner if no stage compiled it, so that one setting is
   timed over the whole run.

Two settings that lower to the same program (the same `compile_check.program_key`: lowered text,
compiler options, topology, versions) are compiled once; the later one is reported as pruned.
Compiled figures are cached on disk by that key (`compile_check.cache_root()`), so a re-plan
lowers but does not compile again. On a host without TPU chips each candidate compiles in a
child process stopped at the host's memory limit (`host_memory`): a program too large to
compile here, or one whose compile crashes XLA, is a candidate that does not fit, with the
reason, and the search goes on.

The fastest fitting candidate of each phase makes the schedule (its steps times the estimated
step time; chip-hours times the price per chip-hour from configs/tpu_prices.json, which states
its source and date). A run has one mesh, dtype and accumulation factor for all its phases, so
the plan also names the one setting with the least estimated time over the whole schedule:
`flags_from_plan_json` reads those flags (or a phase's) back from `plan --json`.

Why this file is long: the search is one staged procedure (meshes, then windowed einsums, ZeRO 1,
dtype and remat on the front-runner, each pruning step with its reason) whose stages share the
candidate records, the schedule built from them and their printed and JSON forms; split, each
part would reach into the others' records. A candidate for splitting: the search's stages.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from bert_jax.core.model import REMAT_POLICIES
from bert_jax.planning import compile_check
from bert_jax.runtime import host_memory
from bert_jax.runtime.errors import UserError, user_path
from bert_jax.runtime.topology import TpuTarget
from bert_jax.training import config_lib

GIB = 1024**3
MESH_KINDS = ("dp", "fsdp", "dp_fsdp", "fsdp_tp")
DTYPES = ("float32", "bfloat16")
_MESH_NAMES = {
    "dp": "data parallel",
    "fsdp": "fsdp",
    "dp_fsdp": "data x fsdp",
    "fsdp_tp": "fsdp + tensor",
}
_DEFAULT_PRICES = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "configs", "tpu_prices.json"
)


@dataclasses.dataclass(frozen=True)
class Setting:
    """What the search varies besides the accumulation factor: each is a `--config.` flag."""

    mesh_kind: str
    mesh: tuple[int, int, int]
    dtype: str = "float32"
    windowed_einsum: bool = True
    shard_optimizer_state: bool = False
    remat: str = "none"

    @property
    def gathers_weights(self) -> bool:
        """Whether the mesh shards the weights (FSDP or tensor axis): only then does XLA make
        windowed loops of the matmuls."""
        return self.mesh[1] > 1 or self.mesh[2] > 1

    def label(self) -> str:
        parts = [f"{_MESH_NAMES.get(self.mesh_kind, self.mesh_kind)} {tuple(self.mesh)}"]
        parts.append(self.dtype)
        if self.gathers_weights:
            parts.append("windowed einsums " + ("on" if self.windowed_einsum else "off"))
        if self.shard_optimizer_state:
            parts.append("ZeRO 1")
        if self.remat != "none":
            parts.append(f"remat {self.remat}")
        return ", ".join(parts)

    def flags(self, accum_steps: int) -> list[str]:
        """The `--config.` flags that run this setting (one argv item each, unquoted)."""
        return [
            f"--config.mesh.shape=({','.join(str(int(n)) for n in self.mesh)})",
            f"--config.model.dtype={self.dtype}",
            f"--config.mesh.windowed_einsum={self.windowed_einsum}",
            f"--config.mesh.shard_optimizer_state={self.shard_optimizer_state}",
            f"--config.model.remat={self.remat}",
            f"--config.grad_accum_steps={int(accum_steps)}",
        ]


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
    compile_seconds: float = 0.0  # spent compiling (0 where every figure came from the cache)
    note: str = ""  # why it does not fit, or why it was pruned
    remat: str = "none"  # config.model.remat of this candidate
    dtype: str = "float32"
    windowed_einsum: bool = True
    shard_optimizer_state: bool = False
    stage: str = "mesh"  # the search stage that made it (see the module docstring)
    pruned: bool = False  # not compiled (or the same program as another candidate)
    program: str = ""  # compile_check.program_key of its step
    update_seconds: float | None = None  # the optimizer update priced alone
    compiles: int = 0  # programs compiled for it (cache hits not counted)
    flags: tuple[str, ...] = ()

    @property
    def setting(self) -> Setting:
        return Setting(
            self.mesh_kind, tuple(self.mesh), self.dtype, self.windowed_einsum,
            self.shard_optimizer_state, self.remat,
        )  # fmt: skip

    @property
    def timed(self) -> bool:
        return self.fits and not self.pruned and bool(self.step_seconds)


@dataclasses.dataclass(frozen=True)
class PhaseSchedule:
    phase: str
    steps: int
    candidate: Candidate | None  # the fastest that fits; None: nothing fits
    seconds: float | None
    runner_up: Candidate | None = None  # the next fastest setting
    why: str = ""  # winner against runner-up: step, HBM, link time
    flags: tuple[str, ...] = ()  # the winner's `--config.` flags


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
    # The one setting for the whole run (a run has one mesh, dtype and accumulation factor).
    flags: tuple[str, ...] = ()
    setting: str = ""
    overall_note: str = ""
    search_seconds: float = 0.0  # wall time of the search
    compiles: int = 0  # programs compiled (cache hits not counted)

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
        elif kind == "dp_fsdp":
            # data over the smallest torus axis (a mesh axis must be whole torus axes)
            data = min((n for n in target.shape if n > 1), default=1)
            if 1 < data < chips:
                found.append((kind, (data, chips // data, 1)))
        elif kind == "fsdp_tp":
            heads = int(config.model.num_attention_heads)
            tensor = next((t for t in (4, 2) if chips % t == 0 and heads % t == 0), None)
            if tensor and chips > tensor:
                found.append((kind, (1, chips // tensor, tensor)))
        else:
            raise UserError(f"--meshes: unknown mesh kind {kind!r}; known: {', '.join(MESH_KINDS)}")
    return found


def _phase_config(config, phase: config_lib.Phase, setting: Setting, accum: int):
    """The config compiling `phase` alone with `setting` and `accum` micro-batches."""
    single = copy.deepcopy(config)
    with single.unlocked():
        for key in config_lib.PHASE_KEYS:
            if key in single:
                single[key].fraction = 1.0 if key == phase.name else 0.0
        single.mesh.shape = tuple(setting.mesh)
        single.mesh.windowed_einsum = setting.windowed_einsum
        single.mesh.shard_optimizer_state = setting.shard_optimizer_state
        single.model.dtype = setting.dtype
        single.model.remat = setting.remat
        single.grad_accum_steps = accum
    return single


def _pruned(phase: str, setting: Setting, stage: str, why: str, accum: int = 1) -> Candidate:
    return Candidate(
        phase, setting.mesh_kind, tuple(setting.mesh), accum, 0, False, note=why,
        remat=setting.remat, dtype=setting.dtype, windowed_einsum=setting.windowed_einsum,
        shard_optimizer_state=setting.shard_optimizer_state, stage=stage, pruned=True,
    )  # fmt: skip


def search(
    config,
    phase,
    target: TpuTarget,
    setting: Setting,
    max_accum: int,
    stage: str = "mesh",
) -> Candidate:
    """The largest micro-batch (fewest accumulation steps, up to `max_accum`) with which `phase`
    fits with `setting`."""
    replicas = setting.mesh[0] * setting.mesh[1]
    common = dict(
        remat=setting.remat, dtype=setting.dtype, windowed_einsum=setting.windowed_einsum,
        shard_optimizer_state=setting.shard_optimizer_state, stage=stage,
    )  # fmt: skip
    accum, spent, compiles, last = 1, 0.0, 0, "no accumulation factor divides the batch"
    while accum <= max_accum and phase.batch_size % (replicas * accum) == 0:
        per_replica = phase.batch_size // (replicas * accum)
        try:
            phase_config = _phase_config(config, phase, setting, accum)
            report = compile_check.check(phase_config, target, watched=True)
        except compile_check.DoesNotFitError as err:
            last, fitted = str(err), None
            compiles += 1
        except (UserError, host_memory.ChildDied) as err:
            # a mesh the torus cannot hold; a compile past the host's memory, or one that
            # crashed XLA's compiler: not compiled here, and the search goes on
            why = f"the compiler crashed: {err}" if isinstance(err, host_memory.ChildDied) else err
            return Candidate(
                phase.name, setting.mesh_kind, tuple(setting.mesh), accum, per_replica, False,
                note=str(why), **common,
            )  # fmt: skip
        else:
            fitted = report.phases[0]
            if not fitted.cached:
                spent += fitted.compile_seconds
                compiles += 1
            if report.fits:
                estimate = report.estimates(fitted) or {}
                if not estimate.get("step_seconds"):  # e.g. -1 s ops outweighing the rest
                    common["note"] = "fits, but XLA's cost model gave no positive step time"
                return Candidate(
                    phase.name, setting.mesh_kind, tuple(setting.mesh), accum, per_replica, True,
                    peak_bytes=fitted.peak_bytes,
                    step_seconds=estimate.get("step_seconds"),
                    tokens_per_second=estimate.get("tokens_per_second"),
                    mfu=estimate.get("mfu"),
                    link_seconds=estimate.get("link_seconds"),
                    compile_seconds=spent,
                    program=fitted.program_key,
                    update_seconds=fitted.update.seconds if fitted.update is not None else None,
                    compiles=compiles,
                    flags=tuple(setting.flags(accum)),
                    **common,
                )  # fmt: skip
            last = f"peak {fitted.peak_bytes / GIB:.2f} GiB"
        accum *= 2
    note = f"does not fit up to {accum // 2} micro-batches ({last})"
    if phase.batch_size % replicas:
        note = f"global batch {phase.batch_size} does not divide over {replicas} replicas"
    return Candidate(
        phase.name, setting.mesh_kind, tuple(setting.mesh), accum // 2 or 1, 0, False,
        compile_seconds=spent, note=note, compiles=compiles, **common,
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


@dataclasses.dataclass(frozen=True)
class _Space:
    """What the search may vary (the CLI's flags), first values first."""

    kinds: tuple[str, ...]
    dtypes: tuple[str, ...]
    windowed: tuple[bool, ...]
    zero: tuple[bool, ...]
    remats: tuple[str, ...]
    max_accum: int
    margin: float


def _fastest(candidates: Sequence[Candidate]) -> Candidate | None:
    timed = [c for c in candidates if c.timed]
    return min(timed, key=lambda c: c.step_seconds) if timed else None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _search_phase(
    config,
    phase,
    target: TpuTarget,
    space: _Space,
    earlier: Sequence[Candidate],
    seen: dict,
    progress: Callable[[Candidate], None] | None = None,
) -> list[Candidate]:
    """Every candidate of one phase, compiled or pruned, in the stages of the module docstring.
    `earlier`: the previous phase's candidates; `seen`: program key -> the label of the first
    candidate that compiled it (shared by all phases)."""
    tried: list[Candidate] = []
    configured_remat = str(config.model.get("remat", "none"))

    def run(setting: Setting, stage: str, max_accum: int = space.max_accum) -> Candidate:
        found = search(config, phase, target, setting, max_accum, stage)
        first = seen.setdefault(found.program, setting.label()) if found.program else None
        if first is not None and first != setting.label():
            found = dataclasses.replace(
                found, fits=False, pruned=True, note=f"compiles to the same program as {first}"
            )
        tried.append(found)
        if progress is not None:
            progress(found)
        return found

    def prune(setting: Setting, stage: str, why: str) -> None:
        tried.append(_pruned(phase.name, setting, stage, why))
        if progress is not None:
            progress(tried[-1])

    # 1. meshes
    dtype, windowed = space.dtypes[0], space.windowed[0]
    earlier_best = _fastest(earlier)
    by_kind = {}
    for c in earlier:
        if c.timed and (c.mesh_kind not in by_kind or c.step_seconds < by_kind[c.mesh_kind]):
            by_kind[c.mesh_kind] = c.step_seconds
    for kind, mesh in meshes(target, config, space.kinds):
        gathers = Setting(kind, mesh).gathers_weights
        setting = Setting(kind, mesh, dtype, windowed, False, configured_remat)
        if earlier_best is not None and kind in by_kind:
            ratio = by_kind[kind] / earlier_best.step_seconds
            if ratio > space.margin:
                prune(
                    setting, "mesh",
                    f"{earlier_best.phase}: {_ms(by_kind[kind])}, {ratio:.2f}x its best "
                    f"({_ms(earlier_best.step_seconds)}), over the margin {space.margin:g}",
                )  # fmt: skip
                continue
        run(setting, "mesh")
        for value in space.windowed[1:] if not gathers else ():
            prune(
                dataclasses.replace(setting, windowed_einsum=value), "windowed einsum",
                "no FSDP or tensor axis: no weights gathered, no windowed loops to turn on or off",
            )  # fmt: skip
        if mesh[0] == 1 and True in space.zero:
            prune(
                dataclasses.replace(setting, shard_optimizer_state=True), "ZeRO 1",
                "data axis of 1: the optimizer slots are already sharded like the weights",
            )  # fmt: skip

    # 2. the other windowed-einsum value, on the fastest mesh that gathers weights
    best = _fastest(tried)
    sharded = [c for c in tried if c.timed and c.setting.gathers_weights]
    if sharded:
        top = min(sharded, key=lambda c: c.step_seconds)
        for value in space.windowed[1:]:
            run(dataclasses.replace(top.setting, windowed_einsum=value), "windowed einsum")
            for c in sharded:
                if c is not top:
                    prune(
                        dataclasses.replace(c.setting, windowed_einsum=value), "windowed einsum",
                        f"tried on the fastest weight-sharding mesh only ({top.setting.label()})",
                    )  # fmt: skip

    # 3. ZeRO 1 where the update it could save can make up the gap to the best
    best = _fastest(tried)
    if True in space.zero and best is not None:
        for c in [c for c in tried if c.timed and c.mesh[0] > 1 and not c.shard_optimizer_state]:
            if c.stage == "windowed einsum" and c is not best:
                continue
            setting = dataclasses.replace(c.setting, shard_optimizer_state=True)
            saving = (c.update_seconds or 0.0) * (1 - 1 / c.mesh[0])
            bound = c.step_seconds - saving
            if c is not best and bound >= best.step_seconds:
                prune(
                    setting, "ZeRO 1",
                    f"cannot win: {_ms(c.step_seconds)} less at most {_ms(saving)} of the update "
                    f"is {_ms(bound)}, not below the best {_ms(best.step_seconds)}",
                )  # fmt: skip
            else:
                run(setting, "ZeRO 1")

    # 4. the other compute dtypes, on the fastest setting
    best = _fastest(tried)
    if best is not None:
        for other in space.dtypes[1:]:
            run(dataclasses.replace(best.setting, dtype=other), "dtype")

    # 5. rematerialization, only where it could save micro-batches
    best = _fastest(tried)
    remats = [r for r in dict.fromkeys(space.remats)]
    if best is not None:
        for remat in remats:
            setting = dataclasses.replace(best.setting, remat=remat)
            if remat == best.remat:
                continue
            if best.accum_steps > 1:
                run(setting, "remat", best.accum_steps // 2)
            else:
                prune(
                    setting, "remat",
                    "the fastest setting fits without accumulation: remat only adds recomputation",
                )  # fmt: skip
    else:  # nothing fits: remat may make it fit
        for c in [c for c in tried if c.stage == "mesh" and not c.pruned and not c.fits]:
            if not c.note.startswith("does not fit"):
                continue  # the mesh itself is the problem, not memory
            for remat in remats:
                if remat != c.remat:
                    run(dataclasses.replace(c.setting, remat=remat), "remat")

    # 6. the earlier phase's winner, so that one setting can be timed over the whole run
    if earlier_best is not None and all(
        c.setting != earlier_best.setting for c in tried if c.timed
    ):
        run(earlier_best.setting, "earlier winner")
    return tried


def _why(best: Candidate, other: Candidate | None) -> str:
    """Winner against runner-up in words: step, HBM, link time."""
    if other is None:
        return "no other setting compiled and fits for this phase (see the pruned ones)"
    gain = other.step_seconds / best.step_seconds - 1
    text = (
        f"est. step {_ms(best.step_seconds)} vs {_ms(other.step_seconds)} ({gain:.0%} faster); "
        f"peak HBM {best.peak_bytes / GIB:.2f} vs {other.peak_bytes / GIB:.2f} GiB/chip"
    )
    if best.link_seconds is not None and other.link_seconds is not None:
        text += f"; ICI at least {_ms(best.link_seconds)} vs {_ms(other.link_seconds)}"
        if best.step_seconds + best.link_seconds > other.step_seconds + other.link_seconds:
            text += " (with no link time hidden, the runner-up would be faster)"
    return text


def _overall(phases, schedule, candidates) -> tuple[Setting | None, int, str]:
    """The one setting with the least estimated time over every phase (a run has one mesh,
    dtype and accumulation factor), its accumulation factor, and a note when a phase's estimate
    was compiled with fewer micro-batches than the run will use."""
    per_setting: dict[Setting, dict[str, Candidate]] = {}
    for c in candidates:
        if c.timed:
            found = per_setting.setdefault(c.setting, {})
            if c.phase not in found or c.step_seconds < found[c.phase].step_seconds:
                found[c.phase] = c
    steps = {p.name: p.steps for p in phases}
    complete = {s: by for s, by in per_setting.items() if set(by) == set(steps)}
    if not complete:
        return None, 1, "no setting was compiled and fits for every phase"
    setting = min(
        complete, key=lambda s: sum(c.step_seconds * steps[p] for p, c in complete[s].items())
    )
    chosen = complete[setting]
    accum = max(c.accum_steps for c in chosen.values())
    fewer = [p for p, c in chosen.items() if c.accum_steps < accum]
    note = ""
    if fewer:
        note = (
            f"{', '.join(fewer)} estimated at fewer micro-batches than the run's "
            f"config.grad_accum_steps={accum}"
        )
    winners = {s.candidate.setting for s in schedule if s.candidate is not None}
    if winners != {setting}:
        note = "; ".join(
            filter(None, [note, "the phases' own winners differ; this is the best common one"])
        )
    return setting, accum, note


def plan(
    config: ml_collections.ConfigDict,
    target: TpuTarget,
    *,
    kinds: Sequence[str] = MESH_KINDS,
    max_accum: int = 64,
    prices: dict[str, Any] | None = None,
    remats: Sequence[str] = ("dots",),
    dtypes: Sequence[str] = ("bfloat16", "float32"),
    windowed: Sequence[bool] = (False, True),
    zero: Sequence[bool] = (False, True),
    margin: float = 1.25,
    progress: Callable[[Candidate], None] | None = None,
) -> Plan:
    """Searches each phase (see the module docstring). `remats`, `dtypes`, `windowed` and `zero`:
    the values of model.remat, model.dtype, mesh.windowed_einsum and mesh.shard_optimizer_state
    to try, first values first; `margin`: how much slower than an earlier phase's best a mesh
    may be and still be compiled for a later phase; `progress` sees each candidate as it comes."""
    start = time.perf_counter()
    phases = config_lib.plan_phases(config)
    config_lib.check_values(config, phases)
    unknown = sorted(set(remats) - set(REMAT_POLICIES))
    if unknown:
        raise UserError(
            f"--remat: unknown policy {unknown[0]!r}; known: {', '.join(REMAT_POLICIES)}"
        )
    bad = sorted(set(dtypes) - set(DTYPES))
    if bad or not dtypes:
        raise UserError(f"--dtypes: {bad[0] if bad else 'none'!r}; known: {', '.join(DTYPES)}")
    if not windowed or not zero:
        raise UserError("--windowed-einsum and --shard-optimizer-state need at least one value")
    space = _Space(
        tuple(kinds), tuple(dict.fromkeys(dtypes)), tuple(dict.fromkeys(windowed)),
        tuple(dict.fromkeys(zero)), tuple(remats), max_accum, margin,
    )  # fmt: skip
    meshes(target, config, kinds)  # an unknown kind fails before anything compiles
    candidates, schedule, seen, earlier = [], [], {}, []
    for phase in phases:
        tried = _search_phase(config, phase, target, space, earlier, seen, progress)
        candidates += tried
        earlier = tried
        best = _fastest(tried)
        runner_up = _fastest([c for c in tried if best is not None and c.setting != best.setting])
        seconds = best.step_seconds * phase.steps if best else None
        schedule.append(
            PhaseSchedule(
                phase.name, phase.steps, best, seconds, runner_up,
                _why(best, runner_up) if best else "", best.flags if best else (),
            )
        )  # fmt: skip
    total = (
        sum(s.seconds for s in schedule) if all(s.seconds is not None for s in schedule) else None
    )
    price = (prices or {}).get("usd_per_chip_hour", {}).get(target.generation.name)
    chip_hours = total / 3600 * target.chips if total is not None else None
    model = config_lib.bert_config(config)
    overall, accum, note = _overall(phases, schedule, candidates)
    return Plan(
        target=target.topology,
        accelerator_type=target.accelerator_type,
        chips=target.chips,
        hbm_bytes=target.hbm_bytes,
        model=f"{model.num_hidden_layers}/{model.hidden_size}/{model.num_attention_heads}",
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
    if phase is None:
        flags = found.get("flags") or []
        if not flags:
            raise UserError(f"{what} {path}: the plan found no setting that fits every phase")
        return [str(f) for f in flags]
    phases = {s.get("phase"): s for s in found["schedule"]}
    if phase not in phases:
        raise UserError(f"{what} {path}: no phase {phase!r}; it has {', '.join(map(str, phases))}")
    flags = phases[phase].get("flags") or []
    if not flags:
        raise UserError(f"{what} {path}: nothing fits {phase} on {found.get('accelerator_type')}")
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


def _duration(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:.1f} days" if days >= 1 else f"{seconds / 3600:.1f} hours"


def _mesh_name(c: Candidate) -> str:
    return c.setting.label()


def format_plan(result: Plan) -> str:
    lines = [
        f"plan: BERT {result.model} on {result.accelerator_type} ({result.target}, "
        f"{result.chips} chips, {result.hbm_bytes / GIB:g} GiB HBM each); times are estimates of "
        "XLA's TPU cost model, not measurements",
        "| phase | stage | setting | batch/replica | accum | peak GiB/chip | fits | est. step ms | "
        "est. tokens/s | est. MFU | ICI ms, at least | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    pruned: dict[tuple[str, str, str], list[str]] = {}
    for c in result.candidates:
        setting = _mesh_name(c)
        if c.pruned:
            pruned.setdefault((c.phase, c.stage, c.note), []).append(setting)
            continue
        if not c.fits:
            lines.append(
                f"| {c.phase} | {c.stage} | {setting} | - | - | - | no: {c.note} | - | - | - | "
                f"- | {c.compile_seconds:.0f} |"
            )
            continue
        step = f"{c.step_seconds * 1e3:.1f}" if c.step_seconds else "-"
        rate = f"{c.tokens_per_second:,.0f}" if c.tokens_per_second else "-"
        mfu = f"{c.mfu:.1%}" if c.mfu is not None and math.isfinite(c.mfu) else "-"
        links = f"{c.link_seconds * 1e3:.1f}" if c.link_seconds is not None else "-"
        compiled = f"{c.compile_seconds:.0f}" if c.compiles else "cached"
        lines.append(
            f"| {c.phase} | {c.stage} | {setting} | {c.batch_per_replica} | {c.accum_steps} | "
            f"{c.peak_bytes / GIB:.2f} | yes | {step} | {rate} | {mfu} | {links} | {compiled} |"
        )
    lines.append(
        "ICI: the least time the step's collectives need on the inter-chip links; XLA's cost "
        "model leaves it out of the step estimate (it prices a collective as memory traffic)"
    )
    if pruned:
        lines.append("pruned (not compiled):")
        for (phase, stage, why), settings in pruned.items():
            lines.append(f"  {phase}, {stage}: {'; '.join(settings)}: {why}")
    lines.append("schedule:")
    for s in result.schedule:
        if s.candidate is None:
            lines.append(f"  {s.phase}: {s.steps:,} steps: nothing fits this slice")
            continue
        c = s.candidate
        lines.append(
            f"  {s.phase}: {s.steps:,} steps x {c.step_seconds * 1e3:.1f} ms with "
            f"{_mesh_name(c)}, {c.accum_steps} micro-batch(es) = {_duration(s.seconds)}"
        )
        lines.append(f"    flags: {shlex.join(s.flags)}")
        if s.runner_up is not None:
            lines.append(f"    runner-up: {_mesh_name(s.runner_up)}, {s.runner_up.accum_steps} "
                         "micro-batch(es)")  # fmt: skip
        lines.append(f"    why: {s.why}")
    if result.total_seconds is not None:
        total = f"  total: {_duration(result.total_seconds)} on {result.chips} chips = "
        total += f"{result.chip_hours:,.0f} chip-hours"
        if result.cost is not None:
            total += (
                f" x ${result.price_per_chip_hour:.2f} = ${result.cost:,.0f} "
                f"(prices: {result.prices_source})"
            )
        lines.append(total)
    if result.flags:
        lines.append(f"one setting for the whole run: {result.setting}")
        lines.append(f"  flags: {shlex.join(result.flags)}")
        if result.overall_note:
            lines.append(f"  note: {result.overall_note}")
    cached = sum(1 for c in result.candidates if c.program and not c.compiles)
    lines.append(
        f"search: {result.search_seconds:.0f} s, {result.compiles} program(s) compiled, "
        f"{cached} candidate(s) read from the compile cache"
    )
    return "\n".join(lines)
