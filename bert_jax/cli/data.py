"""`bert-jax tokenizer train` and `bert-jax data prepare`: a tokenizer, then TFRecord shards."""

from __future__ import annotations

import argparse


def add_to(subparsers) -> None:
    _add_tokenizer(subparsers)
    _add_data(subparsers)


def _add_tokenizer(subparsers) -> None:
    from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings
    from bert_jax.runtime import declarations

    parser = subparsers.add_parser("tokenizer", help="train a SentencePiece tokenizer")
    actions = parser.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    train = actions.add_parser(
        "train",
        help="train SentencePiece with BERT's special tokens ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 "
        "[MASK]=4)",
    )
    train.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="FILE",
        help="text files (one sentence per line), .jsonl, .parquet, Wikipedia XML dumps (.bz2), "
        "tfds:NAME[/CONFIG][:SPLIT] or embedded",
    )
    # The training's flags, help, defaults and ranges from `TokenizerTrainSettings`; the size
    # (no default) is required.
    (size,) = (
        f for f in declarations.declared_fields(TokenizerTrainSettings) if f.name == "vocab_size"
    )
    train.add_argument(
        "--vocab-size", dest="vocab_size", required=True, **declarations.flag_options(size)
    )
    train.add_argument(
        "--output", required=True, metavar="DIR", help="tokenizer directory to write"
    )
    others = [
        name for name in declarations.declarations(TokenizerTrainSettings) if name != "vocab_size"
    ]
    declarations.add_flags(train, TokenizerTrainSettings, names=others)
    train.add_argument(
        "--tfds-data-dir",
        default=None,
        help="TFDS data directory for tfds: inputs (default: TFDS's own)",
    )
    train.set_defaults(run=_train_tokenizer, command_name="tokenizer train")


def _train_tokenizer(args) -> int:
    from bert_jax.data.tokenizers.load_or_train import train_tokenizer
    from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings
    from bert_jax.runtime import declarations

    tokenizer = train_tokenizer(
        args.input,
        args.output,
        declarations.from_args(TokenizerTrainSettings, args),
        tfds_data_dir=args.tfds_data_dir,
        log=lambda line: print(f"tokenizer train: {line}", flush=True),
    )
    print(f"wrote {tokenizer!r} to {args.output}")
    return 0


_PREPARE_USAGE = (
    "bert-jax data prepare --input SRC [SRC ...] --tokenizer TOK --output DIR [options] "
    "[--runner beam [-- BEAM_OPTION ...]]"
)
# Flags of an earlier scheme of several machines, refused by name: --runner beam replaced them.
_SEVERAL_MACHINES = ("--shard-index", "--num-shards", "--merge")


def _add_data(subparsers) -> None:
    from bert_jax.data.preparation.settings import PrepareSettings
    from bert_jax.runtime import declarations

    parser = subparsers.add_parser("data", help="prepare pretraining data")
    actions = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare",
        help="corpus -> masked sentence pairs -> TFRecord shards (original format)",
        usage=_PREPARE_USAGE,
    )
    # What to prepare and where: not settings of the preparation.
    prepare.add_argument(
        "--input",
        nargs="+",
        metavar="SRC",
        help="required: text files/globs (one sentence per line, blank line "
        "between documents), .jsonl (text field), .parquet (text column, a row per document), "
        "Wikipedia XML dumps (.xml.bz2 / .xml, an article per document), "
        "tfds:NAME[/CONFIG][:SPLIT], or embedded[:train|eval]; local or gs://",
    )
    prepare.add_argument(
        "--tokenizer",
        metavar="TOK",
        help="required: tokenizer dir, .model or vocab.txt",
    )
    prepare.add_argument(
        "--output", required=True, metavar="DIR", help="the records directory (local or gs://)"
    )
    # Every setting's flag, help, default and range from its declaration.
    declarations.add_flags(prepare, PrepareSettings)
    prepare.add_argument(
        "--runner",
        default="local",
        choices=["local", "beam"],
        help="local: processes on this machine (--num-workers); beam: an Apache Beam pipeline, "
        "the way past one machine (Dataflow, Flink, Spark; Beam's FnApiRunner here), Beam's "
        "options after a `--`; the same records",
    )
    prepare.add_argument(
        "--beam-options",
        default="",
        metavar="OPTIONS",
        help="Beam's pipeline options as one string (the same as after `--`), e.g. "
        "'--runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp'",
    )
    prepare.add_argument(
        "--dry-run",
        action="store_true",
        help="print the splits, groups and (with --runner beam) pipeline options; write nothing",
    )
    prepare.add_argument(
        "beam_args",
        nargs="*",
        metavar="-- BEAM_OPTION",
        help="Beam's own pipeline options, after a `--` (with --runner beam)",
    )
    for flag in _SEVERAL_MACHINES:  # refused in _prepare, in one line
        prepare.add_argument(flag, nargs="?", default=None, const=True, help=argparse.SUPPRESS)
    prepare.set_defaults(run=_prepare, command_name="data prepare")


