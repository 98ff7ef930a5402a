"""`bert-jax tokenizer train` and `bert-jax data prepare`: a tokenizer, then TFRecord shards."""

from __future__ import annotations

import argparse


def add_to(subparsers) -> None:
    _add_tokenizer(subparsers)
    _add_data(subparsers)


def _add_tokenizer(subparsers) -> None:
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
    train.add_argument(
        "--vocab-size", type=int, required=True, help="pieces, the five special tokens included"
    )
    train.add_argument(
        "--output", required=True, metavar="DIR", help="tokenizer directory to write"
    )
    train.add_argument("--lowercase", action="store_true", help="fold case (uncased model)")
    train.add_argument(
        "--model-type",
        default="unigram",
        choices=["unigram", "bpe"],
        help="SentencePiece's algorithm",
    )
    train.add_argument(
        "--character-coverage",
        type=float,
        default=0.9995,
        help="share of the corpus's characters the vocabulary covers (rarer ones become [UNK])",
    )
    train.add_argument(
        "--input-sentence-size",
        type=int,
        default=2_000_000,
        help="sample at most this many sentences (bounds memory on large corpora)",
    )
    train.add_argument(
        "--tfds-data-dir",
        default=None,
        help="TFDS data directory for tfds: inputs (default: TFDS's own)",
    )
    train.set_defaults(run=_train_tokenizer, command_name="tokenizer train")


def _train_tokenizer(args) -> int:
    from bert_jax.data.tokenizers.load_or_train import train_tokenizer

    tokenizer = train_tokenizer(
        args.input,
        args.vocab_size,
        args.output,
        lowercase=args.lowercase,
        tfds_data_dir=args.tfds_data_dir,
        model_type=args.model_type,
        character_coverage=args.character_coverage,
        input_sentence_size=args.input_sentence_size,
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
    from bert_jax.data import objectives
    from bert_jax.data.layout import (
        DEFAULT_GROUP_BYTES,
        DEFAULT_HELDOUT_SHARE,
        HELDOUT_FLOOR_CAP,
        HELDOUT_MIN_DOCUMENTS,
        HELDOUT_SUBDIR,
    )

    parser = subparsers.add_parser("data", help="prepare pretraining data")
    actions = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare",
        help="corpus -> masked sentence pairs -> TFRecord shards (original format)",
        usage=_PREPARE_USAGE,
    )
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
    prepare.add_argument(
        "--max-seq-length", type=int, default=128, help="tokens per instance, [CLS] and [SEP] in"
    )
    prepare.add_argument(
        "--max-predictions-per-seq",
        type=int,
        default=objectives.MAX_PREDICTIONS_PER_SEQ,
        help="masked positions per instance at most",
    )
    prepare.add_argument(
        "--masked-lm-prob",
        type=float,
        default=objectives.MASKED_LM_PROB,
        help="share of tokens masked",
    )
    prepare.add_argument(
        "--short-seq-prob",
        type=float,
        default=objectives.SHORT_SEQ_PROB,
        help="share of instances cut shorter than --max-seq-length",
    )
    prepare.add_argument(
        "--dupe-factor",
        type=int,
        default=5,
        help="passes over the corpus, each masked anew",
    )
    prepare.add_argument(
        "--seed", type=int, default=12345, help="seeds the groups, pairs, masks and shuffle"
    )
    prepare.add_argument(
        "--whole-word-mask", action="store_true", help="mask all pieces of a word together"
    )
    prepare.add_argument(
        "--objective",
        default=objectives.DEFAULT_OBJECTIVE,
        help="what the records are for: mlm+nsp (the paper's), mlm (no NSP) or ltr "
        "(left-to-right LM, unmasked); pretrain refuses records of another objective",
    )
    prepare.add_argument(
        "--instance-format",
        default="",
        help="sentence_pairs (NSP's), doc_sentences or full_sentences (RoBERTa's, no NSP); "
        "default: sentence_pairs for mlm+nsp, else full_sentences",
    )
    shares = objectives.DEFAULT_SHARES
    prepare.add_argument(
        "--mask-share", type=float, default=shares["mask_share"], help="share of [MASK]"
    )
    prepare.add_argument(
        "--same-share", type=float, default=shares["same_share"], help="share left unchanged"
    )
    prepare.add_argument(
        "--random-share", type=float, default=shares["random_share"], help="share of random ids"
    )
    prepare.add_argument(
        "--num-workers",
        type=int,
        default=1,
        help="processes on this machine (reading splits, then making groups); the records are "
        "the same for any number",
    )
    prepare.add_argument(
        "--num-groups",
        type=int,
        default=0,
        help="documents go to this many groups by a hash of their place in the input, a shard "
        "per group; random next sentences come from the same group (default: one group per "
        "--group-bytes of input)",
    )
    prepare.add_argument(
        "--group-bytes",
        type=int,
        default=DEFAULT_GROUP_BYTES,
        help="input bytes per group when --num-groups is not given (as stored: compressed "
        "dumps and Parquet count compressed); a group is what a worker holds at a time",
    )
    prepare.add_argument(
        "--split-bytes",
        type=int,
        default=None,
        help="inputs are read in splits of about this many bytes, a unit of parallel work; the "
        "records do not depend on it (default: 64 MiB)",
    )
    prepare.add_argument(
        "--heldout-share",
        type=float,
        default=DEFAULT_HELDOUT_SHARE,
        help=f"share of documents held out for evaluation (chosen by a hash of their place in "
        f"the input, the same for any runner), written as records of their own in "
        f"DIR/{HELDOUT_SUBDIR}/ and never in the training records; at least "
        f"{HELDOUT_MIN_DOCUMENTS} documents (at most 1 in {HELDOUT_FLOOR_CAP}) while above 0; "
        "0: none (default: %(default)s)",
    )
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
    prepare.add_argument(
        "--documents-per-shard",
        type=int,
        default=0,
        help="no longer used (documents go to groups by hash): give --num-groups or "
        "--group-bytes; accepted, with a warning",
    )
    prepare.add_argument(
        "--tfds-data-dir", default=None, help="where TFDS keeps its data sets (tfds: inputs)"
    )
    prepare.add_argument(
        "--text-field", default="text", help="JSONL / Parquet / TFDS field with the text"
    )
    from bert_jax.data.sentences import DEFAULT_SPLITTER, SPLITTERS

    prepare.add_argument(
        "--splitter",
        default=DEFAULT_SPLITTER,
        choices=SPLITTERS,
        help="sentence splitter for prose (JSONL, Parquet, TFDS, Wikipedia, --sentence-split), "
        "chosen on benchmarks/sentence_split_eval.py; regex is the rules of earlier versions "
        "(default: %(default)s)",
    )
    prepare.add_argument(
        "--sentence-split",
        action="store_true",
        help="split the lines of text files into sentences (for a paragraph per line)",
    )
    prepare.add_argument(
        "--max-line-bytes",
        type=int,
        default=200_000,
        help="longer lines are skipped (counted as long_lines)",
    )
    prepare.add_argument(
        "--strict", action="store_true", help="stop at the first bad line instead of skipping it"
    )
    prepare.add_argument("--overwrite", action="store_true", help="rewrite the shards in --output")
    prepare.set_defaults(run=_prepare, command_name="data prepare")


