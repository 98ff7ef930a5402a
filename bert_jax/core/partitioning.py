"""Device mesh, logical-axis rules, the shardings they give a state, and global batch assembly.

Model code names logical axes only; the rules here (or in a config's `mesh.rules`) place them on the
mesh `('data', 'fsdp', 'tensor')`. Rules are tried in order and a mesh axis is used at most once per
array, so activations `('batch', 'length', 'embed')` shard the batch over `data` and `fsdp` while
parameters `('vocab', 'embed')` shard `embed` over `fsdp`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.runtime.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

LogicalRules = tuple[tuple[str, Any], ...]

DEFAULT_RULES: LogicalRules = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("embed", "fsdp"),
    ("kv", None),
    ("length", None),
)


def optimizer_state_rules(rules: LogicalRules) -> LogicalRules:
    """Rules for optimizer slots sharded over the data axis too (ZeRO stage 1): `embed`, which
    every kernel and table has, goes to ('data', <its axes>). Each data-parallel replica then
    updates only its slice of every parameter; the parameters themselves stay as `rules` put
    them, and XLA gathers the updated slices."""
    changed = []
    for logical, axes in rules:
        if logical == "embed":
            rest = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            axes = ("data", *(a for a in rest if a != "data"))
        changed.append((logical, axes))
    return tuple(changed)


def mesh_options(mesh_config: Any) -> dict[str, bool]:
    """The settings of a config's `mesh` that `trainer.ShardedTrainer` takes besides the mesh and
    the rules (`rules_from_config`)."""
    return {
        "shard_optimizer_state": bool(mesh_config.get("shard_optimizer_state", False)),
        "windowed_einsum": bool(mesh_config.get("windowed_einsum", True)),
    }


def rules_from_config(rules: Sequence[Sequence[Any]] | None) -> LogicalRules:
    """Normalizes rules written in a config (lists from the command line) to tuples."""
    if not rules:
        return DEFAULT_RULES
    out = []
    for logical, mesh_axes in rules:
        if isinstance(mesh_axes, list):
            mesh_axes = tuple(mesh_axes)
        out.append((str(logical), mesh_axes))
    return tuple(out)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh with axes ('data', 'fsdp', 'tensor'); one entry of `shape` may be -1 (fills up).

    Raises a ValueError naming the sizes when the shape does not match the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = [int(s) for s in shape]
    if len(shape) != len(MESH_AXES):
        raise UserError(f"mesh.shape={tuple(shape)} must have 3 entries for {MESH_AXES}")
    if shape.count(-1) > 1:
        raise UserError(f"mesh.shape={tuple(shape)}: at most one entry may be -1")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known <= 0 or len(devices) % known:
            raise UserError(
                f"mesh.shape={tuple(shape)} cannot be filled from {len(devices)} devices "
                f"({len(devices)} is not a multiple of {known})"
            )
        shape[shape.index(-1)] = len(devices) // known
    if math.prod(shape) != len(devices) or min(shape) < 1:
        raise UserError(
            f"mesh.shape={tuple(shape)} ({dict(zip(MESH_AXES, shape))}) needs "
            f"{math.prod(shape)} devices, but {len(devices)} are available"
        )
    return jax.make_mesh(
        tuple(shape),
        MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
        devices=devices,
    )


def logical_specs(abstract_boxed: Any) -> Any:
    """PartitionSpecs of logical names for a tree holding `nn.Partitioned` boxes."""
    return nn.get_partition_spec(abstract_boxed)


def mesh_shardings(abstract_boxed: Any, mesh: Mesh, rules: LogicalRules) -> Any:
    """NamedShardings for every leaf of a boxed (abstract) tree, after checking divisibility."""
    check_divisible(abstract_boxed, mesh, rules)
    return nn.logical_to_mesh_sharding(logical_specs(abstract_boxed), mesh, rules)


def _mesh_axis_size(mesh: Mesh, axes: Any) -> tuple[int, tuple[str, ...]]:
    if axes is None:
        return 1, ()
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[name] for name in names), names


def check_divisible(abstract_boxed: Any, mesh: Mesh, rules: LogicalRules) -> None:
    """Raises a ValueError naming the parameter, logical axis and sizes when a shard is uneven.

    Runs on shapes only, before anything is compiled or allocated.
    """
    is_box = lambda x: isinstance(x, nn.Partitioned)  # noqa: E731
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_boxed, is_leaf=is_box)[0]:
        if not isinstance(leaf, nn.Partitioned):
            continue
        shape = leaf.value.shape
        spec = nn.logical_to_mesh_axes(leaf.names, rules)
        for dim, (logical, mesh_axes) in enumerate(zip(leaf.names, spec)):
            size, names = _mesh_axis_size(mesh, mesh_axes)
            if shape[dim] % size:
                hint = "change mesh.shape or the rules"
                if logical == "vocab":
                    multiple = math.lcm(128, size)
                    hint += f", or pad the vocabulary: model.vocab_pad_multiple={multiple}"
                raise UserError(
                    f"parameter {jax.tree_util.keystr(path)} dimension {dim} (logical axis "
                    f"'{logical}', size {shape[dim]}) does not divide over mesh axes {names} of "
                    f"total size {size} (mesh {dict(mesh.shape)}); {hint}"
                )


def check_batch_divisible(global_batch_size: int, mesh: Mesh, setting: str = "batch_size") -> None:
    size = math.prod(mesh.shape[a] for a in BATCH_AXES)
    if global_batch_size % size:
        raise UserError(
            f"{setting}={global_batch_size} is not divisible by the data-parallel size {size} "
            f"(mesh axes data x fsdp = {mesh.shape['data']} x {mesh.shape['fsdp']})"
        )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension split over ('data', 'fsdp'); the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


# XLA:TPU's size above which the SPMD partitioner splits a matmul whose operand must be
# gathered (or whose result reduce-scattered) into a loop of partial matmuls and permutes
# (windowed einsum, "collective matmul"); this threshold turns that off.
_NO_WINDOWED_EINSUM = {"xla_jf_spmd_threshold_for_windowed_einsum_mib": 1_000_000}


def compiler_options(mesh: Mesh, windowed_einsum: bool = True) -> dict[str, Any] | None:
    """XLA options for steps on `mesh` (`mesh.windowed_einsum`): None keeps XLA's defaults;
    other backends have no such option and always get None."""
    if windowed_einsum or mesh.devices.flat[0].platform != "tpu":
        return None
    return dict(_NO_WINDOWED_EINSUM)


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Turns this host's part of the batch into global arrays sharded over the batch axes.

    Every host passes its own rows (`global_batch_size / process_count` of them); the result is one
    jax.Array per key with the global batch size as its leading dimension.
    """
    sharding = batch_sharding(mesh)
    return {
        key: jax.make_array_from_process_local_data(sharding, np.asarray(value))
        for key, value in local_batch.items()
    }
