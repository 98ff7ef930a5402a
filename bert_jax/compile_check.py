"""Ahead-of-time compile check: will the train step fit, on this mesh, for every phase?

`check(config)` lowers and compiles the real jitted train step for each phase's global batch
shape on the configured mesh, from shapes alone (`trainer.abstract_state()` and
`jax.ShapeDtypeStruct` batches carrying their shardings): no state is initialized, no data is
read. It reports XLA's memory analysis per device (arguments, outputs, temporaries, and the peak)
next to the device's memory when JAX knows it (GPU, TPU) or when given (`device_memory_bytes`,
e.g. the HBM of the target chip when checking on emulated CPU devices). On a pod it runs on every
host after `jax.distributed.initialize`, so a job that cannot fit fails in seconds, not after
data loading and initialization. `bert-jax pretrain --compile-only` is the command.

The CPU backend's figures describe the CPU program (other fusions and layouts than on TPU/GPU);
run the check on the target hardware for a verdict that binds.
"""

from __future__ import annotations

import dataclasses
import time

import flax.linen as nn
import jax
import ml_collections

from bert_jax import config_lib, optim, partitioning
from bert_jax.train import ShardedTrainer, dummy_batch

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class PhaseMemory:
    phase: str
    batch_size: int  # global
    max_seq_length: int
    max_predictions_per_seq: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    peak_bytes: int  # per device
    compile_seconds: float


@dataclasses.dataclass(frozen=True)
class CompileReport:
    mesh: dict[str, int]
    platform: str
    device_kind: str
    num_devices: int
    device_memory_bytes: int | None
    memory_source: str
    phases: list[PhaseMemory]

    @property
    def fits(self) -> bool | None:
        """True/False against the device memory; None when it is unknown."""
        if self.device_memory_bytes is None:
            return None
        return all(p.peak_bytes <= self.device_memory_bytes for p in self.phases)


class DoesNotFitError(RuntimeError):
    """XLA refused to compile the step because it needs more memory than the device has."""


def device_memory() -> tuple[int | None, str]:
    """(bytes per device, where the figure came from) from the runtime, if it reports it."""
    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 (backends without memory stats raise various errors)
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "reported by the device"
    return None, "unknown"


def _peak(stats) -> int:
    # Live at once at worst: inputs, outputs not aliased to (donated) inputs, and temporaries.
    # Some backends (CPU) report a peak that leaves the temporaries out: take the larger.
    computed = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
    )
    return int(max(computed, getattr(stats, "peak_memory_in_bytes", 0) or 0))


