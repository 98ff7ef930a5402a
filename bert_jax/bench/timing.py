"""`run`: our step beside the peer (or ours unpacked), windows alternating, into a report."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from bert_jax.bench.data import make_data
from bert_jax.bench.ours import OursRunner
from bert_jax.bench.peer import PeerRunner
from bert_jax.bench.report import BenchReport, SideResult, Window
from bert_jax.bench.spec import (
    PEERS,
    BenchSpec,
    hardware_flops_per_position,
    model_flops_per_token,
    peak_flops,
)
from bert_jax.runtime.errors import UserError
from bert_jax.training import metrics


def run(
    spec: BenchSpec,
    peer: str | None = None,
    peer_python: str | None = None,
    log=print,
    compare_unpacked: bool = False,
) -> BenchReport:
    """Compiles, warms up and times our step and, alternating windows with it, the peer's or
    (`compare_unpacked`, with packing) ours on the same instances one per row."""
    if peer is not None and peer not in PEERS:
        raise UserError(f"unknown peer {peer!r}; choose one of {PEERS}")
    if compare_unpacked and (peer is not None or not spec.packing):
        raise UserError(
            "compare_unpacked compares packing with ours unpacked: needs packing, no peer"
        )
    if peer is not None:
        # Two processes share the accelerator: neither may take most of its memory up front
        # (JAX preallocates 75% of a GPU's memory when its backend starts, unless told not to).
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        peer_python = PeerRunner.check(peer_python)  # before any slow work
        if not spec.num_devices:
            spec = dataclasses.replace(spec, num_devices=1)  # the peer runs on one chip
    data = make_data(spec)
    log(f"data: {data.description}")
    # Each side reads one batch per step, in order: batches past the last step would only be
    # placed on the devices (or sent to the peer) and never read.
    used = max(spec.warmup_steps, 1) + spec.windows * spec.steps
    batches, peer_batches = data.batches[:used], data.peer_batches[:used]
    runners: list[Any] = []
    try:
        if peer is not None:
            # Started first: it loads while our side compiles (and fails fast when missing).
            runners.append(PeerRunner(spec, peer_batches, peer_python))
        runners.insert(0, OursRunner(spec, batches))
        if compare_unpacked:
            runners.append(OursRunner(spec, peer_batches, name="bert-jax unpacked"))
        for runner in runners:
            log(f"{runner.name}: compiled in {runner.compile_seconds:.1f}s")
        windows: list[list[Window]] = [[] for _ in runners]
        for w in range(spec.windows):
            order = range(len(runners)) if w % 2 == 0 else reversed(range(len(runners)))
            for i in order:
                windows[i].append(runners[i].window(spec.steps))
            log(
                f"window {w + 1}/{spec.windows}: "
                + ", ".join(
                    f"{r.name} {windows[i][-1].seconds / spec.steps * 1e3:.1f} ms/step"
                    for i, r in enumerate(runners)
                )
            )
        sides = []
        for i, runner in enumerate(runners):
            finish = runner.finish()
            if isinstance(runner, OursRunner):
                device_kind = runner.devices[0].device_kind
                num_devices = len(runner.devices)
                hardware = hardware_flops_per_position(spec)
            else:
                device_kind, num_devices = runner.device_kind, runner.num_devices
                # The peer's MLM head runs on every position.
                hardware = metrics.flops_per_token(spec.model, spec.seq_len, 1.0)
            sides.append(
                SideResult(
                    name=runner.name,
                    compile_seconds=runner.compile_seconds,
                    windows=windows[i],
                    num_devices=num_devices,
                    device_kind=device_kind,
                    model_flops_per_real_token=model_flops_per_token(spec),
                    hardware_flops_per_position=hardware,
                    peak_flops_per_chip=peak_flops(spec, device_kind),
                    peak_memory_bytes=finish.get("peak_memory_bytes"),
                    warmup_loss=runner.warmup_loss,
                )
            )
    finally:
        for runner in runners:
            runner.close()
    return BenchReport(spec, data.description, sides)
