"""Timed windows, one side's medians (tokens/s, MFU, HFU), and the report: table, text, JSON."""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any

from bert_jax.bench.spec import BenchSpec, peer_differences, spec_to_json
from bert_jax.core.modernbert_config import ModernBertConfig


@dataclasses.dataclass
class Window:
    seconds: float
    steps: int
    real_tokens: int
    padded_tokens: int
    instances: int
    # CPU time of the process running the side: on a shared machine, less disturbed by other
    # jobs than the wall clock (threads spinning while they wait count too).
    cpu_seconds: float = 0.0


@dataclasses.dataclass
class SideResult:
    """Medians over windows for one side, and what it needs to be read."""

    name: str
    compile_seconds: float
    windows: list[Window]
    num_devices: int
    device_kind: str
    model_flops_per_real_token: float
    hardware_flops_per_position: float
    peak_flops_per_chip: float | None
    peak_memory_bytes: int | None = None
    warmup_loss: float | None = None  # the first step's, at the initial parameters
    initial_weights: str = ""  # "ours": started from our side's initial parameters
    versions: dict[str, str] = dataclasses.field(default_factory=dict)  # a peer's libraries

    def _median(self, per_window) -> float:
        return float(statistics.median(per_window(w) for w in self.windows))

    @property
    def step_seconds(self) -> float:
        return self._median(lambda w: w.seconds / w.steps)

    @property
    def tokens_per_sec(self) -> float:
        return self._median(lambda w: w.real_tokens / w.seconds)

    @property
    def padded_tokens_per_sec(self) -> float:
        return self._median(lambda w: w.padded_tokens / w.seconds)

    @property
    def sequences_per_sec(self) -> float:
        return self._median(lambda w: w.instances / w.seconds)

    @property
    def model_tflops_per_sec(self) -> float:
        return self.tokens_per_sec * self.model_flops_per_real_token / 1e12

    @property
    def hardware_tflops_per_sec(self) -> float:
        return self.padded_tokens_per_sec * self.hardware_flops_per_position / 1e12

    @property
    def mfu(self) -> float | None:
        if not self.peak_flops_per_chip:
            return None
        return self.model_tflops_per_sec * 1e12 / (self.peak_flops_per_chip * self.num_devices)

    @property
    def hfu(self) -> float | None:
        if not self.peak_flops_per_chip:
            return None
        return self.hardware_tflops_per_sec * 1e12 / (self.peak_flops_per_chip * self.num_devices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "compile_seconds": self.compile_seconds,
            "step_seconds": self.step_seconds,
            "sequences_per_sec": self.sequences_per_sec,
            "tokens_per_sec": self.tokens_per_sec,
            "padded_tokens_per_sec": self.padded_tokens_per_sec,
            "model_tflops_per_sec": self.model_tflops_per_sec,
            "hardware_tflops_per_sec": self.hardware_tflops_per_sec,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "num_devices": self.num_devices,
            "device_kind": self.device_kind,
            "warmup_loss": self.warmup_loss,
            "initial_weights": self.initial_weights,
            "versions": self.versions,
            "windows": [dataclasses.asdict(w) for w in self.windows],
        }


