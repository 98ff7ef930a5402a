"""`bert-jax finetune` (one GLUE, SQuAD, CoNLL-2003 or SWAG task, one setting; or one task from
each checkpoint of a pretraining run) and `bert-jax glue`."""

from __future__ import annotations

import argparse
import sys

from bert_jax.finetune.tuning import settings as declared

# Every fine-tuning setting, its flag, help, default and range come from its declaration
# (`FinetuneSettings` in bert_jax/finetune/tuning/settings.py, which imports no NumPy); a flag
# left unset (None) keeps the task's recipe or the declared default.


def add_to(subparsers) -> None:
    _add_finetune(subparsers)
    _add_glue(subparsers)


def _add_finetune(subparsers) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune on one GLUE task with one setting (the unit of `bert-jax glue`), or on "
        "SQuAD v1.1/v2.0, CoNLL-2003 NER (fine-tuned or feature-based) or SWAG",
        description="Writes DIR/result.json (dev metrics, settings, history), the fine-tuned "
        "model (DIR/model/, which `bert-jax predict` reads; --keep-models) and the test-set "
        "predictions in the GLUE submission format (e.g. DIR/CoLA.tsv). SQuAD: "
        "DIR/predictions.json (and null_odds.json for v2.0) in the official format, the official "
        "EM/F1 in result.json, DIR/results.md; --data is a directory with train-v1.1.json and "
        "dev-v1.1.json (v2.0 alike), the train JSON (dev from --dev-data) or tfds[:DATA_DIR]. "
        "CoNLL-2003: DIR/dev_predictions.txt (conlleval's format), span F1 in result.json; --data "
        "is a directory of column files (eng.train/eng.testa/eng.testb or train.txt/valid.txt/"
        "test.txt) or tfds[:DATA_DIR]. SWAG: --data holds the official train.csv, val.csv "
        "(and test.csv); DIR/dev_predictions.csv and test_predictions.csv, dev accuracy in "
        "result.json.",
    )
    parser.add_argument(
        "--task",
        required=True,
        metavar="glue/NAME",
        help="a GLUE task (e.g. glue/MRPC), or squad/v1.1, squad/v2.0, conll2003, swag; the "
        "flags' defaults below are per task",
    )
    _add_shared_flags(parser, sweep=False)
    _add_span_flags(parser)
    _add_paper_flags(parser)
    parser.set_defaults(run=_run_finetune, command_name="finetune")


def _add_paper_flags(parser) -> None:
    """The paper's other evaluations: the feature-based tagger (Table 7), the step curve
    (Figure 5). SWAG (Table 4) is `--task swag`."""
    group = parser.add_argument_group("feature-based NER and the pretraining-step curve")
    group.add_argument(
        "--features",
        default=None,
        metavar="VARIANT",
        help="CoNLL-2003: keep BERT frozen and train a two-layer BiLSTM tagger on these layers "
        "(Table 7): embeddings, second_to_last, last, sum_last_four (learned weighted sum), "
        "concat_last_four, sum_all (learned weighted sum of every layer); default: fine-tune "
        "the whole model",
    )
    group.add_argument(
        "--lstm-size", type=int, default=768, help="--features: BiLSTM units each way"
    )
    group.add_argument(
        "--each-checkpoint",
        action="store_true",
        help="MODEL is a pretraining workdir: fine-tune from each retained checkpoint into "
        "DIR/steps/step=N/ (resumable) and plot the dev score against the step (Figure 5) in "
        "DIR/curve.{json,md} and DIR/plots/curve.png",
    )
    group.add_argument(
        "--steps",
        nargs="+",
        type=int,
        default=None,
        metavar="STEP",
        help="--each-checkpoint: only these checkpoint steps (default: every retained one)",
    )


def _add_span_flags(parser) -> None:
    """SQuAD's and CoNLL-2003's own options (the GLUE tasks ignore them); their defaults are
    squad_and_conll.SpanOptions' (spelled here to keep NumPy out of `--help`; a test holds them
    equal)."""
    group = parser.add_argument_group("SQuAD and CoNLL-2003")
    group.add_argument("--doc-stride", type=int, default=128, help="SQuAD window stride")
    group.add_argument("--max-query-length", type=int, default=64, help="question sub-tokens")
    group.add_argument("--n-best-size", type=int, default=20, help="SQuAD candidate answers")
    group.add_argument("--max-answer-length", type=int, default=30, help="answer sub-tokens")
    group.add_argument(
        "--null-score-diff-threshold",
        type=float,
        default=0.0,
        help="SQuAD v2.0: answer '' when null score - best score exceeds this (tune it on dev "
        "with result.json's best_f1_thresh)",
    )
    group.add_argument(
        "--document-context",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="CoNLL-2003: fill each window with the sentence's document around it",
    )
    group.add_argument(
        "--dev-data",
        default=None,
        metavar="JSON",
        help="SQuAD dev JSON file (default: dev-v1.1.json / dev-v2.0.json in --data)",
    )


