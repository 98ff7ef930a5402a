"""Ahead-of-time compile check: will the train step fit, on this mesh, for every phase, and what
does XLA's cost model expect of it?

`check(config)` lowers and compiles the real jitted train step for each phase's global batch
shape on the configured mesh, from shapes alone (`trainer.abstract_state()` and
`jax.ShapeDtypeStruct` batches carrying their shardings): no state is initialized, no data is
read. Without a target it compiles for the devices at hand (on a pod, every host after
`jax.distributed.initialize`, so a job that cannot fit fails in seconds). With a
`topology.TpuTarget` it compiles for that TPU slice on whatever machine it runs: XLA's TPU
compiler lays the configured mesh over the slice's chips (every host's), and its memory and cost
analyses describe the TPU program. `bert-jax pretrain --compile-only [--topology v5p-128]` is the
command; `bert_jax/planning/plan.py` searches batch sizes and meshes with it.

Per phase it reports memory per device (arguments, outputs, temporaries, peak) against the
device's memory, and for TPU targets the cost model's step time and from it tokens/s, model
TFLOP/s per chip, MFU (every position counted as real), the bytes its collectives move, and the
compile time. Step times are estimates of XLA's cost model (see `cost_model.py` for how they are
read), not measurements: the compile proves that the program fits and is valid for that chip,
not how fast it runs.

For TPU targets every compile's figures are cached on disk (`compile_cache.py`; `caches.cache_root`:
$BERT_JAX_CACHE_DIR, else ~/.cache/bert_jax) under a hash of the lowered program, its compiler
options, the topology and the jax and libtpu versions (`program_key`): lowering takes seconds
where compiling takes minutes, so a second check or `plan` of the same program reads the figures
back, and `plan` tells two settings that lower to the same program apart from two that do not.

The report's records and their printed form are in `compile_report.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Iterator

import flax.linen as nn
import jax
import ml_collections
import optax

from bert_jax.core import optim, partitioning
from bert_jax.core.trainer import ShardedTrainer, dummy_batch
from bert_jax.planning import compile_cache, cost_model
from bert_jax.planning.compile_cache import (  # noqa: F401  (part of this module's API)
    CompiledFigures,
    program_key,
)
from bert_jax.planning.compile_report import (  # noqa: F401  (part of this module's API)
    GIB,
    CompileReport,
    PhaseCompile,
    format_report,
)
from bert_jax.runtime import hardware, host_memory
from bert_jax.runtime.errors import UserError
from bert_jax.runtime.topology import (
    TpuTarget,
    compile_environment,
    has_local_tpu_chips,
    mesh_error,
)
from bert_jax.training import config_checks, config_lib, flops


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


def _check_batches(config, phases, mesh) -> None:
    accum = int(config.grad_accum_steps)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    for phase in phases:
        partitioning.check_batch_divisible(
            phase.batch_size, mesh, f"config.{phase.name}.batch_size"
        )
        if accum < 1 or phase.batch_size % (accum * dp):
            raise UserError(
                f"config.{phase.name}.batch_size={phase.batch_size} must be divisible by "
                f"config.grad_accum_steps={accum} x data-parallel size {dp}"
            )


def _mesh(config, target: TpuTarget | None):
    if target is None:
        return partitioning.make_mesh(config.mesh.shape)
    devices = target.devices()
    try:
        return partitioning.make_mesh(config.mesh.shape, devices)
    except NotImplementedError as err:  # the mesh cannot be laid over the torus
        raise mesh_error(target, config.mesh.shape, err) from None


@contextlib.contextmanager
def _no_persistent_cache(off: bool) -> Iterator[None]:
    """Compile-only TPU devices have no runtime client: JAX's persistent compilation cache (if
    the user set one) would store their programs and then fail to read them back."""
    if not off:
        yield
        return
    from jax.experimental.compilation_cache import compilation_cache

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once per process whether it uses the cache
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


def _compile(jitted, mesh, rules, *args, what: str):
    compile_only = mesh.devices.flat[0].platform != jax.default_backend()
    try:
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules), _no_persistent_cache(compile_only):
            lowered = jitted.lower(*args)
            return lowered.compile()
    except Exception as err:  # XLA reports OOM at compile time on TPU/GPU
        _raise_if_out_of_memory(err, what)
        raise


def _raise_if_out_of_memory(err: Exception, what: str) -> None:
    if "RESOURCE_EXHAUSTED" in str(err) or "out of memory" in str(err).lower():
        raise DoesNotFitError(f"{what} does not fit: {_oom_line(str(err))}") from err


def _cache_read(key: str) -> CompiledFigures | None:
    path = compile_cache.cache_path(key)
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        figures = CompiledFigures(
            key,
            cost_model.Memory(**entry["memory"]),
            cost_model.ProgramCost(**entry["cost"]),
            float(entry["compile_seconds"]),
            cached=True,
        ) if "memory" in entry else None  # fmt: skip
        limit = int(entry.get("host_memory_limit", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # unreadable, older
        return None
    if "does_not_fit" in entry:
        raise DoesNotFitError(entry["does_not_fit"])
    # Too large for a host's memory: held against a limit no larger, compiled again on more.
    if limit and _host_limit is not None and _host_limit <= limit:
        raise host_memory.HostMemoryError(f"{entry['host_memory']} (found in the compile cache)")
    return figures


# In a watched child (`check(watched=True)`): told (program key, what) as each compile starts
# (and ("", ...) as it ends), and the host-memory limit a cached "too large for this host"
# verdict is held against.
_compiling: Callable[[str, str], None] = lambda key, what: None
_host_limit: int | None = None


def _check_in_child(note, config, target, device_memory_bytes, limit):
    global _compiling, _host_limit
    _compiling, _host_limit = note, limit
    return check(config, target, device_memory_bytes=device_memory_bytes)


def _check_watched(config, target: TpuTarget, device_memory_bytes) -> CompileReport:
    limit = host_memory.limit_bytes()
    compiling = [("", f"the compile check for {target.describe()}")]
    try:
        return host_memory.run_watched(
            _check_in_child, config, target, device_memory_bytes, limit,
            what=lambda: compiling[-1][1], on_note=lambda *note: compiling.append(note),
            limit=limit, environment=compile_environment(),
        )  # fmt: skip
    except host_memory.HostMemoryError as err:
        key = compiling[-1][0]
        if key and limit is not None:
            compile_cache.cache_write(key, {"host_memory_limit": limit, "host_memory": str(err)})
        raise


def _compile_for_target(jitted, mesh, rules, *args, what: str, target: TpuTarget, options):
    """Lowers for `target`'s compile-only devices and compiles, or reads the figures of the same
    program from the cache; a program that does not fit is cached as such too."""
    start = time.perf_counter()
    try:
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules), _no_persistent_cache(True):
            lowered = jitted.lower(*args)
            key = program_key(lowered.as_text(), options, target)
            found = _cache_read(key)
            if found is not None:
                return found
            _compiling(key, f"compiling {what} for {target.describe()}")
            compiled = lowered.compile()
            _compiling("", f"the compile check for {target.describe()}")
    except DoesNotFitError:
        raise
    except Exception as err:
        try:
            _raise_if_out_of_memory(err, what)
        except DoesNotFitError as no_fit:
            if "key" in locals():
                compile_cache.cache_write(key, {"does_not_fit": str(no_fit)})
            raise
        raise
    figures = CompiledFigures(
        key,
        cost_model.read_memory(compiled),
        cost_model.read_cost(compiled),
        time.perf_counter() - start,
    )
    compile_cache.cache_write(
        key,
        {
            "memory": dataclasses.asdict(figures.memory),
            "cost": dataclasses.asdict(figures.cost),
            "compile_seconds": figures.compile_seconds,
        },
    )
    return figures


def _oom_line(message: str) -> str:
    """XLA's statement of the shortfall (e.g. "Used 55.75G of 15.75G hbm. Exceeded hbm capacity
    by 40.00G."), else its first line."""
    used = re.search(
        r"Used [\d.]+\w? of [\d.]+\w? \w+\.(?: Exceeded \w+ capacity by [\d.]+\w?\.)?", message
    )
    if used:
        return used.group(0)
    return message.strip().splitlines()[0][:300]


