"""The one way a command reads `--config FILE[:ARG] --config.key=value ...` plus its own flags.

absl parses these commands' arguments (ml_collections' config flags are absl flags); argparse
only lists them in `bert-jax --help`. The config is locked, so an override naming no setting is
refused: one line naming it, with the closest setting as a suggestion.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bert_jax.runtime.errors import UserError

# The help lists our flags under this heading (as it did when the CLI was one module).
HELP_SECTION = "bert_jax.cli"
_CONFIG_SPEC = re.compile(r"^-{1,2}config(=|$)")
_OVERRIDE = re.compile(r"^-{1,2}(no)?config\.")


@dataclasses.dataclass(frozen=True)
class ConfigCommand:
    """A command configured by a config file: its flags and what it runs on the parsed values."""

    name: str
    summary: str  # its line in `bert-jax --help`
    # (kind, name, default, help) per flag, kind as in absl's DEFINE_<kind>; names use
    # underscores and the dashed spelling is accepted too.
    own_flags: tuple[tuple[str, str, Any, str], ...]
    run: Callable[[Any], int]  # absl FlagValues -> exit status
    define_more: Callable[[Any, Any], None] | None = None  # (absl.flags, FlagValues) -> None

    def add_to(self, subparsers) -> None:
        """Lists the command in `bert-jax --help`; `bert_jax.cli.main` hands its argv to `parse`."""
        subparsers.add_parser(self.name, help=self.summary, add_help=False)

    def main(self, argv: Sequence[str]) -> int:
        return self.run(parse(self, argv))


@contextlib.contextmanager
def _no_bytecode() -> Iterator[None]:
    """Meanwhile Python writes no bytecode cache: loading a config file leaves no __pycache__/
    beside it (bert-jax writes nothing where it was not asked to)."""
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield
    finally:
        sys.dont_write_bytecode = saved


def parse(command: ConfigCommand, argv: Sequence[str]):
    """Returns the parsed absl FlagValues (`.config` is the locked config); prints help and exits
    on -h/--help; raises UserError for a bad flag, config file or override."""
    from absl import flags
    from ml_collections import config_flags

    prog = f"bert-jax {command.name}"
    argv = [_absl_spelling(arg) for arg in argv]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config",
        None,
        "config file, e.g. configs/bert.py:base",
        flag_values=flag_values,
        lock_config=True,
        # The overrides come from `argv` (so `main([...])` works in-process), not sys.argv.
        sys_argv=[prog, *argv],
    )
    # Move the flag under HELP_SECTION (absl files it under the module that defined it).
    config_flag = flag_values["config"]
    delattr(flag_values, "config")
    flags.DEFINE_flag(config_flag, flag_values, module_name=HELP_SECTION)
    for kind, name, default, help_text in command.own_flags:
        define = getattr(flags, f"DEFINE_{kind}")
        define(name, default, help_text, flag_values=flag_values, module_name=HELP_SECTION)
    if command.define_more is not None:
        command.define_more(flags, flag_values)
    if any(arg in ("-h", "--help") for arg in argv):
        print(f"usage: {prog} --config FILE[:ARG] [--config.key=value ...] [flags]\n")
        print(flags_help(flag_values))
        raise SystemExit(0)

    spec = _config_spec(argv)
    if spec is not None and not os.path.isfile(spec.split(":", 1)[0]):
        raise UserError(f"--config {spec}: no such file")
    try:
        with _no_bytecode():
            flag_values([prog, *argv])
    except flags.Error as err:
        message = _without_traceback(str(err))
        for name in flag_values:  # absl names its flags with underscores; we document dashes
            if "_" in name and not name.startswith("config."):
                message = message.replace(f"--{name}", dashed(name))
        raise UserError(message) from None
    except (KeyError, AttributeError) as err:
        # ml_collections raises these when an override names no setting; anything else is a bug.
        problem = _unknown_override(spec, argv) if spec is not None else None
        if problem is None:
            raise
        raise UserError(problem) from err
    if flag_values.config is None:
        raise UserError("--config is required")
    problem = _unknown_file_setting(flag_values.config)
    if problem is not None:
        raise UserError(f"{flag_values['config'].config_filename}: {problem}")
    return flag_values


def _absl_spelling(arg: str) -> str:
    """absl spells flags with underscores and a boolean's negation `--noNAME`; accept the dashed
    spelling every command documents (`--max-accum`, `--no-json`) and the old one alike."""
    if arg.startswith("--") and not arg.startswith("--config"):
        name, sep, value = arg[2:].partition("=")
        if name.startswith("no-"):
            name = "no" + name[3:]
        return "--" + name.replace("-", "_") + sep + value
    return arg


def dashed(name: str) -> str:
    """A flag's documented spelling: `max_accum` -> `--max-accum`."""
    return "--" + name.replace("_", "-")


