"""The hardware table: one declaration per accelerator chip, read by everything that needs a
chip's figures.

A `Chip` names the chip, the `jax.Device.device_kind` strings it reports, its dense bf16 peak,
its HBM, its on-demand price per chip-hour where one is known and, for a Cloud TPU, how Cloud TPU
names and shapes its slices. `runtime/topology.py` turns `--topology v5p-16` into a slice of one;
`plan` reads the slice's HBM, peak and price; `bench` and the pretraining loop's metrics find the
peak by the device kind a run sees, for MFU. A new chip is one entry in `CHIPS`.

A device kind matches exactly, never by substring: "TPU v5" is v5p and "TPU v5 lite" is v5e
whatever their order here, and an unlisted kind (a CPU, a GPU not in the table) has no peak, so
no MFU is reported (`bench --peak-tflops` gives one). A device kind declared twice is a bug the
first lookup reports.
"""

from __future__ import annotations

import dataclasses
import functools

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class TpuSlices:
    """How Cloud TPU names and shapes slices of one TPU chip (`runtime/topology.py`)."""

    cloud_prefix: str  # as in accelerator types: "v4-", "v5p-", "v5litepod-", "v6e-"
    cores_per_chip_in_name: int  # what the accelerator type's N counts per chip
    dims: int  # torus dimensions
    ici_gbytes_per_s: float  # inter-chip links, per chip, one direction
    chip_config_name: str | None = None  # libtpu's name for "one device per chip", if needed
    aliases: tuple[str, ...] = ()  # other spellings of the generation in --topology


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str  # a TPU's as in raw topologies ("v5p"); a GPU's short name ("h100")
    # What `jax.Device.device_kind` (and torch.cuda.get_device_name) report for it; for a TPU
    # the first is what libtpu's compile-only devices report.
    device_kinds: tuple[str, ...]
    peak_bf16_tflops: float  # dense, per chip
    hbm_gib: float  # per chip
    usd_per_chip_hour: float | None = None  # on-demand list price (PRICES says where from)
    tpu: TpuSlices | None = None  # None: not a Cloud TPU (no slices to compile for)

    @property
    def device_kind(self) -> str:
        return self.device_kinds[0]

    @property
    def peak_flops(self) -> float:
        return self.peak_bf16_tflops * 1e12

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * GIB)


# TPUs: HBM, dense bf16 peak and inter-chip bandwidth per chip as Google Cloud's TPU pages list
# them. The ICI figure is one direction: half the pages' bidirectional bandwidth per chip (v5p
# 1200, v5e 400, v6e 800 GB/s), which is also their pod all-reduce bandwidth over the pod's chips
# (v5e 51.2 TB/s / 256, v6e 102.4 TB/s / 256); v4's page gives only the latter (1.1 PB/s /
# 4096). Device kinds as JAX's own table has them (jax/_src/pallas/mosaic/tpu_info.py). On v4
# the chip's two TensorCores act as one device (megacore), as JAX runs them.
# GPUs: NVIDIA's datasheets, dense (the datasheets' bf16 figures halved: they quote sparsity);
# HBM as NVIDIA states it. No GPU price is listed: `plan` prices TPU slices only.
# fmt: off
CHIPS: tuple[Chip, ...] = (
    # name, device kinds, peak bf16 TFLOP/s, HBM GiB, $ per chip-hour, slices:
    #   TpuSlices(accelerator type prefix, its N per chip, torus dims, ICI GB/s, ...)
    Chip("v4", ("TPU v4",), 275.0, 32, 3.22, TpuSlices("v4-", 2, 3, 268.0, "megacore")),
    Chip("v5p", ("TPU v5", "TPU v5p"), 459.0, 95, 4.2, TpuSlices("v5p-", 2, 3, 600.0)),
    Chip("v5e", ("TPU v5 lite", "TPU v5e"), 197.0, 16, 1.2,
         TpuSlices("v5litepod-", 1, 2, 200.0, aliases=("v5litepod", "v5lite"))),
    Chip("v6e", ("TPU v6 lite", "TPU v6e"), 918.0, 32, 2.7,
         TpuSlices("v6e-", 1, 2, 400.0, aliases=("v6", "trillium"))),
    Chip("h100", ("NVIDIA H100 80GB HBM3",), 989.0, 80),  # SXM5
    Chip("h100-pcie", ("NVIDIA H100 PCIe",), 756.0, 80),
    Chip("h200", ("NVIDIA H200",), 989.0, 141),
    Chip("a100-40gb", ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"), 312.0, 40),
    Chip("a100-80gb", ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"), 312.0, 80),
)
# fmt: on

# Where the prices above come from: `plan` prints the source and date beside a cost.
PRICES = {
    "source": "cloud.google.com/tpu/pricing, on-demand, US regions",
    "date": "as listed in 2025",
    "note": (
        "List prices; Spot and committed-use prices are lower. Not re-checked from the offline "
        "machine these figures were written on: update before budgeting (plan --prices FILE)."
    ),
    "currency": "USD",
}


def by_device_kind(device_kind: str) -> Chip | None:
    """The chip that reports exactly this device kind, or None (a CPU, an unlisted chip)."""
    return _kinds(CHIPS).get(device_kind)


def peak_flops(device_kind: str) -> float | None:
    """Peak dense bf16 FLOP/s of one chip of this device kind, or None when it is unknown."""
    chip = by_device_kind(device_kind)
    return chip.peak_flops if chip else None


def tpu_generations() -> dict[str, Chip]:
    """The Cloud TPU chips by generation name, in the table's order."""
    return {c.name: c for c in _checked(CHIPS) if c.tpu is not None}


def tpu_generation(name: str) -> Chip | None:
    """The TPU chip a --topology generation names (its name or an alias), or None."""
    generations = tpu_generations()
    for chip in generations.values():
        if name in chip.tpu.aliases:
            return chip
    return generations.get(name)


def price_table() -> dict:
    """The on-demand prices per chip-hour, in the form of a `plan --prices` file."""
    priced = {c.name: c.usd_per_chip_hour for c in _checked(CHIPS) if c.usd_per_chip_hour}
    return {**PRICES, "usd_per_chip_hour": priced}


@functools.cache
def _checked(table: tuple[Chip, ...]) -> tuple[Chip, ...]:
    """The table, once checked: every name, device kind and TPU alias declared once."""
    seen: dict[str, str] = {}
    for chip in table:
        if not chip.device_kinds:
            raise ValueError(f"chip {chip.name!r} declares no device kind")
        names = (chip.name, *(chip.tpu.aliases if chip.tpu else ()))
        keys = [f"name {n}" for n in names] + [f"device kind {k!r}" for k in chip.device_kinds]
        for key in keys:
            if key in seen:
                raise ValueError(f"{key} is declared by chips {seen[key]!r} and {chip.name!r}")
            seen[key] = chip.name
    return table


@functools.cache
def _kinds(table: tuple[Chip, ...]) -> dict[str, Chip]:
    return {kind: chip for chip in _checked(table) for kind in chip.device_kinds}
