"""The one way a command reads `--config FILE[:ARG] --config.key=value ...` plus its own flags.

absl parses these commands' arguments (ml_collections' config flags are absl flags); to a user
they look like every other command: argparse's help (built from the same flags), dashed
spellings (absl's `--dry_run`/`--nodry_run` still work), a misspelt flag named with the nearest
flag or setting under the command's usage. The config is locked, so an override naming no
setting is refused: one line naming it, with the closest setting as a suggestion. FILE may be
the name of a config that ships with the package (`bert:base`, `demo`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bert_jax import configs
from bert_jax.cli.parser import HelpFormatter, Parser, default_text, unknown_flag_message
from bert_jax.runtime import declarations
from bert_jax.runtime.errors import UserError

# The help lists our flags under this heading (as it did when the CLI was one module).
HELP_SECTION = "bert_jax.cli"
_ALIASES = "bert_jax.cli.aliases"  # earlier spellings: accepted, not listed
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
    # (old name, flag): earlier spellings that keep working, e.g. ("seq_len", "max_seq_length").
    aliases: tuple[tuple[str, str], ...] = ()
    # What `--config-help` prints: every setting of the config family (given the config when
    # --config names one, else None). None: the command has no --config-help.
    settings_help: Callable[[Any], str] | None = None
    # Its report times its compiles (`bench`): it compiles afresh instead of reading the programs
    # earlier commands kept (`runtime.caches.keep_compiled_programs`).
    times_compiles: bool = False

    def add_to(self, subparsers) -> None:
        """Lists the command in `bert-jax --help`; `bert_jax.cli.main` hands its argv to `parse`."""
        subparsers.add_parser(self.name, help=self.summary, add_help=False)

    def main(self, argv: Sequence[str]) -> int:
        flag_values = parse(self, argv)
        if self.settings_help is not None and flag_values.config_help:
            print(self.settings_help(flag_values.config))
            return 0
        return self.run(flag_values)


def declared_flags(cls: type) -> tuple[tuple[str, str, Any, str], ...]:
    """The flags of a declared settings family (runtime/declarations.py) as `ConfigCommand`
    takes them: kind, absl name, default and help with its range. A number is an absl number,
    a boolean an absl boolean (`--NAME`/`--no-NAME`; the help says "on" as for every boolean);
    anything else (a list, a size) is its shown text, read back by `declared_values`."""
    found = []
    for field in declarations.declared_fields(cls):
        declared = field.metadata["declaration"]
        if isinstance(field.default, bool):
            options = declarations.flag_options(field, default_help="")
            found.append(("bool", _absl_name(field.name, declared), field.default, options["help"]))
            continue
        options = declarations.flag_options(field)
        default = field.default
        kind = {int: "integer", float: "float"}.get(options.get("type"), "string")
        if kind == "string" and default is not None:
            default = (declared.show or declarations.shown)(default)
        found.append((kind, _absl_name(field.name, declared), default, options["help"]))
    return tuple(found)


def declared_values(cls: type, flag_values) -> dict[str, Any]:
    """A declared family's settings from the parsed flags of `declared_flags` (a text read by
    its declaration's `parse`; a bad word is one line naming its flag)."""
    values = {}
    for name, declared in declarations.declarations(cls).items():
        value = flag_values[_absl_name(name, declared)].value
        if declared.parse is not None and isinstance(value, str):
            try:
                value = declared.parse(value)
            except ValueError as err:
                raise UserError(f"{declarations.flag_name(name, declared)}: {err}") from None
        values[name] = value
    return values


