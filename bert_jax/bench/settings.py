"""`bert-jax bench`'s shapes and timing, each setting declared once (`BenchSettings`): the
command's flags, their help and the checks derive from these declarations, and `BenchSpec` takes
its defaults from them and checks itself with them. No JAX here: `--help` reads it."""

from __future__ import annotations

import dataclasses

from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """What the command line sets of a benchmark, by `BenchSpec`'s names (the flags may differ:
    `--max-seq-length` sets `seq_len`). What is timed beside what (data, packing, peers and their
    PRNGs) is not declared yet."""

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

    def __post_init__(self):
        for problem in declarations.problems(self):
            raise UserError(problem)
