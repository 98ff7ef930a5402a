"""The `bert-jax` command: parses arguments, then calls library functions; no logic of its own.

Each subcommand has one `_add_<name>` function that declares its flags and binds `args.run` to a
function that imports the library lazily (so `bert-jax --help` stays fast and the model, train step
and bench never import TensorFlow).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# Registration order is the order shown by `bert-jax --help`.
_ADDERS: list = []


def _subcommand(fn):
    _ADDERS.append(fn)
    return fn


def _data_error(command: str, err: Exception) -> int:
    """Bad input or settings: one clear line (it names the file, line or flag), exit status 2."""
    print(f"bert-jax {command}: error: {err}", file=sys.stderr)
    return 2


@_subcommand
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
        help="text files (one sentence per line), .jsonl, tfds:NAME[/CONFIG][:SPLIT] or embedded",
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

    def run(args) -> int:
        from bert_jax.data.tokenizer import train_tokenizer

        try:
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
        except (ValueError, FileNotFoundError) as err:
            return _data_error("tokenizer train", err)
        print(f"wrote {tokenizer!r} to {args.output}")
        return 0

    train.set_defaults(run=run)


@_subcommand
def _add_data(subparsers) -> None:
    parser = subparsers.add_parser("data", help="prepare pretraining data")
    actions = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare", help="corpus -> masked sentence pairs -> TFRecord shards (original format)"
    )
    prepare.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="SRC",
        help="text files/globs (one sentence per line, blank line between documents), .jsonl "
        "(text field), tfds:NAME[/CONFIG][:SPLIT], or embedded[:train|eval]",
    )
    prepare.add_argument(
        "--tokenizer", required=True, metavar="TOK", help="tokenizer dir, .model or vocab.txt"
    )
    prepare.add_argument("--output", required=True, metavar="DIR")
    prepare.add_argument("--max-seq-length", type=int, default=128)
    prepare.add_argument("--max-predictions-per-seq", type=int, default=20)
    prepare.add_argument("--masked-lm-prob", type=float, default=0.15)
    prepare.add_argument("--short-seq-prob", type=float, default=0.1)
    prepare.add_argument("--dupe-factor", type=int, default=5)
    prepare.add_argument("--seed", type=int, default=12345)
    prepare.add_argument("--whole-word-mask", action="store_true")
    prepare.add_argument("--num-workers", type=int, default=1)
    prepare.add_argument(
        "--shard-index", type=int, default=0, help="this machine's index when several share work"
    )
    prepare.add_argument("--num-shards", type=int, default=1, help="number of machines")
    prepare.add_argument(
        "--documents-per-shard",
        type=int,
        default=1000,
        help="documents per output file; bounds memory (random next sentences come from the same "
        "group of documents)",
    )
    prepare.add_argument("--tfds-data-dir", default=None)
    prepare.add_argument("--text-field", default="text", help="JSONL / TFDS field with the text")
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

    def run(args) -> int:
        import logging

        from bert_jax.data.prepare import prepare_records

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        try:
            result = prepare_records(
                args.input,
                args.tokenizer,
                args.output,
                max_seq_length=args.max_seq_length,
                max_predictions_per_seq=args.max_predictions_per_seq,
                masked_lm_prob=args.masked_lm_prob,
                short_seq_prob=args.short_seq_prob,
                dupe_factor=args.dupe_factor,
                seed=args.seed,
                whole_word_mask=args.whole_word_mask,
                num_workers=args.num_workers,
                shard_index=args.shard_index,
                num_shards=args.num_shards,
                documents_per_shard=args.documents_per_shard,
                tfds_data_dir=args.tfds_data_dir,
                text_field=args.text_field,
                sentence_split=args.sentence_split,
                max_line_bytes=args.max_line_bytes,
                strict=args.strict,
                overwrite=args.overwrite,
            )
        except (ValueError, FileNotFoundError) as err:
            return _data_error("data prepare", err)
        print(result.summary())
        for problem in result.corpus_stats.problems:
            print(f"  skipped: {problem}")
        return 0

    prepare.set_defaults(run=run)


# Commands whose flags include ml_collections config overrides (`--config.key=value`): absl
# parses their arguments; argparse only lists them in `bert-jax --help`.
_CONFIG_COMMANDS: dict = {}


def _config_command(name: str, summary: str):
    def register(fn):
        _CONFIG_COMMANDS[name] = fn
        _ADDERS.append(lambda subparsers: subparsers.add_parser(name, help=summary, add_help=False))
        return fn

    return register


def _parse_config_flags(command: str, argv: list[str], define_extra):
    """Parses `--config FILE[:ARG] --config.key=value ...` plus the command's own flags."""
    from absl import flags
    from ml_collections import config_flags

    # absl spells flags with underscores; accept the dashed spelling the other commands use.
    normalized = []
    for arg in argv:
        if arg.startswith("--") and not arg.startswith("--config"):
            name, sep, value = arg[2:].partition("=")
            arg = "--" + name.replace("-", "_") + sep + value
        normalized.append(arg)
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config",
        None,
        "config file, e.g. configs/bert.py:base",
        flag_values=flag_values,
        lock_config=True,
        # The overrides come from `argv` (so `main([...])` works in-process), not sys.argv.
        sys_argv=[f"bert-jax {command}", *normalized],
    )
    define_extra(flags, flag_values)
    if any(arg in ("-h", "--help") for arg in argv):
        print(f"usage: bert-jax {command} --config FILE[:ARG] [--config.key=value ...] [flags]\n")
        print(flag_values.get_help())
        raise SystemExit(0)
    try:
        flag_values([f"bert-jax {command}", *normalized])
    except flags.Error as err:
        raise SystemExit(f"bert-jax {command}: error: {err}") from None
    if flag_values.config is None:
        raise SystemExit(f"bert-jax {command}: error: --config is required")
    return flag_values


