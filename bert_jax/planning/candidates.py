"""The records of `bert-jax plan` (what the search may vary, a setting, a candidate compiled or
pruned, a phase's schedule, the plan) and the plan in words. No JAX here: `--help` reads the
search space's declarations."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from collections.abc import Sequence

from bert_jax.core.dtypes import DTYPES
from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError

GIB = 1024**3
MESH_KINDS = ("dp", "fsdp", "dp_fsdp", "fsdp_tp")
MESH_NAMES = {
    "dp": "data parallel",
    "fsdp": "fsdp",
    "dp_fsdp": "data x fsdp",
    "fsdp_tp": "fsdp + tensor",
}
_SWITCHES = {"true": True, "on": True, "false": False, "off": False}


def _words(text: str) -> tuple[str, ...]:
    """A list flag's value: `dp,fsdp` -> ("dp", "fsdp"); "" -> ()."""
    return tuple(word.strip() for word in text.split(",") if word.strip())


def _switches(text: str) -> tuple[bool, ...]:
    """`false,true` -> (False, True); on/off too."""
    for word in _words(text):
        if word.lower() not in _SWITCHES:
            raise ValueError(f"{word!r} is not true or false")
    return tuple(_SWITCHES[word.lower()] for word in _words(text))


def _switches_text(values: Sequence[bool]) -> str:
    return ",".join(str(value).lower() for value in values)


_WORDS = {"parse": _words, "metavar": "A,B,..."}
_BOOLEANS = {"parse": _switches, "show": _switches_text, "metavar": "BOOL,..."}


@dataclasses.dataclass(frozen=True)
class Space:
    """What `plan`'s search may vary, first values first; each setting declared once: `plan`'s
    flags, their help and defaults, and the checks of `max_accum` and `margin` derive from it."""

    kinds: tuple[str, ...] = setting(
        MESH_KINDS,
        "mesh kinds to try: dp (data parallel), fsdp, dp_fsdp (data over the smallest torus "
        "axis x fsdp), fsdp_tp (fsdp with a tensor axis of 4 or 2)",
        flag="meshes",
        **_WORDS,
    )
    dtypes: tuple[str, ...] = setting(
        ("bfloat16", "float32"),
        "config.model.dtype values to try (float32 master weights either way); the first is "
        "searched over meshes, the others on the fastest setting",
        **_WORDS,
    )
    windowed: tuple[bool, ...] = setting(
        (False, True),
        "config.mesh.windowed_einsum values to try; the first on every mesh, the others on "
        "the fastest mesh that gathers weights",
        flag="windowed-einsum",
        **_BOOLEANS,
    )
    zero: tuple[bool, ...] = setting(
        (False, True),
        "config.mesh.shard_optimizer_state (ZeRO 1) values to try; true only where a data "
        "axis could make it win",
        flag="shard-optimizer-state",
        **_BOOLEANS,
    )
    remats: tuple[str, ...] = setting(
        ("dots",),
        "rematerialization policies to try besides config.model.remat (none, dots, full), "
        "each only where it could take fewer accumulation steps",
        flag="remat",
        **_WORDS,
    )
    max_accum: int = setting(64, "the largest gradient-accumulation factor to try", low=1)
    margin: float = setting(
        1.25,
        "a later phase compiles only the meshes within this factor of the earlier phase's "
        "best step",
        low=1.0,
    )

    def __post_init__(self):
        # Lists as given by Python callers become tuples; a value given twice is tried once.
        for name in ("kinds", "dtypes", "windowed", "zero", "remats"):
            values = tuple(getattr(self, name))
            object.__setattr__(self, name, values if name == "remats" else _once(values))
        for problem in declarations.problems(self):
            raise UserError(problem)
        bad = sorted(set(self.dtypes) - set(DTYPES))
        if bad or not self.dtypes:
            raise UserError(
                f"{_flag('dtypes')}: {bad[0] if bad else 'none'!r}; known: {', '.join(DTYPES)}"
            )
        for name in ("windowed", "zero"):
            if not getattr(self, name):
                raise UserError(f"{_flag(name)} needs at least one value")


def _flag(name: str) -> str:
    """The `plan` flag of the search space's setting `name` (`kinds` -> `--meshes`)."""
    return declarations.flag_name(name, declarations.declarations(Space)[name])


def _once(values: tuple) -> tuple:
    return tuple(dict.fromkeys(values))


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
    model: str  # config_lib.model_label: "BERT 12/768/12", "ModernBERT 22/768/12"
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
        f"plan: {result.model} on {result.accelerator_type} ({result.target}, "
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