def check(
    config: ml_collections.ConfigDict, *, device_memory_bytes: int | None = None
) -> CompileReport:
    """Compiles the train step of every phase from shapes only; see the module docstring.

    Raises ValueError for shapes that do not divide the mesh (naming the setting) and
    DoesNotFitError when XLA itself runs out of device memory while compiling.
    """
    phases = config_lib.plan_phases(config)
    config_lib.check_values(config, phases)
    mesh = partitioning.make_mesh(config.mesh.shape)
    rules = partitioning.rules_from_config(config.mesh.rules)
    accum = int(config.grad_accum_steps)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    for phase in phases:
        partitioning.check_batch_divisible(
            phase.batch_size, mesh, f"config.{phase.name}.batch_size"
        )
        if accum < 1 or phase.batch_size % (accum * dp):
            raise ValueError(
                f"config.{phase.name}.batch_size={phase.batch_size} must be divisible by "
                f"config.grad_accum_steps={accum} x data-parallel size {dp}"
            )
    tx, schedule = optim.from_config(
        config.optimizer, [p.steps for p in phases], [config[p.name] for p in phases]
    )
    trainer = ShardedTrainer(
        config_lib.bert_config(config), tx, mesh, rules, schedule=schedule, accum_steps=accum
    )
    state = trainer.abstract_state()
    replicated = partitioning.replicated(mesh)
    rng = jax.eval_shape(lambda: jax.random.key(0))
    rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=replicated)
    if device_memory_bytes is not None:
        memory, source = int(device_memory_bytes), "given"
    else:
        memory, source = device_memory()

    results = []
    for phase in phases:
        shapes = jax.eval_shape(
            lambda p=phase: dummy_batch(p.batch_size, p.max_seq_length, p.max_predictions_per_seq)
        )
        batch = {
            key: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=trainer.batch_sharding)
            for key, value in shapes.items()
        }
        start = time.perf_counter()
        try:
            # The very jitted step training runs (same shardings, donation, rules).
            with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
                lowered = trainer._train_step.lower(state, batch, rng)  # noqa: SLF001
            compiled = lowered.compile()
        except Exception as err:  # XLA reports OOM at compile time on TPU/GPU
            if "RESOURCE_EXHAUSTED" in str(err) or "out of memory" in str(err).lower():
                raise DoesNotFitError(
                    f"config.{phase.name} (global batch {phase.batch_size}, seq "
                    f"{phase.max_seq_length}) does not fit: {str(err).splitlines()[0]}"
                ) from err
            raise
        stats = compiled.memory_analysis()
        results.append(
            PhaseMemory(
                phase=phase.name,
                batch_size=phase.batch_size,
                max_seq_length=phase.max_seq_length,
                max_predictions_per_seq=phase.max_predictions_per_seq,
                argument_bytes=int(stats.argument_size_in_bytes),
                output_bytes=int(stats.output_size_in_bytes),
                alias_bytes=int(stats.alias_size_in_bytes),
                temp_bytes=int(stats.temp_size_in_bytes),
                code_bytes=int(stats.generated_code_size_in_bytes),
                peak_bytes=_peak(stats),
                compile_seconds=time.perf_counter() - start,
            )
        )
    device = jax.devices()[0]
    return CompileReport(
        mesh=dict(mesh.shape),
        platform=device.platform,
        device_kind=device.device_kind,
        num_devices=jax.device_count(),
        device_memory_bytes=memory,
        memory_source=source,
        phases=results,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.3f} GiB"


def format_report(report: CompileReport) -> str:
    lines = [
        f"compile check: {report.num_devices} {report.platform} device(s) ({report.device_kind}), "
        f"mesh {report.mesh}; memory per device:"
    ]
    for p in report.phases:
        lines.append(
            f"  {p.phase}: global batch {p.batch_size} x seq {p.max_seq_length} "
            f"({p.max_predictions_per_seq} predictions): arguments {_gib(p.argument_bytes)}, "
            f"outputs {_gib(p.output_bytes)} (aliased {_gib(p.alias_bytes)}), temporaries "
            f"{_gib(p.temp_bytes)}, code {_gib(p.code_bytes)} -> peak {_gib(p.peak_bytes)} "
            f"[compiled in {p.compile_seconds:.1f} s]"
        )
    worst = max(report.phases, key=lambda p: p.peak_bytes)
    if report.device_memory_bytes is None:
        lines.append(
            f"verdict: unknown (the {report.platform} runtime does not report its memory; pass "
            f"--device-memory-gib); the largest phase needs {_gib(worst.peak_bytes)} per device"
        )
    else:
        share = worst.peak_bytes / report.device_memory_bytes
        verdict = "fits" if report.fits else "DOES NOT FIT"
        lines.append(
            f"verdict: {verdict}: the largest phase ({worst.phase}) needs "
            f"{_gib(worst.peak_bytes)} of {_gib(report.device_memory_bytes)} per device "
            f"({share:.0%}; device memory {report.memory_source})"
        )
        if not report.fits:
            lines.append(
                "  try: a larger mesh fsdp axis (shards params and optimizer state), "
                "config.grad_accum_steps, a smaller per-device batch, or "
                "config.model.dtype=bfloat16"
            )
    return "\n".join(lines)


def main(config: ml_collections.ConfigDict, device_memory_gib: float | None = None) -> int:
    """`bert-jax pretrain --compile-only`: prints the report on process 0; exit status 0 when it
    fits or the device memory is unknown, 4 when it does not fit."""
    memory = None if device_memory_gib is None else int(device_memory_gib * GIB)
    show = print if jax.process_index() == 0 else (lambda *a, **k: None)
    try:
        report = check(config, device_memory_bytes=memory)
    except DoesNotFitError as err:
        show(f"compile check: DOES NOT FIT: {err}")
        return 4
    show(format_report(report))
    return 4 if report.fits is False else 0
