"""The peer of `bert-jax bench --peer hf-flax`: Hugging Face's FlaxBertForPreTraining, trained.

This file holds both ends: `main`, the peer's process, and `PeerRunner`, our side's driver of it
(and of the PyTorch peer's process, `peer_torch.py`, which speaks the same lines).
The process runs in its own environment (`make bench-peer`: transformers 4.57.6 beside this
project's jax, flax and optax versions), started by `PeerRunner` (below):

    .venv-peer/bin/python -m bert_jax.bench.peer --spec SPEC.json --batches BATCHES.npz

It builds the same model size from the spec, the step an experienced Flax user would write
(`jax.jit` with donated params and optimizer state; optax's AdamW with the same settings as ours:
b1, b2, eps, decoupled weight decay on kernels and embeddings only, global-norm clipping, the
same warmup + linear decay; MLM cross-entropy on the labeled positions plus NSP cross-entropy;
dropout on, PRNG implementation `spec.peer_rng_impl`), compiles it ahead of time and then
answers commands on stdin with JSON lines on stdout:

    -> {"event": "ready", "compile_seconds": ..., "warmup_loss": ..., "device_kind": ...}
    <- {"cmd": "window", "steps": N}   -> {"event": "window", "seconds": ..., "real_tokens": ...}
    <- {"cmd": "finish"}               -> {"event": "done", "peak_memory_bytes": ...}

`warmup_loss` is the loss of the first step, at the initial parameters; a process that cannot
start for a reason the user can fix says so in {"event": "error", "message": ...}.

Batches are ours (unpacked), turned into Hugging Face inputs: `labels` is -100 except at the
masked positions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.bench.report import Window
from bert_jax.bench.spec import BenchSpec, spec_to_json
from bert_jax.runtime.errors import UserError

PEER_VENV = ".venv-peer"


class PeerMissingError(UserError):
    """The peer's environment is not there."""


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_peer_python() -> str:
    return os.path.join(_repo_root(), PEER_VENV, "bin", "python")