@dataclasses.dataclass
class BenchReport:
    spec: BenchSpec
    data: str
    sides: list[SideResult]

    def _other(self, other: int | None) -> int:
        """The index of the side compared with ours: `other`, else the fastest of the others."""
        if other is not None:
            return other
        others = range(1, len(self.sides))
        return max(others, key=lambda i: self.sides[i].tokens_per_sec / self.sides[i].num_devices)

    def ratio_to(self, other: int) -> float:
        """Ours / side `other`: ratio of median real tokens per second per chip."""
        ours, theirs = self.sides[0], self.sides[other]
        return (ours.tokens_per_sec / ours.num_devices) / (
            theirs.tokens_per_sec / theirs.num_devices
        )

    @property
    def ratio(self) -> float | None:
        """Ours / the fastest other side: ratio of median real tokens per second per chip."""
        if len(self.sides) < 2:
            return None
        return self.ratio_to(self._other(None))

    def paired_ratios(self, other: int | None = None) -> dict[str, float]:
        """Medians over windows of ours / side `other` (default: the fastest other) within
        adjacent windows: by wall clock and by CPU time (both robust to load that changes
        between windows)."""
        if len(self.sides) < 2:
            return {}
        ours, theirs = self.sides[0], self.sides[self._other(other)]
        pairs = list(zip(ours.windows, theirs.windows))
        rate = lambda w, t: w.real_tokens / max(t, 1e-9)  # noqa: E731
        out = {"wall": statistics.median(rate(a, a.seconds) / rate(b, b.seconds) for a, b in pairs)}
        if all(a.cpu_seconds and b.cpu_seconds for a, b in pairs):
            out["cpu"] = statistics.median(
                rate(a, a.cpu_seconds) / rate(b, b.cpu_seconds) for a, b in pairs
            )
        return out

    def differences(self) -> list[str]:
        """What differs between our step and each peer's (prefixed by the peer where several)."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for side in self.sides[1:]:
            items = peer_differences(side.name, self.spec.model)
            if items:
                groups.setdefault(items, []).append(side.name)
        if len(groups) == 1:
            return list(next(iter(groups)))
        return [f"{'/'.join(names)}: {item}" for items, names in groups.items() for item in items]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": spec_to_json(self.spec),
            "data": self.data,
            "sides": [side.to_dict() for side in self.sides],
            # Against the fastest other side; "ratios" has one entry per other side.
            "ratio_tokens_per_sec": self.ratio,
            "paired_ratios": self.paired_ratios(),
            "ratios": {
                self.sides[i].name: {
                    "tokens_per_sec": self.ratio_to(i),
                    "paired": self.paired_ratios(i),
                }
                for i in range(1, len(self.sides))
            },
            "peer_differences": self.differences(),
        }

    def table(self) -> str:
        headers = (
            "",
            "step ms",
            "seq/s",
            "tok/s real",
            "tok/s padded",
            "model TFLOP/s",
            "MFU",
            "HFU",
            "peak mem",
            "compile s",
        )
        rows = [headers]
        for side in self.sides:
            rows.append(
                (
                    side.name,
                    f"{side.step_seconds * 1e3:.1f}",
                    f"{side.sequences_per_sec:.1f}",
                    f"{side.tokens_per_sec:,.0f}",
                    f"{side.padded_tokens_per_sec:,.0f}",
                    f"{side.model_tflops_per_sec:.3f}",
                    "-" if side.mfu is None else f"{side.mfu:.1%}",
                    "-" if side.hfu is None else f"{side.hfu:.1%}",
                    _bytes(side.peak_memory_bytes),
                    f"{side.compile_seconds:.1f}",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
        lines = []
        for n, row in enumerate(rows):
            cells = [row[0].ljust(widths[0])]
            cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
            lines.append("| " + " | ".join(cells) + " |")
            if n == 0:
                lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n".join(lines)

    def render(self) -> str:
        spec, model = self.spec, self.spec.model
        ours = self.sides[0]
        vocab = f"vocab {model.vocab_size}"
        if model.padded_vocab_size != model.vocab_size:
            vocab += f" (ours padded to {model.padded_vocab_size})"
        lines = [
            f"bert-jax bench: {_family(model)}, {model.num_hidden_layers} layers, hidden "
            f"{model.hidden_size}, {model.num_attention_heads} heads, {vocab}, {model.dtype}; "
            f"global batch {spec.batch_size} x seq {spec.seq_len}, {spec.max_predictions} "
            f"predictions per row; attention {model.attention_impl}, dropout {_dropout(model)}, "
            "dropout masks "
            + (
                f"from a counter hash keyed by {spec.rng_impl or 'threefry2x32'}"
                if model.dropout_impl == "hash"
                else f"from the {spec.rng_impl or 'threefry2x32'} PRNG"
            )
            + (
                f" (hf-flax: the {spec.peer_rng_impl or 'threefry2x32'} PRNG)"
                if any(side.name == "hf-flax" for side in self.sides)
                else ""
            )
            + (
                " (hf-torch: torch's generator)"
                if any(side.name.startswith("hf-torch") for side in self.sides)
                else ""
            ),
            f"device: {ours.num_devices} x {ours.device_kind}; data: {self.data}",
            f"timing: median of {spec.windows} windows x {spec.steps} steps after "
            f"{spec.warmup_steps} warm-up steps"
            + ("; windows alternate between the sides" if len(self.sides) > 1 else ""),
            "",
            self.table(),
            "",
            f"model FLOPs/token {ours.model_flops_per_real_token / 1e9:.3f} G (real tokens, MLM "
            "head on predicted slots); HFU counts every position computed, padding included"
            + ("" if ours.mfu is not None else "; MFU/HFU: no peak known for this device"),
        ]
        for i, other in enumerate(self.sides[1:], start=1):
            paired = self.paired_ratios(i)
            lines.append(
                f"{ours.name} / {other.name}: {self.ratio_to(i):.2f}x median real tokens/s "
                f"(per chip); window by window: {paired['wall']:.2f}x by wall clock"
                + (f", {paired['cpu']:.2f}x by CPU time" if "cpu" in paired else "")
            )
        if len(self.sides) > 2:
            fastest = self.sides[self._other(None)]
            lines.append(
                f"{ours.name} / the fastest other ({fastest.name}): {self.ratio:.2f}x median "
                "real tokens/s (per chip)"
            )
        if len(self.sides) > 1 and all(side.warmup_loss is not None for side in self.sides):
            lines.append(
                "first-step loss (initial parameters): "
                + ", ".join(
                    f"{side.name} {side.warmup_loss:.6f}"
                    + (" (our initial weights)" if side.initial_weights == "ours" else "")
                    for side in self.sides
                )
                + (
                    "; equal from the same weights with dropout off on unpacked rows"
                    if any(side.initial_weights == "ours" for side in self.sides)
                    else ""
                )
            )
        differences = self.differences()
        if differences:
            lines += [
                "differences between our step and the peer's:",
                *(f"  - {d}" for d in differences),
            ]
        return "\n".join(lines)


def _family(model: Any) -> str:
    return "ModernBERT" if isinstance(model, ModernBertConfig) else "BERT"


def _dropout(model: Any) -> str:
    """The model's dropout rates, as its family names them."""
    if isinstance(model, ModernBertConfig):
        return (
            f"embedding/attention/mlp {model.embedding_dropout}/{model.attention_dropout}/"
            f"{model.mlp_dropout}"
        )
    return f"{model.hidden_dropout_prob}/{model.attention_probs_dropout_prob}"


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB"


def write_json(report: BenchReport, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report.to_dict(), f, indent=2)
        f.write("\n")
