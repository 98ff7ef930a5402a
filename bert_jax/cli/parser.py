"""argparse as every `bert-jax` command speaks it: a misspelt flag is named with the nearest one
under its own command's usage, and each flag's help shows its default.

`bert_jax.cli.build_parser` makes the top-level parser a `Parser`; argparse gives every subparser
the class of the parser it hangs from, so each command module's parsers are `Parser`s too.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class HelpFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to a flag's help unless the help already speaks of its default,
    the flag is required, or it is a switch that is off unless given."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or not action.option_strings or action.required:
            return text
        default = action.default
        if default is None or default is argparse.SUPPRESS or default is False or default == []:
            return text
        return f"{text} (default: {default_text(default)})"


def default_text(default) -> str:
    """A default as a user would type it (`%` escaped for argparse's help expansion)."""
    if isinstance(default, list | tuple):
        text = " ".join(str(value) for value in default)
    elif default is True:
        text = "on"
    elif default == "":
        text = "''"
    else:
        text = str(default)
    return text.replace("%", "%%")


class Parser(argparse.ArgumentParser):
    """A command's parser: flags checked before anything else, each unknown one named with the
    closest flag of this command ("did you mean --max-seq-length?")."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        # A command (a parser without subcommands) checks its own flags, so a misspelt one gets
        # this command's usage, not the top level's "unrecognized arguments".
        if args is not None and self._subparsers is None:
            for flag in unknown_flags(args, self.option_names(), self.allow_abbrev):
                self.error(unknown_flag_message(flag, self.option_names()))
        return super().parse_known_args(args, namespace)

    def option_names(self) -> list[str]:
        return [name for action in self._actions for name in action.option_strings]


def unknown_flags(
    args: Iterable[str], known: Sequence[str], allow_abbrev: bool = True
) -> list[str]:
    """The flags in `args` (up to a `--`) that name no option of `known`; a unique prefix of a
    long option counts as that option when `allow_abbrev` (argparse's rule)."""
    found = []
    for arg in args:
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-" or _NEGATIVE_NUMBER.match(arg):
            continue
        name = arg.split("=", 1)[0]
        if name in known:
            continue
        if allow_abbrev and name.startswith("--"):
            if len([option for option in known if option.startswith(name)]) == 1:
                continue
        if not name.startswith("--") and len(name) > 2 and name[:2] in known:
            continue  # a short option with its value attached (-n3)
        found.append(name)
    return found


def unknown_flag_message(flag: str, known: Sequence[str], extra: Sequence[str] = ()) -> str:
    """`unrecognized argument --x; did you mean --y?` over the flags of the command (and `extra`
    spellings it also takes, such as `--config.total_steps`)."""
    candidates = [name for name in (*known, *extra) if name.startswith("--")]
    close = difflib.get_close_matches(flag, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unrecognized argument {flag}{hint}"