class PeerRunner:
    """A peer's process (`python -m MODULE`) driven window by window over pipes.

    The process starts at construction and loads while our side compiles; `wait_ready` reads
    its "ready" line (compile time, first-step loss, device). `hf-flax` runs this file's `main` in
    the peer's own environment; `hf-torch-eager` and `hf-torch-compiled` run `peer_torch.main` in
    this project's Python.
    """

    def __init__(
        self,
        spec: BenchSpec,
        batches: Sequence[dict[str, np.ndarray]],
        python: str | None = None,
        *,
        name: str = "hf-flax",
        module: str = "bert_jax.bench.peer",
        args: Sequence[str] = (),
        files: dict[str, str] | None = None,
    ):
        self.name = name
        python = self.check(python) if module == "bert_jax.bench.peer" else python
        python = python or sys.executable
        self._dir = tempfile.mkdtemp(prefix="bert_jax_bench_peer_")
        spec_path = os.path.join(self._dir, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec_to_json(spec), f)
        batches_path = os.path.join(self._dir, "batches.npz")
        np.savez(
            batches_path,
            **{f"{i}/{k}": v for i, batch in enumerate(batches) for k, v in batch.items()},
        )
        command = [python, "-m", module, "--spec", spec_path, "--batches", batches_path, *args]
        # Other files the process reads (the torch peer's initial weights): --FLAG PATH.
        for flag, path in (files or {}).items():
            command += [f"--{flag}", path]
        root = _repo_root()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
        # Two processes share the accelerator: neither may grab most of its memory up front.
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self._stderr = open(os.path.join(self._dir, "stderr.txt"), "w+", encoding="utf-8")  # noqa: SIM115
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        self.compile_seconds = 0.0
        self.warmup_loss: float | None = None
        self.device_kind = ""
        self.num_devices = 1
        self.versions: dict[str, str] = {}

    def wait_ready(self) -> None:
        """Waits for the process to load, compile and warm up (see the module docstring)."""
        ready = self._receive("ready")
        self.compile_seconds = float(ready["compile_seconds"])
        self.warmup_loss = float(ready["warmup_loss"])
        self.device_kind = str(ready["device_kind"])
        self.versions = {k: str(ready[k]) for k in ("transformers", "torch") if k in ready}

    @staticmethod
    def check(python: str | None) -> str:
        """The Flax peer's Python, or PeerMissingError saying how to make it."""
        python = python or default_peer_python()
        if not os.path.exists(python):
            raise PeerMissingError(
                f"the hf-flax peer needs its own environment ({python} is missing): run "
                "`make bench-peer` in the repository (it makes .venv-peer with transformers "
                "4.57.6 and this venv's jax, flax and optax), or pass --peer-python"
            )
        return python

    def _receive(self, event: str) -> dict[str, Any]:
        while True:
            line = self.process.stdout.readline()
            if not line:
                self.process.wait()
                self._stderr.seek(0)
                tail = self._stderr.read()[-3000:]
                raise RuntimeError(
                    f"the {self.name} peer exited (status {self.process.returncode}) before "
                    f"'{event}':\n{tail}"
                )
            if line.startswith("{"):
                message = json.loads(line)
                if message.get("event") == "error":  # what the user can fix (a missing package)
                    raise PeerMissingError(f"{self.name}: {message['message']}")
                if message.get("event") == event:
                    return message

    def _send(self, **command: Any) -> None:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def window(self, steps: int) -> Window:
        self._send(cmd="window", steps=steps)
        message = self._receive("window")
        return Window(
            float(message["seconds"]),
            steps,
            int(message["real_tokens"]),
            int(message["padded_tokens"]),
            int(message["instances"]),
            float(message.get("cpu_seconds", 0.0)),
        )

    def finish(self) -> dict[str, Any]:
        self._send(cmd="finish")
        return self._receive("done")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stderr.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def emit(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def hf_inputs(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hugging Face's names, and `labels` [B, L] (-100 where nothing is predicted)."""
    input_ids = np.asarray(batch["input_ids"], np.int32)
    labels = np.full(input_ids.shape, -100, np.int32)
    rows, slots = np.nonzero(np.asarray(batch["masked_lm_weights"]) > 0)
    labels[rows, batch["masked_lm_positions"][rows, slots]] = batch["masked_lm_ids"][rows, slots]
    return {
        "input_ids": input_ids,
        "attention_mask": np.asarray(batch["input_mask"], np.int32),
        "token_type_ids": np.asarray(batch["segment_ids"], np.int32),
        "labels": labels,
        "next_sentence_label": np.asarray(batch["next_sentence_labels"], np.int32).reshape(-1),
    }


def load_batches(path: str) -> list[dict[str, np.ndarray]]:
    with np.load(path) as archive:
        grouped: dict[int, dict[str, np.ndarray]] = {}
        for name in archive.files:
            index, key = name.split("/", 1)
            grouped.setdefault(int(index), {})[key] = archive[name]
    return [grouped[i] for i in sorted(grouped)]


def _decay_mask(params: Any) -> Any:
    from flax import traverse_util

    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {path: path[-1] in ("kernel", "embedding") for path in flat}
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--batches", required=True)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import optax
    import transformers

    from bert_jax.bench.data import batch_counts
    from bert_jax.bench.ours import rng_key
    from bert_jax.bench.spec import spec_from_json
    from bert_jax.core import optim

    with open(args.spec, encoding="utf-8") as f:
        spec = spec_from_json(json.load(f))
    ours = spec.model
    config = transformers.BertConfig(
        vocab_size=ours.vocab_size,
        hidden_size=ours.hidden_size,
        num_hidden_layers=ours.num_hidden_layers,
        num_attention_heads=ours.num_attention_heads,
        intermediate_size=ours.intermediate_size,
        hidden_act=ours.hidden_act,
        hidden_dropout_prob=ours.hidden_dropout_prob,
        attention_probs_dropout_prob=ours.attention_probs_dropout_prob,
        max_position_embeddings=ours.max_position_embeddings,
        type_vocab_size=ours.type_vocab_size,
        initializer_range=ours.initializer_range,
        layer_norm_eps=ours.layer_norm_eps,
    )
    model = transformers.FlaxBertForPreTraining(
        config, input_shape=(1, spec.seq_len), seed=spec.seed, dtype=jnp.dtype(ours.dtype)
    )
    opt = spec.optimizer
    schedule = optim.warmup_decay(opt.learning_rate, opt.warmup_steps, opt.total_steps)
    chain = [optax.clip_by_global_norm(opt.clip_norm)] if opt.clip_norm else []
    chain.append(
        optax.adamw(
            schedule,
            b1=opt.b1,
            b2=opt.b2,
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            mask=_decay_mask,
        )
    )
    tx = optax.chain(*chain)

    def loss_fn(params, batch, dropout_rng):
        out = model(
            batch["input_ids"],
            batch["attention_mask"],
            batch["token_type_ids"],
            params=params,
            dropout_rng=dropout_rng,
            train=True,
        )
        labels = batch["labels"]
        labeled = labels >= 0
        token_loss = optax.softmax_cross_entropy_with_integer_labels(
            out.prediction_logits.astype(jnp.float32), jnp.where(labeled, labels, 0)
        )
        mlm = jnp.sum(token_loss * labeled) / jnp.maximum(jnp.sum(labeled), 1)
        nsp = optax.softmax_cross_entropy_with_integer_labels(
            out.seq_relationship_logits.astype(jnp.float32), batch["next_sentence_label"]
        ).mean()
        return mlm + nsp

    def train_step(params, opt_state, step, batch, rng):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(rng, step))
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, step + 1, loss

    device = jax.devices()[0]
    host_batches = load_batches(args.batches)
    counts = [batch_counts(b) for b in host_batches]
    batches = [jax.device_put(hf_inputs(b), device) for b in host_batches]
    params = jax.device_put(model.params, device)
    opt_state = tx.init(params)
    step = jnp.zeros((), jnp.int32)
    rng = rng_key(spec.seed + 1, spec.peer_rng_impl)

    start = time.perf_counter()
    compiled = (
        jax.jit(train_step, donate_argnums=(0, 1))
        .lower(params, opt_state, step, batches[0], rng)
        .compile()
    )
    compile_seconds = time.perf_counter() - start
    taken = 0

    def run(steps: int) -> tuple[int, int, int, Any]:
        nonlocal params, opt_state, step, taken
        real = padded = instances = 0
        loss = None
        for _ in range(steps):
            index = taken % len(batches)
            taken += 1
            params, opt_state, step, loss = compiled(params, opt_state, step, batches[index], rng)
            r, p, n = counts[index]
            real, padded, instances = real + r, padded + p, instances + n
        return real, padded, instances, loss

    _, _, _, first_loss = run(1)  # the loss at the initial parameters
    first_loss = float(first_loss)
    run(max(spec.warmup_steps, 1) - 1)
    jax.block_until_ready(params)
    emit(
        event="ready",
        compile_seconds=compile_seconds,
        warmup_loss=first_loss,
        device_kind=device.device_kind,
        transformers=transformers.__version__,
    )
    stats = lambda: (device.memory_stats() or {}).get("peak_bytes_in_use")
    serve_windows(run, lambda loss: jax.block_until_ready((params, loss)), stats)
    return 0


def serve_windows(run, wait, peak_memory_bytes) -> None:
    """A peer child's side of the protocol after "ready", shared by every peer: time each window
    the parent asks for (``run(steps) -> (real, padded, instances, loss)``; ``wait(loss)`` returns
    once those steps are done on the device), then report the peak memory on "finish"."""
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "window":
            start, cpu = time.perf_counter(), time.process_time()
            real, padded, instances, loss = run(int(command["steps"]))
            wait(loss)
            emit(
                event="window",
                seconds=time.perf_counter() - start,
                cpu_seconds=time.process_time() - cpu,
                real_tokens=real,
                padded_tokens=padded,
                instances=instances,
            )
        elif command["cmd"] == "finish":
            emit(event="done", peak_memory_bytes=peak_memory_bytes())
            return


if __name__ == "__main__":
    sys.exit(main())