def _update_cost(
    trainer: ShardedTrainer, state, mesh, rules, target: TpuTarget | None
) -> cost_model.ProgramCost:
    """The optimizer update alone (params, slots and gradients as the step shards them)."""

    def apply(params, opt_state, grads):
        updates, opt_state = trainer.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    shardings = trainer.state_shardings
    # the gradients in the layout the step applies them in (ZeRO 1: the slots')
    applied = trainer.grad_shardings[1] if trainer.grad_shardings else shardings.params
    jitted = jax.jit(
        apply,
        in_shardings=(shardings.params, shardings.opt_state, applied),
        out_shardings=(shardings.params, shardings.opt_state),
        donate_argnums=(0, 1),
        compiler_options=trainer.compiler_options,
    )
    grads = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state.params, applied
    )
    args = (state.params, state.opt_state, grads)
    what = "the optimizer update"
    if target is not None:
        options = trainer.compiler_options
        return _compile_for_target(
            jitted, mesh, rules, *args, what=what, target=target, options=options
        ).cost
    return cost_model.read_cost(_compile(jitted, mesh, rules, *args, what=what))


def check(
    config: ml_collections.ConfigDict,
    target: TpuTarget | None = None,
    *,
    device_memory_bytes: int | None = None,
    watched: bool = False,
) -> CompileReport:
    """Compiles the train step of every phase from shapes only; see the module docstring.

    Raises UserError for shapes that do not divide the mesh (naming the setting) and for a mesh
    that cannot be laid over `target`'s torus, and DoesNotFitError when XLA itself runs
    out of device memory while compiling. `watched`: for a TPU target on a host without chips,
    the check runs in a child process stopped at the host's memory limit (`host_memory`), with
    HostMemoryError naming the program; the program is remembered in the compile cache as too
    large for that limit.
    """
    if watched and target is not None and not has_local_tpu_chips():
        return _check_watched(config, target, device_memory_bytes)
    phases = config_lib.split_phases(config)
    config_checks.check_values(config, phases)
    mesh = _mesh(config, target)
    rules = partitioning.rules_from_config(config.mesh.rules)
    _check_batches(config, phases, mesh)
    tx, schedule = optim.from_config(
        config.optimizer, [p.steps for p in phases], [config[p.name] for p in phases]
    )
    model_config = config_lib.bert_config(config)
    accum = int(config.grad_accum_steps)
    trainer = ShardedTrainer(
        model_config, tx, mesh, rules, schedule=schedule, accum_steps=accum,
        **partitioning.mesh_options(config.mesh),
    )  # fmt: skip
    state = trainer.abstract_state()
    rng = jax.eval_shape(lambda: jax.random.key(0))
    rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=partitioning.replicated(mesh))
    if device_memory_bytes is not None:
        memory, source = int(device_memory_bytes), "given"
    elif target is not None:
        memory, source = target.hbm_bytes, f"{target.generation.name} HBM"
    else:
        memory, source = device_memory()

    results, update = [], None
    for phase in phases:
        shapes = jax.eval_shape(
            lambda p=phase: dummy_batch(p.batch_size, p.max_seq_length, p.max_predictions_per_seq)
        )
        batch = {
            key: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=trainer.batch_sharding)
            for key, value in shapes.items()
        }
        start = time.perf_counter()
        what = f"config.{phase.name} (global batch {phase.batch_size}, seq {phase.max_seq_length})"
        # The very jitted step training runs (same shardings, donation, rules).
        step, args = trainer._train_step, (state, batch, rng)  # noqa: SLF001
        if target is not None:
            figures = _compile_for_target(
                step, mesh, rules, *args, what=what, target=target,
                options=trainer.compiler_options,
            )  # fmt: skip
        else:
            compiled = _compile(step, mesh, rules, *args, what=what)
            figures = CompiledFigures(
                "", cost_model.read_memory(compiled), cost_model.read_cost(compiled), 0.0
            )
        cost = figures.cost
        if cost.raw_seconds != 0.0 and update is None:  # a cost model: price the update alone
            update = _update_cost(trainer, state, mesh, rules, target)
        share = flops.head_share(model_config, phase.max_seq_length, phase.max_predictions_per_seq)
        per_token = flops.flops_per_token(model_config, phase.max_seq_length, share)
        results.append(
            PhaseCompile(
                phase=phase.name,
                batch_size=phase.batch_size,
                max_seq_length=phase.max_seq_length,
                max_predictions_per_seq=phase.max_predictions_per_seq,
                accum_steps=accum,
                memory=figures.memory,
                cost=cost,
                update=update,
                model_flops=per_token * phase.batch_size * phase.max_seq_length,
                compile_seconds=time.perf_counter() - start,
                program_key=figures.key,
                cached=figures.cached,
            )
        )
    devices = list(mesh.devices.flat)
    return CompileReport(
        mesh=dict(mesh.shape),
        platform=devices[0].platform,
        device_kind=devices[0].device_kind,
        num_devices=len(devices),
        hosts=len({d.process_index for d in devices}),
        device_memory_bytes=memory,
        memory_source=source,
        phases=results,
        target=target,
        peak_flops=target.peak_flops if target else hardware.peak_flops(devices[0].device_kind),
    )


def main(
    config: ml_collections.ConfigDict,
    device_memory_gib: float | None = None,
    target: TpuTarget | None = None,
) -> int:
    """`bert-jax pretrain --compile-only`: prints the report on process 0; exit status 0 when it
    fits or the device memory is unknown, 4 when it does not fit."""
    memory = None if device_memory_gib is None else int(device_memory_gib * GIB)
    show = print if jax.process_index() == 0 else (lambda *a, **k: None)
    try:
        report = check(config, target=target, device_memory_bytes=memory, watched=True)
    except DoesNotFitError as err:
        on = f" on {target.describe()}" if target is not None else ""
        show(f"compile check: DOES NOT FIT{on}: {err}")
        return 4
    show(format_report(report))
    return 4 if report.fits is False else 0
