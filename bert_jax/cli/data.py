"""`bert-jax tokenizer train` and `bert-jax data prepare`: a tokenizer, then TFRecord shards."""

from __future__ import annotations


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
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--output", required=True, metavar="DIR")
    train.add_argument("--lowercase", action="store_true", help="fold case (uncased model)")
    train.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"])
    train.add_argument("--character-coverage", type=float, default=0.9995)
    train.add_argument(
        "--input-sentence-size",
        type=int,
        default=2_000_000,
        help="sample at most this many sentences (bounds memory on large corpora)",
    )
    train.add_argument("--tfds-data-dir", default=None)
    train.set_defaults(run=_train_tokenizer, command_name="tokenizer train")


def _train_tokenizer(args) -> int:
    from bert_jax.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(
        args.input,
        args.vocab_size,
        args.output,
        lowercase=args.lowercase,
        tfds_data_dir=args.tfds_data_dir,
        model_type=args.model_type,
        character_coverage=args.character_coverage,
        input_sentence_size=args.input_sentence_size,
    )
    print(f"wrote {tokenizer!r} to {args.output}")
    return 0


def _add_data(subparsers) -> None:
    parser = subparsers.add_parser("data", help="prepare pretraining data")
    actions = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare", help="corpus -> masked sentence pairs -> TFRecord shards (original format)"
    )
    prepare.add_argument(
        "--input",
        nargs="+",
        metavar="SRC",
        help="text files/globs (one sentence per line, blank line between documents), .jsonl "
        "(text field), .parquet (text column, a row per document), Wikipedia XML dumps "
        "(.xml.bz2 / .xml, an article per document), tfds:NAME[/CONFIG][:SPLIT], or "
        "embedded[:train|eval]; local or gs://",
    )
    prepare.add_argument("--tokenizer", metavar="TOK", help="tokenizer dir, .model or vocab.txt")
    prepare.add_argument("--output", required=True, metavar="DIR")
    prepare.add_argument("--max-seq-length", type=int, default=128)
    prepare.add_argument("--max-predictions-per-seq", type=int, default=20)
    prepare.add_argument("--masked-lm-prob", type=float, default=0.15)
    prepare.add_argument("--short-seq-prob", type=float, default=0.1)
    prepare.add_argument("--dupe-factor", type=int, default=5)
    prepare.add_argument("--seed", type=int, default=12345)
    prepare.add_argument("--whole-word-mask", action="store_true")
    prepare.add_argument(
        "--objective",
        default="mlm+nsp",
        help="what the records are for: mlm+nsp (the paper's), mlm (no NSP) or ltr "
        "(left-to-right LM, unmasked); pretrain refuses records of another objective",
    )
    prepare.add_argument(
        "--instance-format",
        default="",
        help="sentence_pairs (NSP's), doc_sentences or full_sentences (RoBERTa's, no NSP); "
        "default: sentence_pairs for mlm+nsp, else full_sentences",
    )
    prepare.add_argument("--mask-share", type=float, default=0.8, help="share of [MASK]")
    prepare.add_argument("--same-share", type=float, default=0.1, help="share left unchanged")
    prepare.add_argument("--random-share", type=float, default=0.1, help="share of random ids")
    prepare.add_argument("--num-workers", type=int, default=1)
    prepare.add_argument(
        "--shard-index", type=int, default=0, help="this machine's index when several share work"
    )
    prepare.add_argument("--num-shards", type=int, default=1, help="number of machines")
    prepare.add_argument(
        "--merge",
        action="store_true",
        help="after the --num-shards machines prepared into one --output: check that every "
        "shard finished with the same settings, tokenizer and inputs, and write the manifest "
        "that pretrain reads (it refuses unmerged shards); takes --output only",
    )
    prepare.add_argument(
        "--documents-per-shard",
        type=int,
        default=1000,
        help="documents per output file; bounds memory (random next sentences come from the same "
        "group of documents)",
    )
    prepare.add_argument("--tfds-data-dir", default=None)
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
    prepare.add_argument("--max-line-bytes", type=int, default=200_000)
    prepare.add_argument(
        "--strict", action="store_true", help="stop at the first bad line instead of skipping it"
    )
    prepare.add_argument(
        "--overwrite", action="store_true", help="rewrite this machine's shards in --output"
    )
    prepare.set_defaults(run=_prepare, command_name="data prepare")


def _prepare(args) -> int:
    import logging

    from bert_jax.data.prepare import PrepareSettings, merge_shards, prepare_records
    from bert_jax.runtime.errors import UserError
    from bert_jax.training import config_checks

    if args.merge:
        if args.input or args.tokenizer:
            raise UserError("--merge takes --output only: the shards record their inputs")
        print(merge_shards(args.output).summary())
        return 0
    given = {"--input": args.input, "--tokenizer": args.tokenizer}
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise UserError(f"{' and '.join(missing)} {verb} required (unless --merge)")

    # Records no size preset can read are refused before any work (--max-seq-length 100000).
    config_checks.check_sequence_length(args.max_seq_length, "--max-seq-length")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
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
        shard_index=args.shard_index,
        num_shards=args.num_shards,
        documents_per_shard=args.documents_per_shard,
        tfds_data_dir=args.tfds_data_dir,
        text_field=args.text_field,
        sentence_split=args.sentence_split,
        splitter=args.splitter,
        max_line_bytes=args.max_line_bytes,
        strict=args.strict,
        overwrite=args.overwrite,
    )
    result = prepare_records(args.input, args.tokenizer, args.output, settings)
    print(result.summary())
    for problem in result.corpus_stats.problems:
        print(f"  skipped: {problem}")
    return 0
