"""`bert-jax encode`'s settings, each declared once (`EncodeSettings`): the command's flags, their
help and the checks derive from these declarations, and `encode.encode_texts` takes its defaults
from them. No NumPy or JAX here: `--help` reads it (encode.py, which computes, imports JAX)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from bert_jax.core.dtypes import DTYPES
from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError

POOLS = ("cls", "last", "mean", "none")
DEFAULT_MAX_SEQ_LENGTH = 128


def parse_layers(spec: str | int | Sequence[int]) -> tuple[int, ...]:
    """`-1`, `"-1"` or `"-4,-3,-2,-1"` -> a tuple of layer indices."""
    if isinstance(spec, int):
        return (spec,)
    if isinstance(spec, str):
        try:
            return tuple(int(part) for part in spec.split(",") if part.strip())
        except ValueError as err:
            raise UserError(f"--layer {spec!r}: expected integers such as -1 or -4,-3") from err
    return tuple(int(x) for x in spec)


def _layers_flag(text: str) -> tuple[int, ...]:
    """--layer's value; argparse names the flag in front of the message."""
    try:
        return parse_layers(text)
    except UserError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected integers such as -1 or -4,-3"
        ) from None


@dataclasses.dataclass(frozen=True)
class EncodeSettings:
    """What `encode` reads from the model and how (the model, input and output aside)."""

    pool: str | None = setting(
        None,
        "cls: hidden state at [CLS]; last: at the last real token ([SEP]); mean: average over "
        "real tokens; none: every token",
        choices=POOLS,
        zero="default: where the model's pooler reads, cls (last for a left-to-right model, "
        "where cls is refused)",
    )
    layers: tuple[int, ...] = setting(
        (-1,),
        "hidden state to use: 0 = embeddings, i = layer i, -1 = last; several "
        "(--layer=-4,-3,-2,-1) are concatenated",
        flag="layer",
        parse=_layers_flag,
        metavar="LAYER",
    )
    batch_size: int = setting(32, "fixed batch shape (the last batch is padded)", low=1)
    max_seq_length: int | None = setting(
        None,
        "truncate longer inputs",
        low=1,
        zero=f"default {DEFAULT_MAX_SEQ_LENGTH}, or the model's max_position_embeddings",
    )
    dtype: str | None = setting(None, "compute dtype", choices=DTYPES, zero="default: the model's")

    def __post_init__(self):
        # A Python caller may give the layers as `-1` or "-4,-3,-2,-1", as the flag takes them.
        object.__setattr__(self, "layers", parse_layers(self.layers))
        if not self.layers:
            raise UserError("--layer names no layer (e.g. -1, or -4,-3,-2,-1)")
        for problem in declarations.problems(self):
            raise UserError(problem)
