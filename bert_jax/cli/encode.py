"""`bert-jax encode --model MODEL --input TEXTS.txt --output OUT.npy`: features of text lines."""

from __future__ import annotations


def add_to(subparsers) -> None:
    from bert_jax.inference.encode_settings import EncodeSettings
    from bert_jax.runtime import declarations

    parser = subparsers.add_parser(
        "encode",
        help="extract features (the paper's feature-based approach) for lines of text",
        description="One example per line (`A ||| B` for a pair). Writes float32 OUT.npy: [N, D] "
        "for --pool cls|last|mean, or [N, L, D] zero-padded per-token features plus "
        "OUT.lengths.npy (int32 [N], real tokens per row) for --pool none.",
    )
    parser.add_argument("--model", required=True, metavar="MODEL", help="model dir or workdir")
    parser.add_argument(
        "--input", required=True, metavar="TEXTS.txt", help="one text per line (`A ||| B`: a pair)"
    )
    parser.add_argument(
        "--output", required=True, metavar="OUT.npy", help="the features' .npy file to write"
    )
    # --pool, --layer, --batch-size, --max-seq-length, --dtype: their help, defaults, choices
    # and checks from the declarations.
    declarations.add_flags(parser, EncodeSettings)
    parser.set_defaults(run=_run, command_name="encode")


def _run(args) -> int:
    from bert_jax.inference.encode_settings import EncodeSettings
    from bert_jax.runtime import declarations

    settings = declarations.from_args(EncodeSettings, args)  # refused here, before JAX loads
    from bert_jax.inference.encode import encode_file

    summary = encode_file(args.model, args.input, args.output, settings)
    print(
        f"encoded {summary['texts']} texts with {summary['model']}: features "
        f"{tuple(summary['shape'])} -> {', '.join(summary['written'])}"
    )
    if summary["truncated"]:
        print(
            f"  note: {summary['truncated']} texts were truncated to "
            f"{summary['max_seq_length']} tokens (--max-seq-length)"
        )
    return 0
