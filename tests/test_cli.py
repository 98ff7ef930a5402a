"""The `bert-jax` command line: every command is registered once with its help, user errors end
in one line and exit status 2 from one place, config overrides are checked against the config,
and a bug keeps its traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from bert_jax import cli
from bert_jax.runtime.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "bert.py:tiny")
DESIGNED = ("tokenizer", "data", "pretrain", "convert", "encode", "finetune", "glue")


def _user_error(capsys, argv, command: str) -> str:
    """Runs argv, which must fail as a user error; returns the message of its one stderr line."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    prefix = f"bert-jax {command}: error: "
    assert err.startswith(prefix), err
    return err[len(prefix) :]


def test_help_lists_every_designed_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in (*DESIGNED, "bench", "launch"):
        assert f"\n    {name}" in out, name


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["tokenizer", "train"], "--vocab-size VOCAB_SIZE"),
        (["data", "prepare"], "--max-predictions-per-seq"),
        (["pretrain"], "--dry-run, --no-dry-run"),
        (["convert"], "--vocab-pad-multiple N"),
        (["encode"], "--pool {cls,last,mean,none}"),
        (["finetune"], "--task glue/NAME"),
        (["glue"], "--learning-rates LR"),
        (["bench"], "--peer-python"),
        (["launch", "tpu", "up"], "--accelerator-type"),
        (["launch", "tpu", "logs"], "--worker"),
        (["launch", "slurm"], "--gpus-per-node"),
    ],
)
def test_every_command_has_help(capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: bert-jax {' '.join(argv)} ") and flag in out, out


def test_config_commands_list_their_flags_under_one_heading(capsys):
    with pytest.raises(SystemExit):
        cli.main(["pretrain", "-h"])
    out = capsys.readouterr().out
    ours = "\n" + out.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    for flag in ("--config CONFIG", "--workdir WORKDIR", "--compile-only, --no-compile-only"):
        assert f"\n  {flag} " in ours or f"\n  {flag}\n" in ours, out
    assert "--device-memory-gib DEVICE_MEMORY_GIB" in ours
    assert "\ndistributed options:\n  --coordinator-address" in out
    names = [line.split()[0] for line in out.splitlines() if line.startswith("  --")]
    assert names and not [name for name in names if "_" in name]


def test_config_commands_take_dashed_flags_and_the_old_spellings(capsys):
    """One flag style (issue 37): dashes, `--no-NAME` for a boolean; absl's underscores and
    `--noNAME` keep working for scripts; absl's errors name the dashed spelling."""
    argv = ["plan", "--config", TINY, "--topology", "v5p-8", "--max-accum", "x"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--max-accum" in err and "--max_accum" not in err
    for spelling in ("--no-dry-run", "--nodry_run", "--no-dry_run"):
        assert cli.main(["pretrain", "--config", TINY, "--dry-run", spelling]) == 2
        assert "--workdir is required" in capsys.readouterr().err


def _leaves(parser, path=(), run=None):
    """(command path, leaf parser, its run function, maybe bound on a parent) of the parser tree."""
    run = parser.get_default("run") or run
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield " ".join(path), parser, run
    for name, child in (subcommands[0].choices if subcommands else {}).items():
        yield from _leaves(child, (*path, name), run)


def test_every_argparse_command_runs_something_and_names_itself_for_errors():
    leaves = {path: (leaf, run) for path, leaf, run in _leaves(cli.build_parser())}
    assert set(leaves) >= {"pretrain", "plan", "bench"}  # listed only: absl parses them
    del leaves["pretrain"], leaves["plan"], leaves["bench"]
    # tokenizer train, data prepare, eval, 6 more, launch tpu (9: with watch and status), slurm
    assert len(leaves) == 19
    for path, (leaf, run) in leaves.items():
        assert leaf.get_default("command_name") == path and callable(run), path


def _help_in_a_fresh_process(before: str, after: str) -> str:
    """The last line printed by `after`, run in a new Python after `before` and
    `cli.main(['--help'])`."""
    code = (
        f"import gc, sys\nfrom bert_jax import cli\n{before}\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"{after}\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_a_bert_jax_process_collects_garbage_after_10000_allocations_not_700():
    """The CLI raises the collector's threshold before a command imports the libraries."""
    said = _help_in_a_fresh_process(
        "before = gc.get_threshold()", "print(before, gc.get_threshold())"
    )
    assert said == "(700, 10, 10) (10000, 20, 20)"


def test_help_imports_no_library_and_module_entry_point_works():
    heavy = "('jax', 'tensorflow', 'flax', 'numpy', 'absl', 'ml_collections')"
    listed = f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy}))"
    assert _help_in_a_fresh_process("", listed) == "[]"
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "bert_jax.cli", "tokenizer", "--help"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0 and "usage: bert-jax tokenizer" in proc.stdout, proc.stderr


