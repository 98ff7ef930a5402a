"""`bert-jax encode --model MODEL --input TEXTS.txt --output OUT.npy`: features of text lines."""

from __future__ import annotations


def add_to(subparsers) -> None:
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
    parser.add_argument(
        "--pool",
        default=None,
        choices=["cls", "last", "mean", "none"],
        help="cls: hidden state at [CLS]; last: at the last real token ([SEP]); mean: average "
        "over real tokens; none: every token. Default: where the model's pooler reads, cls (last "
        "for a left-to-right model, where cls is refused)",
    )
    parser.add_argument(
        "--layer",
        default="-1",
        help="hidden state to use: 0 = embeddings, i = layer i, -1 = last; several "
        "(--layer=-4,-3,-2,-1) are concatenated",
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="fixed batch shape (the last batch is padded)"
    )
    parser.add_argument(
        "--max-seq-length",
        type=int,
        default=None,
        help="truncate longer inputs (default 128, or the model's max_position_embeddings)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="compute dtype (default: the model's)",
    )
    parser.set_defaults(run=_run, command_name="encode")


def _run(args) -> int:
    from bert_jax.encode import encode_file

    summary = encode_file(
        args.model,
        args.input,
        args.output,
        pool=args.pool,
        layers=args.layer,
        batch_size=args.batch_size,
        max_seq_length=args.max_seq_length,
        dtype=args.dtype,
    )
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
