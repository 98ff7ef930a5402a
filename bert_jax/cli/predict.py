"""`bert-jax predict --model FINETUNED --input FILE [--output OUT]`: a fine-tuned model's
predictions on new inputs."""

from __future__ import annotations


def add_to(subparsers) -> None:
    from bert_jax.inference import predict
    from bert_jax.runtime import declarations

    parser = subparsers.add_parser(
        "predict",
        help="use a fine-tuned model: its prediction for each row of a TSV or JSONL file",
        description="Each row needs the fields the model's task head reads: text (and text_pair "
        "for a pair task such as MRPC or RTE) for GLUE-style classification and regression; "
        "context, endings (TSV: ending0, ending1, ... columns) and optionally start for "
        "multiple choice (SWAG); question and context for spans (SQuAD); words for tags "
        "(CoNLL-2003; TSV: one column of space-separated words). An optional id is echoed. "
        "JSONL (.jsonl, .json): one object a line; otherwise TSV with a header. Writes, per "
        "row, the label and its probability (score), the predicted score (regression), the "
        "chosen ending (multiple choice), the answer text (spans) or a tag per word. Python: "
        "bert_jax.inference.predict.predict(model, rows).",
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="FINETUNED",
        help="a fine-tuned model directory (a finetune workdir, or its model/)",
    )
    parser.add_argument(
        "--input", required=True, metavar="FILE", help="rows to predict: .jsonl/.json or TSV"
    )
    parser.add_argument(
        "--output",
        default=None,
        metavar="OUT",
        help="where the predictions go (default: standard output); an existing file is replaced "
        "only when it holds predictions",
    )
    # --batch-size, --format and --progress-every: help, defaults and checks from declarations.
    declarations.add_flags(parser, predict.PredictSettings)
    parser.set_defaults(run=_run, command_name="predict")


def _run(args) -> int:
    from bert_jax.inference import predict
    from bert_jax.runtime import declarations

    settings = declarations.from_args(predict.PredictSettings, args)  # refused here, first
    summary = predict.predict_file(args.model, args.input, args.output, settings)
    if args.output is not None:  # else the predictions themselves are on standard output
        print(f"{summary['rows']:,} predictions of {summary['task']} -> {args.output}")
    return 0