def _absl_name(name: str, declared) -> str:
    return declarations.flag_name(name, declared)[2:].replace("-", "_")


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
    on -h/--help; exits with the usage and the nearest flag for an unknown flag (as argparse
    does); raises UserError for a bad value, config file or override."""
    from absl import flags

    prog = f"bert-jax {command.name}"
    given = list(argv)
    argv = [_absl_spelling(arg) for arg in argv]
    spec = _config_spec(argv)
    if spec is not None and not any(arg in ("-h", "--help") for arg in argv):
        argv = _with_config_spec(argv, configs.resolve(spec))
    flag_values = define_flags(command, argv)
    if any(arg in ("-h", "--help") for arg in argv):
        help_parser(command, flag_values).print_help()
        raise SystemExit(0)

    spec = _config_spec(argv)
    unknown = _unknown_flag(argv, flag_values)
    if unknown is not None:
        flag = given[unknown].split("=", 1)[0]  # as the user spelt it
        parser = help_parser(command, flag_values)
        parser.error(_unknown_flag_message(flag, parser.option_names(), _setting_flags(spec)))
    try:
        with _no_bytecode():
            flag_values([prog, *argv])
    except flags.Error as err:
        message = _readable_value_error(_without_traceback(str(err)))
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
        if command.settings_help is not None and flag_values.config_help:
            return flag_values  # the declared settings need no config
        raise UserError("--config is required")
    problem = _unknown_file_setting(flag_values.config)
    if problem is not None:
        raise UserError(f"{flag_values['config'].config_filename}: {problem}")
    return flag_values


def define_flags(command: ConfigCommand, argv: Sequence[str] = ()):
    """absl FlagValues with the command's flags, `--config` first (its overrides read from argv,
    in absl's spelling), nothing parsed yet."""
    from absl import flags
    from ml_collections import config_flags

    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config",
        None,
        CONFIG_HELP,
        flag_values=flag_values,
        lock_config=True,
        # The overrides come from `argv` (so `main([...])` works in-process), not sys.argv.
        sys_argv=[f"bert-jax {command.name}", *argv],
    )
    # Move the flag under HELP_SECTION (absl files it under the module that defined it).
    config_flag = flag_values["config"]
    delattr(flag_values, "config")
    flags.DEFINE_flag(config_flag, flag_values, module_name=HELP_SECTION)
    for kind, name, default, help_text in command.own_flags:
        define = getattr(flags, f"DEFINE_{kind}")
        define(name, default, help_text, flag_values=flag_values, module_name=HELP_SECTION)
    if command.settings_help is not None:
        flags.DEFINE_bool(
            "config_help",
            False,
            "list every setting of the config (--config.KEY): its default, range or choices and "
            "what it does; with --config, that config's values where they differ, then exit",
            flag_values=flag_values,
            module_name=HELP_SECTION,
        )
    for old, name in command.aliases:
        flags.DEFINE_alias(old, name, flag_values=flag_values, module_name=_ALIASES)
    if command.define_more is not None:
        command.define_more(flags, flag_values)
    return flag_values


def _absl_spelling(arg: str) -> str:
    """absl spells flags with underscores and a boolean's negation `--noNAME`; accept the dashed
    spelling every command documents (`--max-accum`, `--no-json`) and the old one alike."""
    if arg.startswith("--") and not (_CONFIG_SPEC.match(arg) or _OVERRIDE.match(arg)):
        name, sep, value = arg[2:].partition("=")
        if name.startswith("no-"):
            name = "no" + name[3:]
        return "--" + name.replace("-", "_") + sep + value
    return arg


def dashed(name: str) -> str:
    """A flag's documented spelling: `max_accum` -> `--max-accum`."""
    return "--" + name.replace("_", "-")


CONFIG_HELP = (
    "the config: a packaged one named without a path (bert:SIZE with SIZE tiny, mini, small, "
    "medium, base or large; demo; paper/NAME[:ROW], the paper's experiments, e.g. "
    "paper/table8:0_20_80) or a file FILE.py[:ARG] with get_config(), e.g. configs/bert.py:base"
)
_OVERRIDES_HELP = (
    "Every setting of the config is a flag too: --config.KEY=VALUE (e.g. "
    "--config.total_steps=1000, --config.optimizer.learning_rate=5e-5); `bert-jax pretrain "
    "--config bert:base --dry-run` lists them."
)


def help_parser(command: ConfigCommand, flag_values) -> Parser:
    """An argparse parser with the command's flags, for its help and usage errors (absl parses):
    dashed names, a boolean as `--NAME, --no-NAME`, the default; ours first, then each group absl
    keeps (e.g. distributed options)."""
    parser = Parser(
        prog=f"bert-jax {command.name}",
        usage=f"bert-jax {command.name} --config FILE[:ARG] [--config.KEY=VALUE ...] [options]",
        description=command.summary,
        epilog=_OVERRIDES_HELP,
        formatter_class=HelpFormatter,
    )
    sections = flag_values.flags_by_module_dict()
    order = [HELP_SECTION] + sorted(m for m in sections if m not in (HELP_SECTION, _ALIASES))
    aliases = {}
    for old, name in command.aliases:
        aliases.setdefault(name, []).append(dashed(old))
    for module in order:
        if module not in sections:
            continue
        group = parser
        if module != HELP_SECTION:
            group = parser.add_argument_group(module.rpartition(".")[2] + " options")
        for flag in sorted(sections[module], key=lambda f: (f.name != "config", f.name)):
            text = flag.help or ""
            if flag.name in aliases:
                text += f" (also {', '.join(aliases[flag.name])})"
            if flag.boolean:
                if flag.default:
                    text += " (default: on)"
                group.add_argument(
                    dashed(flag.name),
                    action=argparse.BooleanOptionalAction,
                    default=argparse.SUPPRESS,
                    help=text.replace("%", "%%"),
                )
            else:
                if flag.default is not None and "default" not in text.lower():
                    text += f" (default: {default_text(flag.default)})"
                group.add_argument(
                    dashed(flag.name), metavar=flag.name.upper(), help=text.replace("%", "%%")
                )
    return parser


