"""Cloud TPU slices as compile targets: accelerator names, chips, hosts, and compile-only TPU
devices from libtpu on any host (no TPU needed). A chip's figures (HBM, peak FLOP/s, links,
price) and how Cloud TPU names its slices are declared once, in `runtime/hardware.py`.

`parse("v5p-128")` or `parse("v5p:4x4x4")` gives a `TpuTarget`; `target.devices()` asks libtpu
(the `tpu` extra: `pip install -e '.[tpu]'` in a checkout) for the slice's devices, with which a
`jax.jit` step lowers and compiles for that TPU exactly as on the slice itself: XLA's real TPU
compiler runs here, so its memory and cost analyses describe the TPU program.

Names count as Cloud TPU does: `v4-N` and `v5p-N` count TensorCores (two per chip: v5p-8 is 4
chips), `v5litepod-N` (v5e) and `v6e-N` count chips. A raw topology `GEN:AxBxC` names chips per
torus axis. On v4 the chip's two TensorCores act as one device (megacore), as JAX runs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import importlib.util
import math
import os
import re
import sys
from collections.abc import Iterator

from bert_jax.runtime import hardware
from bert_jax.runtime.errors import UserError

GIB = hardware.GIB


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """One TPU slice: what `parse` read, and what the compile and the report need of it."""

    name: str  # as given
    generation: hardware.Chip  # a chip with Cloud TPU slices (`chip.tpu`)
    shape: tuple[int, ...]  # chips per torus axis

    @property
    def topology(self) -> str:
        """libtpu's topology name, e.g. "v5p:2x2x2"."""
        return f"{self.generation.name}:{'x'.join(map(str, self.shape))}"

    @property
    def accelerator_type(self) -> str:
        """The Cloud TPU accelerator type of the same slice, e.g. "v5p-16"."""
        g = self.generation
        return f"{g.tpu.cloud_prefix}{self.chips * g.tpu.cores_per_chip_in_name}"

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def hbm_bytes(self) -> int:
        return self.generation.hbm_bytes

    @property
    def peak_flops(self) -> float:
        return self.generation.peak_flops

    @property
    def ici_bytes_per_second(self) -> float:
        return self.generation.tpu.ici_gbytes_per_s * 1e9

    def devices(self) -> list:
        """The slice's compile-only TPU devices (every host's), from libtpu."""
        return list(_topology_devices(self.topology, self.generation.tpu.chip_config_name))

    def describe(self) -> str:
        return (
            f"{self.accelerator_type} (topology {self.topology}: {self.chips} chips, "
            f"{self.generation.hbm_gib:g} GiB HBM and {self.generation.peak_bf16_tflops:g} "
            "bf16 TFLOP/s each)"
        )


def _default_shape(generation: hardware.Chip, chips: int) -> tuple[int, ...]:
    """The torus Cloud TPU gives an accelerator type of `chips` chips (powers of two)."""
    if generation.tpu.dims == 2:  # v5e, v6e: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16
        a = 2 ** (int(math.log2(chips)) // 2)
        return (a, chips // a)
    if chips == 1:
        return (1, 1, 1)
    if chips == 2:
        return (1, 1, 2)
    if chips == 4:
        return (2, 2, 1)
    # v4, v5p: 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ...: the smallest axis doubles, the last first.
    shape = [2, 2, 2]
    while math.prod(shape) < chips:
        smallest = min(shape)
        last = max(i for i, s in enumerate(shape) if s == smallest)
        shape[last] *= 2
    return tuple(shape)


def parse(name: str) -> TpuTarget:
    """`v5p-128`, `v4-8`, `v5litepod-16`, `v6e-64`, or a raw topology such as `v5p:4x4x4`.

    Raises UserError naming what was not understood and the accepted forms.
    """
    text = name.strip().lower()
    raw = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+){1,2})", text)
    if raw:
        gen = _generation(raw.group(1), name)
        shape = tuple(int(s) for s in raw.group(2).split("x"))
        if len(shape) != gen.tpu.dims or min(shape) < 1:
            raise UserError(
                f"--topology {name}: {gen.name} topologies have {gen.tpu.dims} axes "
                f"(e.g. {gen.name}:{'x'.join(['2'] * gen.tpu.dims)})"
            )
        return TpuTarget(name, gen, shape)
    typed = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
    if not typed:
        raise UserError(
            f"--topology {name}: expected a Cloud TPU accelerator type (v4-8, v5p-128, "
            "v5litepod-16, v6e-64) or a topology (v5p:2x2x2, v5e:4x4)"
        )
    gen = _generation(typed.group(1), name)
    count = int(typed.group(2))
    per_chip = gen.tpu.cores_per_chip_in_name
    chips, rest = divmod(count, per_chip)
    if rest or chips < 1 or chips & (chips - 1):
        counted = "TensorCores (2 per chip)" if per_chip == 2 else "chips"
        raise UserError(
            f"--topology {name}: {gen.tpu.cloud_prefix}N counts {counted}; N={count} is not a "
            f"standard slice (a power of two{' times 2' if per_chip == 2 else ''}); give a raw "
            f"topology such as {gen.name}:{'x'.join(['2'] * gen.tpu.dims)} for other shapes"
        )
    return TpuTarget(name, gen, _default_shape(gen, chips))


