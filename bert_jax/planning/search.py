"""The search of `bert-jax plan`, stage by stage.

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
Compiled figures are cached on disk by that key (`runtime.caches.cache_root()`), so a re-plan
lowers but does not compile again. On a host without TPU chips each candidate compiles in a
child process stopped at the host's memory limit (`host_memory`): a program too large to
compile here, or one whose compile crashes XLA, is a candidate that does not fit, with the
reason, and the search goes on.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence

import ml_collections

from bert_jax.planning import compile_check
from bert_jax.planning.candidates import (
    GIB,
    MESH_KINDS,
    Candidate,
    Setting,
    Space,
    fastest,
    ms,
)
from bert_jax.runtime import host_memory
from bert_jax.runtime.errors import UserError
from bert_jax.runtime.topology import TpuTarget
from bert_jax.training import config_lib


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


def expected_compiles(target: TpuTarget, config, phases, space: Space) -> int:
    """About how many candidates the search compiles (each may compile a few accumulation
    factors): per phase, stage 1's meshes, stage 2's other windowed-einsum values, stage 3's
    meshes with a data axis, stage 4's other dtypes and stage 5's other remat policies (each
    stage at most that many; stages 3 and 5 often fewer), and each later phase's check of the
    earlier winner. Pruned candidates compile nothing and are not counted."""
    kinds = meshes(target, config, space.kinds)
    per_phase = len(kinds)
    if any(Setting(kind, mesh).gathers_weights for kind, mesh in kinds):
        per_phase += len(space.windowed) - 1
    if True in space.zero:
        per_phase += sum(1 for _, mesh in kinds if mesh[0] > 1)
    per_phase += len(space.dtypes) - 1
    configured = str(config.model.get("remat", "none"))
    per_phase += len([r for r in dict.fromkeys(space.remats) if r != configured])
    return per_phase * len(phases) + len(phases) - 1


def searched(candidate: Candidate) -> bool:
    """Whether the search lowered (and compiled, or read from the cache) this candidate: not
    one pruned without trying it."""
    return not candidate.pruned or bool(candidate.program)


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


def pruned_candidate(
    phase: str, setting: Setting, stage: str, why: str, accum: int = 1
) -> Candidate:
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
            undecided = isinstance(err, (host_memory.ChildDied, host_memory.HostMemoryError))
            return Candidate(
                phase.name, setting.mesh_kind, tuple(setting.mesh), accum, per_replica, False,
                note=str(why), undecided=undecided, **common,
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


def search_phase(
    config,
    phase,
    target: TpuTarget,
    space: Space,
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
        tried.append(pruned_candidate(phase.name, setting, stage, why))
        if progress is not None:
            progress(tried[-1])

    # 1. meshes
    dtype, windowed = space.dtypes[0], space.windowed[0]
    earlier_best = fastest(earlier)
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
                    f"{earlier_best.phase}: {ms(by_kind[kind])}, {ratio:.2f}x its best "
                    f"({ms(earlier_best.step_seconds)}), over the margin {space.margin:g}",
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
    best = fastest(tried)
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
    best = fastest(tried)
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
                    f"cannot win: {ms(c.step_seconds)} less at most {ms(saving)} of the update "
                    f"is {ms(bound)}, not below the best {ms(best.step_seconds)}",
                )  # fmt: skip
            else:
                run(setting, "ZeRO 1")

    # 4. the other compute dtypes, on the fastest setting
    best = fastest(tried)
    if best is not None:
        for other in space.dtypes[1:]:
            run(dataclasses.replace(best.setting, dtype=other), "dtype")

    # 5. rematerialization, only where it could save micro-batches
    best = fastest(tried)
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


def why(best: Candidate, other: Candidate | None) -> str:
    """Winner against runner-up in words: step, HBM, link time."""
    if other is None:
        return "no other setting compiled and fits for this phase (see the pruned ones)"
    gain = other.step_seconds / best.step_seconds - 1
    text = (
        f"est. step {ms(best.step_seconds)} vs {ms(other.step_seconds)} ({gain:.0%} faster); "
        f"peak HBM {best.peak_bytes / GIB:.2f} vs {other.peak_bytes / GIB:.2f} GiB/chip"
    )
    if best.link_seconds is not None and other.link_seconds is not None:
        text += f"; ICI at least {ms(best.link_seconds)} vs {ms(other.link_seconds)}"
        if best.step_seconds + best.link_seconds > other.step_seconds + other.link_seconds:
            text += " (with no link time hidden, the runner-up would be faster)"
    return text


def overall(phases, schedule, candidates) -> tuple[Setting | None, int, str]:
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