def flags_help(flag_values) -> str:
    """The flags in the layout of the argparse commands: dashed names, a boolean as
    `--NAME, --no-NAME`, the default, then the help; ours first, then each group absl keeps."""
    import textwrap

    sections = flag_values.flags_by_module_dict()
    order = [HELP_SECTION] + sorted(m for m in sections if m != HELP_SECTION)
    lines = []
    for module in order:
        if module not in sections:
            continue
        title = "options" if module == HELP_SECTION else module.rpartition(".")[2] + " options"
        shown = sorted(sections[module], key=lambda f: f.name)
        if not shown:
            continue
        lines.append(f"{title}:")
        for flag in shown:
            if flag.boolean:
                spelling = f"{dashed(flag.name)}, --no-{flag.name.replace('_', '-')}"
            else:
                spelling = f"{dashed(flag.name)} {flag.name.upper()}"
            text = flag.help or ""
            if flag.default is not None and not flag.boolean:
                text += f" (default: {flag.default})"
            lines.append(f"  {spelling}")
            lines += textwrap.wrap(text, 96, initial_indent=" " * 8, subsequent_indent=" " * 8)
        lines.append("")
    return "\n".join(lines).rstrip()


def _config_spec(argv: list[str]) -> str | None:
    """The FILE[:ARG] given to --config, if given on the command line."""
    for i, arg in enumerate(argv):
        match = _CONFIG_SPEC.match(arg)
        if match:
            if match.group(1) == "=":
                return arg.split("=", 1)[1]
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def _without_traceback(message: str) -> str:
    """A config file's get_config() error arrives with its traceback as text; keep its last line."""
    head, sep, trace = message.partition("Traceback (most recent call last):")
    if not sep:
        return message
    last = [line for line in trace.strip().splitlines() if line.strip()][-1].strip()
    # A UserError from get_config() names the setting itself; its class name adds nothing.
    last = last.removeprefix(f"{UserError.__module__}.{UserError.__name__}: ")
    return f"{head.strip()} {last}"


def _unknown_override(spec: str, argv: list[str]) -> str | None:
    """Names the first `--config.a.b=...` whose path is not a setting of the config (with the
    closest setting), or None when every override names one."""
    from absl import flags
    from ml_collections import config_flags

    overrides = [arg.split("=", 1)[0] for arg in argv if _OVERRIDE.match(arg)]
    if not overrides:
        return None
    plain = flags.FlagValues()  # the config as the file gives it, without the overrides
    config_flags.DEFINE_config_file("config", flag_values=plain, sys_argv=["", "--config", spec])
    try:
        with _no_bytecode():
            plain(["", "--config", spec])
        config = plain.config
    except Exception:  # the original exception is the one to show
        return None
    for flag in overrides:
        path = flag.split(".", 1)[1]
        if "[" in path:  # indexing (a[0].b): let ml_collections' own message stand
            continue
        problem = _missing_setting(config, path.split("."), prefix=flag.split(".", 1)[0])
        if problem is not None:
            return f"{flag}: {problem}"
    return None


def _missing_setting(config, keys: list[str], prefix: str) -> str | None:
    node, walked = config, []
    for key in keys:
        where = "config." + ".".join(walked) if walked else "the config"
        names = _setting_names(node)
        if names is None:
            return f"{where} is a {type(node).__name__}, it has no setting {key!r}"
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            if close:
                guess = ".".join([*walked, close[0], *keys[len(walked) + 1 :]])
                return f"{where} has no setting {key!r}; did you mean {prefix}.{guess}?"
            return f"{where} has no setting {key!r} (it has: {', '.join(sorted(names))})"
        node = node[key] if hasattr(node, "keys") else getattr(node, key)
        walked.append(key)
    return None


def _setting_names(node) -> list[str] | None:
    if hasattr(node, "keys"):  # ConfigDict, dict
        return [str(name) for name in node.keys()]
    if dataclasses.is_dataclass(node):
        return [field.name for field in dataclasses.fields(node)]
    return None


def _unknown_file_setting(config) -> str | None:
    """A config file that misspells a key (`config.optimizer.learnig_rate = 1e-3`) adds a setting
    that nothing reads (overrides cannot: the config is locked). Names the first such key, with
    the closest setting of the recipe (config_lib.pretraining_config; model: BertConfig fields)."""
    from bert_jax.core.model import BertConfig
    from bert_jax.training import config_lib

    known = set(_flat_keys(config_lib.pretraining_config("base").to_dict()))
    known.update(f"model.{field.name}" for field in dataclasses.fields(BertConfig))
    for key in _flat_keys(config.to_dict()):
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean config.{close[0]}?" if close else ""
            return f"config.{key} is not a setting{hint}"
    return None


def _flat_keys(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _flat_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"