def _generation(text: str, name: str) -> hardware.Chip:
    chip = hardware.tpu_generation(text)
    if chip is None:
        known = hardware.tpu_generations().values()
        raise UserError(
            f"--topology {name}: unknown TPU generation {text!r}; known: "
            f"{', '.join(g.name + ' (' + g.tpu.cloud_prefix + 'N)' for g in known)}"
        )
    return chip


def quiet_runtime_without_chips() -> None:
    """On a host with libtpu but no TPU chip and no GPU plugin, runs JAX on the CPU without
    asking libtpu for chips (it would look for the TPU metadata server and print warnings in
    every process); lets several processes load libtpu (its lock file in /tmp would refuse a
    second one). Changes nothing on a TPU VM, nor where libtpu is not installed, nor where
    JAX_PLATFORMS is set."""
    if importlib.util.find_spec("libtpu") is None or has_local_tpu_chips():
        return
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if "JAX_PLATFORMS" not in os.environ and not _other_plugins():
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ[_PLATFORMS_SET] = "cpu"


_PLATFORMS_SET = "BERT_JAX_SET_JAX_PLATFORMS"  # JAX_PLATFORMS was bert-jax's choice, not yours


def quiet_library_runtime() -> None:
    """`quiet_runtime_without_chips` for the Python API (`fill_mask`, `encode_texts`,
    `load_model_dir`), called before they first touch a device. The CLI applies the rule before
    JAX is imported; a program may have imported JAX already, which read JAX_PLATFORMS then, so
    the platform is also set in JAX's config while its backends have not started (libtpu would
    otherwise print `E0000 ... unexpected worker hostname` and more on a host without a chip).
    Once they have started, nothing changes: the program asked JAX for devices first."""
    quiet_runtime_without_chips()
    if os.environ.get(_PLATFORMS_SET) != "cpu" or os.environ.get("JAX_PLATFORMS") != "cpu":
        return
    jax = sys.modules.get("jax")
    if jax is None:  # JAX reads the environment when it is imported
        return
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized() and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")


def compile_environment() -> dict[str, str | None]:
    """What a process that only compiles for TPU topologies changes in its environment
    (None: removed): the JAX_PLATFORMS=cpu that `quiet_runtime_without_chips` set. With it, XLA's
    TPU compiler crashed (SIGSEGV in a compiler thread) on BERT-Large at seq 512 with remat for
    a v4-8 in 5 of 5 runs here; without it, the same compile succeeded in 5 of 6."""
    if os.environ.get(_PLATFORMS_SET) and os.environ.get("JAX_PLATFORMS") == "cpu":
        return {"JAX_PLATFORMS": None, _PLATFORMS_SET: None}
    return {}


def _other_plugins() -> bool:
    """Whether a PJRT plugin besides libtpu (CUDA, ROCm, ...) is installed."""
    from importlib.metadata import entry_points

    return bool(list(entry_points(group="jax_plugins"))) or (
        importlib.util.find_spec("jax_plugins") is not None
    )


@contextlib.contextmanager
def _no_chip_environment() -> Iterator[None]:
    """What libtpu must read when it loads on a host without chips to describe a slice quietly;
    restored after (these names would make `distributed` take the host for a TPU VM)."""
    saved = dict(os.environ)
    if not has_local_tpu_chips():
        for key, value in (
            ("TPU_SKIP_MDS_QUERY", "1"),
            ("TPU_ACCELERATOR_TYPE", "v5litepod-4"),
            ("TPU_WORKER_HOSTNAMES", "localhost"),
            ("TPU_WORKER_ID", "0"),
            ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
        ):
            os.environ.setdefault(key, value)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def has_local_tpu_chips() -> bool:
    """Whether this host has TPU chips attached (as the TPU VM images expose them)."""
    return os.path.exists("/dev/accel0") or bool(glob.glob("/dev/vfio/[0-9]*"))


@functools.cache
def _topology_devices(topology: str, chip_config_name: str | None) -> tuple:
    try:
        import libtpu  # noqa: F401 (only to tell a missing install from other failures)
    except ImportError:
        raise UserError(
            "compiling for a TPU topology needs libtpu: pip install -e '.[tpu]' in a bert-jax "
            "checkout (or pip install 'jax[tpu]==<your jax version>')"
        ) from None
    from jax.experimental import topologies

    options = {"chip_config_name": chip_config_name} if chip_config_name else {}
    with _no_chip_environment():
        description = topologies.get_topology_desc(topology, platform="tpu", **options)
    return tuple(description.devices)


def hosts(devices) -> int:
    """Processes (TPU VM hosts) the slice spans."""
    return len({d.process_index for d in devices})


def mesh_error(target: TpuTarget, mesh_shape, err: Exception) -> UserError:
    """The one line for a mesh XLA cannot lay over the torus."""
    return UserError(
        f"config.mesh.shape={tuple(mesh_shape)} cannot be laid over {target.topology} (torus "
        f"axes {'x'.join(map(str, target.shape))}): each mesh axis must be a product of whole "
        f"torus axes, e.g. ({target.chips}, 1, 1) ({err})"
    )
