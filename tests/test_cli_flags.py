"""One dialect for every `bert-jax` command: help and a shown default for every flag, the nearest
flag named under the command's own usage for a misspelling, the same spellings everywhere,
`--version`, and no TensorFlow banner on stderr."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib import metadata

import pytest

from bert_jax import cli
from bert_jax.cli import config_flags
from bert_jax.cli import finetune as finetune_cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "bert.py:tiny")


def _leaves(parser, path=()):
    """(command path, parser) of every command of the argparse tree."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield " ".join(path), parser
    for name, child in (subcommands[0].choices if subcommands else {}).items():
        yield from _leaves(child, (*path, name))


def _config_command_parser(name: str):
    """The argparse parser `pretrain`, `plan` or `bench` shows its help and usage with."""
    command = cli._CONFIG_COMMANDS[name]
    return config_flags.help_parser(command, config_flags.define_flags(command))


def _every_command():
    for path, parser in _leaves(cli.build_parser()):
        if path in cli._CONFIG_COMMANDS:
            parser = _config_command_parser(path)
        yield path, parser


def test_every_flag_of_every_command_has_help_and_shows_its_default():
    commands = dict(_every_command())
    assert {"pretrain", "plan", "bench", "data prepare", "launch slurm"} <= set(commands)
    missing, hidden = [], []
    for path, parser in commands.items():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            if not action.help:
                missing.append(f"{path} {action.option_strings[0]}")
                continue
            shown = formatter._expand_help(action)
            default = action.default
            has_default = default not in (None, False, [], argparse.SUPPRESS)
            if has_default and not action.required and "default" not in shown.lower():
                hidden.append(f"{path} {action.option_strings[0]}: {shown}")
    assert missing == [], "flags without help"
    assert hidden == [], "flags whose help hides their default"


def test_bench_help_shows_each_default_once_and_the_common_spellings(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: bert-jax bench --config FILE[:ARG]")
    flat = " ".join(out.split())
    assert "devices to use (0: all; 1 with --peer); >= 0 (default 0)" in flat
    assert ") (default:" not in out
    assert "--batch-size BATCH_SIZE global batch size" in flat and "(also --batch)" in flat
    assert "--max-seq-length MAX_SEQ_LENGTH" in flat and "(also --seq-len)" in flat


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["bench", "--config", TINY, "--seq-len", "64", "--batch", "2"], (64, 2)),
        (["bench", "--config", TINY, "--max-seq-length", "64", "--batch-size", "2"], (64, 2)),
        (["bench", "--config", TINY, "--seq_len=32", "--batch=4"], (32, 4)),
    ],
)
def test_bench_takes_the_common_spellings_and_the_old_ones(argv, expected):
    flag_values = config_flags.parse(cli._CONFIG_COMMANDS["bench"], argv[1:])
    assert (flag_values.max_seq_length, flag_values.batch_size) == expected


