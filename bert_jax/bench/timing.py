"""`run`: our step beside the peers (or ours unpacked), windows alternating, into a report."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any

from bert_jax.bench.data import make_data
from bert_jax.bench.ours import OursRunner
from bert_jax.bench.peer import PeerRunner
from bert_jax.bench.report import BenchReport, SideResult, Window
from bert_jax.bench.spec import (
    BenchSpec,
    hardware_flops_per_position,
    is_modernbert,
    model_flops_per_token,
    peak_flops,
    peer_sides,
)
from bert_jax.runtime.errors import UserError
from bert_jax.training import flops


def check_torch_peer(spec: BenchSpec) -> None:
    """What the PyTorch peer's step cannot reproduce, as a user error before any slow work."""
    if not spec.optimizer.bias_correction:
        raise UserError(
            "--peer hf-torch: torch's AdamW always corrects the moments' bias; "
            "config.optimizer.bias_correction=False has no counterpart there"
        )
    if is_modernbert(spec):
        return  # ModernBertForMaskedLM: masked LM alone, as ours
    if spec.model.objective != "mlm+nsp":
        raise UserError(
            f"--peer hf-torch times BertForPreTraining (MLM + NSP); config.model.objective="
            f"{spec.model.objective!r}"
        )


def _torch_weights(params: Any, spec: BenchSpec, directory: str) -> str:
    """Our initial parameters as a Hugging Face state dict in DIRECTORY/weights.npz."""
    import jax
    import numpy as np

    from bert_jax.convert import modernbert_names
    from bert_jax.convert.hf import hf_state_dict_from

    state_dict_from = (
        modernbert_names.state_dict_from if is_modernbert(spec) else hf_state_dict_from
    )
    path = os.path.join(directory, "weights.npz")
    np.savez(path, **state_dict_from(jax.device_get(params), spec.model))
    return path


def run(
    spec: BenchSpec,
    peer: str | None = None,
    peer_python: str | None = None,
    log=print,
    compare_unpacked: bool = False,
) -> BenchReport:
    """Compiles, warms up and times our step and, alternating windows with it, the peers' (`peer`:
    one of `spec.PEERS`, or several separated by commas) or (`compare_unpacked`, with packing)
    ours on the same instances one per row. `peer_python` is the Flax peer's Python; the PyTorch
    peer runs in this one, from our initial parameters."""
    peers = peer_sides(peer)
    if compare_unpacked and (peers or not spec.packing):
        raise UserError(
            "compare_unpacked compares packing with ours unpacked: needs packing, no peer"
        )
    torch_sides = [side for side in peers if side.startswith("hf-torch")]
    if peers:
        # Two processes share the accelerator: neither may take most of its memory up front
        # (JAX preallocates 75% of a GPU's memory when its backend starts, unless told not to).
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if "hf-flax" in peers and is_modernbert(spec):
            raise UserError(
                "--peer hf-flax: transformers has no Flax ModernBERT; time ModernBERT beside "
                "--peer hf-torch"
            )
        if "hf-flax" in peers:
            peer_python = PeerRunner.check(peer_python)  # before any slow work
        if torch_sides:
            check_torch_peer(spec)
        if not spec.num_devices:
            spec = dataclasses.replace(spec, num_devices=1)  # the peers run on one chip
    data = make_data(spec)
    log(f"data: {data.description}")
    # Each side reads one batch per step, in order: batches past the last step would only be
    # placed on the devices (or sent to the peer) and never read.
    used = max(spec.warmup_steps, 1) + spec.windows * spec.steps
    batches, peer_batches = data.batches[:used], data.peer_batches[:used]
    runners: list[Any] = []
    work = tempfile.mkdtemp(prefix="bert_jax_bench_")

    def start_torch_peers(params: Any) -> None:
        # Started as soon as our initial parameters exist: they load while our side compiles.
        weights = _torch_weights(params, spec, work)
        for side in torch_sides:
            mode = side.rsplit("-", 1)[1]
            runners.append(
                PeerRunner(
                    spec,
                    peer_batches,
                    None,
                    name=side,
                    module="bert_jax.bench.peer_torch",
                    args=("--mode", mode),
                    files={"weights": weights},
                )  # fmt: skip
            )

    try:
        if "hf-flax" in peers:
            # Started first: it loads while our side compiles (and fails fast when missing).
            runners.append(PeerRunner(spec, peer_batches, peer_python))
        ours = OursRunner(spec, batches, on_init=start_torch_peers if torch_sides else None)
        runners.insert(0, ours)
        if compare_unpacked:
            runners.append(OursRunner(spec, peer_batches, name="bert-jax unpacked"))
        for runner in runners:
            if isinstance(runner, PeerRunner):
                runner.wait_ready()
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
            initial_weights, versions = "", {}
            if isinstance(runner, OursRunner):
                device_kind = runner.devices[0].device_kind
                num_devices = len(runner.devices)
                hardware = hardware_flops_per_position(spec)
            else:
                device_kind, num_devices = runner.device_kind, runner.num_devices
                versions = runner.versions
                if runner.name in torch_sides:
                    # The MLM head on the gathered slots, the last layer at every position.
                    share = spec.max_predictions / spec.seq_len
                    hardware = flops.flops_per_token(spec.model, spec.seq_len, share)
                    initial_weights = "ours"
                else:
                    # The Flax peer's MLM head runs on every position.
                    hardware = flops.flops_per_token(spec.model, spec.seq_len, 1.0)
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
                    initial_weights=initial_weights,
                    versions=versions,
                )
            )
    finally:
        for runner in runners:
            runner.close()
        shutil.rmtree(work, ignore_errors=True)
    return BenchReport(spec, data.description, sides)