def test_the_console_script_exits_with_mains_code_its_objects_kept_from_the_collector():
    """`console_main` (the `bert-jax` script, `python -m bert_jax.cli`) exits with what `main`
    returned, after freezing what is alive (shutdown's collections then skip it)."""
    code = (
        "import gc\nfrom bert_jax import cli\ncli.main = lambda: 3\n"
        "try:\n    cli.console_main()\n"
        "except SystemExit as exit:\n    print(exit.code, gc.get_freeze_count() > 0)\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.split() == ["3", "True"], proc.stderr


def test_console_script_runs():
    script = os.path.join(os.path.dirname(sys.executable), "bert-jax")
    proc = subprocess.run([script, "pretrain", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--config" in proc.stdout and "--workdir" in proc.stdout


def test_config_overrides_work_in_process(capsys):
    argv = ["pretrain", "--config", TINY, "--config.total_steps=1234", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "total_steps = 1234" in out
    assert "steps 0..1110 (1111), seq 128" in out
    # absl's underscore spelling and `--config=FILE` work as well.
    assert cli.main(["pretrain", f"--config={TINY}", "--dry_run"]) == 0


def test_pretrain_without_config_is_a_clear_error(capsys):
    assert "--config is required" in _user_error(
        capsys, ["pretrain", "--workdir", "/x"], "pretrain"
    )


def test_config_file_errors_are_one_line(capsys, tmp_path):
    missing = str(tmp_path / "nope.py")
    message = _user_error(capsys, ["pretrain", "--config", missing, "--dry-run"], "pretrain")
    assert message == f"--config {missing}: no such file\n"
    argv = ["pretrain", "--config", TINY.replace(":tiny", ":hugee"), "--dry-run"]
    message = _user_error(capsys, argv, "pretrain")
    assert "Error whilst parsing config file: unknown model size 'hugee'" in message
    argv = ["bench", "--config", TINY, "--config.phase1.batch_size=1.5"]
    message = _user_error(capsys, argv, "bench")
    assert message == (
        "--config.phase1.batch_size=1.5: an integer setting takes a whole number, not '1.5'\n"
    )
    message = _user_error(capsys, ["bench", "--config", TINY, "--steps", "x"], "bench")
    assert message == "--steps=x: an integer setting takes a whole number, not 'x'\n"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["pretrain", "--config", TINY, "--workdirr", "w"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: bert-jax pretrain --config FILE[:ARG]")
    assert err.endswith(
        "bert-jax pretrain: error: unrecognized argument --workdirr; did you mean --workdir?\n"
    )


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "--config.optimzer.learning_rate=1",
            "--config.optimzer.learning_rate: the config has no setting 'optimzer'; "
            "did you mean --config.optimizer.learning_rate?",
        ),
        (
            "--config.optimizer.learning_rat=1",
            "--config.optimizer.learning_rat: config.optimizer has no setting 'learning_rat'; "
            "did you mean --config.optimizer.learning_rate?",
        ),
        (
            "--noconfig.data.whole_word_mas",
            "--noconfig.data.whole_word_mas: config.data has no setting 'whole_word_mas'; "
            "did you mean --noconfig.data.whole_word_mask?",
        ),
        (
            "--config.total_steps.x=1",
            "--config.total_steps.x: config.total_steps is a int, it has no setting 'x'",
        ),
    ],
)
def test_config_key_typo_names_the_key_and_the_closest_setting(capsys, override, expected):
    for command in ("pretrain", "bench"):
        argv = [command, "--config", TINY, "--dry-run" if command == "pretrain" else "--steps=1"]
        assert _user_error(capsys, [*argv, override], command) == expected + "\n"


def test_config_key_typo_without_a_close_match_lists_the_settings(capsys):
    argv = ["pretrain", "--config", TINY, "--config.optimizer.zzz=1", "--dry-run"]
    message = _user_error(capsys, argv, "pretrain")
    assert message.startswith("--config.optimizer.zzz: config.optimizer has no setting 'zzz' (it")
    assert "learning_rate" in message


def test_pretrain_needs_a_workdir_to_train(capsys):
    message = _user_error(capsys, ["pretrain", "--config", TINY], "pretrain")
    assert message == "--workdir is required\n"


def test_data_commands_name_the_missing_file(capsys, tmp_path):
    missing = str(tmp_path / "missing.txt")
    argv = ["tokenizer", "train", "--input", missing, "--vocab-size", "100", "--output", "t"]
    assert missing in _user_error(capsys, argv, "tokenizer train")
    argv = ["data", "prepare", "--input", "embedded", "--tokenizer", missing]
    assert missing in _user_error(capsys, [*argv, "--output", str(tmp_path / "o")], "data prepare")


def test_convert_and_encode_errors(capsys, tmp_path):
    argv = ["convert", "--from", "tf2", "a", "--to", "hf", "b"]
    assert _user_error(capsys, argv, "convert").startswith("--from 'tf2': use ")
    argv = ["convert", "--from", "hf", "a", "--to", "onnx", "b"]
    assert _user_error(capsys, argv, "convert").startswith("--to 'onnx': use ")
    missing = str(tmp_path / "no_model")
    argv = ["convert", "--from", "hf", missing, "--to", "bert-jax", str(tmp_path / "out")]
    assert missing in _user_error(capsys, argv, "convert")
    argv = ["encode", "--model", missing, "--input", "x.txt", "--output", "y.npy"]
    assert "x.txt" in _user_error(capsys, argv, "encode")  # the input is read first
    with pytest.raises(SystemExit) as exit_info:  # argparse's own usage error, as before
        cli.main([*argv, "--pool", "max"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'max'" in capsys.readouterr().err


def test_finetune_and_glue_errors(capsys, tmp_path):
    missing = str(tmp_path / "no_model")
    common = ["--model", missing, "--data", str(tmp_path), "--workdir", str(tmp_path / "w")]
    message = _user_error(capsys, ["glue", *common, "--tasks", "XNLI"], "glue")
    assert message.startswith("unknown GLUE task 'XNLI'; choose one of MNLI")
    data = str(tmp_path / "no_glue")
    common[3] = data
    message = _user_error(capsys, ["finetune", *common, "--task", "glue/MRPC"], "finetune")
    assert message == f"GLUE data directory not found: {data}\n"


def test_launch_errors_name_the_action(capsys):
    argv = ["launch", "tpu", "run", "--name", "n", "--zone", "z", "--dry-run", "--env", "BAD"]
    assert "--env" in _user_error(capsys, argv, "launch tpu run")
    argv = ["launch", "slurm", "--nodes", "2", "--dry-run"]
    assert "nothing to run" in _user_error(capsys, argv, "launch slurm")


def test_a_user_error_raised_by_the_library_is_one_line(capsys, monkeypatch):
    from bert_jax.inference import encode

    def refuse(*args, **kwargs):
        raise UserError("--input texts.txt: line 3 is empty")

    monkeypatch.setattr(encode, "encode_file", refuse)
    argv = ["encode", "--model", "m", "--input", "texts.txt", "--output", "o.npy"]
    assert _user_error(capsys, argv, "encode") == "--input texts.txt: line 3 is empty\n"


def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
    from bert_jax.inference import encode
    from bert_jax.training import config_checks

    def bug(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(encode, "encode_file", bug)
    with pytest.raises(KeyError, match="a bug"):
        cli.main(["encode", "--model", "m", "--input", "t.txt", "--output", "o.npy"])
    monkeypatch.setattr(config_checks, "dry_run_outline", bug)
    with pytest.raises(KeyError, match="a bug"):
        cli.main(["pretrain", "--config", TINY, "--dry-run"])
    # A config file with a bug is not mistaken for an override typo.
    config = tmp_path / "buggy.py"
    config.write_text("def get_config():\n    return {}.missing\n", encoding="utf-8")
    with pytest.raises(AttributeError, match="missing"):
        cli.main(["pretrain", "--config", str(config), "--config.x=1", "--dry-run"])


@pytest.mark.parametrize(
    "bug",
    [
        ValueError("operands could not be broadcast together with shapes (3,) (4,)"),
        KeyError("a key bert-jax expected"),
        OSError(5, "Input/output error"),
        FileNotFoundError(2, "No such file or directory", "/tmp/a-file-bert-jax-wrote"),
        RuntimeError("an invariant broke"),
    ],
    ids=lambda err: type(err).__name__,
)
def test_anything_but_a_user_error_is_a_bug(monkeypatch, bug):
    """A plain ValueError, KeyError or OSError from inside a command is a bug: it propagates
    (the console script prints its traceback and exits 1), it is never a one-line exit 2."""
    from bert_jax.inference import encode

    def fail(*args, **kwargs):
        raise bug

    monkeypatch.setattr(encode, "encode_file", fail)
    with pytest.raises(type(bug)):
        cli.main(["encode", "--model", "m", "--input", "t.txt", "--output", "o.npy"])


def _user_error_classes() -> list[type[UserError]]:
    """Every UserError subclass the library defines (its modules imported first)."""
    import importlib
    import pkgutil

    import bert_jax

    for module in pkgutil.walk_packages(bert_jax.__path__, "bert_jax."):
        if not module.name.startswith("bert_jax.cli"):
            importlib.import_module(module.name)
    found, todo = [], [UserError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_user_error_class_is_one_line_and_exit_2(capsys, monkeypatch):
    from bert_jax.inference import encode

    classes = _user_error_classes()
    names = {cls.__name__ for cls in classes}
    # The library's own error types are user errors (issue 27 re-based these on UserError).
    for name in (
        "ModelDirError",
        "ConversionError",
        "GlueDataError",
        "HostMismatchError",
        "PeerMissingError",
        "LaunchError",
        "StorageError",
        "CheckpointError",
        "InputError",
        "WorkdirLockedError",
    ):
        assert name in names, name
    for cls in classes:
        # Some classes take extra arguments: build each without __init__ and set its args.
        def refuse(*args, _cls=cls, **kwargs):
            err = _cls.__new__(_cls)
            err.args = (f"--input t.txt: {_cls.__name__}",)
            raise err

        monkeypatch.setattr(encode, "encode_file", refuse)
        argv = ["encode", "--model", "m", "--input", "t.txt", "--output", "o.npy"]
        assert _user_error(capsys, argv, "encode") == f"--input t.txt: {cls.__name__}\n"


def test_debug_env_prints_the_user_errors_traceback(capsys, monkeypatch):
    from bert_jax.inference import encode

    def refuse(*args, **kwargs):
        raise UserError("--input texts.txt: line 3 is empty")

    monkeypatch.setattr(encode, "encode_file", refuse)
    monkeypatch.setenv("BERT_JAX_DEBUG", "1")
    argv = ["encode", "--model", "m", "--input", "texts.txt", "--output", "o.npy"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in refuse" in err
    assert err.endswith("bert-jax encode: error: --input texts.txt: line 3 is empty\n")


def test_help_lists_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for status, words in (
        ("0", "done"),
        ("1", "a bug"),
        ("2", "a user error"),
        ("4", "does not fit"),
        ("143", "stopped by SIGTERM after saving"),
    ):
        assert any(line.split()[:1] == [status] and words in line for line in out.splitlines())


def test_console_script_exit_statuses(tmp_path):
    """The installed entry point: a bug exits 1 with its traceback, a user error 2 in one line."""
    bin_dir = os.path.dirname(sys.executable)
    script = os.path.join(bin_dir, "bert-jax")
    missing = str(tmp_path / "missing.txt")
    argv = [script, "encode", "--model", str(tmp_path), "--input", missing]
    done = subprocess.run(
        [*argv, "--output", str(tmp_path / "o.npy")], capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    code = (
        "import sys; from bert_jax import cli\nfrom bert_jax.inference import encode\n"
        "def bug(*a, **k): raise ValueError('shapes (3,) and (4,) differ')\n"
        "encode.encode_file = bug\n"
        "sys.exit(cli.main(['encode', '--model', 'm', '--input', 't', '--output', 'o.npy']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "ValueError: shapes (3,) and (4,) differ" in done.stderr
