"""The `bert-jax` command: parses arguments, then calls library functions; no logic of its own.

Each subcommand has one `_add_<name>` function that declares its flags and binds `args.run` to a
function that imports the library lazily (so `bert-jax --help` stays fast and the model, train step
and bench never import TensorFlow).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

# Registration order is the order shown by `bert-jax --help`.
_ADDERS: list = []


def _subcommand(fn):
    _ADDERS.append(fn)
    return fn


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bert-jax", description="BERT pretraining, conversion and evaluation in JAX/Flax."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _ADDERS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    result = args.run(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