def _task_options(args):
    from bert_jax.finetune.runs import one_task as run
    from bert_jax.finetune.runs import squad_and_conll as token_tasks

    span = token_tasks.SpanOptions(
        doc_stride=args.doc_stride,
        max_query_length=args.max_query_length,
        n_best_size=args.n_best_size,
        max_answer_length=args.max_answer_length,
        null_score_diff_threshold=args.null_score_diff_threshold,
        document_context=args.document_context,
        dev_data=args.dev_data,
    )
    return run.TaskOptions(
        span=span,
        features=args.features,
        lstm_size=args.lstm_size,
        predict_test=args.predict_test is not False,
    )


def _run_finetune(args) -> int:
    from bert_jax.finetune.runs import one_task as run
    from bert_jax.runtime import step_buffers

    step_buffers.run_cpu_programs_inline()  # before JAX's CPU backend starts
    _print_progress()
    options = _task_options(args)
    if args.each_checkpoint:
        from bert_jax.finetune.runs import curve

        with _one_writer(args.workdir, "finetune"):
            outcome = curve.run_curve(
                args.model,
                args.task,
                args.data,
                args.workdir,
                _overrides(args),
                options,
                args.steps,
            )
        points = ", ".join(f"{p['step']}: {p['score']:.2f}" for p in outcome["points"])
        print(f"{outcome['task']} {outcome['metric']} by step: {points} -> {args.workdir}/curve.md")
        return 0
    if args.steps is not None:
        from bert_jax.runtime.errors import UserError

        raise UserError("--steps selects checkpoints for --each-checkpoint; add that flag")
    result = run.run_task(
        args.model,
        args.task,
        args.data,
        args.workdir,
        _overrides(args),
        options,
        overwrite=args.overwrite,
    )
    if result.get("reused"):
        print(
            f"{args.workdir} holds this run, finished earlier: its result is reused "
            "(--overwrite trains again)"
        )
    shown = figures(result["dev_metrics"], result["task"])
    print(f"{result['task']} dev: {shown} -> {args.workdir}/result.json")
    for line in baseline_lines(result):
        print(line)
    return 0


def baseline_lines(result: dict) -> list[str]:
    """A sentence task's majority-class baseline on dev, and a line for each split on which the
    model predicted one thing for every example (`references.prediction_notes`)."""
    from bert_jax.finetune.reports import references

    lines = []
    for report_name, baseline in (result.get("dev_baseline") or {}).items():
        lines.append(
            f"{report_name} majority class on dev ({baseline['prediction']!r} for every "
            f"example): {figures(baseline['metrics'])}"
        )
    return lines + [f"warning: {note}" for note in references.prediction_notes(result)]


def figures(metrics: dict, task: str = "") -> str:
    """`accuracy 84.31, f1 88.10` (`tuning_loop.figures`, which the progress lines use too)."""
    from bert_jax.finetune.tuning import tuning_loop

    return tuning_loop.figures(metrics, task)


def _add_glue(subparsers) -> None:
    parser = subparsers.add_parser(
        "glue",
        help="the paper's GLUE protocol: tasks x learning rates x seeds, resumable, with reports",
        description="Each trial is saved as it ends (DIR/trials/TASK/lr=LR_seed=SEED/result.json); "
        "running the same command again resumes. Writes DIR/results.{json,csv,md}, "
        "DIR/plots/TASK.png and DIR/submission/*.tsv (the selected trial per task: best on dev), "
        "and keeps the selected trial's fine-tuned model in its directory "
        "(DIR/trials/TASK/lr=LR_seed=SEED/model/; --keep-models).",
    )
    _add_shared_flags(parser, sweep=True)
    parser.add_argument(
        "--tasks", nargs="+", default=None, metavar="TASK", help="default: all nine GLUE tasks"
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
    from bert_jax.finetune.reports import references
    from bert_jax.finetune.runs import sweep

    _print_progress()
    overrides = _overrides(args)
    overrides.update(tasks=args.tasks, predict_test=args.predict_test)
    overrides.update(
        {option: getattr(args, option) for option in map(declared.swept_option, declared.SWEPT)}
    )
    options = sweep.sweep_options(args.config, overrides)
    with _one_writer(args.workdir, "glue"):
        outcome = sweep.run_sweep(args.model, args.data, args.workdir, **options)
    print(
        f"{len(outcome.ran)} trials run, {len(outcome.reused)} finished earlier; "
        f"reports in {args.workdir}/results.md"
    )
    for task_name, record in outcome.selected.items():
        notes = references.prediction_notes(record)
        if notes:
            print(
                f"{task_name}: the selected trial ({record['trial']}) "
                f"{references.collapse_phrase(record)}: " + "; ".join(notes)
            )
    flagged = [r["trial"] for r in outcome.records if references.prediction_notes(r)]
    if flagged:
        print(
            f"{len(flagged)} of {len(outcome.records)} trials predict a single class on dev or "
            f"test: see 'Trials that predict a single class' in {args.workdir}/results.md"
        )
    return 0


def _one_writer(workdir: str, command: str):
    """The workdir's lock while the command works (`finetune.runs.workdir.one_writer`; on
    process 0)."""
    import jax

    from bert_jax.finetune.runs import workdir as finetune_workdir

    return finetune_workdir.one_writer(workdir, command, writer=jax.process_index() == 0)


def _add_shared_flags(parser, sweep: bool) -> None:
    """Flags shared by `finetune` and `glue` (defaults None: the library's defaults apply)."""
    parser.add_argument("--model", required=True, metavar="MODEL", help="model dir or workdir")
    parser.add_argument(
        "--data",
        required=True,
        metavar="DATA",
        help="local GLUE directory (CoLA/train.tsv, MNLI/dev_matched.tsv, ...) or tfds[:DATA_DIR]"
        + ("" if sweep else "; for the other tasks see the description above"),
    )
    parser.add_argument(
        "--workdir",
        required=True,
        metavar="DIR",
        help="where the results go (a finished one is reused unless --overwrite)"
        if not sweep
        else "where the trials and reports go (a rerun resumes)",
    )
    if not sweep:
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="train again in a workdir that holds a finished result (replacing it)",
        )
    for name, declaration in declared.DECLARATIONS.items():
        _add_setting_flag(parser, name, declaration, sweep)
    parser.add_argument(
        "--predict-test",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write test-set predictions in the GLUE submission format (default on)",
    )