def _usage_error(capsys, argv) -> tuple[str, str]:
    """Runs argv, which must be refused by the parser: (its usage line, its error line)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[0], lines[-1]


@pytest.mark.parametrize(
    "argv, command, suggestion",
    [
        (["data", "prepare", "--max-seq-lenght", "64"], "data prepare", "--max-seq-length"),
        (["tokenizer", "train", "--vocab-szie", "9"], "tokenizer train", "--vocab-size"),
        (["finetune", "--task", "glue/RTE", "--learnig-rate", "1"], "finetune", "--learning-rate"),
        (["launch", "slurm", "--gpus-per-mode", "4"], "launch slurm", "--gpus-per-node"),
        (["pretrain", "--config", TINY, "--total_steps", "3"], "pretrain", "--config.total_steps"),
        (["pretrain", "--config", TINY, "--learning-rate=1"], "pretrain", "--config.optimizer."),
        (["plan", "--config", TINY, "--topologie", "v5p-8"], "plan", "--topology"),
        (["bench", "--config", TINY, "--batchsize", "2"], "bench", "--batch-size"),
    ],
)
def test_a_misspelt_flag_gets_its_commands_usage_and_the_nearest_flag(
    capsys, argv, command, suggestion
):
    usage, error = _usage_error(capsys, argv)
    assert usage.startswith(f"usage: bert-jax {command} "), usage
    flag = argv[-2].split("=")[0] if "=" not in argv[-1] else argv[-1].split("=")[0]
    assert error.startswith(f"bert-jax {command}: error: unrecognized argument {flag}; "), error
    assert f"did you mean {suggestion}" in error, error


def test_a_flag_with_no_near_spelling_is_named_alone(capsys):
    _, error = _usage_error(capsys, ["encode", "--zzzzzz", "--model", "m"])
    assert error == "bert-jax encode: error: unrecognized argument --zzzzzz"


def test_abbreviations_and_negative_values_still_parse(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["eval", "--model", "m", "--data", "d", "--batch-s", "4"])
    assert args.batch_size == 4
    args = parser.parse_args(["encode", "--model", "m", "--input", "i", "--output", "o"])
    args = parser.parse_args(
        ["finetune", "--model", "m", "--data", "d", "--workdir", "w", "--task", "squad/v2.0"]
        + ["--null-score-diff-threshold", "-1.5"]
    )
    assert args.null_score_diff_threshold == -1.5


def test_version_is_the_installed_packages(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"bert-jax {metadata.version('bert-jax')}\n"


def test_finetune_help_shows_each_tasks_defaults_from_their_owners(capsys):
    from bert_jax.finetune.runs import conll_features as feature_ner
    from bert_jax.finetune.runs import multiple_choice as swag_task
    from bert_jax.finetune.runs import squad_and_conll as token_tasks
    from bert_jax.finetune.tuning import sentence_tuning as loop

    glue = loop.FinetuneSettings()
    owners = {
        "GLUE": vars(glue),
        "SQuAD": token_tasks.TASK_DEFAULTS["v1.1"],
        "SQuAD v1.1": token_tasks.TASK_DEFAULTS["v1.1"],
        "SQuAD v2.0": token_tasks.TASK_DEFAULTS["v2.0"],
        "CoNLL-2003": token_tasks.TASK_DEFAULTS["conll2003"],
        "SWAG": swag_task.DEFAULTS,
    }
    for name, per_task in finetune_cli.TASK_DEFAULTS.items():
        for task, value in per_task.items():
            assert owners[task][name] == value, (name, task)
    squad = token_tasks.TASK_DEFAULTS
    assert squad["v1.1"]["max_seq_length"] == squad["v2.0"]["max_seq_length"]
    assert squad["v1.1"]["learning_rate"] == squad["v2.0"]["learning_rate"]
    assert feature_ner.DEFAULTS["learning_rate"] == finetune_cli.FEATURES_LEARNING_RATE
    with pytest.raises(SystemExit):
        cli.main(["finetune", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "default per task: GLUE 128, SQuAD 384, CoNLL-2003 128, SWAG 128" in flat
    assert "default per task: GLUE 2e-05, SQuAD 5e-05" in flat
    with pytest.raises(SystemExit):
        cli.main(["glue", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "--max-seq-length MAX_SEQ_LENGTH default 128" in flat and "SQuAD" not in flat


def test_no_tensorflow_banner_on_stderr(tmp_path):
    """TensorFlow's start-up lines (oneDNN, CPU features, absl's InitializeLog warning) are
    silenced in every bert-jax process, here one that imports TensorFlow."""
    script = os.path.join(os.path.dirname(sys.executable), "bert-jax")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    code = (
        "import sys\nfrom bert_jax import cli\n"
        "from bert_jax.cli import data\n"
        "def run(args):\n    import tensorflow as tf\n"  # its banners print on import
        "    print(tf.constant(3).numpy())\n    return 0\n"
        "data._train_tokenizer = run\n"
        "sys.exit(cli.main(['tokenizer', 'train', '--input', 'x', '--vocab-size', '9', "
        "'--output', 'o']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0 and done.stdout == "3\n", done.stderr
    for banner in ("oneDNN", "cpu_feature_guard", "absl::InitializeLog", "This TensorFlow"):
        assert banner not in done.stderr, done.stderr
    done = subprocess.run([script, "data", "prepare", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_span_flags_default_to_the_runs_options():
    """SQuAD's and CoNLL-2003's flags (cli/finetune.py keeps NumPy out of `--help`, so it spells
    them) take the defaults of SpanOptions, the run's owner, and of the answer search."""
    import dataclasses
    import inspect

    from bert_jax.finetune.runs.squad_and_conll import SpanOptions
    from bert_jax.finetune.tasks.squad_answers import answers_from_logits

    parser = argparse.ArgumentParser()
    finetune_cli._add_span_flags(parser)
    flags = {action.dest: action.default for action in parser._actions if action.dest != "help"}
    options = {field.name: field.default for field in dataclasses.fields(SpanOptions)}
    assert flags == options
    search = inspect.signature(answers_from_logits).parameters
    for name in ("n_best_size", "max_answer_length", "null_score_diff_threshold"):
        assert search[name].default == options[name], name


def test_a_duration_default_is_shown_as_the_flag_spells_it():
    """The supervisor's help shows its defaults in the flags' own spelling, which reads back."""
    from bert_jax.launch import durations

    for seconds, text in ((90, "90s"), (120, "2m"), (3600, "1h"), (86400, "1d"), (0.5, "0.5s")):
        assert durations.text(seconds) == text
        assert durations.seconds(text) == seconds
