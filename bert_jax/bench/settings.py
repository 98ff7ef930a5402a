"""`bert-jax bench`'s shapes and timing, each setting declared once (`BenchSettings`): the
command's flags, their help and the checks derive from these declarations, and `BenchSpec` takes
its defaults from them and checks itself with them. No JAX here: `--help` reads it."""

from __future__ import annotations

import dataclasses

from bert_jax.core.prng_impls import DROPOUT_RNG_IMPLS
from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """What the command line sets of a benchmark. The settings of the spec have `BenchSpec`'s
    names (the flags may differ: `--max-seq-length` sets `seq_len`); `real_data` becomes the
    spec's `data` (`spec_from_config`); `peer`, `peer_python` and `compare_unpacked` say what
    is timed beside it (`timing.run`)."""

    seq_len: int | None = setting(
        None, "sequence length", low=1, flag="max-seq-length", zero="default: phase 1's"
    )
    batch_size: int | None = setting(None, "global batch size", low=1, zero="default: that phase's")
    steps: int = setting(10, "timed steps per window", low=1)
    windows: int = setting(5, "timed windows; figures are medians over windows", low=1)
    warmup_steps: int = setting(2, "untimed steps after compiling", low=0, flag="warmup")
    packing_factor: float = setting(
        0.0,
        "rows read per packed row",
        low=1.0,
        also=(0,),
        zero="0: the most that drops under 1% of the instances",
    )
    num_devices: int = setting(
        0, "devices to use", low=0, flag="devices", zero="0: all; 1 with --peer"
    )
    peak_tflops: float = setting(
        0.0,
        "peak TFLOP/s per chip, for MFU on unlisted chips",
        low=0.0,
        zero="0: the hardware table's, by device kind",
    )

    # The data: real instances or full synthetic rows, packed or not.
    real_data: bool = setting(False, "instances from the embedded corpus, real lengths")
    packing: bool = setting(False, "pack several instances per row (implies --real-data)")
    tokenizer: str = setting(
        "", "tokenizer for --real-data", zero="default: the embedded corpus's, see bench/data.py"
    )
    # Our dropout PRNG and the peer's (jax.random key implementations).
    rng_impl: str = setting(
        "",
        "our dropout PRNG",
        choices=DROPOUT_RNG_IMPLS,
        also=("",),
        zero="default: config.dropout_rng_impl",
    )
    peer_rng_impl: str = setting(
        "",
        "the peer's dropout PRNG",
        choices=DROPOUT_RNG_IMPLS,
        also=("",),
        zero="default threefry2x32",
    )
    # What is timed beside ours.
    peer: str = setting(
        "",
        "also time peers in the same run: hf-torch (PyTorch, eager and compiled; or "
        "hf-torch-eager, hf-torch-compiled), hf-flax; several comma-separated",
        zero="default: none",
    )
    peer_python: str = setting("", "hf-flax's Python", zero="default: .venv-peer/bin/python")
    compare_unpacked: bool = setting(False, "with --packing: also time the rows unpacked")

    def __post_init__(self):
        for problem in declarations.problems(self):
            raise UserError(problem)
