"""The supervisor's policy is declared once (`supervisor.Policy`): the `launch tpu up --watch` and
`launch tpu watch` flags, their defaults, the checks, the detached watcher's command line, the
recorded settings and the docs' stated defaults (the SLURM job's too) agree with the
declarations."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bert_jax import cli
from bert_jax.cli import launch as launch_cli
from bert_jax.launch import LaunchError, durations, events, slurm, workdir_state
from bert_jax.launch.supervisor import Policy
from bert_jax.runtime import declarations

ROOT = Path(__file__).resolve().parent.parent
WATCH = ["launch", "tpu", "watch", "--workdir", "gs://b/run"]
UP = ["launch", "tpu", "up", "--name", "n", "--zone", "z", "--watch"]
DECLARED = declarations.declarations(Policy)


def _flag(name: str) -> str:
    return declarations.flag_name(name, DECLARED[name])


def test_unset_flags_give_the_declared_policy():
    assert launch_cli._policy(cli.build_parser().parse_args(WATCH)) == Policy()
    up = cli.build_parser().parse_args([*UP, "--", "--workdir", "gs://b/run"])
    assert launch_cli._policy(up) == Policy()


def test_every_setting_is_set_by_its_flag_and_survives_the_detached_command_line():
    """Each setting away from its default through its own flag; `--detach` starts `launch tpu
    watch` with flags that parse back to the same policy."""
    given = [
        "--max-failures", "7", "--max-preemptions", "2", "--stall-timeout", "45m",
        "--startup-timeout", "90s", "--stop-grace", "0.5s", "--poll", "2m",
        "--recreate-delay", "0", "--keep",
    ]  # fmt: skip
    args = cli.build_parser().parse_args([*WATCH, *given])
    policy = launch_cli._policy(args)
    assert policy == Policy(7, 2, 2700.0, 90.0, 0.5, 120.0, 0.0, True)
    changed = {n for n, v in policy.to_dict().items() if v != Policy().to_dict()[n]}
    assert changed == set(DECLARED)  # the list above reaches every declared setting
    again = cli.build_parser().parse_args(launch_cli._watch_argv(args, "gs://b/run"))
    assert launch_cli._policy(again) == policy


def _outside(name: str) -> str:
    """A value of `name`'s flag that its declared range refuses."""
    declared = DECLARED[name]
    if declared.high == math.inf:
        return "inf"
    return str(int(declared.low) - 1)


@pytest.mark.parametrize("name", sorted(n for n, d in DECLARED.items() if d.low is not None))
def test_a_value_outside_the_declared_range_is_one_line_naming_the_flag(capsys, name):
    assert cli.main([*WATCH, f"{_flag(name)}={_outside(name)}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bert-jax launch tpu watch: error: {_flag(name)} "), err
    assert DECLARED[name].range_text() in err and err.count("\n") == 1, err


def test_help_shows_each_flag_with_its_declared_default():
    helps = {
        option: action.help
        for action in _watch_parser()._actions
        for option in action.option_strings
    }
    for name, default in declarations.defaults(Policy).items():
        text = helps[_flag(name)]
        assert DECLARED[name].help in text
        if isinstance(default, float):
            assert f"default {durations.text(default)}" in text, text
        elif default is None:
            assert DECLARED[name].zero in text, text


def _watch_parser():
    parser = cli.build_parser()
    launch = parser._subparsers._group_actions[0].choices["launch"]
    tpu = launch._subparsers._group_actions[0].choices["tpu"]
    return tpu._subparsers._group_actions[0].choices["watch"]


def test_a_programmatic_policy_is_checked_as_the_flags_are():
    with pytest.raises(LaunchError, match=r"^--stop-grace -1s must be in \(0, inf\)$"):
        Policy(stop_grace=-1.0)
    with pytest.raises(LaunchError, match=r"^--max-preemptions -2 must be >= 0$"):
        Policy(max_preemptions=-2)


def test_the_recorded_policy_is_what_status_shows(tmp_path):
    """The `watching` row keeps `to_dict`; `launch tpu status` reads it back as flags, which a
    new `launch tpu watch` takes as they are."""
    policy = Policy(max_failures=1, stall_timeout=900.0, keep=True)
    log = events.EventLog(str(tmp_path), clock=lambda: 1000.0)
    log.append("watching", attempt=0, policy={**policy.to_dict(), "from_a_later_version": 1})
    text = workdir_state.status_text(str(tmp_path))
    shown = text.splitlines()[-1]
    assert shown == (
        "supervisor: --max-failures 1 --stall-timeout 15m --startup-timeout 1h --stop-grace 2m "
        "--poll 1m --keep"
    )
    again = cli.build_parser().parse_args([*WATCH, *shown.split()[1:]])
    assert launch_cli._policy(again) == policy


def test_the_docs_state_the_declared_defaults():
    """Where launch/README.md and docs/pods.md give a launch flag's default (`--flag` (default
    V...), it is the declared one, in the flag's own spelling."""
    flags = {
        declarations.flag_name(name, declared): (settings, name, declared)
        for settings in (Policy, slurm.SlurmJob)
        for name, declared in declarations.declarations(settings).items()
    }
    checked = set()
    for page in ("launch/README.md", "docs/pods.md"):
        text = " ".join((ROOT / page).read_text().split())
        for flag, value in re.findall(r"`(--[a-z-]+)` \(default ([^,;)]+)", text):
            if flag not in flags:
                continue
            settings, name, declared = flags[flag]
            default = declarations.defaults(settings)[name]
            assert (declared.parse or type(default))(value) == default, (page, flag, value)
            checked.add(name)
    expected = {"max_failures", "startup_timeout", "stop_grace", "poll_seconds", "signal_seconds"}
    assert expected <= checked