def _prepare(args) -> int:
    import logging
    import shlex
    import sys

    from bert_jax.data.preparation.run import PrepareSettings, prepare_records
    from bert_jax.runtime.errors import UserError
    from bert_jax.training import config_checks

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

    # Records no size preset can read are refused before any work (--max-seq-length 100000).
    config_checks.check_sequence_length(args.max_seq_length, "--max-seq-length")
    # Progress lines as every long command prints them ("data prepare: splits read 3/12 ..."),
    # on stdout beside the summary; stderr keeps an error's one line.
    logging.basicConfig(level=logging.INFO, format="data prepare: %(message)s", stream=sys.stdout)
    settings = PrepareSettings(
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor,
        seed=args.seed,
        whole_word_mask=args.whole_word_mask,
        objective=args.objective,
        instance_format=args.instance_format,
        mask_share=args.mask_share,
        same_share=args.same_share,
        random_share=args.random_share,
        num_workers=args.num_workers,
        num_groups=args.num_groups,
        group_bytes=args.group_bytes,
        **({"split_bytes": args.split_bytes} if args.split_bytes else {}),
        heldout_share=args.heldout_share,
        documents_per_shard=args.documents_per_shard,
        tfds_data_dir=args.tfds_data_dir,
        text_field=args.text_field,
        sentence_split=args.sentence_split,
        splitter=args.splitter,
        max_line_bytes=args.max_line_bytes,
        strict=args.strict,
        overwrite=args.overwrite,
    )
    if args.runner == "beam":
        from bert_jax.data.preparation import beam_pipeline as beam

        result = beam.prepare_with_beam(
            args.input, args.tokenizer, args.output, settings, beam_args, dry_run=args.dry_run
        )
        if isinstance(result, str) or result is None:
            print(
                result
                or f"the job runs on: {args.output} is complete once it holds stats-0-of-1.json"
            )
            return 0
    elif args.dry_run:
        from bert_jax.data.preparation.run import check_run, describe_run

        print(describe_run(check_run(args.input, args.tokenizer, args.output, settings)))
        return 0
    else:
        result = prepare_records(args.input, args.tokenizer, args.output, settings)
    print(result.summary())
    for problem in result.corpus_stats.problems:
        print(f"  skipped: {problem}")
    return 0