def _add_setting_flag(parser, name: str, declaration, sweep: bool) -> None:
    """The flag of one declared setting; `glue` takes a swept setting as a list
    (`--learning-rates`)."""
    kind = declared.FinetuneSettings.__dataclass_fields__[name].type
    default = declared.DEFAULTS[name]
    limits = declaration.range_text()
    about = declaration.help + (f"; {limits}" if limits and declaration.choices is None else "")
    if sweep and declaration.swept is not None:
        values = " ".join(_shown(value) for value in declaration.swept)
        parser.add_argument(
            f"--{declared.flag_name(declared.swept_option(name))}",
            nargs="+",
            type=float if kind == "float" else int,
            default=None,
            metavar=declaration.metavar or name.upper(),
            help=f"default {values}; each a trial: {about}",
        )
        return
    options: dict = {"default": None, "help": f"{_default(name, default, sweep)}; {about}"}
    if declaration.parse is not None:
        options["type"] = declaration.parse
    elif kind == "bool":
        options["action"] = argparse.BooleanOptionalAction
    elif kind in ("int", "float"):
        options["type"] = int if kind == "int" else float
    if declaration.choices is not None:
        options["choices"] = declaration.choices
    if declaration.metavar is not None:
        options["metavar"] = declaration.metavar
    parser.add_argument(f"--{declared.flag_name(name)}", **options)


def _shown(value) -> str:
    """A default as help shows it: `on`/`off`, `-1,1,1`, `2e-05`."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(x) for x in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


# The defaults of the other tasks' recipes, as `finetune --help` shows them beside GLUE's (the
# declared defaults); each task's registered recipe owns them (`Task.defaults` in
# bert_jax/finetune/tasks/): tests/test_cli_flags.py checks that these agree (importing the
# registry here would load NumPy for `--help`).
_OTHER_TASKS = {
    "learning_rate": {"SQuAD": 5e-5, "CoNLL-2003": 5e-5, "SWAG": 2e-5},
    "batch_size": {"SQuAD v1.1": 32, "SQuAD v2.0": 48, "CoNLL-2003": 32, "SWAG": 16},
    "epochs": {"SQuAD v1.1": 3, "SQuAD v2.0": 2, "CoNLL-2003": 3, "SWAG": 3},
    "max_seq_length": {"SQuAD": 384, "CoNLL-2003": 128, "SWAG": 128},
}
TASK_DEFAULTS = {
    name: {"GLUE": declared.DEFAULTS[name], **others} for name, others in _OTHER_TASKS.items()
}
FEATURES_LEARNING_RATE = 1e-3  # --features (conll.TASKS' feature-based recipe)


def _default(name: str, default, sweep: bool) -> str:
    """`default 2e-05` (glue, and a setting no task's recipe changes); the default of each task
    for finetune."""
    if sweep or name not in TASK_DEFAULTS:
        return f"default {_shown(default)}"
    text = ", ".join(f"{task} {value:g}" for task, value in TASK_DEFAULTS[name].items())
    if name == "learning_rate":
        text += f"; with --features {FEATURES_LEARNING_RATE:g}"
    return f"default per task: {text}"


def _overrides(args) -> dict:
    return {name: getattr(args, name, None) for name in declared.DECLARATIONS}


def _print_progress() -> None:
    """Fine-tuning's progress as plain lines on stdout, as `pretrain` prints its own (no time
    stamp, no logger name); other libraries' (Orbax, absl) only from WARNING up."""
    import logging

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    progress = logging.getLogger("bert_jax.finetune")
    progress.handlers = [handler]
    progress.propagate = False
    progress.setLevel(logging.INFO)
