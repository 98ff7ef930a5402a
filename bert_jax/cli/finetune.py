"""`bert-jax finetune` (one GLUE task, one setting) and `bert-jax glue` (the paper's sweep)."""

from __future__ import annotations

import argparse

# The per-trial settings both commands pass on; a flag left unset (None) keeps the library default.
_SETTINGS = (
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


def add_to(subparsers) -> None:
    _add_finetune(subparsers)
    _add_glue(subparsers)


def _add_finetune(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune on one GLUE task with one setting (the unit of `bert-jax glue`)",
        description="Writes DIR/result.json (dev metrics, settings, history) and the test-set "
        "predictions in the GLUE submission format (e.g. DIR/CoLA.tsv).",
    )
    parser.add_argument("--task", required=True, metavar="glue/NAME", help="e.g. glue/MRPC")
    _add_shared_flags(parser, sweep=False)
    parser.set_defaults(run=_run_finetune, command_name="finetune")


def _run_finetune(args) -> int:
    from bert_jax.finetune import sweep

    _log_progress()
    options = sweep.sweep_options(overrides=_overrides(args))
    record = sweep.run_single(
        args.model,
        args.task,
        args.data,
        args.workdir,
        settings=options["settings"],
        predict_test=args.predict_test is not False,
    )
    print(f"{record['task']} dev: {record['dev_metrics']} -> {args.workdir}/result.json")
    return 0


def _add_glue(subparsers) -> None:
    parser = subparsers.add_parser(
        "glue",
        help="the paper's GLUE protocol: tasks x learning rates x seeds, resumable, with reports",
        description="Each trial is saved as it ends (DIR/trials/TASK/lr=LR_seed=SEED/result.json); "
        "running the same command again resumes. Writes DIR/results.{json,csv,md}, "
        "DIR/plots/TASK.png and DIR/submission/*.tsv (best-on-dev trial per task).",
    )
    _add_shared_flags(parser, sweep=True)
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
    # Not an ml_collections config: sweep options (no --config.key overrides), read by the library.
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="sweep options from a .json file or a .py file with get_config() (flags override)",
    )
    parser.set_defaults(run=_run_glue, command_name="glue")


def _run_glue(args) -> int:
    from bert_jax.finetune import sweep

    _log_progress()
    overrides = _overrides(args)
    overrides.update(
        tasks=args.tasks,
        learning_rates=args.learning_rates,
        seeds=args.seeds,
        predict_test=args.predict_test,
    )
    options = sweep.sweep_options(args.config, overrides)
    outcome = sweep.run_sweep(args.model, args.data, args.workdir, **options)
    print(
        f"{len(outcome.ran)} trials run, {len(outcome.reused)} finished earlier; "
        f"reports in {args.workdir}/results.md"
    )
    return 0


def _add_shared_flags(parser, sweep: bool) -> None:
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


def _overrides(args) -> dict:
    return {name: getattr(args, name, None) for name in _SETTINGS}


def _log_progress() -> None:
    """Our progress lines at INFO; other libraries' (Orbax, absl) only from WARNING up."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("bert_jax.finetune").setLevel(logging.INFO)
