"""Settings declared once (runtime/declarations.py): the mechanism itself on a toy family, then a
walk over every family that declares with it: no undeclared field, and every option of the
family's commands is a declared setting's flag or a listed non-setting (so a flag added by hand
beside the declarations fails here)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable

import pytest

from bert_jax import cli
from bert_jax.bench import settings as bench_settings
from bert_jax.cli import bench as bench_cli
from bert_jax.cli import config_flags
from bert_jax.cli import plan as plan_cli
from bert_jax.data.preparation import settings as prepare_settings
from bert_jax.data.tokenizers import train_settings as tokenizer_settings
from bert_jax.finetune.tuning import settings as finetune_settings
from bert_jax.inference import encode_settings, fill_mask, predict
from bert_jax.launch import queued, slurm, supervisor, tpu
from bert_jax.planning import candidates as plan_candidates
from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import Declaration, setting
from bert_jax.training import model_eval


def _pair(text: str) -> tuple[int, int]:
    return tuple(int(x) for x in text.split(","))  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class Toy:
    """One setting of each kind the mechanism handles."""

    count: int = setting(3, "how many", low=1)
    share: float = setting(0.5, "a share", low=0.0, high=1.0, high_open=True)
    mode: str = setting("a", "which one", choices=("a", "b"))
    on: bool = setting(True, "on unless --no-on")
    off: bool = setting(False, "off unless --off")
    limit: float | None = setting(None, "an optional limit", low=0.0, low_open=True, zero="none")
    pair: tuple[int, int] = setting((1, -2), "two integers", parse=_pair, metavar="A,B")
    renamed: int = setting(7, "a flag named otherwise", flag="other-name", low=0)
    hidden: int = setting(0, "a setting without a flag", flag="")


def _toy_parser(**options) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    declarations.add_flags(parser, Toy, **options)
    return parser


@pytest.mark.parametrize(
    "declared, text",
    [
        (Declaration("x"), ""),
        (Declaration("x", choices=("bert", "adamw-hf")), "one of bert, adamw-hf"),
        (Declaration("x", low=0, high=1), "in [0, 1]"),
        (Declaration("x", low=0, high=1, low_open=True, high_open=True), "in (0, 1)"),
        (Declaration("x", low=0.0, high=math.inf, low_open=True, high_open=True), "in (0, inf)"),
        (Declaration("x", low=1), ">= 1"),
        (Declaration("x", low=0, low_open=True), "> 0"),
        (Declaration("x", high=5), "<= 5"),
        (Declaration("x", high=5e-5, high_open=True), "< 5e-05"),
    ],
)
def test_range_text(declared, text):
    assert declared.range_text() == text


def test_allows():
    share = Declaration("x", low=0.0, high=1.0, high_open=True)
    assert share.allows(0.0) and share.allows(0.99) and share.allows(None)
    assert not share.allows(1.0) and not share.allows(-0.1) and not share.allows(math.nan)
    positive = Declaration("x", low=0.0, low_open=True)
    assert not positive.allows(0.0) and positive.allows(math.inf)
    finite = Declaration("x", low=0.0, high=math.inf, high_open=True)
    assert finite.allows(0.0) and not finite.allows(math.inf) and not finite.allows(math.nan)
    assert Declaration("x").allows(math.nan)  # no range declared: nothing refused
    choices = Declaration("x", choices=("a", "b"))
    assert choices.allows("a") and not choices.allows("c")


def test_problems_name_each_setting_by_its_flag():
    assert declarations.problems(Toy()) == []
    bad = Toy(count=0, share=1.0, mode="c", renamed=-1, limit=0.0)
    assert declarations.problems(bad) == [
        "--count 0 must be >= 1",
        "--share 1.0 must be in [0, 1)",
        "--mode 'c' is not one of a, b",
        "--limit 0.0 must be > 0",
        "--other-name -1 must be >= 0",
    ]
    named = declarations.problems(Toy(count=0), name_of=lambda name: f"config.toy.{name}")
    assert named == ["config.toy.count 0 must be >= 1"]
    shown = dataclasses.make_dataclass(
        "Shown", [("wait", float, setting(1.0, "w", low=0.0, show=lambda v: f"{v:g}s"))]
    )
    assert declarations.problems(shown(wait=-2.0)) == ["--wait -2s must be >= 0"]


def _options(name: str, **kwargs) -> dict:
    field = {f.name: f for f in declarations.declared_fields(Toy)}[name]
    return declarations.flag_options(field, **kwargs)


def test_flag_options_by_kind():
    count = _options("count")
    assert count["type"] is int and count["default"] == 3
    assert count["help"] == "how many; >= 1 (default 3)"
    share = _options("share")
    assert share["type"] is float and share["help"] == "a share; in [0, 1) (default 0.5)"
    mode = _options("mode")
    assert mode["choices"] == ("a", "b") and "type" not in mode
    assert mode["help"] == "which one (default a)"  # the choices are argparse's to list
    assert _options("on")["action"] is argparse.BooleanOptionalAction
    assert _options("on")["help"] == "on unless --no-on (default on)"
    assert _options("off")["action"] == "store_true" and _options("off")["default"] is False
    limit = _options("limit")
    assert limit["default"] is None and limit["type"] is float
    assert limit["help"] == "an optional limit (none); > 0"  # no default to show but `zero`
    pair = _options("pair")
    assert pair["type"] is _pair and pair["metavar"] == "A,B"
    assert pair["help"] == "two integers (default 1,-2)"


def test_flag_options_unset_is_none_and_the_callers_default_help():
    count = _options("count", unset_is_none=True, default_help="default per task")
    assert count["default"] is None and count["help"] == "how many; >= 1 (default per task)"
    off = _options("off", unset_is_none=True)
    assert off["action"] is argparse.BooleanOptionalAction and off["default"] is None


def test_add_flags_and_from_args():
    parser = _toy_parser()
    options = {o for action in parser._actions for o in action.option_strings}
    assert {"--other-name", "--no-on", "--pair"} <= options
    assert "--renamed" not in options and "--hidden" not in options
    assert declarations.from_args(Toy, parser.parse_args([])) == Toy()
    args = parser.parse_args(["--count", "5", "--no-on", "--other-name", "2", "--pair=3,-4"])
    assert declarations.from_args(Toy, args, mode="b") == Toy(
        count=5, on=False, renamed=2, pair=(3, -4), mode="b"
    )
    only = argparse.ArgumentParser()
    declarations.add_flags(only, Toy, names=["count"])
    assert [a.dest for a in only._actions if a.option_strings != ["-h", "--help"]] == ["count"]
    # Unset flags (None) leave the declared defaults.
    unset = _toy_parser(unset_is_none=True).parse_args(["--share", "0.25"])
    assert declarations.from_args(Toy, unset) == Toy(share=0.25)


def test_to_flags_gives_the_settings_again():
    changed = Toy(count=9, on=False, off=True, limit=2.5, pair=(-1, 0), renamed=0, hidden=4)
    argv = declarations.to_flags(changed)
    assert "--no-on" in argv and "--off" in argv and "--pair=-1,0" in argv
    assert not any(arg.startswith("--hidden") for arg in argv)
    again = declarations.from_args(Toy, _toy_parser().parse_args(argv))
    assert again == dataclasses.replace(changed, hidden=0)  # no flag: not carried
    assert declarations.as_dict(changed)["pair"] == (-1, 0)


def test_undeclared_names_a_plain_field():
    plain = dataclasses.make_dataclass("Plain", [("x", int, 1), ("y", int, setting(2, "y"))])
    assert declarations.undeclared(plain) == ["x"]
    assert declarations.undeclared(Toy) == []
    assert declarations.defaults(plain) == {"y": 2}


def test_marked_settings_and_what_was_recorded_before():
    marked = dataclasses.make_dataclass(
        "Marked",
        [
            ("width", int, setting(8, "w", identity=True)),
            ("cut", str, setting("new", "c", records=True, before="old")),
            ("field", str, setting("text", "f", records=True, reader="field_name")),
            ("strict", bool, setting(False, "s", reader=True)),
        ],
    )
    assert declarations.marked(marked, "identity") == ("width",)
    assert declarations.marked(marked, "records") == ("cut", "field")
    assert declarations.marked(marked, "reader") == ("field", "strict")
    # Recorded from the first manifest on unless `before` says what earlier records had.
    assert declarations.before_recorded(marked) == {"cut": "old"}


# --- every family ----------------------------------------------------------------------------


def _argparse_options(*path: str) -> set[str]:
    """The long options of the command at `path` (`launch tpu watch`), as `bert-jax` parses."""
    parser = cli.build_parser()
    for name in path:
        (subparsers,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = subparsers.choices[name]
    return _long_options(parser)


def _config_command_options(command) -> set[str]:
    """The long options of a command that reads a config (`plan`, ...), as its help lists them."""
    return _long_options(config_flags.help_parser(command, config_flags.define_flags(command)))


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


@dataclasses.dataclass(frozen=True)
class Family:
    """A declared settings class, the options of the commands whose flags set it, and those of
    the options that are not its settings."""

    settings: type
    commands: tuple[Callable[[], set[str]], ...]
    non_settings: frozenset[str]
    # Flags a family derives beyond one per setting (glue's --learning-rates for learning_rate).
    more_flags: Callable[[], set[str]] = set


def _swept_flags() -> set[str]:
    return {
        "--" + finetune_settings.flag_name(finetune_settings.swept_option(name))
        for name in finetune_settings.SWEPT
    }


def _listed(*groups: str) -> frozenset[str]:
    """Options named in groups of words (one group per reason, said in a comment beside it)."""
    return frozenset(" ".join(groups).split())


# Adding a family is one entry here: its class, its commands, and why each other option is not
# one of its settings.
FAMILIES = {
    "finetune": Family(
        finetune_settings.FinetuneSettings,
        (lambda: _argparse_options("finetune"), lambda: _argparse_options("glue")),
        _listed(
            "--task --tasks --model --data --dev-data --workdir",  # what to run on, and where
            "--overwrite",  # an action on the workdir
            "--config",  # glue's sweep file: a path (the options in it are these flags)
            # Output, not a hyperparameter: the GLUE submission files (not declared yet).
            "--predict-test --no-predict-test",
            # SQuAD's and CoNLL's span options (SpanOptions; tests/test_cli_flags.py holds the
            # flags' defaults equal to them; not declared yet).
            "--doc-stride --max-query-length --n-best-size --max-answer-length",
            "--null-score-diff-threshold --document-context --no-document-context",
            # The feature-based tagger (Table 7) and the checkpoint curve (Figure 5).
            "--features --lstm-size --each-checkpoint --steps",
        ),
        _swept_flags,
    ),
    "supervisor": Family(
        supervisor.Policy,
        (
            lambda: _argparse_options("launch", "tpu", "up"),
            lambda: _argparse_options("launch", "tpu", "watch"),
        ),
        _listed(
            # The slice and how it is asked for (the "launch tpu" and "launch tpu capacity"
            # families).
            "--name --zone --project --accelerator-type --version --valid-until-duration",
            "--spot --best-effort --reserved --guaranteed --no-queued",
            # The source the workers install, the job's command and environment (the Job).
            "--remote-dir --source --archive --jax-spec --setup-command --env --workdir",
            "--settings --plan --skip-preflight",
            # Actions, and where the watcher's own output goes.
            "--dry-run --watch --detach --pid-file --log --no-stream --no-follow",
        ),
    ),
    "slurm": Family(
        slurm.SlurmJob,
        (lambda: _argparse_options("launch", "slurm"),),
        _listed(
            # Declared settings whose flags take a line each time (added by cli/launch.py).
            "--setup --env --sbatch-option",
            "--script --submit --dry-run",  # where the script goes, and what is done with it
            "--workdir --note --exit-status",  # `slurm status` and `slurm record`
        ),
    ),
    "data prepare": Family(
        prepare_settings.PrepareSettings,
        (lambda: _argparse_options("data", "prepare"),),
        _listed(
            "--input --tokenizer --output",  # what to prepare, with what, and where
            "--runner --beam-options",  # which engine runs it (the same records either way)
            "--dry-run",  # an action
            # Flags of an earlier way past one machine, refused in one line naming --runner beam.
            "--shard-index --num-shards --merge",
        ),
    ),
    "tokenizer train": Family(
        tokenizer_settings.TokenizerTrainSettings,
        (lambda: _argparse_options("tokenizer", "train"),),
        _listed("--input --output", "--tfds-data-dir"),  # what to train on, where; tfds's cache
    ),
    "plan's search space": Family(
        plan_candidates.Space,
        (lambda: _config_command_options(plan_cli.COMMAND),),
        _listed(
            "--config --topology --prices",  # what to plan, for which slice, at which prices
            "--json --no-json --dry-run --no-dry-run --verbose --no-verbose",  # what it prints
        ),
    ),
    "launch tpu": Family(
        tpu.TpuVm,
        tuple(
            (lambda action=action: _argparse_options("launch", "tpu", action))
            for action in ("create", "setup", "run", "logs", "stop", "delete")
        ),
        _listed(
            "--dry-run",  # an action
            # How the slice is asked for (the "launch tpu capacity" family; --spot sets spot).
            "--spot --best-effort --reserved --guaranteed --valid-until-duration --no-queued",
            "--source --archive --jax-spec --setup-command",  # what setup installs
            "--env --no-follow --settings --plan",  # the run's environment and its settings
            "--worker",  # whose log to stream
        ),
    ),
    "launch tpu capacity": Family(
        queued.Capacity,
        (
            lambda: _argparse_options("launch", "tpu", "create"),
            lambda: _argparse_options("launch", "tpu", "delete"),
        ),
        _listed(
            "--name --zone --project --remote-dir --accelerator-type --version",  # the slice
            "--dry-run",  # an action
        ),
        # A switch per capacity kind, not one flag for the kind.
        lambda: {f"--{kind}" for kind in queued.SWITCHES},
    ),
    "encode": Family(
        encode_settings.EncodeSettings,
        (lambda: _argparse_options("encode"),),
        _listed("--model --input --output"),  # what to encode, and where the features go
    ),
    "bench": Family(
        bench_settings.BenchSettings,
        (lambda: _config_command_options(bench_cli.COMMAND),),
        _listed("--config", "--json"),  # what to time; where the report also goes
    ),
    "eval": Family(
        model_eval.EvalSettings,
        (lambda: _argparse_options("eval"),),
        _listed("--model --data", "--json"),  # what to evaluate on what; how it prints
    ),
    "fill-mask": Family(
        fill_mask.FillMaskSettings,
        (lambda: _argparse_options("fill-mask"),),
        _listed("--model --input", "--json"),  # what to try on which texts; how it prints
    ),
    "predict": Family(
        predict.PredictSettings,
        (lambda: _argparse_options("predict"),),
        _listed("--model --input --output"),  # which model on which rows, and where they go
    ),
}


def _declared_flags(settings: type, negated: bool = False) -> set[str]:
    """The flag of each setting of `settings` that has one; `negated`: and `--no-` for each
    boolean (argparse's BooleanOptionalAction adds it)."""
    flags = set()
    for field in declarations.declared_fields(settings):
        declared = field.metadata["declaration"]
        if declared.flag == "":
            continue
        flag = declarations.flag_name(field.name, declared)
        flags.add(flag)
        if negated and isinstance(field.default, bool):
            flags.add("--no-" + flag[2:])
    return flags


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_field_of_a_family_is_declared(family):
    settings = FAMILIES[family].settings
    assert declarations.undeclared(settings) == []
    for name, declared in declarations.declarations(settings).items():
        default = declarations.defaults(settings)[name]
        assert declared.help, name
        assert declared.allows(default), f"{name}'s default {default!r} is outside its range"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_option_of_a_familys_commands_is_declared_or_listed(family):
    entry = FAMILIES[family]
    derived = _declared_flags(entry.settings, negated=True) | entry.more_flags()
    seen: set[str] = set()
    for command in entry.commands:
        options = command()
        by_hand = options - derived - entry.non_settings
        assert not by_hand, f"flags neither declared nor listed: {by_hand}"
        seen |= options
    # The list stays true: each entry is an option of one of the commands, and no setting.
    assert entry.non_settings <= seen, entry.non_settings - seen
    assert not entry.non_settings & derived
    # Every declared flag is taken by one of the commands at least.
    assert _declared_flags(entry.settings) <= seen, _declared_flags(entry.settings) - seen
