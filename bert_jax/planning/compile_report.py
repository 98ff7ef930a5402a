"""What a compile check reports: each phase's compiled step (memory, the cost model's figures)
and the report in words (`bert-jax pretrain --compile-only`)."""

from __future__ import annotations

import dataclasses

from bert_jax.planning import cost_model
from bert_jax.runtime.topology import TpuTarget

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class PhaseCompile:
    """One phase's compiled train step."""

    phase: str
    batch_size: int  # global
    max_seq_length: int
    max_predictions_per_seq: int
    accum_steps: int
    memory: cost_model.Memory  # per device
    cost: cost_model.ProgramCost  # per device
    update: cost_model.ProgramCost | None  # the optimizer update compiled alone (TPU targets)
    model_flops: float  # per step, all devices (flops.flops_per_token, every position real)
    compile_seconds: float
    program_key: str = ""  # the step's `program_key` (TPU targets; "" for local devices)
    cached: bool = False  # the figures came from the compile cache (no compile ran)

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak

    @property
    def update_in_step(self) -> bool:
        """Whether the step's cost counts the update (see `cost_model`: a cond may drop it)."""
        return self.update is not None and not self.update.lost_unpriced_ops

    @property
    def step_seconds(self) -> float | None:
        """The cost model's step time, or None where the backend has no cost model (CPU).

        XLA prices a loop's body once; `cost.seconds` counts each body as often as it runs
        (the accumulation loop's `accum_steps` times, FSDP's windowed matmul loops theirs; see
        `cost_model.loop_factor`). The update, priced alone, is added where the step's `cond`
        dropped it.
        """
        if self.cost.raw_seconds == 0.0 or self.update is None:
            return None
        return self.cost.seconds + (0.0 if self.update_in_step else self.update.seconds)

    @property
    def step_flops(self) -> float:
        """XLA's FLOPs of the whole step per device (loop bodies counted as often as they run,
        by the cycles' `loop_factor`)."""
        update = self.update.flops if self.update is not None else 0.0
        micro = self.cost.flops - (update if self.update_in_step else 0.0)
        return micro * self.cost.loop_factor + update

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.max_seq_length


@dataclasses.dataclass(frozen=True)
class CompileReport:
    mesh: dict[str, int]
    platform: str
    device_kind: str
    num_devices: int
    hosts: int
    device_memory_bytes: int | None
    memory_source: str
    phases: list[PhaseCompile]
    target: TpuTarget | None = None
    peak_flops: float | None = None  # per device

    @property
    def fits(self) -> bool | None:
        """True/False against the device memory; None when it is unknown."""
        if self.device_memory_bytes is None:
            return None
        return all(p.peak_bytes <= self.device_memory_bytes for p in self.phases)

    def estimates(self, phase: PhaseCompile) -> dict[str, float] | None:
        """tokens/s, model TFLOP/s per device and MFU from the cost model's step time; on a TPU
        target also the least time the collectives need on the inter-chip links."""
        seconds = phase.step_seconds
        if not seconds or seconds <= 0:
            return None
        tflops = phase.model_flops / seconds / self.num_devices / 1e12
        estimate = {
            "step_seconds": seconds,
            "tokens_per_second": phase.tokens_per_step / seconds,
            "model_tflops_per_device": tflops,
            "mfu": tflops * 1e12 / self.peak_flops if self.peak_flops else float("nan"),
        }
        if self.target is not None:  # what the step estimate leaves out: `cost_model.link_bytes`
            estimate["link_seconds"] = phase.cost.link_bytes / self.target.ici_bytes_per_second
        return estimate


def _gib(n: int) -> str:
    return f"{n / GIB:.3f} GiB"


def _bytes(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n < GIB else _gib(int(n))


def _links(report: CompileReport, estimate: dict[str, float]) -> str:
    if "link_seconds" not in estimate:  # set for TPU targets only
        return ""
    rate = report.target.generation.tpu.ici_gbytes_per_s
    return (
        f"; on the inter-chip links at least {estimate['link_seconds'] * 1e3:.2f} ms at "
        f"{rate:g} GB/s per chip, not in the step estimate (hidden only where XLA overlaps them)"
    )


def format_report(report: CompileReport) -> str:
    where = f"{report.num_devices} {report.platform} device(s) ({report.device_kind})"
    if report.target is not None:
        where = f"{report.target.describe()} on {report.hosts} host(s)"
    lines = [f"compile check: {where}, mesh {report.mesh}; memory per device:"]
    for p in report.phases:
        m = p.memory
        lines.append(
            f"  {p.phase}: global batch {p.batch_size} x seq {p.max_seq_length} "
            f"({p.max_predictions_per_seq} predictions): arguments {_gib(m.argument)}, "
            f"outputs {_gib(m.output)} (aliased {_gib(m.alias)}), temporaries "
            f"{_gib(m.temp)}, code {_gib(m.code)} -> peak {_gib(m.peak)} "
            f"[compiled in {p.compile_seconds:.1f} s]"
        )
        estimate = report.estimates(p)
        if estimate is not None:
            collectives = sorted(p.cost.collective_bytes.items())
            moved = ", ".join(f"{kind} {_bytes(n)}" for kind, n in collectives)
            update = "" if p.update_in_step else " incl. the optimizer update priced alone"
            if p.accum_steps > 1:
                update += f", {p.accum_steps} micro-batches"
            lines.append(
                f"    XLA cost-model estimate (not a measurement): step "
                f"{estimate['step_seconds'] * 1e3:.2f} ms{update} -> "
                f"{estimate['tokens_per_second']:,.0f} tokens/s, "
                f"{estimate['model_tflops_per_device']:.1f} model TFLOP/s per chip, "
                f"MFU {estimate['mfu']:.1%} (every position counted as real); collectives "
                f"per chip per step: {moved or 'none'}{_links(report, estimate)}"
            )
    worst = max(report.phases, key=lambda p: p.peak_bytes)
    if report.device_memory_bytes is None:
        lines.append(
            f"verdict: unknown (the {report.platform} runtime does not report its memory; pass "
            f"--device-memory-gib); the largest phase needs {_gib(worst.peak_bytes)} per device"
        )
        return "\n".join(lines)
    share = worst.peak_bytes / report.device_memory_bytes
    verdict = "fits" if report.fits else "DOES NOT FIT"
    lines.append(
        f"verdict: {verdict}: the largest phase ({worst.phase}) needs "
        f"{_gib(worst.peak_bytes)} of {_gib(report.device_memory_bytes)} per device "
        f"({share:.0%}; device memory {report.memory_source})"
    )
    if not report.fits:
        lines.append(
            f"  short by {_gib(worst.peak_bytes - report.device_memory_bytes)}; try: a larger "
            "mesh fsdp axis (shards params and optimizer state), config.grad_accum_steps, a "
            "smaller per-device batch, or config.model.dtype=bfloat16"
        )
    return "\n".join(lines)