@_config_command(
    "pretrain",
    "pretrain BERT: --config configs/bert.py:SIZE --workdir DIR [--config.key=value ...]",
)
def _run_pretrain(argv: list[str]) -> int:
    from bert_jax import distributed

    def define(flags, flag_values):
        flags.DEFINE_string(
            "workdir", None, "run directory (created; resumed)", flag_values=flag_values
        )
        flags.DEFINE_bool(
            "dry_run",
            False,
            "print the resolved config and phase plan, then exit",
            flag_values=flag_values,
        )
        flags.DEFINE_bool(
            "compile_only",
            False,
            "compile the train step of every phase for the mesh from shapes alone (no state, no "
            "data), print its memory per device and exit (status 4: does not fit)",
            flag_values=flag_values,
        )
        flags.DEFINE_float(
            "device_memory_gib",
            None,
            "with --compile-only: device memory to check against (default: reported by the device)",
            flag_values=flag_values,
        )
        distributed.define_flags(flags, flag_values)

    flag_values = _parse_config_flags("pretrain", argv, define)
    from bert_jax import pretrain

    config = flag_values.config
    if flag_values.dry_run:
        print(pretrain.describe(config))
        return 0
    try:
        # Multi-process jobs join up before anything touches a device.
        distributed.initialize_from_flags(flag_values)
    except ValueError as err:
        return _data_error("pretrain", err)
    if flag_values.compile_only:
        from bert_jax import compile_check

        try:
            return compile_check.main(config, flag_values.device_memory_gib)
        except ValueError as err:
            return _data_error("pretrain", err)
    if not flag_values.workdir:
        return _data_error("pretrain", ValueError("--workdir is required"))
    try:
        result = pretrain.pretrain(config, flag_values.workdir)
    except pretrain.NonFiniteError as err:
        print(f"bert-jax pretrain: stopped: {err}", file=sys.stderr)
        return 3
    except (ValueError, FileNotFoundError) as err:
        return _data_error("pretrain", err)
    # 143 = 128 + SIGTERM: a preempted run has not finished, and schedulers should see that.
    return 143 if result.preempted else 0


@_subcommand
def _add_convert(subparsers) -> None:
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
        "bert_config.json, vocab.txt), a Hugging Face dir, or a bert-jax model dir / workdir",
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

    def run(args) -> int:
        from bert_jax.convert.convert import SOURCE_FORMATS, TARGET_FORMATS, convert
        from bert_jax.model_dir import ModelDirError

        (src_format, src), (dst_format, dst) = args.source, args.target
        if src_format not in SOURCE_FORMATS:
            return _data_error(
                "convert", ValueError(f"--from {src_format!r}: use {SOURCE_FORMATS}")
            )
        if dst_format not in TARGET_FORMATS:
            return _data_error("convert", ValueError(f"--to {dst_format!r}: use {TARGET_FORMATS}"))
        try:
            report = convert(
                src_format,
                src,
                dst_format,
                dst,
                drop_heads=args.drop_heads,
                tokenizer=args.tokenizer,
                lowercase=args.lowercase,
                overwrite=args.overwrite,
                vocab_pad_multiple=args.vocab_pad_multiple,
            )
        except (ValueError, FileNotFoundError, FileExistsError, ModelDirError) as err:
            return _data_error("convert", err)
        print(report.summary())
        if args.report_json:
            with open(args.report_json, "w", encoding="utf-8") as f:
                f.write(report.to_json() + "\n")
        return 0

    parser.set_defaults(run=run)


