"""`bert-jax eval --model MODEL --data RECORDS`: held-out MLM accuracy, perplexity (and NSP)."""

from __future__ import annotations


def add_to(subparsers) -> None:
    from bert_jax.runtime import declarations
    from bert_jax.training.model_eval import EvalSettings

    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model on held-out prepared records: MLM accuracy, perplexity, NSP",
        description="Prints MLM accuracy (beside the most-frequent-token baseline), MLM "
        "perplexity = exp(mean masked-token loss; next-token loss for an 'ltr' model) and, for "
        "an 'mlm+nsp' model, NSP accuracy (beside the majority label's share, and whether the "
        "model predicts one class), over the records' own masking.",
    )
    parser.add_argument("--model", required=True, metavar="MODEL", help="model dir or workdir")
    parser.add_argument(
        "--data", required=True, metavar="RECORDS", help="records from `data prepare`"
    )
    # --batch-size and --batches: their help, defaults and checks from the declarations.
    declarations.add_flags(parser, EvalSettings)
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    parser.set_defaults(run=_run, command_name="eval")


def _run(args) -> int:
    import json
    import sys

    from bert_jax.runtime import declarations
    from bert_jax.training.model_eval import EvalSettings, evaluate_model, summary_lines

    settings = declarations.from_args(EvalSettings, args)  # refused here, before loading
    # Progress goes to stderr with --json, so that stdout holds the one JSON object.
    stream = sys.stderr if args.json else sys.stdout
    result = evaluate_model(
        args.model,
        args.data,
        settings,
        console=lambda line: print(line, file=stream, flush=True),
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print("\n".join(summary_lines(result)))
    return 0
