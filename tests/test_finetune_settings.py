"""Every fine-tuning setting is declared once (a `FinetuneSettings` field: default, help, range or
choices, what it shapes): the `finetune` and `glue` flags, the sweep's matching settings and
lists, the checks and the report's protocol block come from the declaration, and nothing else in
the fine-tuning code writes a setting's default."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import pathlib

import pytest

from bert_jax import cli
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.finetune.runs import sweep
from bert_jax.finetune.tuning import settings as declared
from bert_jax.finetune.tuning.settings import FinetuneSettings
from bert_jax.runtime.errors import UserError
from tests.glue_fixtures.tiny import GLUE_DIR, fixture_tokenizer, tiny_encoder

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "bert_jax"
# The flags of `finetune` and `glue` that are not fine-tuning settings (what to run, where, and
# the other tasks' own options): every other flag must be a declared setting's.
NOT_SETTINGS = {
    "help",
    "model",
    "data",
    "workdir",
    "task",
    "tasks",
    "config",
    "overwrite",
    "predict_test",
    "features",
    "lstm_size",
    "each_checkpoint",
    "steps",
    "doc_stride",
    "max_query_length",
    "n_best_size",
    "max_answer_length",
    "null_score_diff_threshold",
    "document_context",
    "dev_data",
}


def _command(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subcommands.choices[name]


def _setting_flags(parser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_SETTINGS}


def test_every_setting_flag_comes_from_a_declaration_and_shows_its_default():
    finetune = _setting_flags(_command("finetune"))
    assert set(finetune) == set(declared.DECLARATIONS)
    glue = _setting_flags(_command("glue"))
    swept = {declared.swept_option(name): name for name in declared.SWEPT}
    assert set(swept) == {"learning_rates", "seeds"}
    assert set(glue) == (set(declared.DECLARATIONS) - set(swept.values())) | set(swept)
    for dest, action in glue.items():
        name = swept.get(dest, dest)
        declaration = declared.declaration(name)
        assert action.default is None, dest  # unset: the task's recipe or the declared default
        assert declaration.help in action.help, dest
        default = declared.DEFAULTS[name] if dest not in swept else declaration.swept
        shown = [default] if dest not in swept else list(default)
        text = " ".join(
            ("on" if v else "off")
            if isinstance(v, bool)
            else ",".join(map(str, v))
            if isinstance(v, tuple)
            else f"{v:g}"
            if isinstance(v, float)
            else str(v)
            for v in shown
        )
        assert action.help.startswith(f"default {text};"), (dest, action.help)
        if declaration.choices is not None:
            assert tuple(action.choices) == declaration.choices
    assert glue["learning_rates"].nargs == "+" and glue["seeds"].nargs == "+"


def test_each_declaration_says_its_help_and_range_and_its_default_is_in_range():
    for field in dataclasses.fields(FinetuneSettings):
        declaration = field.metadata["declaration"]
        assert declaration.help, field.name
        assert declaration.allows(field.default), field.name
        if declaration.swept is not None:
            assert all(declaration.allows(value) for value in declaration.swept), field.name
    assert sweep.PAPER_LEARNING_RATES == (5e-5, 4e-5, 3e-5, 2e-5)
    assert declared.TRIAL_SETTINGS == (
        "epochs",
        "batch_size",
        "max_seq_length",
        "warmup_proportion",
        "weight_decay",
        "dropout",
        "dropout_impl",
        "clip_norm",
        "adam_bias_correction",
        "adam_epsilon",
        "optimizer",
        "decay_from",
        "group_by_length",
    )


def _literal_defaults(tree: ast.AST):
    """(setting, line) where a declared setting is given its declared default as a literal: an
    assignment or field, a parameter default, a keyword, a dict entry or an
    `add_argument(--flag, default=...)`. A task's registered recipe (`Task(defaults={...})`)
    states the paper's values for that task and is not counted."""
    recipes = {
        id(kw.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg == "defaults" and isinstance(kw.value, ast.Dict)
    }
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            pairs += [(getattr(t, "id", getattr(t, "attr", None)), node.value) for t in targets]
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            names = [a.arg for a in positional[len(positional) - len(node.defaults) :]]
            pairs += zip(names, node.defaults)
            pairs += zip([a.arg for a in node.kwonlyargs], node.kw_defaults)
        elif isinstance(node, ast.Dict) and id(node) not in recipes:
            pairs += [
                (k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
            ]
        elif isinstance(node, ast.Call):
            pairs += [(kw.arg, kw.value) for kw in node.keywords]
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                pairs += [(first.value, kw.value) for kw in node.keywords if kw.arg == "default"]
        for name, value in pairs:
            if not isinstance(name, str) or not isinstance(value, ast.Constant | ast.Tuple):
                continue
            setting = name.lstrip("-").replace("-", "_")
            if setting not in declared.DEFAULTS:
                continue
            try:
                literal = ast.literal_eval(value)
            except ValueError:
                continue
            default = declared.DEFAULTS[setting]
            if type(literal) is type(default) and literal == default:
                yield setting, value.lineno


def _hand_kept_lists(tree: ast.AST):
    """(line, names): a tuple, list or set literal of two or more declared settings' names and
    nothing else — a list of settings kept by hand (as the sweep's matching settings once
    were). A list of a record's columns, some of them settings, is not one."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(names) >= 2 and all(name in declared.DECLARATIONS for name in names):
                yield node.lineno, names


def _checked_files() -> list[pathlib.Path]:
    files = sorted((PACKAGE / "finetune").rglob("*.py")) + [PACKAGE / "cli" / "finetune.py"]
    return [path for path in files if path != PACKAGE / "finetune" / "tuning" / "settings.py"]


def test_no_declared_default_or_list_of_settings_is_written_elsewhere():
    files = _checked_files()
    assert len(files) > 30
    found, lists, flags = [], [], []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(REPO)
        found += [f"{where}:{line} {name}" for name, line in _literal_defaults(tree)]
        lists += [f"{where}:{line} {names}" for line, names in _hand_kept_lists(tree)]
        for node in ast.walk(tree):  # a setting's flag is made from its declaration only
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "add_argument"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).lstrip("-").replace("-", "_") in declared.DEFAULTS
            ):
                flags.append(f"{where}:{node.lineno} {node.args[0].value}")
    assert found == [], "a declared default written outside settings.py"
    assert lists == [], "a hand-kept list of settings (derive it from the declarations)"
    assert flags == [], "a setting's flag added by hand"


def test_the_walk_catches_what_it_should():
    """The checks above find a default, a hand-kept list and a flag when they are there."""
    code = (
        "def f(x, dropout=0.1):\n    pass\n"
        "settings = {'batch_size': 32}\n"
        "KEYS = ('epochs', 'batch_size')\n"
        "COLUMNS = ('trial', 'learning_rate', 'seed')\n"  # a record's columns: not counted
        "Task(defaults={'batch_size': 32})\n"  # a recipe: not counted
    )
    tree = ast.parse(code)
    assert sorted(_literal_defaults(tree)) == [("batch_size", 3), ("dropout", 1)]
    assert list(_hand_kept_lists(tree)) == [(4, ["epochs", "batch_size"])]


def test_settings_outside_their_range_are_one_line_naming_the_flag(tmp_path, capsys):
    with pytest.raises(UserError, match=r"dropout=1\.0 must be in \[0, 1\) \(--dropout\)"):
        FinetuneSettings(dropout=1.0)
    with pytest.raises(UserError, match=r"learning_rate=0\.0 must be > 0 \(--learning-rate\)"):
        FinetuneSettings(learning_rate=0.0)
    with pytest.raises(UserError, match="mesh_shape=.* needs three axes"):
        FinetuneSettings(mesh_shape=(1, 1))
    with pytest.raises(UserError, match=r"learning_rate=-1\.0 must be > 0"):
        sweep.trials_for(["RTE"], [2e-5, -1.0], [0])  # before any trial runs
    base = ["--model", "m", "--data", GLUE_DIR, "--workdir", str(tmp_path / "w")]
    assert cli.main(["finetune", *base, "--task", "glue/RTE", "--warmup-proportion", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(--warmup-proportion)" in err, err
    assert cli.main(["glue", *base, "--tasks", "RTE", "--batch-size", "0"]) == 2
    assert "batch_size=0 must be >= 1 (--batch-size)" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def _changed(name: str):
    """Another allowed value of a setting."""
    default, declaration = declared.DEFAULTS[name], declared.declaration(name)
    if declaration.choices is not None:
        return next(c for c in declaration.choices if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, tuple):
        return (1, 1, 1)
    changed = default / 2 if default else 0.5
    return type(default)(changed) if isinstance(default, float) else default + 1


def test_a_finished_trial_is_reused_exactly_when_its_trial_settings_match(tmp_path):
    """Walks the declarations: a setting that shapes a trial refuses a finished one run with
    another value; any other setting does not."""
    trial = sweep.trials_for(["MRPC"], [2e-5], [0])[0]
    directory = tmp_path / "trials" / "MRPC" / "lr=2e-05_seed=0"
    directory.mkdir(parents=True)
    saved = {"settings": FinetuneSettings().to_dict(), "model": "/m"}
    (directory / sweep.RESULT_NAME).write_text(json.dumps(saved), encoding="utf-8")
    for name, declaration in declared.DECLARATIONS.items():
        if declaration.swept is not None:
            continue  # a trial's own learning rate and seed: its directory
        now = FinetuneSettings(**{name: _changed(name)})
        if declaration.trial:
            with pytest.raises(UserError, match=f"{name}: saved"):
                sweep.load_finished(trial, str(tmp_path), now, "/m")
        else:
            assert sweep.load_finished(trial, str(tmp_path), now, "/m") is not None, name


def test_tuners_are_shared_by_trials_that_differ_only_outside_the_step():
    from bert_jax.core import partitioning
    from bert_jax.finetune.tuning import sentence_tuning as loop

    config, _ = tiny_encoder()
    mesh = partitioning.make_mesh((-1, 1, 1))
    first = loop.fine_tuner(config, 2, mesh, FinetuneSettings())
    other_trial = FinetuneSettings(learning_rate=1e-4, seed=3, epochs=1.0, log_every=7)
    assert loop.fine_tuner(config, 2, mesh, other_trial) is first
    other_step = FinetuneSettings(weight_decay=0.0)
    assert loop.fine_tuner(config, 2, mesh, other_step) is not first
    step_names = {name for name, d in declared.DECLARATIONS.items() if d.step}
    assert step_names == {
        "weight_decay",
        "dropout",
        "dropout_impl",
        "clip_norm",
        "adam_bias_correction",
        "adam_epsilon",
        "optimizer",
        "micro_batch_tokens",
    }


def _trial_saved_without(tmp_path, name: str):
    """An MRPC trial finished under tmp_path with the default settings less `name`, as runs
    saved before that setting existed."""
    trial = sweep.trials_for(["MRPC"], [2e-5], [0])[0]
    directory = tmp_path / "trials" / "MRPC" / "lr=2e-05_seed=0"
    directory.mkdir(parents=True)
    before = FinetuneSettings().to_dict()
    del before[name]
    saved = {"settings": before, "model": "/m"}
    (directory / sweep.RESULT_NAME).write_text(json.dumps(saved), encoding="utf-8")
    return trial


def test_a_bert_trial_saved_before_decay_from_existed_ran_its_decay_from_step_0(tmp_path):
    """`decay_from` was added with a new default ("warmup-end"); the "bert" runs saved before it
    decayed from step 0, and are reused only by settings that do."""
    trial = _trial_saved_without(tmp_path, "decay_from")
    with pytest.raises(UserError, match="decay_from: saved 'step-0', now 'warmup-end'"):
        sweep.load_finished(trial, str(tmp_path), FinetuneSettings(), "/m")
    original = FinetuneSettings(decay_from="step-0")
    assert sweep.load_finished(trial, str(tmp_path), original, "/m") is not None
    assert sweep.as_run({"optimizer": "adamw-hf"})["decay_from"] == "warmup-end"


def test_a_bert_trial_saved_before_adam_epsilon_existed_ran_the_original_codes(tmp_path):
    """`adam_epsilon` was added with torch's 1e-8 as its default; the "bert" runs saved before it
    ran the original code's 1e-6, and are reused only by settings that do ("adamw-hf" runs ran
    torch's)."""
    trial = _trial_saved_without(tmp_path, "adam_epsilon")
    with pytest.raises(UserError, match="adam_epsilon: saved 1e-06, now 1e-08"):
        sweep.load_finished(trial, str(tmp_path), FinetuneSettings(), "/m")
    original = FinetuneSettings(adam_epsilon=1e-6)
    assert sweep.load_finished(trial, str(tmp_path), original, "/m") is not None
    assert sweep.as_run({"optimizer": "adamw-hf"})["adam_epsilon"] == 1e-8


def test_a_trial_saved_before_dropout_impl_existed_drew_the_hash_masks(tmp_path):
    """`dropout_impl` was added with the hash as its default, the masks the runs saved before it
    drew: they are reused by default, and not by runs with prng masks."""
    trial = _trial_saved_without(tmp_path, "dropout_impl")
    assert sweep.load_finished(trial, str(tmp_path), FinetuneSettings(), "/m") is not None
    with pytest.raises(UserError, match="dropout_impl: saved 'hash', now 'prng'"):
        sweep.load_finished(trial, str(tmp_path), FinetuneSettings(dropout_impl="prng"), "/m")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    config, params = tiny_encoder()
    path = tmp_path_factory.mktemp("models") / "tiny"
    return save_model_dir(path, config, params, fixture_tokenizer())


def test_a_glue_run_records_the_settings_that_ran(model_dir, tmp_path, capsys):
    workdir = tmp_path / "glue"
    argv = ["glue", "--model", model_dir, "--data", GLUE_DIR, "--workdir", str(workdir)]
    argv += ["--tasks", "RTE", "--learning-rates", "5e-5", "3e-5", "--seeds", "7"]
    argv += ["--epochs", "1", "--batch-size", "8", "--eval-batch-size", "16"]
    argv += ["--max-seq-length", "32", "--warmup-proportion", "0.25", "--weight-decay", "0"]
    argv += ["--no-predict-test", "--log-every", "1"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    with open(workdir / "results.json", encoding="utf-8") as f:
        protocol = json.load(f)["protocol"]
    ran = protocol["settings"]
    assert ran["learning_rate"] == [5e-5, 3e-5] and ran["seed"] == [7]
    assert (ran["epochs"], ran["batch_size"], ran["eval_batch_size"]) == (1.0, 8, 16)
    assert (ran["max_seq_length"], ran["warmup_proportion"], ran["weight_decay"]) == (32, 0.25, 0.0)
    assert ran["log_every"] == 1 and set(ran) == set(declared.DECLARATIONS)
    assert (protocol["epochs"], protocol["batch_size"], protocol["max_seq_length"]) == (1.0, 8, 32)
    with open(workdir / "trials" / "RTE" / "lr=3e-05_seed=7" / "result.json") as f:
        trial = json.load(f)
    assert (trial["settings"]["learning_rate"], trial["settings"]["seed"]) == (3e-5, 7)
    # Progress as every other command prints it: plain lines, no time stamps or logger names.
    assert "RTE/lr=5e-05_seed=7: running" in out and "RTE step 1/1 loss " in out
    assert "bert_jax" not in out and not any(line[:4].isdigit() for line in out.splitlines())
    assert "1 trials run" not in out and "2 trials run, 0 finished earlier" in out
