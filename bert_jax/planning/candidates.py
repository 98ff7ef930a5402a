"""The records of `bert-jax plan` (a setting, a candidate compiled or pruned, a phase's schedule,
the plan) and the plan in words."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from collections.abc import Sequence

GIB = 1024**3
MESH_KINDS = ("dp", "fsdp", "dp_fsdp", "fsdp_tp")
DTYPES = ("float32", "bfloat16")
MESH_NAMES = {
    "dp": "data parallel",
    "fsdp": "fsdp",
    "dp_fsdp": "data x fsdp",
    "fsdp_tp": "fsdp + tensor",
}


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
        parts = [f"{MESH_NAMES.get(self.mesh_kind, self.mesh_kind)} {tuple(self.mesh)}"]
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
    # No verdict on this host: its compile passed the host's memory limit or crashed XLA (a
    # verdict of the slice it is not: on a larger host it may fit).
    undecided: bool = False
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
    undecided: int = 0  # with no winner: candidates this host could not compile to a verdict


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


def fastest(candidates: Sequence[Candidate]) -> Candidate | None:
    timed = [c for c in candidates if c.timed]
    return min(timed, key=lambda c: c.step_seconds) if timed else None


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def duration(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:.1f} days" if days >= 1 else f"{seconds / 3600:.1f} hours"


def mesh_name(c: Candidate) -> str:
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
        setting = mesh_name(c)
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
        if s.candidate is None and s.undecided:
            lines.append(
                f"  {s.phase}: {s.steps:,} steps: no verdict on this host: {s.undecided} "
                "candidate(s) could not be compiled here (past its memory limit, or XLA crashed)"
            )
            continue
        if s.candidate is None:
            lines.append(f"  {s.phase}: {s.steps:,} steps: nothing fits this slice")
            continue
        c = s.candidate
        lines.append(
            f"  {s.phase}: {s.steps:,} steps x {c.step_seconds * 1e3:.1f} ms with "
            f"{mesh_name(c)}, {c.accum_steps} micro-batch(es) = {duration(s.seconds)}"
        )
        lines.append(f"    flags: {shlex.join(s.flags)}")
        if s.runner_up is not None:
            lines.append(f"    runner-up: {mesh_name(s.runner_up)}, {s.runner_up.accum_steps} "
                         "micro-batch(es)")  # fmt: skip
        lines.append(f"    why: {s.why}")
    if result.total_seconds is not None:
        total = f"  total: {duration(result.total_seconds)} on {result.chips} chips = "
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
