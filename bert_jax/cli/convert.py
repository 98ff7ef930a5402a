"""`bert-jax convert --from {tf1,hf,bert-jax} SRC --to {bert-jax,hf} DST`: checkpoints in/out."""

from __future__ import annotations

import argparse

from bert_jax.runtime.errors import UserError


def add_to(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert checkpoints: Google TF1 / Hugging Face / bert-jax -> bert-jax / Hugging Face",
        description="Strict conversion: every source tensor is used once (optimizer slots, "
        "global_step, tied copies and buffers are reported as ignored) and every parameter is "
        "filled with the right shape; otherwise nothing is written and the error names the tensor.",
    )
    parser.add_argument(
        "--from",
        dest="source",
        nargs=2,
        required=True,
        metavar=("{tf1,hf,bert-jax}", "SRC"),
        help="source format and path: a Google checkpoint dir (bert_model.ckpt.*, "
        "bert_config.json, vocab.txt), a Hugging Face dir (BERT or ModernBERT), or a bert-jax "
        "model dir / workdir",
    )
    parser.add_argument(
        "--to",
        dest="target",
        nargs=2,
        required=True,
        metavar=("{bert-jax,hf}", "DST"),
        help="target format and directory (written atomically)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    parser.add_argument(
        "--drop-heads",
        action="store_true",
        help="convert the encoder (with pooler) only, leaving out MLM/NSP or task heads",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="TOK",
        help="tokenizer to store instead of the source's (dir, .model or vocab.txt)",
    )
    parser.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="override the tokenizer's case setting (default: stored, or inferred from vocab.txt)",
    )
    parser.add_argument(
        "--vocab-pad-multiple",
        type=int,
        default=None,
        metavar="N",
        help="(--to bert-jax) pad the word-embedding rows to a multiple of N, as "
        "model.vocab_pad_multiple (128 in configs/bert.py); default: the source's (none)",
    )
    parser.add_argument("--report-json", default=None, metavar="FILE", help="also save the report")
    parser.set_defaults(run=_run, command_name="convert")


def _run(args) -> int:
    from bert_jax.convert.between_formats import SOURCE_FORMATS, TARGET_FORMATS, convert
    from bert_jax.training import load_model

    (src_format, src), (dst_format, dst) = args.source, args.target
    if src_format not in SOURCE_FORMATS:
        raise UserError(f"--from {src_format!r}: use {SOURCE_FORMATS}")
    if dst_format not in TARGET_FORMATS:
        raise UserError(f"--to {dst_format!r}: use {TARGET_FORMATS}")
    report = convert(  # a ModernBERT source (config.json's model_type) converts as that family
        src_format,
        src,
        dst_format,
        dst,
        drop_heads=args.drop_heads,
        tokenizer=args.tokenizer,
        lowercase=args.lowercase,
        overwrite=args.overwrite,
        vocab_pad_multiple=args.vocab_pad_multiple,
        load_model_dir=load_model.load_model_dir,  # also a workdir (its latest checkpoint)
    )
    print(report.summary())
    if args.report_json:
        from bert_jax.runtime import fs

        fs.write_text(args.report_json, report.to_json() + "\n")
    return 0
