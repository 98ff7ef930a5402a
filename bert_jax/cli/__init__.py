"""The `bert-jax` command: one parser from the command modules, one dispatch, one error line.

One module per command family declares its flags and a `run` that calls the library, imported
lazily (so `bert-jax --help` stays fast and the model, train step and bench never import
TensorFlow). `pretrain` and `bench` take an ml_collections config (`--config FILE[:ARG]
--config.key=value`), which `config_flags` parses for both. A user error raised anywhere below
(see `bert_jax.runtime.errors`) becomes one line on stderr and exit status 2 here, and only here;
any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from collections.abc import Sequence

from bert_jax.cli import (
    bench,
    config_flags,
    convert,
    data,
    encode,
    evaluate,
    fill_mask,
    finetune,
    launch,
    plan,
    predict,
    pretrain,
)
from bert_jax.cli.parser import Parser
from bert_jax.runtime import caches, errors, topology

# `bert-jax --help` lists the commands in this order (data: tokenizer, data; finetune:
# finetune, glue).
_FAMILIES = (
    data,
    pretrain,
    evaluate,
    plan,
    convert,
    encode,
    fill_mask,
    finetune,
    predict,
    bench,
    launch,
)
# Their arguments go to absl (config_flags) instead of argparse.
_CONFIG_COMMANDS: dict[str, config_flags.ConfigCommand] = {
    command.name: command for command in (pretrain.COMMAND, plan.COMMAND, bench.COMMAND)
}


class _Version(argparse.Action):
    """`--version`: the installed package's version, read only when asked for."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"bert-jax {installed_version()}")
        parser.exit()


def installed_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("bert-jax")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="bert-jax",
        description="BERT pretraining, conversion and evaluation in JAX/Flax.",
        epilog=errors.EXIT_STATUSES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in _FAMILIES:
        family.add_to(subparsers)
    return parser


def collect_garbage_less_often() -> None:
    """Python's cyclic garbage collector walks its young objects after every 700 allocations at
    its default threshold; importing JAX, TensorFlow and Orbax and tracing a model allocate
    millions of objects that live on. `pretrain --config configs/bert.py:base --compile-only`:
    1,163 collections, 1.36 s; after every 10,000, 65 collections, 0.34 s. A tiny run in a fresh
    process: 0.8-1.0 s of its imports' 3.3-4.4 s of CPU time, then 0.25 s. Called first thing
    in every `bert-jax` process (and by the test processes)."""
    gc.set_threshold(10_000, 20, 20)


def quiet_tensorflow() -> None:
    """No TensorFlow start-up banner (absl's "All log messages before absl::InitializeLog()",
    oneDNN's and the CPU features' lines) in a bert-jax process; a value the user set stands.
    TensorFlow 2.21 logs the oneDNN line whatever TF_CPP_MIN_LOG_LEVEL says, so its custom
    operations go off: bert-jax runs tf.data with TensorFlow, no math that oneDNN speeds up."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def console_main() -> None:
    """The `bert-jax` command: `main`, then the exit. What is alive by then stays out of the
    cyclic garbage collector's passes (`gc.freeze`): at interpreter shutdown they walked every
    object JAX, Flax and Orbax leave behind, 0.3-0.4 s of each command's exit (a fine-tune's
    0.57-0.73 s from `main` returning to the process ending, 0.27-0.33 s frozen). Reference
    counts still free everything and close what is open; Python never promised to finalize
    cycles still alive at exit, and bert-jax closes its writers and files itself."""
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    collect_garbage_less_often()
    quiet_tensorflow()
    # libtpu (bert-jax[tpu]) on a host without TPU chips: quiet, and loadable by many processes.
    topology.quiet_runtime_without_chips()
    if argv and argv[0] in _CONFIG_COMMANDS:
        command = _CONFIG_COMMANDS[argv[0]]
        if not command.times_compiles:
            caches.keep_compiled_programs()
        name, run = command.name, lambda: command.main(argv[1:])
    else:
        caches.keep_compiled_programs()
        args = build_parser().parse_args(argv)
        name, run = args.command_name, lambda: args.run(args)
    try:
        return int(run() or 0)
    except errors.UserError as err:
        if os.environ.get(errors.DEBUG_ENV, "") not in ("", "0"):
            traceback.print_exc()
        print(f"bert-jax {name}: error: {err}", file=sys.stderr)
        return errors.EXIT_USER_ERROR