@_subcommand
def _add_encode(subparsers) -> None:
    parser = subparsers.add_parser(
        "encode",
        help="extract features (the paper's feature-based approach) for lines of text",
        description="One example per line (`A ||| B` for a pair). Writes float32 OUT.npy: [N, D] "
        "for --pool cls|mean, or [N, L, D] zero-padded per-token features plus OUT.lengths.npy "
        "(int32 [N], real tokens per row) for --pool none.",
    )
    parser.add_argument("--model", required=True, metavar="MODEL", help="model dir or workdir")
    parser.add_argument("--input", required=True, metavar="TEXTS.txt")
    parser.add_argument("--output", required=True, metavar="OUT.npy")
    parser.add_argument(
        "--pool",
        default="cls",
        choices=["cls", "mean", "none"],
        help="cls: hidden state at [CLS]; mean: average over real tokens; none: every token",
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
        "--dtype", default=None, choices=["float32", "bfloat16"], help="compute dtype"
    )

    def run(args) -> int:
        from bert_jax.encode import encode_file
        from bert_jax.model_dir import ModelDirError

        try:
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
        except (ValueError, FileNotFoundError, ModelDirError) as err:
            return _data_error("encode", err)
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

    parser.set_defaults(run=run)


def _add_finetune_flags(parser, sweep: bool) -> None:
    """Flags shared by `finetune` and `glue` (defaults None: the library's defaults apply)."""
    parser.add_argument("--model", required=True, metavar="MODEL", help="model dir or workdir")
    parser.add_argument(
        "--data",
        required=True,
        metavar="DATA",
        help="local GLUE directory (CoLA/train.tsv, MNLI/dev_matched.tsv, ...) or tfds[:DATA_DIR]",
    )
    parser.add_argument("--workdir", required=True, metavar="DIR")
    if not sweep:
        parser.add_argument("--learning-rate", type=float, default=None, help="default 2e-5")
        parser.add_argument("--seed", type=int, default=None, help="default 0")
    parser.add_argument("--epochs", type=float, default=None, help="default 3")
    parser.add_argument("--batch-size", type=int, default=None, help="default 32")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="default 32")
    parser.add_argument("--max-seq-length", type=int, default=None, help="default 128")
    parser.add_argument("--warmup-proportion", type=float, default=None, help="default 0.1")
    parser.add_argument("--weight-decay", type=float, default=None, help="default 0.01")
    parser.add_argument("--dropout", type=float, default=None, help="default 0.1")
    parser.add_argument(
        "--adam-bias-correction",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Adam bias correction (default on; --no-adam-bias-correction matches the original "
        "code's optimizer)",
    )
    parser.add_argument(
        "--eval-every-epoch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also evaluate on dev after every epoch",
    )
    parser.add_argument(
        "--mesh-shape",
        type=lambda text: tuple(int(x) for x in text.split(",")),
        default=None,
        metavar="DATA,FSDP,TENSOR",
        help="device mesh (default -1,1,1: data parallel over every device)",
    )
    parser.add_argument("--log-every", type=int, default=None, help="steps between log lines")
    parser.add_argument(
        "--predict-test",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write test-set predictions in the GLUE submission format (default on)",
    )


_FINETUNE_SETTINGS = (
    "learning_rate",
    "seed",
    "epochs",
    "batch_size",
    "eval_batch_size",
    "max_seq_length",
    "warmup_proportion",
    "weight_decay",
    "dropout",
    "adam_bias_correction",
    "eval_every_epoch",
    "mesh_shape",
    "log_every",
)


def _finetune_overrides(args) -> dict:
    return {name: getattr(args, name, None) for name in _FINETUNE_SETTINGS}


def _log_finetune_progress() -> None:
    """Our progress lines at INFO; other libraries' (Orbax, absl) only from WARNING up."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("bert_jax.finetune").setLevel(logging.INFO)


def _glue_errors():
    from bert_jax.model_dir import ModelDirError

    return (ValueError, FileNotFoundError, ModelDirError)


@_subcommand
def _add_finetune(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune on one GLUE task with one setting (the unit of `bert-jax glue`)",
        description="Writes DIR/result.json (dev metrics, settings, history) and the test-set "
        "predictions in the GLUE submission format (e.g. DIR/CoLA.tsv).",
    )
    parser.add_argument("--task", required=True, metavar="glue/NAME", help="e.g. glue/MRPC")
    _add_finetune_flags(parser, sweep=False)

    def run(args) -> int:
        from bert_jax.finetune import sweep

        _log_finetune_progress()
        try:
            options = sweep.sweep_options(overrides=_finetune_overrides(args))
            record = sweep.run_single(
                args.model,
                args.task,
                args.data,
                args.workdir,
                settings=options["settings"],
                predict_test=args.predict_test is not False,
            )
        except _glue_errors() as err:
            return _data_error("finetune", err)
        print(f"{record['task']} dev: {record['dev_metrics']} -> {args.workdir}/result.json")
        return 0

    parser.set_defaults(run=run)


@_subcommand
def _add_glue(subparsers) -> None:
    parser = subparsers.add_parser(
        "glue",
        help="the paper's GLUE protocol: tasks x learning rates x seeds, resumable, with reports",
        description="Each trial is saved as it ends (DIR/trials/TASK/lr=LR_seed=SEED/result.json); "
        "running the same command again resumes. Writes DIR/results.{json,csv,md}, "
        "DIR/plots/TASK.png and DIR/submission/*.tsv (best-on-dev trial per task).",
    )
    _add_finetune_flags(parser, sweep=True)
    parser.add_argument(
        "--tasks", nargs="+", default=None, metavar="TASK", help="default: all nine GLUE tasks"
    )
    parser.add_argument(
        "--learning-rates",
        nargs="+",
        type=float,
        default=None,
        metavar="LR",
        help="default: the paper's 5e-5 4e-5 3e-5 2e-5",
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, default=None, metavar="SEED", help="default: 0"
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="sweep options from a .json file or a .py file with get_config() (flags override)",
    )

    def run(args) -> int:
        from bert_jax.finetune import sweep

        _log_finetune_progress()
        overrides = _finetune_overrides(args)
        overrides.update(
            tasks=args.tasks,
            learning_rates=args.learning_rates,
            seeds=args.seeds,
            predict_test=args.predict_test,
        )
        try:
            options = sweep.sweep_options(args.config, overrides)
            outcome = sweep.run_sweep(args.model, args.data, args.workdir, **options)
        except _glue_errors() as err:
            return _data_error("glue", err)
        print(
            f"{len(outcome.ran)} trials run, {len(outcome.reused)} finished earlier; "
            f"reports in {args.workdir}/results.md"
        )
        return 0

    parser.set_defaults(run=run)


@_config_command(
    "bench",
    "training throughput (tokens/s, MFU) of the real train step, optionally beside Hugging "
    "Face's Flax BERT: --config configs/bert.py:SIZE [--peer hf-flax]",
)
def _run_bench(argv: list[str]) -> int:
    def define(flags, flag_values):
        define = lambda kind, name, default, help: getattr(flags, f"DEFINE_{kind}")(  # noqa: E731
            name, default, help, flag_values=flag_values
        )
        define("integer", "steps", 10, "timed steps per window")
        define("integer", "windows", 5, "timed windows; figures are medians over windows")
        define("integer", "warmup", 2, "untimed steps after compiling")
        define("integer", "seq_len", None, "sequence length (default: phase 1's)")
        define("integer", "batch", None, "global batch size (default: that phase's)")
        define("string", "peer", None, "also time a peer in the same run: hf-flax")
        define("string", "peer_python", None, "the peer's Python (default: .venv-peer/bin/python)")
        define("bool", "real_data", False, "instances from the embedded corpus, real lengths")
        define("bool", "packing", False, "pack several instances per row (implies --real-data)")
        define("bool", "compare_unpacked", False, "with --packing: also time the rows unpacked")
        define("float", "packing_factor", 0.0, "rows read per packed row (0: most, <1% dropped)")
        define("string", "tokenizer", None, "tokenizer for --real-data (default: see bench.py)")
        define("string", "rng_impl", "", "our dropout PRNG (default: config.dropout_rng_impl)")
        define("string", "peer_rng_impl", "", "the peer's dropout PRNG (default threefry2x32)")
        define("integer", "devices", 0, "devices to use (default: all; 1 with --peer)")
        define("float", "peak_tflops", 0.0, "peak TFLOP/s per chip, for MFU on unlisted chips")
        define("string", "json", None, "also write the report as JSON to this file")

    flag_values = _parse_config_flags("bench", argv, define)
    from bert_jax import bench

    try:
        spec = bench.spec_from_config(
            flag_values.config,
            seq_len=flag_values.seq_len,
            batch_size=flag_values.batch,
            steps=flag_values.steps,
            windows=flag_values.windows,
            warmup_steps=flag_values.warmup,
            data="embedded" if flag_values.real_data or flag_values.packing else "synthetic",
            packing=flag_values.packing,
            packing_factor=flag_values.packing_factor,
            tokenizer=flag_values.tokenizer or "",
            rng_impl=flag_values.rng_impl,
            peer_rng_impl=flag_values.peer_rng_impl,
            num_devices=flag_values.devices,
            peak_tflops=flag_values.peak_tflops,
        )
        report = bench.run(
            spec,
            peer=flag_values.peer,
            peer_python=flag_values.peer_python,
            compare_unpacked=flag_values.compare_unpacked,
        )
    except (ValueError, FileNotFoundError, bench.PeerMissingError) as err:
        return _data_error("bench", err)
    print(report.render())
    if flag_values.json:
        bench.write_json(report, flag_values.json)
    return 0


@_subcommand
def _add_launch(subparsers) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="run `bert-jax pretrain` on a Cloud TPU VM slice or a SLURM GPU cluster",
        description="Thin launchers over `bert-jax pretrain`; pretrain arguments go after --. "
        "--dry-run prints every command (or the sbatch script) instead of running it. "
        "Recipes: launch/README.md.",
    )
    kinds = parser.add_subparsers(dest="launch_kind", required=True, metavar="KIND")
    _add_launch_tpu(kinds)
    _add_launch_slurm(kinds)


def _add_launch_tpu(kinds) -> None:
    from bert_jax.launch import tpu

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", required=True, help="TPU VM name")
    common.add_argument("--zone", required=True, help="e.g. us-central2-b")
    common.add_argument("--project", default=None, help="default: gcloud's configured project")
    common.add_argument(
        "--remote-dir", default="bert-jax", help="directory under each worker's home"
    )
    common.add_argument("--dry-run", action="store_true", help="print the gcloud commands only")
    creating = argparse.ArgumentParser(add_help=False)
    creating.add_argument("--accelerator-type", default="v4-32")
    creating.add_argument("--version", default="tpu-ubuntu2204-base", help="TPU VM software")
    creating.add_argument("--spot", action="store_true", help="a Spot (preemptible) TPU VM")
    installing = argparse.ArgumentParser(add_help=False)
    installing.add_argument(
        "--source", default=None, help="bert-jax checkout to copy (default: this one)"
    )
    installing.add_argument("--archive", default=None, help="where to pack it locally")
    installing.add_argument("--jax-spec", default=None, help="default: jax[tpu]==<local jax>")
    installing.add_argument(
        "--setup-command",
        action="append",
        default=[],
        metavar="SHELL",
        help="extra shell line run on every worker after the install (e.g. a gcsfuse mount)",
    )
    running = argparse.ArgumentParser(add_help=False)
    running.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment"
    )
    running.add_argument(
        "--no-follow", action="store_true", help="do not stream worker 0's log after the start"
    )
    running.add_argument(
        "pretrain_args", nargs="*", metavar="-- PRETRAIN_ARGS", help="bert-jax pretrain args"
    )
    viewing = argparse.ArgumentParser(add_help=False)
    viewing.add_argument("--worker", type=int, default=0, help="whose log to stream")
    parser = kinds.add_parser("tpu", help="Cloud TPU VM slice: create, setup, run, logs, stop")
    actions = parser.add_subparsers(dest="tpu_action", required=True, metavar="ACTION")
    helps = {
        "up": ("create (or reuse), setup, run", [common, creating, installing, running]),
        "create": ("create the TPU VM unless it exists", [common, creating]),
        "setup": ("copy this source tree to every worker and install it", [common, installing]),
        "run": ("start bert-jax pretrain on every worker; stream worker 0", [common, running]),
        "logs": ("stream a worker's log", [common, viewing]),
        "stop": ("SIGTERM every worker: checkpoint at the same step, then exit", [common]),
        "delete": ("delete the TPU VM", [common]),
    }
    for action, (summary, parents) in helps.items():
        actions.add_parser(action, help=summary, parents=parents)

    def run(args) -> int:
        from bert_jax.launch import LaunchError, Runner

        try:
            vm = tpu.TpuVm(
                name=args.name,
                zone=args.zone,
                project=args.project,
                accelerator_type=getattr(args, "accelerator_type", "v4-32"),
                version=getattr(args, "version", "tpu-ubuntu2204-base"),
                spot=getattr(args, "spot", False),
                remote_dir=args.remote_dir,
            )
            tpu.perform(
                args.tpu_action,
                vm,
                Runner(dry_run=args.dry_run),
                pretrain_args=getattr(args, "pretrain_args", ()),
                env=tpu.parse_env(getattr(args, "env", ())),
                follow=not getattr(args, "no_follow", False),
                source_dir=getattr(args, "source", None),
                archive=getattr(args, "archive", None),
                jax_spec=getattr(args, "jax_spec", None),
                setup_commands=getattr(args, "setup_command", ()),
                worker=getattr(args, "worker", 0),
            )
        except LaunchError as err:
            return _data_error(f"launch tpu {args.tpu_action}", err)
        return 0

    parser.set_defaults(run=run)


def _add_launch_slurm(kinds) -> None:
    parser = kinds.add_parser(
        "slurm",
        help="write (and --submit) an sbatch script for GPU nodes",
        description="One process per GPU (--per gpu) or per node (--per node); the coordinator is "
        "the first node of the allocation.",
    )
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--per", choices=["gpu", "node"], default="gpu")
    parser.add_argument("--job-name", default="bert-jax")
    parser.add_argument("--partition", default=None)
    parser.add_argument("--account", default=None)
    parser.add_argument("--time", default=None, help="e.g. 4-00:00:00")
    parser.add_argument("--cpus-per-task", type=int, default=None)
    parser.add_argument("--port", type=int, default=None, help="default: from the job id")
    parser.add_argument("--output", default=None, help="default: JOB_NAME-%%j.out")
    parser.add_argument("--bert-jax", default="bert-jax", help="the executable on the nodes")
    parser.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="SHELL",
        help="shell line run first, e.g. 'source ~/venv/bin/activate'",
    )
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--sbatch-option",
        action="append",
        default=[],
        metavar="OPT",
        help="extra #SBATCH option, e.g. exclusive or mem=0 (or --sbatch-option=--exclusive)",
    )
    parser.add_argument("--script", default=None, help="default: JOB_NAME.sbatch")
    parser.add_argument("--submit", action="store_true", help="run sbatch on the script")
    parser.add_argument("--dry-run", action="store_true", help="print the script only")
    parser.add_argument(
        "pretrain_args", nargs="*", metavar="-- PRETRAIN_ARGS", help="bert-jax pretrain args"
    )

    def run(args) -> int:
        from bert_jax.launch import LaunchError, Runner, slurm

        try:
            job = slurm.SlurmJob(
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                per=args.per,
                job_name=args.job_name,
                partition=args.partition,
                account=args.account,
                time=args.time,
                cpus_per_task=args.cpus_per_task,
                port=args.port,
                output=args.output,
                bert_jax=args.bert_jax,
                setup=tuple(args.setup),
                env=slurm.parse_env(args.env),
                sbatch_options=tuple(args.sbatch_option),
            )
            slurm.write_and_submit(
                job,
                args.pretrain_args,
                args.script or f"{args.job_name}.sbatch",
                Runner(dry_run=args.dry_run),
                submit=args.submit,
            )
        except LaunchError as err:
            return _data_error("launch slurm", err)
        return 0

    parser.set_defaults(run=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bert-jax", description="BERT pretraining, conversion and evaluation in JAX/Flax."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _ADDERS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # TensorFlow (tf.data only) would otherwise log its CPU-feature banners on every start.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if argv and argv[0] in _CONFIG_COMMANDS:
        return int(_CONFIG_COMMANDS[argv[0]](argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    result = args.run(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