def _unknown_flag(argv: list[str], flag_values) -> int | None:
    """The index of the first flag of argv (in absl's spelling) that names none of the command's
    flags; config overrides are checked against the config later."""
    known = set()
    for name in flag_values:
        known.add(name)
        if flag_values[name].boolean:
            known.add("no" + name)
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if not arg.startswith("-") or _OVERRIDE.match(arg) or _CONFIG_SPEC.match(arg):
            continue
        name = arg.lstrip("-").split("=", 1)[0]
        if name not in known and name not in ("h", "help"):
            return i
    return None


def _unknown_flag_message(flag: str, options: list[str], settings: list[str]) -> str:
    """The nearest of the command's flags and the config's `--config.KEY`s; a setting's own
    name without `--config.` (`--total_steps`, `--learning-rate`) names that setting, the least
    nested one where several end so."""
    name = flag.lstrip("-").replace("-", "_")
    same = [s for s in settings if s == f"--config.{name}" or s.endswith(f".{name}")]
    if same:
        best = min(same, key=lambda s: (s.count("."), s))
        return f"unrecognized argument {flag}; did you mean {best}?"
    return unknown_flag_message(flag, options, settings)


def _setting_flags(spec: str | None) -> list[str]:
    """`--config.KEY` for every setting of the config named by spec (none if it does not load):
    what a user who typed `--total_steps` meant."""
    config = _plain_config(spec) if spec is not None else None
    if config is None:
        return []
    return [f"--config.{key}" for key in _flat_keys(config.to_dict())]


def _config_spec(argv: list[str]) -> str | None:
    """The FILE[:ARG] given to --config, if given on the command line."""
    for i, arg in enumerate(argv):
        match = _CONFIG_SPEC.match(arg)
        if match:
            if match.group(1) == "=":
                return arg.split("=", 1)[1]
            return argv[i + 1] if i + 1 < len(argv) else None
    return None


def _with_config_spec(argv: list[str], spec: str) -> list[str]:
    """argv with --config's FILE[:ARG] replaced by spec (a packaged config's path)."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        match = _CONFIG_SPEC.match(arg)
        if match:
            if match.group(1) == "=":
                argv[i] = arg.split("=", 1)[0] + "=" + spec
            elif i + 1 < len(argv):
                argv[i + 1] = spec
            break
    return argv


# absl's and Python's words for a value a typed --config.KEY=VALUE override cannot take, and
# what the setting accepts (absl's boolean parser: true/false, t/f, 1/0, any case).
_VALUE_PROBLEMS = (
    (r"\('Non-boolean argument to boolean flag', .*\)", "a boolean setting takes true or false"),
    (r"invalid literal for int\(\) with base 10: .*", "an integer setting takes a whole number"),
    (r"could not convert string to float: .*", "a number setting takes a number such as 1e-4"),
)


def _readable_value_error(message: str) -> str:
    """absl's "flag --config.KEY=VALUE: ('Non-boolean argument to boolean flag', 'VALUE')" as one
    line naming the setting, the value and what it accepts; other messages unchanged."""
    match = re.fullmatch(r"flag (--\S+?)=(.*?): (.*)", message, flags=re.DOTALL)
    if match is None:
        return message
    flag, value, problem = match.groups()
    for pattern, accepted in _VALUE_PROBLEMS:
        if re.fullmatch(pattern, problem, flags=re.DOTALL):
            return f"{flag}={value}: {accepted}, not {value!r}"
    return message


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

    overrides = [arg.split("=", 1)[0] for arg in argv if _OVERRIDE.match(arg)]
    if not overrides:
        return None
    config = _plain_config(spec)
    if config is None:  # the original exception is the one to show
        return None
    for flag in overrides:
        path = flag.split(".", 1)[1]
        if "[" in path:  # indexing (a[0].b): let ml_collections' own message stand
            continue
        problem = _missing_setting(config, path.split("."), prefix=flag.split(".", 1)[0])
        if problem is not None:
            return f"{flag}: {problem}"
    return None


def _plain_config(spec: str):
    """The config as the file gives it, without the overrides; None if it does not load."""
    from absl import flags
    from ml_collections import config_flags

    plain = flags.FlagValues()
    config_flags.DEFINE_config_file("config", flag_values=plain, sys_argv=["", "--config", spec])
    try:
        with _no_bytecode():
            plain(["", "--config", spec])
        return plain.config
    except Exception:
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
    the closest setting of the recipe (config_lib.pretraining_config; model: BertConfig fields,
    and every family's declared settings: config_checks names one of another family)."""
    from bert_jax.core.model import BertConfig
    from bert_jax.training import config_lib, config_schema

    known = set(_flat_keys(config_lib.pretraining_config("base").to_dict()))
    known.update(config_schema.keys())
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
