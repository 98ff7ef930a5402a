"""`bert-jax fill-mask --model MODEL (--input FILE | TEXT ...)`: top-k tokens for each [MASK]."""

from __future__ import annotations


def add_to(subparsers) -> None:
    from bert_jax.inference import fill_mask
    from bert_jax.runtime import declarations

    parser = subparsers.add_parser(
        "fill-mask",
        help="try a model: the most likely tokens for each [MASK] in lines of text",
        description="Each text becomes [CLS] text [SEP] with the model's tokenizer; every [MASK] "
        "in it gets the top-k tokens of the masked-LM head with their probabilities, as "
        "transformers' fill-mask pipeline gives them for the model exported with `bert-jax "
        "convert --to hf`. Python: bert_jax.inference.fill_mask.fill_mask(model, texts, top_k=5).",
    )
    parser.add_argument("--model", required=True, metavar="MODEL", help="model dir or workdir")
    parser.add_argument(
        "texts",
        nargs="*",
        metavar="TEXT",
        help="texts with one or more [MASK] (or --input)",
    )
    parser.add_argument(
        "--input",
        metavar="FILE",
        help=f"a text with [MASK] per line (blank lines skipped); {fill_mask.STDIN} reads "
        "standard input",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per text: text, and for each [MASK] its position and predictions "
        "(token_id, token = the vocabulary entry, token_str = it decoded as text, score = "
        "probability)",
    )
    # --top-k and --batch-size: their help, defaults and checks from the declarations.
    declarations.add_flags(parser, fill_mask.FillMaskSettings)
    parser.set_defaults(run=_run, command_name="fill-mask")


def _run(args) -> int:
    import json

    from bert_jax.inference import fill_mask
    from bert_jax.runtime import declarations
    from bert_jax.runtime.errors import UserError

    settings = declarations.from_args(fill_mask.FillMaskSettings, args)  # refused here, first
    if bool(args.texts) == bool(args.input):
        raise UserError(
            "give the texts either as arguments or with --input FILE (one per line), not "
            + ("both" if args.texts else "neither")
        )
    if args.input:
        texts, names = fill_mask.read_texts(args.input)
    else:
        texts, names = args.texts, [f"TEXT {i + 1}" for i in range(len(args.texts))]
    results = fill_mask.fill_mask(args.model, texts, settings, names=names)
    for result in results:
        print(
            json.dumps(result.to_json(), ensure_ascii=False)
            if args.json
            else fill_mask.format_text(result)
        )
    return 0