def _prepare(args) -> int:
    import atexit
    import gc
    import shlex

    from bert_jax.runtime.errors import UserError

    for flag in _SEVERAL_MACHINES:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise UserError(
                f"{flag} is gone: past one machine, run --runner beam (Dataflow, Flink, Spark), "
                "which writes the same records from one command (docs/dataflow.md)"
            )
    beam_args = [*shlex.split(args.beam_options), *args.beam_args]
    if beam_args and args.runner != "beam":
        raise UserError(
            f"{beam_args[0]}: Beam pipeline options (after `--` or in --beam-options) need "
            "--runner beam"
        )
    given = {"--input": args.input, "--tokenizer": args.tokenizer}
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise UserError(f"{' and '.join(missing)} {verb} required")
    workers = None
    if args.runner == "beam" and not args.dry_run:
        # The FnApiRunner's worker processes start now, to import Beam while this process
        # imports the rest (beam_workers.LocalWorkers); prepare_with_beam closes them.
        from bert_jax.data.preparation.beam_workers import LocalWorkers

        workers = LocalWorkers(beam_args)
        # What Beam and the job leave lives until the process ends: its exit need not collect
        # it (about 0.3 CPU-s of the interpreter's teardown with Beam loaded). Once, whatever
        # the runs in one process (tests).
        atexit.unregister(gc.freeze)
        atexit.register(gc.freeze)
    try:
        return _prepare_checked(args, beam_args, workers)
    finally:
        if workers is not None:  # closed by prepare_with_beam, unless a check refused the run
            workers.close()


def _prepare_checked(args, beam_args: list[str], workers) -> int:
    import logging
    import sys

    from bert_jax.data.preparation.local_runner import prepare_records
    from bert_jax.data.preparation.settings import PrepareSettings
    from bert_jax.runtime import declarations
    from bert_jax.training import config_checks

    # Records no size preset can read are refused before any work (--max-seq-length 100000).
    config_checks.check_sequence_length(args.max_seq_length, "--max-seq-length")
    # Progress lines as every long command prints them ("data prepare: splits read 3/12 ..."),
    # on stdout beside the summary; stderr keeps an error's one line.
    logging.basicConfig(level=logging.INFO, format="data prepare: %(message)s", stream=sys.stdout)
    settings = declarations.from_args(PrepareSettings, args)
    if args.runner == "beam":
        from bert_jax.data.preparation import beam_pipeline as beam

        result = beam.prepare_with_beam(
            args.input,
            args.tokenizer,
            args.output,
            settings,
            beam_args,
            dry_run=args.dry_run,
            workers=workers,
        )
        if isinstance(result, str) or result is None:
            print(
                result
                or f"the job runs on: {args.output} is complete once it holds stats-0-of-1.json"
            )
            return 0
    elif args.dry_run:
        from bert_jax.data.preparation.stage import check_run, describe_run

        print(describe_run(check_run(args.input, args.tokenizer, args.output, settings)))
        return 0
    else:
        result = prepare_records(args.input, args.tokenizer, args.output, settings)
    print(result.summary())
    for problem in result.corpus_stats.problems:
        print(f"  skipped: {problem}")
    return 0
