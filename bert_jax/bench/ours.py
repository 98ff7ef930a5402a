"""Our side of the benchmark: the sharded pretraining step, compiled ahead of time, timed."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bert_jax.bench.data import batch_counts
from bert_jax.bench.report import Window
from bert_jax.bench.spec import BenchSpec
from bert_jax.runtime.errors import UserError


def _peak_memory(devices) -> int | None:
    peaks = []
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:  # noqa: BLE001 (backends without memory stats raise various errors)
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None


def rng_key(seed: int, impl: str):
    import jax

    return jax.random.key(seed, impl=impl or None)


class OursRunner:
    """Our sharded train step, compiled ahead of time, run on preloaded global batches."""

    def __init__(
        self,
        spec: BenchSpec,
        batches: Sequence[dict[str, np.ndarray]],
        name: str = "bert-jax",
        on_init: Callable[[Any], None] | None = None,
    ):
        """`on_init(params)` is called with the initial parameters, before compiling."""
        self.name = name
        import flax.linen as nn
        import jax

        from bert_jax.core import optim, partitioning
        from bert_jax.core.trainer import ShardedTrainer

        self.spec = spec
        devices = jax.devices()
        if spec.num_devices:
            if spec.num_devices > len(devices):
                raise UserError(f"{spec.num_devices} devices asked, {len(devices)} present")
            devices = devices[: spec.num_devices]
        self.devices = devices
        mesh = partitioning.make_mesh(spec.mesh_shape, devices=devices)
        rules = partitioning.rules_from_config(spec.rules)
        opt = spec.optimizer
        schedule = optim.warmup_decay(opt.learning_rate, opt.warmup_steps, max(opt.total_steps, 1))
        tx = optim.bert_adamw(
            schedule,
            b1=opt.b1,
            b2=opt.b2,
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            clip_norm=opt.clip_norm or None,
            bias_correction=opt.bias_correction,
        )
        trainer = ShardedTrainer(
            spec.model, tx, mesh, rules, schedule=schedule,
            shard_optimizer_state=spec.shard_optimizer_state,
            windowed_einsum=spec.windowed_einsum,
        )  # fmt: skip
        self.state = trainer.init(rng_key(spec.seed, ""))
        if on_init is not None:
            on_init(self.state.params)
        self.rng = rng_key(spec.seed + 1, spec.rng_impl)
        self.batches = [trainer.global_batch(b) for b in batches]
        self.counts = [batch_counts(b) for b in batches]
        start = time.perf_counter()
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            lowered = trainer._train_step.lower(self.state, self.batches[0], self.rng)  # noqa: SLF001
        self.step = lowered.compile()
        self.compile_seconds = time.perf_counter() - start
        self.warmup_loss = None
        self._next = 0
        self.warm_up(spec.warmup_steps)

    def _run(self, steps: int) -> tuple[int, int, int, Any]:
        real = padded = instances = 0
        step_metrics = None
        for _ in range(steps):
            index = self._next % len(self.batches)
            self._next += 1
            self.state, step_metrics = self.step(self.state, self.batches[index], self.rng)
            r, p, n = self.counts[index]
            real, padded, instances = real + r, padded + p, instances + n
        return real, padded, instances, step_metrics

    def warm_up(self, steps: int) -> None:
        """`steps` untimed steps (at least one); `warmup_loss` is the first step's loss."""
        import jax

        _, _, _, step_metrics = self._run(1)
        if self.warmup_loss is None:
            self.warmup_loss = float(step_metrics["loss"])  # at the initial parameters
        self._run(max(steps, 1) - 1)
        jax.block_until_ready(self.state)

    def window(self, steps: int) -> Window:
        import jax

        start, cpu = time.perf_counter(), time.process_time()
        real, padded, instances, step_metrics = self._run(steps)
        jax.block_until_ready((self.state, step_metrics))
        return Window(
            time.perf_counter() - start,
            steps,
            real,
            padded,
            instances,
            time.process_time() - cpu,
        )

    def finish(self) -> dict[str, Any]:
        return {"peak_memory_bytes": _peak_memory(self.devices)}

    def close(self) -> None:
        pass
